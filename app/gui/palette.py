"""Colours and themes. Sequence colours are Okabe–Ito, safe for colour-blind readers."""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.core.operations import introduced_names
from pagesim.core.sequence import family_of
from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QPalette

# Okabe & Ito (2008), without black, and without their grey: grey means a free block, so
# it is never an owner's colour. Distinguishable under the common colour-vision deficiencies.
OKABE_ITO = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"]


@dataclass(frozen=True)
class Theme:
    name: str
    window: str
    panel: str
    text: str
    muted: str
    free_block: str
    block_border: str
    empty_slot: str
    highlight: str
    good: str
    bad: str
    plot_background: str
    # A selected row, the scrubber's filled part: a neutral slate, never an owner's colour (it
    # was Okabe-Ito blue, the fifth request's, so a selected row read as that request's).
    selection: str
    selection_text: str


THEMES = {
    "dark": Theme(
        "dark",
        "#1e1f24",
        "#26282e",
        "#e6e6e6",
        "#9aa0a6",
        "#33363d",
        "#4a4e57",
        "#2b2d33",
        "#ffffff",
        "#4cc38a",
        "#ff6b6b",
        "#1b1c20",
        "#59616e",
        "#ffffff",
    ),
    "light": Theme(
        "light",
        "#f4f4f6",
        "#ffffff",
        "#1f2328",
        "#5f6670",
        "#e4e6ea",
        "#b8bcc4",
        "#f0f1f4",
        "#000000",
        "#1a7f4b",
        "#c62828",
        "#ffffff",
        "#c5ccd6",
        "#1f2328",
    ),
}


# Per cycle of seven owners: plain, then hatches (the shade alone can look alike).
PATTERNS = (None, Qt.BrushStyle.BDiagPattern, Qt.BrushStyle.FDiagPattern, Qt.BrushStyle.DiagCrossPattern)


class SequenceColours:
    """A stable colour per request (sequence family): its place in the order the timeline
    brings requests in (:meth:`follow`; a request not in it takes the next place), handed
    out when first asked for. A request's chip, its sequences' rows, its GPU and CPU tiles
    all take the same one."""

    def __init__(self) -> None:
        self._operations: tuple = ()  # the timeline's operations the places were read from
        self._place: dict[str, int] = {}  # family -> its place in the timeline's order
        self._by_family: dict[str, QColor] = {}  # the colours handed out so far
        self._pattern: dict[str, Qt.BrushStyle | None] = {}  # set with the colour: paint asks per block

    def __call__(self, seq_id: str) -> QColor:
        family = family_of(seq_id)
        colour = self._by_family.get(family)
        if colour is None:
            index = self._place.setdefault(family, len(self._place))
            colour = QColor(OKABE_ITO[index % len(OKABE_ITO)])
            # Past seven requests, vary lightness so neighbours still differ (and the pool
            # adds a hatch pattern for them: SequenceColours.pattern).
            cycle = index // len(OKABE_ITO)
            if cycle:
                # One step lighter or darker only (never near white, the highlight's colour);
                # the hatch pattern tells the cycles apart.
                colour = colour.lighter(130) if cycle % 2 else colour.darker(150)
            self._by_family[family] = colour
            self._pattern[family] = PATTERNS[cycle % len(PATTERNS)]
        return colour

    def of_request(self, request: str) -> QColor:
        """A scheduler request's colour: the one its sequences have (``r3`` as ``r3/s0``)."""
        return self(request)

    def pattern(self, seq_id: str):
        """A hatch drawn over the owner's colour for requests past the first seven (None: plain),
        so that owners stay apart even where two shades look alike."""
        self(seq_id)
        return self._pattern[family_of(seq_id)]

    def hatch(self, seq_id: str, theme: Theme) -> QBrush | None:
        """The brush that hatches ``seq_id``'s owner over its colour (None: one of the first seven)."""
        pattern = self.pattern(seq_id)
        return None if pattern is None else QBrush(QColor(theme.window), pattern)

    @property
    def hatched(self) -> bool:
        """Whether any colour handed out so far carries a hatch (an eighth request or later)."""
        return any(pattern is not None for pattern in self._pattern.values())

    def reset(self) -> None:
        self._operations = ()
        self._place.clear()
        self._by_family.clear()
        self._pattern.clear()

    def follow(self, operations: tuple) -> None:
        """Places in the order the timeline's ``operations`` bring requests in, whatever order
        the user stepped or seeked in: undoing a branch gives the script's requests their
        colours back (the branch's own had taken the next ones). Every frame asks; the
        operations change only with an action, an undo or a redo."""
        if operations == self._operations:
            return
        self._operations = operations
        families = tuple(dict.fromkeys(family_of(name) for name in introduced_names(operations)))
        if tuple(self._place)[: len(families)] == families:
            return
        self.reset()
        self._operations = operations
        self._place = {family: index for index, family in enumerate(families)}


def luminance(colour: QColor) -> float:
    """Relative luminance (WCAG 2)."""

    def channel(value: float) -> float:
        return value / 12.92 if value <= 0.03928 else ((value + 0.055) / 1.055) ** 2.4

    return 0.2126 * channel(colour.redF()) + 0.7152 * channel(colour.greenF()) + 0.0722 * channel(colour.blueF())


def contrast(a: QColor, b: QColor) -> float:
    """WCAG contrast ratio of two colours, 1 (none) to 21 (black on white)."""
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


LINE_CONTRAST = 3.0  # WCAG's minimum for graphics: a thin line stays visible on the background
TEXT_CONTRAST = 4.5  # WCAG's minimum for ordinary text


def ink_on(fill: QColor | str) -> QColor:
    """Black or white, whichever reads better on ``fill`` (white on a mid orange read at 2:1)."""
    fill = QColor(fill)
    black, white = QColor("#000000"), QColor("#ffffff")
    return black if contrast(black, fill) >= contrast(white, fill) else white


def readable_on(colour: QColor, background: str | QColor, minimum: float = LINE_CONTRAST) -> QColor:
    """``colour``, darkened (on a light background) or lightened (on a dark one) just enough
    to stand out from ``background``: yellow lines vanished on the light theme's grey."""
    background = QColor(background)
    out = QColor(colour)
    darken = luminance(background) > 0.5
    for _ in range(12):
        if contrast(out, background) >= minimum:
            break
        out = out.darker(115) if darken else out.lighter(115)
    return out


def qpalette(theme: Theme) -> QPalette:
    palette = QPalette()
    roles = {
        QPalette.ColorRole.Window: theme.window,
        QPalette.ColorRole.Base: theme.panel,
        QPalette.ColorRole.AlternateBase: theme.window,
        QPalette.ColorRole.Button: theme.panel,
        QPalette.ColorRole.Text: theme.text,
        QPalette.ColorRole.WindowText: theme.text,
        QPalette.ColorRole.ButtonText: theme.text,
        QPalette.ColorRole.ToolTipBase: theme.panel,
        QPalette.ColorRole.ToolTipText: theme.text,
        QPalette.ColorRole.PlaceholderText: theme.muted,
    }
    for role, colour in roles.items():
        palette.setColor(role, QColor(colour))
    palette.setColor(QPalette.ColorRole.Highlight, QColor(theme.selection))
    palette.setColor(QPalette.ColorRole.HighlightedText, QColor(theme.selection_text))
    return palette
