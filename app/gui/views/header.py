"""Above the pool: the scenario's title and description, the pool's geometry, and what the
step just did in one sentence (with the scenario's own narration of it)."""

from __future__ import annotations

import html

from pagesim.app.gui.views.elided_label import ElidedLabel
from pagesim.core.view_model import Frame
from PySide6.QtWidgets import QFrame, QLabel, QTextBrowser


class ScenarioHeader:
    """The four lines over the pool; the window places them."""

    def __init__(self, line_spacing: int) -> None:
        # A long title keeps to one line ending in "…" (whole in its tooltip) rather than
        # widen the centre and squeeze the docks beside it, or push the pool down.
        self.scenario_title = ElidedLabel(max_lines=1)
        self.scenario_title.setObjectName("scenarioTitle")
        self.scenario_title.set_full_text("loading…")
        # Three lines at most, ending in "…" where it goes on (the whole text in the tooltip).
        self.scenario_description = ElidedLabel(max_lines=3)
        self.scenario_description.setObjectName("scenarioDescription")
        self.pool_caption = QLabel()
        self.pool_caption.setWordWrap(True)
        # What the step just did, in one sentence (and the scenario's own narration of it).
        # A fixed height (the pool must not jump as captions grow and shrink); a long one scrolls.
        self.step_caption = QTextBrowser()
        self.step_caption.setFrameShape(QFrame.Shape.NoFrame)
        self.step_caption.setFixedHeight(4 * line_spacing + 8)
        self.step_caption.viewport().setAutoFillBackground(False)
        self.step_caption.viewport().setStyleSheet("background: transparent;")  # not the scroll bar
        self.step_caption.setToolTip("What this step did to the block tables and the pool (Step log: every step)")
        self.pool_caption.setToolTip("The physical KV-cache pool: one tile per block, one cell per token slot")
        self._caption_html = ""

    @property
    def widgets(self) -> tuple:
        return self.scenario_title, self.scenario_description, self.pool_caption, self.step_caption

    def bind(self, controller) -> None:
        controller.frameChanged.connect(self.show_frame)

    def show_frame(self, frame: Frame) -> None:
        c = frame.config
        branched = frame.branch_step is not None
        self.scenario_title.set_full_text(
            frame.scenario_name + (f" — your branch from step {frame.branch_step}" if branched else "")
        )
        self.scenario_description.set_full_text(" ".join(frame.scenario_description.split()))
        self.pool_caption.setText(
            f"Physical KV-cache pool · {c.num_blocks} blocks × block size {c.block_size} · {c.num_heads} heads "
            f"({c.num_kv_heads} KV) × head dim {c.head_dim} · {c.dtype} · {len(frame.free_queue)} in the free queue"
        )
        if frame.position == 0:
            text = f"Step 0 of {frame.length}: nothing yet. → plays the first step; the Step log lists them all."
        else:
            text = f"<b>Step {frame.position}</b> · {html.escape(frame.caption or frame.label)}"
        if frame.note:  # the scenario's narration, after what happened
            text += f"<br><i>{html.escape(frame.note)}</i>"
        if text != self._caption_html:  # relaying out rich text on every step costs
            self._caption_html = text
            self.step_caption.setHtml(text)
