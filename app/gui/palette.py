"""Colours and themes. Sequence colours are Okabe–Ito, safe for colour-blind readers."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette

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
    ),
}


# Per cycle of seven owners: plain, then hatches (the shade alone can look alike).
PATTERNS = (None, Qt.BrushStyle.BDiagPattern, Qt.BrushStyle.FDiagPattern, Qt.BrushStyle.DiagCrossPattern)


class SequenceColours:
    """A stable colour per sequence, assigned in order of first appearance."""

    def __init__(self) -> None:
        self._by_seq: dict[str, QColor] = {}
        self._pattern: dict[str, Qt.BrushStyle | None] = {}  # set with the colour: paint asks per block

    def __call__(self, seq_id: str) -> QColor:
        colour = self._by_seq.get(seq_id)
        if colour is None:
            index = len(self._by_seq)
            colour = QColor(OKABE_ITO[index % len(OKABE_ITO)])
            # Past seven sequences, vary lightness so neighbours still differ (and the pool
            # adds a hatch pattern for them: SequenceColours.pattern).
            cycle = index // len(OKABE_ITO)
            if cycle:
                # One step lighter or darker only (never near white, the highlight's colour);
                # the hatch pattern tells the cycles apart.
                colour = colour.lighter(130) if cycle % 2 else colour.darker(150)
            self._by_seq[seq_id] = colour
            self._pattern[seq_id] = PATTERNS[cycle % len(PATTERNS)]
        return colour

    def of_request(self, request: str) -> QColor:
        """A scheduler request's colour: that of its first sequence (``r3`` → ``r3/s0``), as the pool shows."""
        for seq_id in self._by_seq:
            if seq_id == request or seq_id.startswith(request + "/"):
                return self._by_seq[seq_id]
        return self(request)

    def pattern(self, seq_id: str):
        """A hatch drawn over the owner's colour for sequences past the first seven (None: plain),
        so that owners stay apart even where two shades look alike."""
        self(seq_id)
        return self._pattern[seq_id]

    def reset(self) -> None:
        self._by_seq.clear()
        self._pattern.clear()


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
    palette.setColor(QPalette.ColorRole.Highlight, QColor("#0072B2"))
    palette.setColor(QPalette.ColorRole.HighlightedText, QColor("#ffffff"))
    return palette
