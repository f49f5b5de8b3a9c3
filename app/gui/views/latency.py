"""The latency panel: the current scenario's serving time on a model shape and a GPU
(core's ``scenario_latency``, on the worker thread): each request's queue time, time to
first token and time per output token, and the run's throughput."""

from __future__ import annotations

import math

import pyqtgraph as pg
from pagesim.app.gui.palette import Theme
from pagesim.app.gui.views.elided_label import ElidedLabel
from pagesim.app.gui.views.plots import _key, _style_plot, add_plot
from pagesim.app.gui.views.presets import gpu_box, model_shape_box, result_table
from pagesim.core.studies.request_latency import DEFAULT_GPU, DEFAULT_MODEL_SHAPE, ScenarioLatency
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSplitter,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

COLUMNS = (
    ("request", "The request's name in the scenario (n parallel samples of one request are one row)"),
    (
        "state",
        "finished, rejected (longer than the pool or max_model_len), aborted (v0: outgrew the pool after it ran; "
        "its tokens are not counted) or unfinished (the scheduler stalled)",
    ),
    ("queue ms", "Arrival to first admission"),
    ("TTFT ms", "Time to first token: arrival to the end of the step that produced it"),
    ("TPOT ms", "Time per output token after the first: (finish − first token) / (outputs − 1)"),
    ("outputs", "Output tokens the request produced (n samples: per sample × n)"),
    ("preemptions", "Times the request was preempted (its work recomputed or its blocks swapped)"),
)
PROMPT = (
    "Compute the scenario's serving time: every request's queue time, TTFT and TPOT, with each step timed by "
    "a roofline model of the chosen model on the chosen GPU (an estimate, not a measurement)."
)


# One bar per figure per request, side by side (Okabe–Ito).
BARS = (("queue", "queue", "#56B4E9"), ("ttft", "TTFT", "#E69F00"), ("tpot", "TPOT", "#009E73"))
MAX_TICK_NAMES = 16  # request names under the bars; more would overlap


def _ms(seconds: float) -> str:
    return "—" if math.isnan(seconds) else f"{seconds * 1e3:.2f}"


class LatencyPanel(QWidget):
    def __init__(self, theme: Theme, compute_latency, parent=None) -> None:
        super().__init__(parent)
        self.theme = theme
        self.compute_latency = compute_latency
        self.result: ScenarioLatency | None = None
        self.running = False
        self._operations: tuple | None = None  # the timeline's, as the newest frame has them
        self._computed_for: tuple | None = None  # ... when the shown result was asked for
        self.model_box = model_shape_box(DEFAULT_MODEL_SHAPE, "Model shape: its weights and K/V bytes time each step")
        self.gpu_box = gpu_box(DEFAULT_GPU, "GPU: its HBM bandwidth and FLOP/s bound each step's time")
        for box in (self.model_box, self.gpu_box):  # a shown result follows the presets
            box.currentIndexChanged.connect(lambda _: self.result is not None and self.run())
        self.run_button = QPushButton("Compute latency")
        self.run_button.setToolTip(
            "Replay the current scenario (with your own actions) to its end, every step timed by the roofline "
            "model, on the worker thread"
        )
        self.run_button.clicked.connect(self.run)
        self.figures = QLabel()
        self.figures.setTextFormat(Qt.TextFormat.RichText)
        self.figures.setToolTip(
            "Means over the finished requests (p99 in brackets); throughput: the finished requests' output tokens "
            "over the whole run (tokens of a request that never finished are counted apart)"
        )
        self.summary = ElidedLabel(max_lines=2)  # a long stall reason ends in "…", whole in the tooltip
        self.summary.setTextFormat(Qt.TextFormat.PlainText)
        self.summary.set_full_text(PROMPT)
        self.table = result_table(COLUMNS, "One row per request, in the order they arrived")
        self.plots = pg.GraphicsLayoutWidget()
        self.plots.setMinimumHeight(90)
        self.plot = add_plot(self.plots, 0, 0)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setMenuEnabled(False)
        self.bars: list[pg.BarGraphItem] = []
        body = QSplitter(Qt.Orientation.Horizontal)
        body.addWidget(self.table)
        body.addWidget(self.plots)
        body.setSizes([500, 500])
        body.setChildrenCollapsible(False)
        controls = QHBoxLayout()
        for widget in (QLabel("model"), self.model_box, QLabel("on"), self.gpu_box, self.run_button):
            controls.addWidget(widget)
        controls.addWidget(self.figures, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(controls)
        layout.addWidget(self.summary)
        layout.addWidget(body, 1)
        self.set_theme(theme)
        self._clear_bars()

    def bind(self, controller) -> None:
        controller.frameChanged.connect(self.follow_timeline)
        controller.loaded.connect(lambda _: self.clear())
        controller.latencyReady.connect(self.show_result)
        controller.studyFailed.connect(lambda study, message: study == "latency" and self.show_failure(message))

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.plots.setBackground(theme.plot_background)
        keys = " · ".join(_key(colour, "■ " + name) for _, name, colour in BARS)
        _style_plot(self.plot, theme, f"Per request: {keys}", "ms", "request", grid=False)
        if self.result is not None:
            self.show_result(self.result)

    def follow_timeline(self, frame) -> None:
        """Say so when the user's actions changed the timeline since the shown result."""
        self._operations = frame.operations
        if self.result is not None and not self.running:
            self._say_summary()

    def run(self) -> None:
        if self.running:
            return
        self.running = True
        self.run_button.setEnabled(False)
        self._computed_for = self._operations
        self.summary.set_full_text(
            f"replaying the scenario with {self.model_box.currentText()} on {self.gpu_box.currentText()}…"
        )
        self.compute_latency(self.model_box.currentData(), self.gpu_box.currentData())

    def clear(self) -> None:
        """Forget the result: it was of another scenario."""
        self.result = None
        self.running = False
        self.run_button.setEnabled(True)
        self.table.setRowCount(0)
        self._clear_bars()
        self.figures.setText("")
        self.summary.setStyleSheet("")
        self.summary.set_full_text(PROMPT)

    def show_failure(self, message: str) -> None:
        self.running = False
        self.run_button.setEnabled(True)
        self.summary.setStyleSheet(f"color: {self.theme.bad}")
        self.summary.set_full_text(f"✗ could not compute the latency: {message}")

    def show_result(self, result: ScenarioLatency) -> None:
        self.result = result
        self.running = False
        self.run_button.setEnabled(True)
        s = result.summary
        if s.requests:
            self.figures.setText(
                f"mean queue <b>{_ms(s.queue['mean'])}</b> ms · TTFT <b>{_ms(s.ttft['mean'])}</b> ms "
                f"(p99 {_ms(s.ttft['p99'])}) · TPOT <b>{_ms(s.tpot['mean'])}</b> ms (p99 {_ms(s.tpot['p99'])}) · "
                f"<b>{s.throughput:,.0f}</b> tokens/s of finished requests"
                + (f" ({s.discarded_tokens:,} tokens of unfinished ones not counted)" if s.discarded_tokens else "")
            )
        else:
            self.figures.setText("")
        self._say_summary()
        self.table.setRowCount(len(result.requests))
        for row, r in enumerate(result.requests):
            cells = (
                r.request,
                r.state,
                _ms(r.queue),
                _ms(r.ttft),
                _ms(r.tpot),
                str(r.output_tokens) if r.samples == 1 else f"{r.output_tokens} × {r.samples}",
                str(r.preemptions),
            )
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if column >= 2:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if column == 1 and r.state != "finished":
                    item.setForeground(QColor(self.theme.bad))
                self.table.setItem(row, column, item)
        self._draw_bars(result)

    def _clear_bars(self) -> None:
        for bar in self.bars:
            self.plot.removeItem(bar)
        self.bars = []
        self.plot.getAxis("bottom").setTicks(None)
        self.plots.setVisible(False)  # no empty 0–1 axes: the line above says what to do

    def _draw_bars(self, result: ScenarioLatency) -> None:
        self._clear_bars()
        rows = result.requests
        if not rows:
            return
        self.plots.setVisible(True)
        width = 0.8 / len(BARS)
        for k, (field, _, colour) in enumerate(BARS):
            x = [i + (k - 1) * width for i in range(len(rows))]
            heights = [0.0 if math.isnan(v := getattr(r, field)) else v * 1e3 for r in rows]
            bar = pg.BarGraphItem(x=x, height=heights, width=width, brush=colour, pen=None)
            self.plot.addItem(bar)
            self.bars.append(bar)
        named = len(rows) <= MAX_TICK_NAMES
        self.plot.getAxis("bottom").setTicks([[(i, r.request) for i, r in enumerate(rows)]] if named else None)
        self.plot.setXRange(-0.6, len(rows) - 0.4, padding=0)
        self.plot.enableAutoRange(axis="y")

    def _say_summary(self) -> None:
        result = self.result
        s = result.summary
        where = f"{result.model_shape} on {result.gpu} (roofline) · the scenario's pool: {result.pool}"
        if not result.requests:
            text = (
                f"{where} · this scenario submits no requests (its sequences are added by hand): latency needs "
                "requests; try Preemption by recompute or any scenario with submit steps"
            )
        else:
            text = f"{where} · {s.requests} of {len(result.requests)} requests finished in "
            text += f"{result.steps} scheduler steps, {s.seconds * 1e3:.2f} ms simulated"
            states = [r.state for r in result.requests]
            for state, what in (("rejected", "rejected as submitted"), ("aborted", "aborted after running")):
                if count := states.count(state):
                    text += f" · {count} {what}"
        warn = bool(result.stalled)
        if result.stalled:
            text += f" · STALLED: {result.stalled}"
        if self._operations is not None and self._computed_for is not None and self._operations != self._computed_for:
            text += " · your actions changed the timeline since: Compute again"
            warn = True
        if result.note:
            text += f" · {result.note}"
        self.summary.setStyleSheet(f"color: {self.theme.bad}" if warn else "")
        self.summary.set_full_text(text)
