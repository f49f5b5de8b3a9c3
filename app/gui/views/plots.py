"""The kernel-vs-dense panel and the memory panel (pyqtgraph)."""

from __future__ import annotations

import math
import re

import numpy as np
import pyqtgraph as pg
from pagesim.app.gui.controller import LIVE_TIMERS
from pagesim.app.gui.palette import TEXT_CONTRAST, Theme, readable_on
from pagesim.app.gui.views.layer_box import LayerBox
from pagesim.app.gui.views.live_text import LiveText
from pagesim.app.gui.views.presets import gpu_box, model_shape_box
from pagesim.core.events import plural
from pagesim.core.studies.waste import CATEGORY_LABELS as WASTE_LABELS
from pagesim.core.studies.waste import WasteStudy
from pagesim.core.studies.workload import DISTRIBUTIONS
from pagesim.core.token_text import quoted, visible
from pagesim.core.view_model import Frame
from PySide6.QtCore import QElapsedTimer, Qt, QTimer
from PySide6.QtGui import QColor, QFontMetricsF
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QGraphicsTextItem,
    QGraphicsWidget,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

# Paul Tol's "muted" scheme: colours for physical blocks, distinct from the sequence palette.
BLOCK_COLOURS = ["#88CCEE", "#CC6677", "#DDCC77", "#117733", "#332288", "#AA4499", "#44AA99", "#999933", "#882255"]


MAX_BLOCK_LABELS = 24
ERROR_PLOT_HEIGHT = 150  # px: title, bars per head against the bound, head numbers (the layer and head menus above)
MAX_TEXT_TICKS = 24  # tokens: past these the weights' axis keeps numbers (the labels would collide)
TICK_CHARS = 6  # a token's text on that axis, cut with "…"
ERROR_AXIS_TOP = 2  # log10: decades above an error of 1, room for the bound's label over its line
# The error axis's bottom: an exact zero cannot sit on a log axis, and fp32's errors start near 1e-8.
ERROR_FLOOR = 1e-10
# The memory history redraws at most this often: five curves and two plots cost a few ms,
# and a line over the steps gains nothing from 60 redraws a second. A frame that comes
# after a pause at least this long is drawn at once (stepping by hand, playback).
HISTORY_REDRAW_MS = 100
SUMMARY_LINES = 4  # blocks, then the prefix cache and the scheduler's queues when there are any
QUEUE_NAMES_SHOWN = 8  # per scheduler queue in the summary; the Scheduler dock shows them all
KERNEL_COLOUR, DENSE_COLOUR, UTIL_COLOUR, FRAG_COLOUR = "#E69F00", "#56B4E9", "#009E73", "#D55E00"
HIT_COLOUR = "#CC79A7"


def readable_keys(title: str, background: str) -> str:
    """A title's coloured keys darkened (or lightened) to read as text on ``background``: the
    curves' orange and sky blue were pale on the light theme's white."""
    return re.sub(
        r"color:\s*(#[0-9A-Fa-f]{6})",
        lambda m: f"color:{readable_on(QColor(m.group(1)), background, TEXT_CONTRAST).name()}",
        title,
    )


def _key(colour: str, text: str) -> str:
    """A coloured legend entry inside a plot title: legends would cover the data."""
    return f"<span style='color:{colour}'>{text}</span>"


class _Title(pg.LabelItem):
    """A plot's title whose text does not set the plot's minimum width: a LabelItem makes its
    text's width its minimum, so title + axes came to more than a narrow dock and the plot
    ran past its widget, cutting the right axis's numbers ("0.2" showed as "0"). The text
    may reach over the axes' columns instead (it is centred above the plot)."""

    def updateMin(self) -> None:  # LabelItem sets its minimum size here
        super().updateMin()
        self.setMinimumWidth(0)


class Plot(pg.PlotItem):
    """A PlotItem whose title may overhang its axes (``_Title``, in the cell above the view
    box where PlotItem keeps its own) and whose vertical axes' labels are cut to what fits
    (``set_side_label``)."""

    TITLE_HEIGHT = 30  # px: the title row, as PlotItem.setTitle makes it
    title_item: _Title | None = None  # PlotItem.__init__ calls setTitle before it exists

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        # side -> (the whole text, then shorter ones; colour)
        self.side_labels: dict[str, tuple[tuple[str, ...], str]] = {}
        self.shown_side_labels: dict[str, str] = {}  # side -> the part shown ("" for none)
        self.title_choices: tuple[tuple[str, ...], dict] | None = None  # (longest first, setTitle's args)
        self._title_widths: list[float] = []  # each choice's width as drawn, measured once
        # PlotItem's own title (hidden from here on) moves to the empty corner cell, at no size
        # (taken out of the layout alone, it crashed at exit): this one takes its place.
        grid = QGraphicsWidget.layout(self)
        own = grid.itemAt(0, 1)
        grid.removeItem(own)
        own.setMaximumSize(0, 0)
        grid.addItem(own, 0, 0)
        self.title_item = _Title("", size="11pt", parent=self)
        grid.addItem(self.title_item, 0, 1)
        self.setTitle(None)
        self.getViewBox().sigResized.connect(self.fit_side_labels)
        for side in ("left", "bottom", "right", "top"):
            # Ticks show the values themselves: pyqtgraph scales an axis spanning (0, 1) by
            # 1000 and writes "(x0.001)" unless no range allows a prefix (disabling the
            # prefix alone rescales once more, on the next label or theme change).
            self.getAxis(side).setSIPrefixEnableRanges(())
            self.getAxis(side).enableAutoSIPrefix(False)

    def setTitle(self, title: str | None = None, **args) -> None:
        if self.title_item is None:
            super().setTitle(None)
            return
        grid = QGraphicsWidget.layout(self)
        if title is None:
            self.title_item.setVisible(False)
            grid.setRowFixedHeight(0, 0)
            self.title_item.setMaximumHeight(0)
        else:
            self.title_item.setMaximumHeight(self.TITLE_HEIGHT)
            grid.setRowFixedHeight(0, self.TITLE_HEIGHT)
            self.title_item.setVisible(True)
            self.title_item.setText(title, **args)

    def set_fitting_title(self, choices: tuple[str, ...], **args) -> None:
        """The first of ``choices`` (longest first) that fits the plot's width as its title:
        a centred title wider than a narrow dock was cut at both ends ("ores · running max")."""
        self.title_choices = (choices, args)
        self._title_widths = []
        for text in choices:  # (measured as drawn: the title item's own rich text and font)
            self.setTitle(text, **args)
            self._title_widths.append(self.title_item.item.boundingRect().width())
        self.fit_title()

    def fit_title(self) -> None:
        """On a resize: the longest choice that fits, set only when it changes (a new title
        lays the plot out again)."""
        if self.title_choices is None or self.title_item is None:
            return
        choices, args = self.title_choices
        room = self.width() - 4
        text = next((t for t, w in zip(choices, self._title_widths, strict=True) if w <= room), choices[-1])
        if self.title_item.text != text:
            self.setTitle(text, **args)

    def fit_side_labels(self, *_) -> None:
        self.fit_title()
        room = self.getViewBox().height()
        for side, (candidates, color) in self.side_labels.items():
            fitting = next((c for c in candidates if _label_length(c, color) <= room), "")
            if fitting == self.shown_side_labels.get(side, ""):
                continue
            self.shown_side_labels[side] = fitting
            if fitting:
                self.setLabel(side, fitting, color=color)
            else:
                self.setLabel(side, None)


def vertical_scroll(widget: QWidget) -> QScrollArea:
    """``widget`` in a frameless scroll area that scrolls up and down only, fitted to its width."""
    scroll = QScrollArea()
    scroll.setWidgetResizable(True)
    scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    scroll.setFrameShape(QFrame.Shape.NoFrame)
    scroll.setWidget(widget)
    return scroll


def add_plot(view: pg.GraphicsLayoutWidget, row: int, col: int) -> Plot:
    plot = Plot()
    view.addItem(plot, row=row, col=col)
    return plot


def set_side_label(plot: Plot, side: str, text: str, color: str, short: str | None = None) -> None:
    """A vertical axis's label, cut to what fits beside the plot: the whole text, else
    ``short`` (by default the part before its parenthesis), else none. A rotated label longer
    than a short plot ran over the plot above it (the walk-through at 1024 × 700); the axis's
    tooltip keeps it whole."""
    plot.getAxis(side).setToolTip(text)
    plot.side_labels[side] = ((text, text.split(" (")[0] if short is None else short), color)
    plot.fit_side_labels()


_LABEL_PROBE: list = []  # one QGraphicsTextItem, to measure a label as an axis would draw it


def _label_length(text: str, color: str) -> float:
    """How long ``text`` would be as an axis's label: the rich text AxisItem.labelString
    writes, in a QGraphicsTextItem's default font, as the axis's own label has."""
    if not _LABEL_PROBE:
        _LABEL_PROBE.append(QGraphicsTextItem())
    probe = _LABEL_PROBE[0]
    probe.setHtml(f"<span style='color: {color}'>{text} </span>")
    return probe.boundingRect().width()


def _style_plot(
    plot: Plot, theme: Theme, title: str, left: str, bottom: str, grid: bool = True, left_short: str | None = None
) -> None:
    plot.title_choices = None  # (a fixed title now: a resize must not bring back an earlier choice)
    plot.setTitle(readable_keys(title, theme.plot_background), color=theme.text, size="9pt")
    set_side_label(plot, "left", left, theme.muted, left_short)
    plot.setLabel("bottom", bottom, color=theme.muted)
    plot.showGrid(x=grid, y=grid, alpha=0.15)
    for axis in ("left", "bottom"):
        plot.getAxis(axis).setTextPen(theme.muted)
        plot.getAxis(axis).setPen(theme.muted)


class KernelPanel(QWidget):
    """For the selected sequence and head: the kernel's output against dense attention."""

    def __init__(self, theme: Theme, colours=None, parent=None) -> None:
        super().__init__(parent)
        self.theme = theme
        self.colours = colours  # the owners' colours (one system across views), or None
        self.frame: Frame | None = None
        self.backend_label = QLabel("backend: starting…")
        self.backend_label.setToolTip("The kernel backend and device every step runs on")
        self.backend_label.setWordWrap(True)
        self.head_box = QSpinBox()
        self.head_box.setPrefix("head ")
        self.head_box.setToolTip("Query head to plot (GQA: several query heads share one KV head)")
        self.head_box.valueChanged.connect(lambda _: self._redraw())
        self.layer_box = LayerBox()  # a real model's: asks the worker for that layer's detail
        self.verdict = QLabel("no sequence")
        self.verdict.setTextFormat(Qt.TextFormat.RichText)
        self.verdict.setWordWrap(True)
        self.verdict.setToolTip(
            "Max abs difference between the paged kernel and dense attention (torch SDPA, fp32) on the same "
            "tokens, against the bound that fp32 rounding explains (the dashed line: the tightest head's)"
        )
        top = QHBoxLayout()  # what to show above, the verdict on it below at the dock's full width
        top.addWidget(self.layer_box)
        top.addWidget(self.head_box)
        top.addStretch(1)
        self.plots = pg.GraphicsLayoutWidget()
        self.output_plot = add_plot(self.plots, 0, 0)
        self.weights_plot = add_plot(self.plots, 1, 0)
        # The match per head stays in sight at every window size, right under the verdict;
        # the two larger plots scroll below it when the dock is short.
        self.error_view = pg.GraphicsLayoutWidget()
        self.error_view.setFixedHeight(ERROR_PLOT_HEIGHT)
        self.error_plot = add_plot(self.error_view, 0, 0)
        # They agree to ~1e-7: the kernel as a line, dense as hollow markers on it, both visible.
        self.kernel_curve = self.output_plot.plot(name="paged kernel")
        self.dense_curve = self.output_plot.plot(name="dense SDPA", symbol="o", symbolSize=8, pen=None)
        self.weight_bars = pg.BarGraphItem(x=[], height=[], width=0.9)
        self.weights_plot.addItem(self.weight_bars)
        # The token hovered in the token map: its bar ringed, its weight written.
        self.hovered_weight = pg.ScatterPlotItem(symbol="o", size=13, brush=None)
        self.hovered_label = pg.TextItem(anchor=(0.5, 1.3))
        self.weights_plot.addItem(self.hovered_weight)
        self.weights_plot.addItem(self.hovered_label)
        self.error_bars = pg.BarGraphItem(x=[], height=[], width=0.6)
        self.error_plot.addItem(self.error_bars)
        self.tolerance_line = pg.InfiniteLine(
            angle=0, movable=False, label="rounding bound", labelOpts={"position": 0.02, "anchors": [(0, 1), (0, 1)]}
        )
        self.error_plot.addItem(self.tolerance_line)
        self.error_plot.setLogMode(y=True)
        self.error_plot.getAxis("bottom").setTickSpacing(1, 1)
        self.error_plot.setYRange(np.log10(ERROR_FLOOR) - 1, ERROR_AXIS_TOP, padding=0)  # (room for 10⁻¹⁰'s label)
        # 10⁻¹⁰, 10⁻⁵, 1: room for each label (the bars ran 15 decades in 45 px, 10⁻¹² unlabelled)
        self.error_plot.getAxis("left").setTicks([[(-10.0, "10⁻¹⁰"), (-5.0, "10⁻⁵"), (0.0, "1")], []])
        # A fixed pool of block labels, shown and hidden: re-adding TextItems on every
        # frame churns the scene for nothing.
        self._block_labels = [pg.TextItem(anchor=(0, 1)) for _ in range(MAX_BLOCK_LABELS)]
        for label in self._block_labels:
            label.setVisible(False)
            self.weights_plot.addItem(label)
        self._labelled_top: float | None = None
        self._token_labels: list[tuple[int, str]] | None = None  # a short real context's, by token
        self.weights_plot.getViewBox().sigResized.connect(lambda *_: self._fit_weight_range())
        self.weights_plot.getViewBox().sigResized.connect(lambda *_: self._fit_token_labels())
        # The whole panel scrolls, the verdict and the match per head first: in a short dock
        # (1024 × 700) a scroll area of the two larger plots alone was laid over the lower
        # half of the per-head chart, its head numbers and its 10⁻¹⁰ hidden.
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.backend_label)
        layout.addLayout(top)
        layout.addWidget(self.verdict)
        layout.addWidget(self.error_view)
        # Two plots need room: below the fold they scroll rather than squash to nothing.
        self.plots.setMinimumHeight(300)
        self.plots.setMinimumWidth(260)
        # (their own size hint, 480 px, made the panel taller than a 1080-px dock: scrolled)
        self.plots.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Ignored)
        layout.addWidget(self.plots, 1)
        self.scroll = vertical_scroll(content)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.scroll)
        self.set_theme(theme)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.plots.setBackground(theme.plot_background)
        self.error_view.setBackground(theme.plot_background)
        _style_plot(
            self.output_plot,
            theme,
            f"Output: {_key(KERNEL_COLOUR, '●─ paged kernel')} vs {_key(DENSE_COLOUR, '× dense SDPA')}",
            "value",
            "dimension",
        )
        _style_plot(
            self.weights_plot,
            theme,
            "Attention weights (a shade per block)",
            "weight",
            "token",
        )
        _style_plot(self.error_plot, theme, "Max |kernel − dense| per head", "error", "head")

        self.kernel_curve.setPen(pg.mkPen(KERNEL_COLOUR, width=2))
        self.dense_curve.setSymbolPen(pg.mkPen(DENSE_COLOUR, width=1.5))
        self.dense_curve.setSymbolBrush(None)
        self.tolerance_line.setPen(pg.mkPen(theme.bad, width=1, style=Qt.PenStyle.DashLine))
        self.tolerance_line.label.setColor(theme.text)  # (pyqtgraph's default: white, lost on the light theme)
        self._redraw()

    def show_hovered_token(self, seq_id: str, token: int) -> None:
        """Ring token ``token``'s weight bar if the panel shows ``seq_id`` (-1: none)."""
        focus = self.frame.focus if self.frame is not None else None
        if focus is None or focus.seq_id != seq_id or not 0 <= token < focus.context_len:
            self.hovered_weight.setData([], [])
            self.hovered_label.setVisible(False)
            return
        head = min(self.head_box.value(), focus.weights.shape[0] - 1)
        weight = float(focus.weights[head][token])
        self.hovered_weight.setData([token], [weight], pen=pg.mkPen(self.theme.highlight, width=2))
        pieces = self._pieces(focus.seq_id)
        text = f" {quoted(pieces[token], 16)}" if pieces is not None and token < len(pieces) else ""
        self.hovered_label.setText(f"token {token}{text}: {weight:.3f}", color=self.theme.highlight)
        self.hovered_label.setPos(token, weight)
        self.hovered_label.setVisible(True)

    def set_backend(self, name: str, device: str) -> None:
        self.backend_label.setText(f"<b>{name.upper()}</b> · {device}")

    def bind(self, controller) -> None:
        controller.frameChanged.connect(self.show_frame)
        controller.backendReady.connect(self.set_backend)
        self.layer_box.currentIndexChanged.connect(lambda _: controller.set_layer(self.layer_box.layer()))

    def show_frame(self, frame: Frame) -> None:
        previous = self.frame.focus if self.frame is not None else None
        self.frame = frame
        self.set_backend(frame.backend, frame.device)
        if self.head_box.maximum() != frame.config.num_heads - 1:  # a spin box re-lays out on every setMaximum
            self.head_box.setMaximum(frame.config.num_heads - 1)
        self.layer_box.set_layers(frame.num_layers, frame.worst_layer)
        if not _same_focus(previous, frame.focus):  # most steps leave the selected sequence alone
            self._redraw()

    def _redraw(self) -> None:
        focus = self.frame.focus if self.frame is not None else None
        for label in self._block_labels:
            label.setVisible(False)
        if focus is None:
            live = self.frame is not None and bool(self.frame.sequences)
            self.verdict.setText(
                "Select a sequence to compare its kernel output with dense attention."
                if live
                else "No live sequence at this step: nothing to attend yet. Step forward (→) or add a "
                "sequence (A); its kernel output and dense attention will be compared here."
            )
            self.kernel_curve.setData([], [])
            self.dense_curve.setData([], [])
            self.weight_bars.setOpts(x=[], height=[])
            self.error_bars.setOpts(x=[], height=[])
            self.plots.setVisible(False)  # no empty 0–1 axes: the sentence above says what to do
            return
        self.plots.setVisible(True)
        head = min(self.head_box.value(), focus.output.shape[0] - 1)
        dims = np.arange(focus.output.shape[1])
        self.kernel_curve.setData(dims, focus.output[head])
        self.dense_curve.setData(dims, focus.dense[head])
        error, bound = float(focus.head_errors[head]), float(focus.head_tolerances[head])
        ok = bool(focus.head_passed[head])
        colour = self.theme.good if ok else self.theme.bad
        mark = "✓ match" if ok else "✗ MISMATCH"
        exact = focus.kv_mismatch is None
        kv = (
            f"<span style='color:{self.theme.good}'>K/V read = K/V written, bit for bit</span>"
            if exact
            else f"<span style='color:{self.theme.bad}; font-weight:bold'>✗ {focus.kv_mismatch}</span>"
        )
        where = f"head {head}"
        if focus.num_layers > 1:
            worst = " (the step's worst)" if focus.layer == focus.worst_layer else ""
            against = "K/V gathered through the block table" if focus.gathered else "the dense engine's own K/V"
            where = f"layer {focus.layer} of {focus.num_layers}{worst}, head {head}, dense over {against}"
        self.verdict.setText(
            f"<span style='color:{colour}; font-weight:bold'>{mark}</span> · sequence <b>{focus.seq_id}</b>, "
            f"{where}: max |err| {error:.2e} {'≤' if ok else '>'} rounding bound {bound:.1e} "
            f"({focus.context_len} tokens) · {kv}"
        )
        blocks = focus.token_blocks
        # The sequence's own colour (as in the pool and the table), a darker shade every
        # other block so the blocks stand apart; the block ids are written over them.
        owner = self.colours(focus.seq_id) if self.colours is not None else QColor(KERNEL_COLOUR)
        shades = (pg.mkBrush(owner), pg.mkBrush(owner.darker(160)))
        starts = np.flatnonzero(np.r_[True, blocks[1:] != blocks[:-1]])
        run = np.cumsum(np.r_[True, blocks[1:] != blocks[:-1]]) - 1  # which block (in order) each token is in
        brushes = [shades[r % 2] for r in run.tolist()]
        positions = np.arange(focus.context_len)
        self.weight_bars.setOpts(x=positions, height=focus.weights[head], brushes=brushes, pen=None)
        self._label_tokens(focus)
        top = float(focus.weights[head].max())
        if len(starts) <= MAX_BLOCK_LABELS:
            for label, start in zip(self._block_labels, starts, strict=False):
                label.setText(f"#{int(blocks[start])}", color=self.theme.muted)
                label.setPos(float(start), top)
                label.setVisible(True)
            self._labelled_top = top
            self._fit_weight_range()
        else:
            self._labelled_top = None
            self.weights_plot.enableAutoRange(axis="y")
        heads = np.arange(len(focus.head_errors))
        floor = ERROR_FLOOR
        self.error_bars.setOpts(
            x=heads,
            height=np.log10(np.maximum(focus.head_errors, floor)) - np.log10(floor),
            y0=np.log10(floor),
            brushes=[pg.mkBrush(self.theme.good if ok else self.theme.bad) for ok in focus.head_passed.tolist()],
        )
        self.tolerance_line.setValue(np.log10(float(focus.head_tolerances.min())))
        self.error_plot.setYRange(np.log10(floor) - 1, ERROR_AXIS_TOP, padding=0)  # fixed decades: steps compare

    def _pieces(self, seq_id: str) -> tuple[str, ...] | None:
        state = self.frame.sequence(seq_id) if self.frame is not None else None
        return state.pieces if state is not None else None

    def _label_tokens(self, focus) -> None:
        """A real model's short context: each bar labelled by its token's text, on the axis
        (a longer one keeps numbers; hovering a token in the map names it)."""
        pieces = self._pieces(focus.seq_id)
        axis = self.weights_plot.getAxis("bottom")
        if pieces is None or focus.context_len > MAX_TEXT_TICKS:
            self._token_labels = None
            axis.setTicks(None)
            return
        self._token_labels = [(t, visible(pieces[t], TICK_CHARS)) for t in range(min(focus.context_len, len(pieces)))]
        self._fit_token_labels()

    def _fit_token_labels(self) -> None:
        """The token labels that fit the axis's width: every k-th on the first tick level, the
        others on a second one that pyqtgraph leaves out where it would crowd (it always draws
        the first: at 1920 px a 17-token context's labels ran together). Redone on a resize."""
        labels = self._token_labels
        if not labels:
            return
        axis = self.weights_plot.getAxis("bottom")
        metrics = QFontMetricsF(axis.style.get("tickFont") or axis.font())
        widest = max(metrics.horizontalAdvance(text) for _, text in labels) + 6
        span = max(1.0, self.weights_plot.getViewBox().width()) / max(1, len(labels))  # px per token
        every = max(1, math.ceil(widest / span))
        axis.setTicks([labels[::every], [label for i, label in enumerate(labels) if i % every]])

    def _fit_weight_range(self) -> None:
        """Room above the tallest bar for a line of block ids (auto-range ignores text: the
        ids sat on the view's top edge, cut in half). Redone when the plot is resized."""
        if self._labelled_top is None:
            return
        line = self._block_labels[0].boundingRect().height()
        share = min(0.6, (line + 2) / max(1.0, self.weights_plot.getViewBox().height()))
        self.weights_plot.setYRange(0, self._labelled_top / (1 - share), padding=0)


def _same_focus(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return (
        a.seq_id == b.seq_id
        and a.layer == b.layer
        and a.worst_layer == b.worst_layer
        and a.context_len == b.context_len
        and np.array_equal(a.output, b.output)
        and np.array_equal(a.dense, b.dense)
        and np.array_equal(a.token_blocks, b.token_blocks)
    )


def over_the_line(xs, ys, line: float) -> tuple[list[float], list[float]]:
    """The parts of a polyline above ``line`` on a log axis: its points there and, where a
    segment crosses the line, the crossing (NaN elsewhere, for ``connect="finite"``), so a
    single step over the line still shows from where it crossed."""
    out_x: list[float] = []
    out_y: list[float] = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        x0, y0 = (xs[i - 1], ys[i - 1]) if i else (x, y)
        if (y0 > line) != (y > line) and min(y0, y) > 0:
            t = (math.log(line) - math.log(y0)) / (math.log(y) - math.log(y0))
            out_x.append(x0 + t * (x - x0))
            out_y.append(line)
        out_x.append(x)
        out_y.append(y if y > line else math.nan)
    return out_x, out_y


EMPTY_VIEW = (10, 10)  # (steps, blocks) the memory plots span before any frame


class MemoryPanel(QWidget):
    """Blocks used over steps against a contiguous max-length reservation; utilisation."""

    def __init__(self, theme: Theme, parent=None) -> None:
        super().__init__(parent)
        self.plots = pg.GraphicsLayoutWidget()
        self.blocks_plot = add_plot(self.plots, 0, 0)
        self.util_plot = add_plot(self.plots, 0, 1)
        self.used_curve = self.blocks_plot.plot(name="paged: blocks used")
        self.contiguous_curve = self.blocks_plot.plot(name="contiguous max-length reservation")
        # Where the contiguous reservation would need more blocks than the pool has: impossible.
        self.overflow_curve = self.blocks_plot.plot(name="contiguous: more than the pool", connect="finite")
        # Log scale: a contiguous reservation can be 100× the paged line; both stay readable.
        self.blocks_plot.setLogMode(y=True)
        # Named by a tick on the right axis, outside the curves: a label on the line itself lay
        # where the used curve climbs to the pool, or over the curves' first steps.
        self.pool_line = pg.InfiniteLine(angle=0, movable=False)
        self.blocks_plot.addItem(self.pool_line)
        self.blocks_plot.showAxis("right")
        self.blocks_plot.getAxis("right").setTicks([[]])
        self._pool_tick: int | None = None  # the pool the right axis names
        self.util_curve = self.util_plot.plot(name="utilisation (% of allocated slots)", connect="finite")
        self.frag_curve = self.util_plot.plot(name="internal fragmentation (% of slots)", connect="finite")
        # With prefix caching on only (a flat 0 % says nothing): % of the prompt blocks looked up so far.
        self.hit_curve = self.util_plot.plot(name="prefix cache hit rate (% of prompt blocks)", connect="finite")
        # A dot on each curve at the current step: a lone step (the first, or one between empty
        # ones) draws no line, and the dots say where "now" is on a replay seen from its end.
        self.blocks_now = self.blocks_plot.plot(pen=None, symbol="o", symbolSize=7)
        self.util_now = self.util_plot.plot(pen=None, symbol="o", symbolSize=7)
        # The last step's tick label may reach past the plot's edge, into the margin: it was
        # dropped (the slots plot stopped at 27 of 30 steps, the blocks plot beside it did not).
        self.util_plot.getAxis("bottom").setStyle(hideOverlappingLabels=12)
        self.shows_hits = False
        self._view: tuple[int, int] | None = None
        self.plotted: Frame | None = None  # the frame the curves show (drawn ≤ HISTORY_REDRAW_MS late)
        self._pending: Frame | None = None
        self._since_draw = QElapsedTimer()
        self._redraw_timer = QTimer(self)
        self._redraw_timer.setObjectName("pagesim-memory-redraw")
        self._redraw_timer.setSingleShot(True)
        self._redraw_timer.timeout.connect(self._draw_pending)
        LIVE_TIMERS.add(self._redraw_timer)
        self.summary = LiveText(lines=1, max_lines=SUMMARY_LINES)  # new numbers every step: no re-layout
        self.summary.setToolTip(
            "Utilisation: slots holding tokens / slots allocated. Internal fragmentation: allocated slots left "
            "empty at the end of each sequence's last block. Contiguous: what reserving max_model_len per "
            "sequence up front (as pre-paging servers did) would hold."
        )
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.summary)
        self.plots.setMinimumHeight(130)
        layout.addWidget(self.plots, 1)
        self.set_theme(theme)
        # Until a scenario's first frame (a real model may still be loading): empty axes with
        # readable ticks, not a log axis's default range crowding its labels into one spot.
        self._set_view(*EMPTY_VIEW)
        self._view = None  # the first frame sets its own, whatever it is
        self.pool_line.hide()  # no pool yet

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.plots.setBackground(theme.plot_background)
        _style_plot(
            self.blocks_plot,
            theme,
            f"Blocks: {_key(KERNEL_COLOUR, '─ paged, used')} vs "
            f"{_key(DENSE_COLOUR, '- - contiguous max-length reservation')} "
            f"({_key(theme.bad, '━ more than the pool')})",
            "blocks (log)",
            "step",
            grid=False,  # redrawn every step; a grid costs more than the curves
            left_short="log",  # (the title says blocks; the scale is what a short axis must still say)
        )
        self._style_util_plot()
        self.used_curve.setPen(pg.mkPen(KERNEL_COLOUR, width=2))
        self.contiguous_curve.setPen(pg.mkPen(DENSE_COLOUR, width=2, style=Qt.PenStyle.DashLine))
        self.overflow_curve.setPen(pg.mkPen(theme.bad, width=4))
        self.pool_line.setPen(pg.mkPen(theme.muted, width=1, style=Qt.PenStyle.DotLine))
        self.blocks_plot.getAxis("right").setTextPen(theme.muted)
        self.blocks_plot.getAxis("right").setPen(theme.muted)
        self.util_curve.setPen(pg.mkPen(UTIL_COLOUR, width=2))
        self.frag_curve.setPen(pg.mkPen(FRAG_COLOUR, width=2))
        self.hit_curve.setPen(pg.mkPen(HIT_COLOUR, width=2))
        if self.plotted is not None:  # the dots in this theme's colours (a warning red differs)
            self._mark_now(self.plotted.history[-1] if self.plotted.history else None, self.plotted.config.num_blocks)

    def _style_util_plot(self) -> None:
        util = _key(UTIL_COLOUR, "─ utilisation")
        if self.shows_hits:  # a shorter title: three keys in the width two had
            title = f"{util} · {_key(FRAG_COLOUR, '─ internal frag.')} · {_key(HIT_COLOUR, '─ prefix hits')} (%)"
        else:
            title = f"Slots: {util} · {_key(FRAG_COLOUR, '─ internal fragmentation')} (% of allocated)"
        _style_plot(self.util_plot, self.theme, title, "%", "step", grid=False)
        tip = "Utilisation and internal fragmentation: % of the slots allocated"
        if self.shows_hits:
            tip += ". Prefix hits: % of the full prompt blocks looked up so far that the cache supplied"
        self.util_plot.getAxis("left").setToolTip(tip)

    def bind(self, controller) -> None:
        controller.frameChanged.connect(self.show_frame)

    def show_frame(self, frame: Frame) -> None:
        self._show_summary(frame)
        self._pending = frame
        if not self._since_draw.isValid() or self._since_draw.elapsed() >= HISTORY_REDRAW_MS:
            self._draw_pending()
        elif not self._redraw_timer.isActive():
            self._redraw_timer.start(HISTORY_REDRAW_MS - self._since_draw.elapsed())

    def flush(self) -> None:
        """Draw what is pending now (a screenshot, the window closing, a test)."""
        self._redraw_timer.stop()
        if self._pending is not None:
            self._draw_pending()

    def _draw_pending(self) -> None:
        frame, self._pending = self._pending, None
        if frame is None:
            return
        self._since_draw.start()
        self._draw_history(frame)
        self.plotted = frame

    def _draw_history(self, frame: Frame) -> None:
        history = frame.history
        if frame.config.prefix_caching != self.shows_hits:
            self.shows_hits = frame.config.prefix_caching
            self._style_util_plot()
        steps = np.array([m.step for m in history], dtype=float)
        nan = float("nan")
        pool = frame.config.num_blocks
        self.used_curve.setData(steps, [m.used_blocks or nan for m in history])  # a log axis has no 0
        self.contiguous_curve.setData(steps, [m.contiguous_blocks or nan for m in history])
        self.overflow_curve.setData(*over_the_line(steps, [m.contiguous_blocks for m in history], pool))
        self.pool_line.setValue(np.log10(pool))  # the plot is in log10 units
        self.pool_line.show()
        if pool != self._pool_tick:  # (a new tick lays the axis out again: once a scenario)
            self._pool_tick = pool
            self.blocks_plot.getAxis("right").setTicks([[(np.log10(pool), f"pool {pool:,}")], []])
        # Fixed ranges: axes re-layout only when the scenario or the peak changes.
        peak = max([frame.config.num_blocks, *(m.contiguous_blocks for m in history)])
        self._set_view(max(1, frame.length), peak)
        # Nothing allocated: no utilisation to speak of (a gap, not a jump to 100 %).
        self.util_curve.setData(steps, [100 * m.utilisation if m.slots_allocated else nan for m in history])
        self.frag_curve.setData(
            steps, [100 * m.internal_fragmentation / m.slots_allocated if m.slots_allocated else nan for m in history]
        )
        # Nothing looked up yet: no rate (a gap).
        hits = [100 * m.prefix_hit_rate if m.prefix_lookup_blocks else nan for m in history] if self.shows_hits else []
        self.hit_curve.setData(steps if self.shows_hits else [], hits)
        self._mark_now(history[-1] if history else None, pool)

    def _mark_now(self, m, pool: int) -> None:
        """The current step's values as dots, in their curves' colours (none where a curve has no value)."""
        blocks, util = [], []
        if m is not None:
            if m.used_blocks:
                blocks.append((m.used_blocks, KERNEL_COLOUR))
            if m.contiguous_blocks:
                blocks.append((m.contiguous_blocks, self.theme.bad if m.contiguous_blocks > pool else DENSE_COLOUR))
            if m.slots_allocated:
                util.append((100 * m.utilisation, UTIL_COLOUR))
                util.append((100 * m.internal_fragmentation / m.slots_allocated, FRAG_COLOUR))
            if self.shows_hits and m.prefix_lookup_blocks:
                util.append((100 * m.prefix_hit_rate, HIT_COLOUR))
        for item, points in ((self.blocks_now, blocks), (self.util_now, util)):
            item.setData(
                [m.step] * len(points) if m is not None else [],
                [value for value, _ in points],
                symbolBrush=[pg.mkBrush(colour) for _, colour in points],
                symbolPen=[pg.mkPen(colour) for _, colour in points],
            )

    def _set_view(self, steps: int, peak: int) -> None:
        """Fixed ranges: the axes re-layout only when the scenario or the peak changes."""
        if (steps, peak) == self._view:
            return
        self._view = (steps, peak)
        spacing = max(1, round(steps / 10))  # whole steps only
        for plot in (self.blocks_plot, self.util_plot):
            plot.setXRange(0, steps + 0.5, padding=0)
            plot.getAxis("bottom").setTickSpacing(spacing, spacing)
        self.blocks_plot.setYRange(0, np.log10(peak * 1.6), padding=0)  # from 1 block

        # Powers of ten labelled; 2 and 5 times them as a second level, which pyqtgraph
        # labels only where there is room (a log axis's own minor ticks crowd a short plot).
        def marks(multiples):
            return [(np.log10(m * 10**e), f"{m * 10**e:,}") for e in range(8) for m in multiples
                    if m * 10**e <= peak * 1.6]  # fmt: skip

        self.blocks_plot.getAxis("left").setTicks([marks((1,)), marks((2, 5))])
        self.util_plot.setYRange(0, 105, padding=0)

    def _show_summary(self, frame: Frame) -> None:
        m = frame.metrics
        if m is None:
            v1 = frame.config.scheduler == "v1"  # block 0 is the null block from the start
            null = " (block 0 is the null block)" if v1 else ""
            self.summary.setText(f"{frame.config.num_blocks - v1} blocks free{null} · nothing allocated yet")
            return
        saving = f", {m.contiguous_blocks / m.used_blocks:.1f}× what paging uses" if m.used_blocks else ""
        if m.contiguous_blocks > m.total_blocks:
            saving += (
                f" — <span style='color:{self.theme.bad}'>more than the pool's {m.total_blocks}: impossible</span>"
            )
        prefix = ""
        if frame.config.prefix_caching:
            prefix = (
                f" · prefix cache: {m.prefix_hit_blocks}/{m.prefix_lookup_blocks} blocks hit "
                f"({m.prefix_hit_rate:.0%}), {m.cached_free_blocks} cached while free"
            )
        if frame.queues is not None:
            q, c = frame.queues, frame.scheduler_counts
            prefix += (
                f"<br>scheduler · running {_names(q['running'])} · waiting {_names(q['waiting'])}"
                f" · swapped {_names(q['swapped'])} · {plural(c['preemptions'], 'preemption')} · "
                f"{c['finished']} finished · {c['rejected']} rejected"
            )
        null = " (one the null block)" if frame.config.scheduler == "v1" else ""
        if not m.slots_allocated:
            self.summary.setText(
                f"<b>{m.used_blocks}</b>/{m.total_blocks} blocks used{null} · nothing allocated to a sequence{prefix}"
            )
            return
        self.summary.setText(
            f"<b>{m.used_blocks}</b>/{m.total_blocks} blocks used{null} · {m.free_blocks} free · "
            f"{m.shared_blocks} shared · utilisation {m.utilisation:.1%} · "
            f"internal fragmentation {m.internal_fragmentation} slots · contiguous (each sequence reserving "
            f"max_model_len, {frame.config.max_model_len} tokens) would hold {m.contiguous_blocks} blocks"
            f"{saving}{prefix}"
        )


def _names(queue) -> str:
    """A queue's requests for the summary line: the first few, then how many more."""
    if not queue:
        return "—"
    shown = ", ".join(queue[:QUEUE_NAMES_SHOWN])
    return shown if len(queue) <= QUEUE_NAMES_SHOWN else f"{shown} … (+{len(queue) - QUEUE_NAMES_SHOWN})"


WASTE_COLOURS = {
    "token_states": "#009E73",
    "reservation": "#56B4E9",
    "internal_fragmentation": "#E69F00",
    "external_fragmentation": "#D55E00",
    "free": "#999999",
}


WASTE_PROMPT = "Run a workload to see where each allocator's KV memory goes (the vLLM paper's Fig. 2)."
# The study's own pool and lengths, as `pagesim waste` has them: a served model's, not the
# scenario's teaching-sized pool (on a toy pool only one request fits at a time).
WASTE_BLOCK_SIZE = 16
WASTE_MAX_LEN = 2048


class WastePanel(QWidget):
    """Where KV memory goes under load: paging against contiguous reservations, stacked."""

    def __init__(self, theme: Theme, request_waste, parent=None) -> None:
        super().__init__(parent)
        self.request_waste = request_waste
        self.workload = QComboBox()
        self.workload.addItems(list(DISTRIBUTIONS))
        self.workload.setToolTip("Length distribution of the seeded workload (see core/studies/workload.py)")
        self.count = QSpinBox()
        self.count.setRange(50, 5000)
        self.count.setSingleStep(50)
        self.count.setValue(500)
        self.count.setSuffix(" requests")
        self.count.setToolTip("Requests in the workload (seeded: the same ones every run), all arriving at once")
        self.pool_kind = QComboBox()
        self.pool_kind.addItem("model on GPU", "preset")
        self.pool_kind.addItem("blocks", "blocks")
        self.pool_kind.setToolTip(
            "The pool the study replays on: what a model leaves of a GPU's memory after its weights (vLLM's "
            f"share, 0.9), or a number of blocks of {WASTE_BLOCK_SIZE} tokens; not the scenario's small pool"
        )
        self.model_box = model_shape_box("llama-13b", "The model whose weights and K/V bytes size the pool")
        self.gpu_box = gpu_box("a100-40gb", "The GPU whose memory, less the weights, is the pool")
        self.blocks = QSpinBox()
        self.blocks.setRange(-(-WASTE_MAX_LEN // WASTE_BLOCK_SIZE), 10_000_000)  # one max-length request fits
        self.blocks.setValue(2048)
        self.blocks.setSuffix(f" blocks of {WASTE_BLOCK_SIZE}")
        self.blocks.setToolTip(
            f"The pool in blocks of {WASTE_BLOCK_SIZE} tokens (at least one {WASTE_MAX_LEN}-token request fits)"
        )
        self.pool_kind.currentIndexChanged.connect(lambda _: self._show_pool_controls())
        self.run_button = QPushButton("Compare allocators")
        self.run_button.setToolTip(
            "Replay the workload on the chosen pool through paged blocks and through Orca's "
            f"contiguous reservations (exact, next power of two, max length {WASTE_MAX_LEN}), and split the memory"
        )
        self.run_button.clicked.connect(self.run)
        self.summary = QLabel(WASTE_PROMPT)
        self.summary.setTextFormat(Qt.TextFormat.PlainText)  # (a refusal's words, as they are)
        self.summary.setWordWrap(True)
        controls = QHBoxLayout()
        for widget in (
            QLabel("workload"), self.workload, self.count, QLabel("pool"), self.pool_kind, self.model_box, self.gpu_box,
            self.blocks, self.run_button,
        ):  # fmt: skip
            controls.addWidget(widget)
        controls.addStretch(1)
        self.plots = pg.GraphicsLayoutWidget()
        self.plots.setMinimumHeight(150)
        self.plot = add_plot(self.plots, 0, 0)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setMenuEnabled(False)
        self.bars: list[pg.BarGraphItem] = []
        self.result = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(controls)
        layout.addWidget(self.summary)
        layout.addWidget(self.plots, 1)
        self._show_pool_controls()
        self.set_theme(theme)

    def _show_pool_controls(self) -> None:
        preset = self.pool_kind.currentData() == "preset"
        self.model_box.setVisible(preset)
        self.gpu_box.setVisible(preset)
        self.blocks.setVisible(not preset)

    def pool_choice(self) -> dict:
        """The pool as ``compute_waste`` takes it: a model shape on a GPU, or a block count."""
        sizes = {"block_size": WASTE_BLOCK_SIZE, "max_len": WASTE_MAX_LEN}
        if self.pool_kind.currentData() == "preset":
            return {"model_shape": self.model_box.currentData(), "gpu": self.gpu_box.currentData()} | sizes
        return {"model_shape": None, "gpu": None, "blocks": self.blocks.value()} | sizes

    def run(self) -> None:
        """Replay the chosen workload; the last study's chart goes at once (a refusal would
        otherwise leave it under the new settings, read as theirs)."""
        self.clear()
        self.summary.setText(
            f"Comparing allocators on {self.count.value()} {self.workload.currentText()}-like requests…"
        )
        self.request_waste(self.workload.currentText(), self.count.value(), **self.pool_choice())

    def show_failure(self, message: str) -> None:
        self.clear()
        self.summary.setStyleSheet(f"color: {self.theme.bad}")
        self.summary.setText(f"✗ could not compare the allocators: {message}")

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.plots.setBackground(theme.plot_background)
        keys = " · ".join(_key(WASTE_COLOURS[c], "■ " + WASTE_LABELS[c]) for c in WASTE_COLOURS)
        _style_plot(self.plot, theme, f"KV pool under load: {keys}", "% of the pool", "", grid=False)

    def clear(self) -> None:
        """Forget the last study: it was of another scenario's pool."""
        self.result = None
        for bar in self.bars:
            self.plot.removeItem(bar)
        self.bars = []
        self.plot.getAxis("bottom").setTicks(None)
        self.summary.setStyleSheet("")
        self.summary.setText(WASTE_PROMPT)

    def show_result(self, result: WasteStudy) -> None:
        self.clear()
        self.result = result
        rows = result.allocators
        x = np.arange(len(rows))
        bottom = np.zeros(len(rows))
        for category, colour in WASTE_COLOURS.items():
            height = np.array([100 * r.shares[category] for r in rows])
            bar = pg.BarGraphItem(x=x, height=height, y0=bottom, width=0.6, brush=colour, pen=None)
            self.plot.addItem(bar)
            self.bars.append(bar)
            bottom = bottom + height
        self.plot.getAxis("bottom").setTicks([[(i, r.allocator) for i, r in enumerate(rows)]])
        self.plot.setYRange(0, 100, padding=0.02)
        self.plot.setXRange(-0.6, len(rows) - 0.4, padding=0)
        tokens = ", ".join(f"{r.allocator} {r.shares['token_states']:.0%}" for r in rows)
        self.summary.setText(
            f"Pool: {result.pool}. {result.count} {result.distribution}-like requests (max length {WASTE_MAX_LEN}): "
            f"share of the pool holding token states — {tokens}. Peak batch: "
            + ", ".join(f"{r.allocator} {r.peak_batch}" for r in rows)
        )
