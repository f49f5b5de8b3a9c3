"""Above the pool: the scenario's title and description, the pool's geometry, and what the
step just did: the scenario's own note on it first, then the engine's sentence."""

from __future__ import annotations

import html
import re

from pagesim.app.gui.views.elided_label import ElidedLabel
from pagesim.app.gui.views.live_text import LiveText
from pagesim.core.view_model import Frame
from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QToolTip

NARRATION_MAX_LINES = 12  # it grows to its text (no box that scrolls); a longer one ends in "…"
NARRATION_SHARE = 0.35  # of the centre's height at most: the pool below keeps the rest
DESCRIPTION_LINES = 3  # at step 0; from step 1 on, one line (whole in its tooltip): the narration needs the room
_QUOTED = re.compile(r' ?"[^"\n]*"')  # (with the space before it: a name stays with its token)


def unbreakable_quotes(text: str) -> str:
    """``text`` with the spaces inside its quoted token texts, and the one before each, made
    non-breaking: a line must not break inside a token (a token that is one space read as a
    stray quote on each line) or between a sequence's name and its token."""
    return _QUOTED.sub(lambda quote: quote.group(0).replace(" ", "\u00a0"), text)


class Narration(LiveText):
    """What the step did, as tall as its text up to a share of the centre's height (a small
    window keeps room for the pool); beyond that it ends in "…", whole in its tooltip."""

    def __init__(self) -> None:
        super().__init__(lines=2, max_lines=NARRATION_MAX_LINES)
        self._watched: QObject | None = None

    def event(self, event) -> bool:
        if event.type() == QEvent.Type.ParentChange:  # follow the height of the widget it sits in
            if self._watched is not None:
                self._watched.removeEventFilter(self)
            self._watched = self.parentWidget()
            if self._watched is not None:
                self._watched.installEventFilter(self)
        return super().event(event)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        # (a layout request too: the rows above and below may change height between resizes)
        if watched is self._watched and event.type() in (QEvent.Type.Resize, QEvent.Type.LayoutRequest):
            line = self.fontMetrics().lineSpacing()
            height = watched.height()
            share = int(height * NARRATION_SHARE // line)
            # Nor more than the room the rest of the centre leaves (its title, bars, legend and
            # the pool's least height): a taller narration would make the window taller than
            # the screen it was sized to (a 700-px window came out 713 px).
            others = watched.minimumSizeHint().height() - self.height()
            room = (height - others - 2) // line
            lines = max(self.min_lines, min(NARRATION_MAX_LINES, share, room))
            if lines != self.max_lines:
                self.max_lines = lines
                self.fit_to_text()
        return False


class ScenarioHeader:
    """The lines over the pool; the window places them."""

    def __init__(self) -> None:
        # A long title keeps to one line ending in "…" (whole in its tooltip) rather than
        # widen the centre and squeeze the docks beside it, or push the pool down.
        self.scenario_title = ElidedLabel(max_lines=1)
        self.scenario_title.setObjectName("scenarioTitle")
        self.scenario_title.set_full_text("loading…")
        # Three lines at most, ending in "…" where it goes on (the whole text in the tooltip).
        self.scenario_description = ElidedLabel(max_lines=DESCRIPTION_LINES)
        self.scenario_description.setObjectName("scenarioDescription")
        # A click shows the whole description over the window (the layout stays as it is: the
        # narration keeps its room): from step 1 on it keeps to one line, and a tooltip that
        # nothing pointed at was the only way to read the rest.
        self.scenario_description.opens_on_click = True
        self.scenario_description.clicked.connect(self.show_whole_description)
        self.pool_caption = ElidedLabel(max_lines=1, separator=" · ")
        # What the step just did: the scenario's note, then the engine's sentence. It grows to
        # its text rather than scroll in a box; it shrinks back only at a new start (or a
        # resize), so the pool does not jump on every step.
        self.step_caption = Narration()
        self.step_caption.setObjectName("narration")
        self.step_caption.setToolTip("What this step did to the block tables and the pool (Step log: every step)")
        self._caption_html = ""

    def show_whole_description(self) -> None:
        label = self.scenario_description
        if label.elided:  # (a text shown whole has nothing more to say)
            QToolTip.showText(label.mapToGlobal(label.rect().bottomLeft()), label.full_text, label)

    @property
    def widgets(self) -> tuple:
        """Top to bottom; the pool's caption goes with the pool (the window places it)."""
        return self.scenario_title, self.scenario_description, self.step_caption

    def bind(self, controller) -> None:
        controller.frameChanged.connect(self.show_frame)

    def show_frame(self, frame: Frame) -> None:
        c = frame.config
        branched = frame.branch_step is not None
        self.scenario_title.set_full_text(
            frame.scenario_name + (f" — your branch from step {frame.branch_step}" if branched else "")
        )
        self.scenario_description.set_full_text(" ".join(frame.scenario_description.split()))
        self.scenario_description.set_max_lines(DESCRIPTION_LINES if frame.position == 0 else 1)
        self.pool_caption.set_full_text(
            f"Physical KV-cache pool · {c.num_blocks} blocks × block size {c.block_size} · "
            f"{len(frame.free_queue)} in the free queue · {c.num_heads} heads ({c.num_kv_heads} KV) × "
            f"head dim {c.head_dim} · {c.dtype}"
        )
        if frame.position == 0:
            text = f"Step 0 of {frame.length}: nothing yet. → plays the first step; the Step log lists them all."
        else:
            text = f"<b>Step {frame.position}</b> · "
            what = html.escape(unbreakable_quotes(frame.caption or frame.label))
            # The scenario's own words on the step first (why it matters), then what the engine did.
            text += f"<i>{html.escape(frame.note)}</i><br>{what}" if frame.note else what
        if text != self._caption_html:  # relaying out rich text on every step costs
            self._caption_html = text
            self.step_caption.setText(text)
            if frame.position == 0:  # a new start: back to the height its text needs
                self.step_caption.fit_to_text()
