"""The what-if panel: the current scenario replayed once per chosen engine setting (core's
``sweep``, on the worker thread), its variants side by side with the original: blocks in
use over the steps, and a row of figures per variant."""

from __future__ import annotations

import math

import pyqtgraph as pg
from pagesim.app.gui.palette import OKABE_ITO, Theme
from pagesim.app.gui.views.elided_label import ElidedLabel
from pagesim.app.gui.views.plots import _style_plot, add_plot
from pagesim.app.gui.views.presets import gpu_box, model_shape_box, result_table
from pagesim.core.config import CacheConfig
from pagesim.core.errors import InvalidStudyError
from pagesim.core.studies.request_latency import DEFAULT_GPU, DEFAULT_MODEL_SHAPE
from pagesim.core.studies.sweep import SweepResult, VariantResult, expand, parse_setting
from pagesim.core.studies.whatif import PANEL_KNOBS, suggested_values
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QPixmap
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

KNOB_TIPS = {
    "block_size": "Tokens per KV block. The pool keeps its memory: its block count becomes the original's slots "
    "over the new size",
    "num_blocks": "The GPU pool's size in blocks (block size unchanged)",
    "prefix_caching": "Reuse the K/V of full prompt blocks another request already computed (true / false)",
    "preemption": "What a step that runs out of blocks does to the newest request: recompute its tokens later, or "
    "swap its blocks to a CPU pool (one as large as the GPU pool is added if the scenario has none)",
    "watermark": "Share of the pool kept free when admitting requests, so running ones can grow (a fraction in [0, 1))",
    "max_num_seqs": "At most this many sequences run in one step",
    "max_num_batched_tokens": "The tokens one step may compute (vLLM v1's budget; chunked prefill). v1 only: on a v0 "
    "scenario, add scheduler = v1 to the grid too",
    "scheduler": "v0 (whole prompts, vLLM v0) or v1 (one token budget a step, chunked prefill; no swap)",
}
# (header, tooltip) per column; a refused variant's reason spans the columns after its status.
COLUMNS = (
    ("variant", "The setting changed; the original is the scenario as it is (first row, bold). The swatch is its "
     "curve's colour"),
    ("status", "ok, stalled (the scheduler could never finish: hover for why), unfinished, or cannot run"),
    ("pool", "Blocks × tokens per block the variant ran with"),
    ("iterations", "Scheduler iterations (and your own operations) until every request was done; a submit is "
     "no iteration, so this counts fewer than the timeline's steps"),
    ("peak blocks", "The most blocks in use after any step"),
    ("peak slots", "The most token slots in use after any step (blocks × tokens per block): the KV memory, "
     "comparable across block sizes"),
    ("preemptions", "Requests preempted (recomputed or swapped out) over the run"),
    ("prefix hit", "Share of full prompt blocks the prefix cache supplied"),
    ("finished", "Requests that finished"),
    (
        "rejected",
        "Requests refused: as submitted (longer than the pool or max_model_len), or, under v0, aborted after running "
        "as they outgrew the pool",
    ),
    ("queue ms", "Mean time from a request's arrival to its first admission (roofline time)"),
    ("TTFT ms", "Mean time to first token: arrival to the end of the step that produced it"),
    ("TPOT ms", "Mean time per output token after the first"),
    ("tokens/s", "Output tokens over the run's simulated seconds"),
)  # fmt: skip
PROMPT = "Choose a setting and its values (a first guess is filled in), then Run what-if."
PROMPT_TIP = (
    "The current scenario, with your own actions, is replayed once per variant beside the original. Add to grid "
    "several settings to run every combination of their values"
)


def variant_colour(index: int, theme: Theme) -> str:
    """The original in the text colour; the variants in Okabe–Ito order."""
    return theme.text if index == 0 else OKABE_ITO[(index - 1) % len(OKABE_ITO)]


def _ms(seconds: float) -> str:
    return "—" if math.isnan(seconds) else f"{seconds * 1e3:.2f}"


class WhatIfPanel(QWidget):
    def __init__(self, theme: Theme, run_sweep, cancel_sweep, parent=None) -> None:
        super().__init__(parent)
        self.theme = theme
        self.run_sweep, self.cancel_sweep = run_sweep, cancel_sweep
        self.config: CacheConfig | None = None  # the current scenario's: the suggested values follow it
        self._suggested = ""  # the values last suggested (replaced on another scenario unless edited)
        self.settings: list[tuple[str, tuple]] = []  # the grid: (config field, values) per knob added
        self.variants: list[VariantResult] = []  # as they arrive, the original first
        self.result: SweepResult | None = None
        self.running = False
        self.curves: list[pg.PlotDataItem] = []

        self.knob_box = QComboBox()
        for knob in PANEL_KNOBS:
            self.knob_box.addItem(knob)
            self.knob_box.setItemData(self.knob_box.count() - 1, KNOB_TIPS[knob], Qt.ItemDataRole.ToolTipRole)
        self.knob_box.setToolTip("The engine setting to vary (hover an entry for what it does)")
        self.knob_box.currentTextChanged.connect(self._suggest)
        self.values_edit = QLineEdit()
        self.values_edit.setToolTip("Values to try, separated by commas, e.g. 2,8 or true,false")
        self.values_edit.setMinimumWidth(90)
        self.values_edit.returnPressed.connect(self.add_setting)
        self.add_button = QPushButton("Add to grid")
        self.add_button.setToolTip(
            "Add this setting to the grid: several settings run every combination of their values"
        )
        self.add_button.clicked.connect(self.add_setting)
        self.grid_label = ElidedLabel(max_lines=1)
        self.grid_label.setTextFormat(Qt.TextFormat.PlainText)
        self.grid_label.setMinimumWidth(60)  # squeezed to nothing in a narrow window, it could not even say "…"
        self.clear_button = QPushButton("Clear grid")
        self.clear_button.setToolTip("Forget the settings added to the grid")
        self.clear_button.clicked.connect(self.clear_grid)
        self.model_box = model_shape_box(
            DEFAULT_MODEL_SHAPE, "Model shape whose iteration times (roofline) give the latency columns"
        )
        self.gpu_box = gpu_box(DEFAULT_GPU, "GPU whose bandwidth and FLOP/s time each iteration")
        self.run_button = QPushButton("Run what-if")
        self.run_button.setToolTip(
            "Replay the current scenario (with your own actions) once per variant, on the worker thread"
        )
        self.run_button.clicked.connect(self.run)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop after the variant being replayed; the rows so far stay")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        self.progress = QProgressBar()
        self.progress.setFormat("%v / %m variants")
        self.progress.setToolTip("Variants replayed so far")
        self.progress.setMaximumWidth(160)
        self.progress.setValue(0)
        self.progress.setVisible(False)  # until a run starts
        self.status = ElidedLabel(max_lines=2)  # a long refusal ends in "…", whole in the tooltip
        self.status.setTextFormat(Qt.TextFormat.PlainText)

        self.plots = pg.GraphicsLayoutWidget()
        self.plot = add_plot(self.plots, 0, 0)
        self.plot.getAxis("left").setToolTip(
            "Token slots in use after each step: blocks in use × tokens per block, the KV memory a variant holds "
            "(a block count alone would make a variant of larger blocks look smaller)"
        )
        self.plots.setMinimumHeight(90)
        self.table = result_table(COLUMNS, "One row per variant, the original first")
        body = QSplitter(Qt.Orientation.Horizontal)
        body.addWidget(self.plots)
        body.addWidget(self.table)
        body.setStretchFactor(0, 2)
        body.setStretchFactor(1, 3)
        body.setSizes([400, 600])  # the table's columns need the room more than the curves
        body.setChildrenCollapsible(False)

        vary = QHBoxLayout()
        for widget in (QLabel("vary"), self.knob_box, QLabel("=")):
            vary.addWidget(widget)
        vary.addWidget(self.values_edit, 1)
        vary.addWidget(self.add_button)
        vary.addWidget(self.grid_label, 2)
        vary.addWidget(self.clear_button)
        run = QHBoxLayout()
        for widget in (QLabel("timed as"), self.model_box, QLabel("on"), self.gpu_box, self.run_button):
            run.addWidget(widget)
        for widget in (self.cancel_button, self.progress):
            run.addWidget(widget)
        run.addWidget(self.status, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(vary)
        layout.addLayout(run)
        layout.addWidget(body, 1)
        self._show_grid()
        self.set_theme(theme)
        self.clear()

    # -- wiring ----------------------------------------------------------------------
    def bind(self, controller) -> None:
        controller.frameChanged.connect(self.follow_scenario)
        controller.loaded.connect(lambda _: self.clear())
        controller.sweepProgress.connect(self.show_progress)
        controller.sweepReady.connect(self.show_result)
        controller.sweepCancelled.connect(self.show_cancelled)
        controller.studyFailed.connect(lambda study, message: study == "whatif" and self.show_failure(message))

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.plots.setBackground(theme.plot_background)
        _style_plot(self.plot, theme, "Token slots in use (blocks × block size), a curve per variant", "slots",
                    "scheduler iteration (submits are not iterations)")  # fmt: skip
        for index, curve in enumerate(self.curves):
            curve.setPen(self._pen(index))

    def _pen(self, index: int):
        return pg.mkPen(variant_colour(index, self.theme), width=3 if index == 0 else 1.6)

    def follow_scenario(self, frame) -> None:
        if frame.config != self.config:
            self.config = frame.config
            text = self.values_edit.text()
            if not text or text == self._suggested:  # (values the user typed stay; ours follow the scenario)
                self._suggest(self.knob_box.currentText())

    def _suggest(self, knob: str) -> None:
        if self.config is not None:
            self._suggested = suggested_values(knob, self.config)
            self.values_edit.setText(self._suggested)

    # -- the grid --------------------------------------------------------------------
    def _parsed(self) -> tuple[str, tuple] | None:
        """The setting on the left, parsed; None (and the reason shown) if it does not parse."""
        try:
            return parse_setting(f"{self.knob_box.currentText()}={self.values_edit.text()}")
        except InvalidStudyError as exc:
            self.show_failure(str(exc))
            return None

    def add_setting(self) -> None:
        setting = self._parsed()
        if setting is None:
            return
        # A knob added again replaces its earlier values.
        self.settings = [s for s in self.settings if s[0] != setting[0]] + [setting]
        self._show_grid()

    def clear_grid(self) -> None:
        self.settings = []
        self._show_grid()

    def _show_grid(self) -> None:
        if not self.settings:
            self.grid_label.set_full_text("grid: (the setting on the left)")
            self.grid_label.setToolTip("The grid Run replays; with nothing added, Run varies the setting on the left")
            return
        parts = [f"{name}={','.join(_text(v) for v in values)}" for name, values in self.settings]
        self.grid_label.set_full_text("grid: " + " × ".join(parts))

    # -- running ---------------------------------------------------------------------
    def run(self) -> None:
        if self.running:
            return
        settings = list(self.settings)
        if not settings:
            setting = self._parsed()
            if setting is None:
                return
            settings = [setting]
        try:
            count = 1 + len([c for c in expand(settings) if c])
        except InvalidStudyError as exc:
            self.show_failure(str(exc))
            return
        self.clear()
        self.running = True
        self.progress.setRange(0, count)
        self.progress.setValue(0)
        self.progress.setVisible(True)
        self._set_status(f"replaying {count} variants of the scenario…")
        self._enable(running=True)
        self.run_sweep(settings, self.model_box.currentData(), self.gpu_box.currentData())

    def cancel(self) -> None:
        if self.running:
            self.cancel_sweep()
            self.cancel_button.setEnabled(False)
            self._set_status("cancelling after the variant in progress…")

    def _enable(self, running: bool) -> None:
        self.run_button.setEnabled(not running)
        self.cancel_button.setEnabled(running)

    def _set_status(self, text: str, colour: str | None = None, tip: str | None = None) -> None:
        self.status.setStyleSheet(f"color: {colour}" if colour else "")
        self.status.set_full_text(text)
        if tip:
            self.status.setToolTip(tip)

    def clear(self) -> None:
        """Forget the rows and curves (a new run, or another scenario: they described the last one)."""
        self.variants = []
        self.result = None
        for curve in self.curves:
            self.plot.removeItem(curve)
        self.curves = []
        self.table.setRowCount(0)
        self.progress.setValue(0)
        self.plots.setVisible(False)  # no empty 0–1 axes before the first curve
        if not self.running:
            self.progress.setVisible(False)
            self._set_status(PROMPT, tip=PROMPT_TIP)

    # -- results in ------------------------------------------------------------------
    def show_progress(self, index: int, count: int, variant: VariantResult) -> None:
        if not self.running:
            return  # a late reply of a run already cleared
        self.progress.setRange(0, count)
        self.progress.setValue(index)
        self.variants.append(variant)
        self._add_row(len(self.variants) - 1, variant)
        if variant.ran and variant.used_blocks:
            row = len(self.variants) - 1
            size = variant.config.block_size
            curve = self.plot.plot(
                list(range(1, len(variant.used_blocks) + 1)),
                [n * size for n in variant.used_blocks],
                pen=self._pen(row),
            )
            curve.setZValue(10 if row == 0 else 5)
            self.curves.append(curve)
            steps = max(len(v.used_blocks) for v in self.variants if v.ran)
            spacing = max(1, round(steps / 8))  # whole steps only (a 4-step run had ticks at 1.5, 2.5)
            self.plot.getAxis("bottom").setTickSpacing(spacing, spacing)
            self.plots.setVisible(True)

    def show_result(self, result: SweepResult, note: str = "") -> None:
        """All variants in; ``note`` says what was replayed if not the scenario itself."""
        self.result = result
        self.running = False
        self._enable(running=False)
        refused = sum(not v.ran for v in result.variants)
        shape, gpu = result.hardware.shape.name, result.hardware.gpu.name
        times = f"times: {shape} on {gpu} (roofline estimate)"
        if not result.original.ran:  # nothing to compare with: say why once, plainly
            text = f"✗ the scenario itself cannot be replayed: {result.original.reason}"
        elif refused:
            text = f"{len(result.variants)} variants, {refused} could not run (its row says why) · {times}"
        else:
            text = f"✓ {len(result.variants)} variants replayed · {times}"
        self._set_status(text + (f" · {note}" if note else ""), self.theme.bad if refused else None)

    def show_cancelled(self, done: int) -> None:
        self.running = False
        self._enable(running=False)
        self._set_status(f"cancelled after {done} of {self.progress.maximum()} variants; the rows so far stay")

    def show_failure(self, message: str) -> None:
        """One line saying why nothing (more) runs; the rows so far stay."""
        self.running = False
        self._enable(running=False)
        self._set_status(f"✗ {message}", self.theme.bad)

    def _add_row(self, row: int, v: VariantResult) -> None:
        self.table.insertRow(row)
        swatch = QPixmap(10, 10)
        swatch.fill(QColor(variant_colour(row, self.theme)))
        name = QTableWidgetItem(v.label)
        name.setData(Qt.ItemDataRole.DecorationRole, swatch)
        name.setToolTip(v.label)
        if row == 0:
            font = QFont(name.font())
            font.setBold(True)
            name.setFont(font)
        self.table.setItem(row, 0, name)
        status = QTableWidgetItem(v.status)
        status.setToolTip(v.reason or v.status)
        if v.status != "ok":
            status.setForeground(QColor(self.theme.bad))
        self.table.setItem(row, 1, status)
        if not v.ran:
            reason = QTableWidgetItem(v.reason)
            reason.setToolTip(v.reason)
            reason.setForeground(QColor(self.theme.bad))
            self.table.setItem(row, 2, reason)
            self.table.setSpan(row, 2, 1, len(COLUMNS) - 2)
            return
        lat = v.latency
        cells = [
            f"{v.config.num_blocks} × {v.config.block_size}",
            str(v.steps),
            str(v.peak_blocks),
            f"{v.peak_blocks * v.config.block_size:,}",
            str(v.preemptions),
            f"{v.prefix_hit_rate:.0%}",
            str(v.finished),
            str(v.rejected),
            _ms(lat.queue["mean"]) if lat else "—",
            _ms(lat.ttft["mean"]) if lat else "—",
            _ms(lat.tpot["mean"]) if lat else "—",
            "—" if lat is None or not lat.requests else f"{lat.throughput:,.0f}",  # no request: no rate
        ]
        for column, text in enumerate(cells, start=2):
            item = QTableWidgetItem(text)
            item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.table.setItem(row, column, item)

    def cell(self, row: int, column: str) -> str:
        """The text of ``row``'s cell under the header ``column`` (tests, and readers of the table)."""
        index = [name for name, _ in COLUMNS].index(column)
        item = self.table.item(row, index)
        return item.text() if item is not None else ""


def _text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
