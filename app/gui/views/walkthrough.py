"""The kernel walk-through: one (sequence, head) of the current step, stage by stage —
which physical block the kernel reads when, the scores, the running max and the rescales,
which warp and thread group takes which token, and v2's partitions."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from pagesim.app.gui.controller import LIVE_TIMERS
from pagesim.app.gui.palette import Theme
from pagesim.app.gui.views.layer_box import LayerBox
from pagesim.app.gui.views.plots import (
    BLOCK_COLOURS,
    DENSE_COLOUR,
    KERNEL_COLOUR,
    Plot,
    _key,
    _style_plot,
    readable_keys,
    set_side_label,
    vertical_scroll,
)
from pagesim.core.view_model import Frame
from pagesim.core.walkthrough import KERNEL_CHOICES, WalkThrough
from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDockWidget,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QSlider,
    QSpinBox,
    QStyle,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

PARTITION_CHOICES = (8, 16, 32, 64, 128, 256, 512)
# px: title, axis and a plot area a few dots tall can still be read in (below this, they scroll)
SCORE_PLOT_MIN_HEIGHT, LANE_PLOT_MIN_HEIGHT = 130, 100
MAX_RESCALE_LABELS = 8  # the newest rescales get their factor written; older ones keep a marker
REAL_PARTITION = 512
PLAY_MS = 40


# The scores plot's title, longest first: the first that fits a narrow dock is shown.
WALK_TITLES = (
    "Scores · running max m (red, ▲ rescale) · sum ℓ (right)",
    "Scores · max m (red, ▲ rescale) · ℓ (right)",
    "Scores · max m · ℓ (right)",
)


class WalkThroughPanel(QWidget):
    """Asks for a replay (``traceRequested``: kernel, head, partition size) and draws it."""

    traceRequested = Signal(str, int, int)
    lookupShown = Signal(str, int, int, int)  # seq, logical block, physical block, slot (-1: none)

    def __init__(self, theme: Theme, parent=None) -> None:
        super().__init__(parent)
        self.theme = theme
        self.walk: WalkThrough | None = None
        self.stage = 0
        self.kernel_box = QComboBox()
        for key, label in KERNEL_CHOICES.items():
            self.kernel_box.addItem(label.split(":")[0], key)  # short in the box, the whole name as its tip
            self.kernel_box.setItemData(self.kernel_box.count() - 1, label, Qt.ItemDataRole.ToolTipRole)
        self.kernel_box.setToolTip(
            "Which kernel's algorithm to replay: the CPU kernel folds a tile of whole blocks "
            "(at least 4 blocks and 32 tokens) at a time, a long sequence split into partitions; "
            "the CUDA kernel splits the tokens over 4 warps × thread groups (v1), "
            "and over 512-token partitions with a reduce (v2, split-K)"
        )
        self.head_box = QSpinBox()
        self.head_box.setPrefix("head ")
        self.head_box.setToolTip("The query head to follow")
        self.layer_box = LayerBox()  # a real model's layer, whose own K/V the replay reads
        self.layer_box.currentIndexChanged.connect(self._ask)
        self.partition_box = QComboBox()
        for size in PARTITION_CHOICES:
            label = f"{size}" + (" (real)" if size == REAL_PARTITION else " (teaching)")
            self.partition_box.addItem(label, size)
        self.partition_box.setCurrentIndex(PARTITION_CHOICES.index(REAL_PARTITION))
        self.partition_box.setToolTip(
            "v2's partition size. The real kernel uses 512; a smaller teaching size shows the partitions on "
            "short contexts"
        )
        for box in (self.kernel_box, self.partition_box):
            box.currentIndexChanged.connect(self._ask)
        self.partition_label = QLabel("v2 partition:")
        self.kernel_box.currentIndexChanged.connect(lambda _: self._show_kernel_controls())
        self.head_box.valueChanged.connect(self._ask)
        self.buttons = {}
        controls = QHBoxLayout()
        icons = QStyle.StandardPixmap
        for key, icon, tip in (
            ("start", icons.SP_MediaSkipBackward, "First stage"),
            ("back", icons.SP_MediaSeekBackward, "Previous stage"),
            ("play", icons.SP_MediaPlay, "Play the stages (again: pause)"),
            ("next", icons.SP_MediaSeekForward, "Next stage"),
            ("end", icons.SP_MediaSkipForward, "Last stage: the output"),
        ):
            button = QPushButton()
            button.setIcon(self.style().standardIcon(icon))
            button.setToolTip(tip)
            button.setFixedWidth(36)
            button.clicked.connect(lambda _=False, k=key: self._control(k))
            self.buttons[key] = button
            controls.addWidget(button)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setToolTip("Scrub through the stages; the scenario's timeline is separate")
        self.slider.valueChanged.connect(self.show_stage)
        controls.addWidget(self.slider, 1)
        self.stage_label = QLabel("open a step with attention to walk through its kernel")
        self.stage_label.setWordWrap(True)
        self.lookups = QLabel()
        self.lookups.setWordWrap(True)
        for label in (self.stage_label, self.lookups):  # long text must not widen the dock
            label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.lookups.setToolTip("The block table walked in the kernel's order: logical block → physical block")
        self.score_plot = pg.PlotWidget(plotItem=Plot())
        self.lane_plot = pg.PlotWidget(plotItem=Plot())
        self.scores = pg.ScatterPlotItem(size=5, pen=None)
        self.seen = pg.ScatterPlotItem(size=6, pen=None)
        self.running_max = pg.PlotDataItem(stepMode=None)
        self.current = pg.ScatterPlotItem(size=14, pen=pg.mkPen("w", width=2), brush=None)
        for item in (self.scores, self.seen, self.running_max, self.current):
            self.score_plot.addItem(item)
        # Where a new maximum arrived: the state so far was rescaled by exp(m_old − m_new).
        self.rescales = pg.ScatterPlotItem(symbol="t1", size=11, pen=None)
        self.score_plot.addItem(self.rescales)
        self.rescale_labels = [pg.TextItem(anchor=(0.5, 1.2)) for _ in range(MAX_RESCALE_LABELS)]
        for label in self.rescale_labels:
            self.score_plot.addItem(label)
        # The running sum ℓ on its own axis (right): it grows with the context, the scores do not.
        plot = self.score_plot.getPlotItem()
        self.sum_box = pg.ViewBox()
        plot.showAxis("right")
        plot.scene().addItem(self.sum_box)
        plot.getAxis("right").linkToView(self.sum_box)
        self.sum_box.setXLink(plot)
        plot.getViewBox().sigResized.connect(lambda: self.sum_box.setGeometry(plot.getViewBox().sceneBoundingRect()))
        self.running_sum = pg.PlotDataItem()
        self.sum_box.addItem(self.running_sum)
        self.lanes = pg.ScatterPlotItem(size=5, pen=None)
        self.lane_now = pg.ScatterPlotItem(size=14, pen=pg.mkPen("w", width=2), brush=None)
        self.lane_plot.addItem(self.lanes)
        self.lane_plot.addItem(self.lane_now)
        # The last stage: the replay's output beside the kernel's and dense attention's.
        self.out_trace = pg.PlotDataItem()
        self.out_kernel = pg.ScatterPlotItem(symbol="x", size=9, pen=None)
        self.out_dense = pg.ScatterPlotItem(symbol="o", size=7, brush=None)
        for item in (self.out_trace, self.out_kernel, self.out_dense):
            self.lane_plot.addItem(item)
        # Merge stages: the tree the per-lane states fold through (done, the current one, nodes).
        self.tree_done = pg.PlotDataItem(connect="pairs")
        self.tree_now = pg.PlotDataItem(connect="pairs")
        self.tree_nodes = pg.ScatterPlotItem(size=7, pen=None)
        for item in (self.tree_done, self.tree_now, self.tree_nodes):
            self.lane_plot.addItem(item)
        self.bands: list = []
        self.timer = QTimer(self)
        self.timer.setObjectName("pagesim-walkthrough")
        LIVE_TIMERS.add(self.timer)
        self.timer.timeout.connect(lambda: self._control("next"))
        top = QHBoxLayout()
        for widget in (self.kernel_box, self.layer_box, self.head_box):
            top.addWidget(widget)
        top.addStretch(1)
        # v2's partition size on a line of its own (shown for v2 only): beside the kernel,
        # layer and head menus, a narrow dock cut every one of them short.
        partition = QHBoxLayout()
        partition.addWidget(self.partition_label)
        partition.addWidget(self.partition_box)
        partition.addStretch(1)
        self.kernel_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addLayout(partition)
        layout.addLayout(controls)
        layout.addWidget(self.stage_label)
        layout.addWidget(self.lookups)
        self.score_plot.setMinimumHeight(SCORE_PLOT_MIN_HEIGHT)
        self.score_plot.setToolTip(
            "Dots: each token's score q·k·scale (lit once read). Red: the running max m. ▲: a new maximum arrived, "
            "so everything summed so far was rescaled by exp(m_old − m_new) (the factor is written by the newest). "
            "Right axis: the running sum ℓ of exp(score − m)."
        )
        self.lane_plot.setMinimumHeight(LANE_PLOT_MIN_HEIGHT)
        # The two plots need room to be read: in a short dock they scroll (as the Check tab's
        # do) rather than squash to a sliver each or make the dock too tall for a 700-px
        # window; the controls and the stage's text stay put. (The word-wrapped text stays
        # outside: inside, the scroll area would size the plots by their preferred heights.)
        plots = QWidget()
        plots_layout = QVBoxLayout(plots)
        plots_layout.setContentsMargins(0, 0, 0, 0)
        plots_layout.addWidget(self.score_plot, 3)
        plots_layout.addWidget(self.lane_plot, 2)
        self.plots_scroll = vertical_scroll(plots)
        layout.addWidget(self.plots_scroll, 1)
        self._show_kernel_controls()
        self.set_theme(theme)

    def _show_kernel_controls(self) -> None:
        """Only v2 splits the context into partitions: the size menu is hidden for the others."""
        v2 = self.kernel == "cuda-v2"
        self.partition_label.setVisible(v2)
        self.partition_box.setVisible(v2)

    # -- requests -------------------------------------------------------------------
    @property
    def kernel(self) -> str:
        return self.kernel_box.currentData()

    def _ask(self) -> None:
        self.traceRequested.emit(self.kernel, self.head_box.value(), int(self.partition_box.currentData()))

    def set_heads(self, num_heads: int) -> None:
        self.head_box.setRange(0, max(0, num_heads - 1))

    def set_default_kernel(self, backend: str) -> None:
        """Start on the kernel this machine runs."""
        if backend == "cuda" and self.kernel == "cpu":
            self.kernel_box.setCurrentIndex(1)

    # -- drawing ---------------------------------------------------------------------
    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        for plot in (self.score_plot, self.lane_plot):
            plot.setBackground(theme.plot_background)
        _style_plot(self.score_plot.getPlotItem(), theme, WALK_TITLES[0], "q·k·scale", "token")
        self.score_plot.getPlotItem().set_fitting_title(WALK_TITLES, color=theme.text, size="9pt")
        right = self.score_plot.getPlotItem().getAxis("right")
        set_side_label(self.score_plot.getPlotItem(), "right", "ℓ (running sum)", KERNEL_COLOUR)
        right.setTextPen(theme.muted)
        right.setPen(theme.muted)
        _style_plot(self.lane_plot.getPlotItem(), theme, "Who reads each token", "lane", "token")
        self.running_max.setPen(pg.mkPen(theme.bad, width=2))
        if self.walk is not None:
            self.show_walk(self.walk)

    def show_walk(self, walk: WalkThrough | None) -> None:
        self.timer.stop()
        self.walk = walk
        for band in self.bands:
            self.score_plot.removeItem(band)
        self.bands = []
        if walk is None:
            self.stage_label.setText("this step ran no attention for the selected sequence")
            for item in (self.scores, self.seen, self.current, self.lanes, self.lane_now, self.rescales):
                item.setData([], [])
            self.running_max.setData([], [])
            self.running_sum.setData([], [])
            for label in self.rescale_labels:
                label.setVisible(False)
            self.slider.setRange(0, 0)
            return
        trace = walk.trace
        n = trace.context_len
        tokens = np.arange(n)
        self.scores.setData(tokens, trace.scores, brush=pg.mkBrush(self.theme.muted))
        lanes, brushes = self._lanes(walk)
        self.lanes.setData(tokens, lanes, brush=brushes)
        lane_axis = "lane (warp, group)" if trace.geometry is not None else "tile (CPU fold)"
        set_side_label(self.lane_plot.getPlotItem(), "left", lane_axis, self.theme.muted)
        for part in trace.partitions:
            band = pg.LinearRegionItem((part.begin - 0.5, part.end - 0.5), movable=False)
            band.setBrush(pg.mkBrush(BLOCK_COLOURS[part.index % len(BLOCK_COLOURS)] + "30"))
            band.setToolTip(f"partition {part.index}: m = {part.max_logit:+.3f}, ℓ = {part.exp_sum:.3f}")
            self.score_plot.addItem(band)
            self.bands.append(band)
        self.slider.blockSignals(True)
        self.slider.setRange(0, walk.num_stages - 1)
        self.slider.blockSignals(False)
        self.show_stage(min(self.stage, walk.num_stages - 1))

    def _lanes(self, walk: WalkThrough):
        trace = walk.trace
        lanes = np.zeros(trace.context_len)
        colours = np.zeros(trace.context_len, np.int64)
        tile_of = {}  # the CPU fold: logical block -> its tile (a lane per tile of whole blocks)
        for index, fold in enumerate(trace.block_folds):
            tile_of.update(dict.fromkeys(range(fold["logical"], fold["logical_end"]), index))
        for step in trace.steps:
            if step.lane is None:  # two shades alternating, tile after tile
                tile = tile_of[step.logical_block]
                lanes[step.token], colours[step.token] = tile, tile % 2
            else:
                warp, group, _ = step.lane
                lanes[step.token] = warp * trace.geometry.tokens_per_warp + group
                colours[step.token] = warp
        if trace.geometry is None:  # blocks are not owners: neutral shades, never an owner's colour
            palette = [pg.mkBrush(self.theme.text), pg.mkBrush(self.theme.muted)]
        else:  # the four warps
            palette = [pg.mkBrush(c) for c in BLOCK_COLOURS[:4]]
        return lanes, [palette[c % len(palette)] for c in colours.tolist()]

    def show_stage(self, stage: int) -> None:
        walk = self.walk
        if walk is None:
            return
        stage = max(0, min(stage, walk.num_stages - 1))
        self.stage = stage
        if self.slider.value() != stage:
            self.slider.blockSignals(True)
            self.slider.setValue(stage)
            self.slider.blockSignals(False)
        steps = walk.trace.steps[: min(stage + 1, len(walk.trace.steps))]
        visited = np.array([s.token for s in steps], np.int64)
        self.seen.setData(visited, walk.trace.scores[visited], brush=pg.mkBrush(self.theme.highlight))
        maxes = np.array([s.m_after for s in steps])
        order = np.argsort(visited, kind="stable")
        if walk.trace.geometry is None:  # one running max, growing along the context
            self.running_max.setData(visited[order], maxes[order], pen=pg.mkPen(self.theme.bad, width=2), symbol=None)
        else:  # each thread group keeps its own: its m after each of its tokens
            self.running_max.setData(
                visited[order], maxes[order], pen=None, symbol="t1", symbolSize=6,
                symbolBrush=pg.mkBrush(self.theme.bad), symbolPen=None,
            )  # fmt: skip
        self._show_sum_and_rescales(walk, steps, visited[order])
        token = walk.stage_token[stage]
        if token >= 0:
            step = walk.trace.steps[stage]
            self.lookupShown.emit(walk.seq_id, step.logical_block, step.physical_block, step.slot)
        else:
            self.lookupShown.emit(walk.seq_id, -1, -1, -1)
        if token >= 0:
            self.current.setData([token], [walk.trace.scores[token]])
            self.lane_now.setData([token], [self.lanes.data["y"][token]])
        else:
            self.current.setData([], [])
            self.lane_now.setData([], [])
        merge = stage - len(walk.trace.steps)
        merging = 0 <= merge < len(walk.trace.merges)
        self._show_output(stage == walk.num_stages - 1, merging)
        if merging:
            self._show_tree(merge)
        self.stage_label.setText(f"stage {stage + 1} / {walk.num_stages} · {walk.stage_text(stage)}")
        self.lookups.setText(self._lookup_text(walk, token))

    def _show_sum_and_rescales(self, walk: WalkThrough, steps, tokens_in_order) -> None:
        """ℓ after each token read so far, and a marker (with its factor, for the newest few)
        wherever a new maximum made the kernel rescale what it had summed."""
        theme = self.theme
        by_token = sorted(steps, key=lambda s: s.token)
        sums = np.array([s.l_after for s in by_token])
        if walk.trace.geometry is None:
            self.running_sum.setData(tokens_in_order, sums, pen=pg.mkPen(KERNEL_COLOUR, width=1.5), symbol=None)
        else:  # each thread group sums its own tokens
            self.running_sum.setData(
                tokens_in_order, sums, pen=None, symbol="o", symbolSize=3,
                symbolBrush=pg.mkBrush(KERNEL_COLOUR), symbolPen=None,
            )  # fmt: skip
        rescaled = [s for s in by_token if s.correction < 1.0 and np.isfinite(s.m_before)]
        if walk.trace.geometry is not None and steps:  # CUDA: each thread group rescales its own state
            lane = steps[-1].lane[:2]
            rescaled = [s for s in rescaled if s.lane[:2] == lane]
        self.rescales.setData([s.token for s in rescaled], [s.m_after for s in rescaled], brush=pg.mkBrush(theme.bad))
        # Label the newest rescales, no two closer than 4 % of the context (they would overlap).
        spacing = 0.04 * max(1, walk.trace.context_len)
        newest = []
        for step in sorted(rescaled, key=lambda s: s.token, reverse=True):
            if len(newest) == MAX_RESCALE_LABELS:
                break
            if all(abs(step.token - kept.token) >= spacing for kept in newest):
                newest.append(step)
        for label, step in zip(self.rescale_labels, newest + [None] * MAX_RESCALE_LABELS, strict=False):
            if step is None:
                label.setVisible(False)
                continue
            label.setText(f"×{step.correction:.2f}", color=theme.bad)
            label.setPos(step.token, step.m_after)
            label.setVisible(True)

    def _show_output(self, last: bool, merging: bool = False) -> None:
        """The lane picture, the merge tree at a merge stage, or at the last stage the three
        outputs over the head's dimensions."""
        walk, plot = self.walk, self.lane_plot.getPlotItem()
        for item in (self.lanes, self.lane_now):
            item.setVisible(not last and not merging)
        for item in (self.tree_done, self.tree_now, self.tree_nodes):
            item.setVisible(merging)
        for item in (self.out_trace, self.out_kernel, self.out_dense):
            item.setVisible(last)
        plot.getAxis("bottom").setTicks(None)  # the tree sets its own
        self.lane_plot.setVisible(True)
        # The merge tree and the outputs need the height; the scores are the token stages' picture.
        self.score_plot.setVisible(not (merging or last))
        if merging:
            return
        if last:
            dims = np.arange(len(walk.kernel_output))
            self.out_trace.setData(dims, walk.trace.output, pen=pg.mkPen(KERNEL_COLOUR, width=2))
            self.out_kernel.setData(dims, walk.kernel_output, pen=pg.mkPen(self.theme.text))
            self.out_dense.setData(dims, walk.dense_output, pen=pg.mkPen(DENSE_COLOUR, width=1.5))
            key = f"{_key(KERNEL_COLOUR, '— replay')} · × kernel · {_key(DENSE_COLOUR, '○ dense')}"
            _style_plot(plot, self.theme, key, "value", "dimension")
            # (a narrow dock keeps the key whole: the stage's line above says the error too)
            titles = tuple(
                readable_keys(title, self.theme.plot_background)
                for title in (f"{key} (|replay − kernel| {walk.trace_error:.1e})", key)
            )
            plot.set_fitting_title(titles, color=self.theme.text, size="9pt")
        else:
            # The CPU kernel folds whole tiles (≥ 4 blocks, ≥ 32 tokens): a short context is one tile, and
            # a plot of every token in tile 0 says nothing. It shows from two tiles on.
            self.lane_plot.setVisible(walk.trace.geometry is not None or len(walk.trace.block_folds) > 1)
            axis = "lane (warp, group)" if walk.trace.geometry is not None else "tile (CPU fold)"
            _style_plot(plot, self.theme, "Who reads each token", axis, "token")
            # Lanes and tiles are whole numbers: integer ticks, and room around a single one.
            plot.enableAutoRange()
            top = max(1, int(self.lanes.data["y"].max()) if len(self.lanes.data) else 1)
            plot.getAxis("left").setTickSpacing(max(1, round(top / 4)), 1)
            plot.setYRange(-0.5, top + 0.5, padding=0)
            return
        plot.getAxis("left").setTickSpacing()
        plot.enableAutoRange()

    def _show_tree(self, current: int) -> None:
        """The merge the stage is at, in its tree, left to right: a warp's thread groups
        exchanging states by xor shuffles (a butterfly per mask), the warps meeting in
        shared memory, or v2's partitions meeting in the reduce. Done merges faint, this one
        bold."""
        walk, theme = self.walk, self.theme
        merges = walk.trace.merges
        now = merges[current]
        if now.stage == "group":
            ours = [
                (i, m) for i, m in enumerate(merges)
                if m.stage == "group" and m.partition == now.partition and m.warp == now.warp
            ]  # fmt: skip
            masks = sorted({m.mask for _, m in ours})
            level_of = {mask: k + 1 for k, mask in enumerate(masks)}
            groups = walk.trace.geometry.tokens_per_warp
            seg_of = {}
            for i, m in ours:
                x, a, b = level_of[m.mask], m.into, m.other
                seg_of[i] = [((x - 1, a), (x, a)), ((x - 1, b), (x, a)), ((x - 1, a), (x, b)), ((x - 1, b), (x, b))]
            nodes = [(x, y) for x in range(len(masks) + 1) for y in range(groups)]
            x_label = f"shuffle round (xor masks {', '.join(map(str, masks))})"
            y_label = f"thread group of warp {now.warp}"
        else:
            stage = now.stage
            ours = [
                (i, m)
                for i, m in enumerate(merges)
                if m.stage == stage and (stage == "reduce" or m.partition == now.partition)
            ]
            centre = (len(ours) - 1) / 2
            seg_of = {i: [((0, m.other), (1, centre))] for i, m in ours}
            nodes = [(0, m.other) for _, m in ours] + [(1, centre)]
            if stage == "warp":
                x_label, y_label = "warps → shared memory", "warp"
            else:
                x_label, y_label = "partitions → reduce", "partition"
        done = [seg for i, _ in ours if i < current for seg in seg_of[i]]

        def pairs(segments):
            xs = [p[0] for seg in segments for p in seg]
            ys = [p[1] for seg in segments for p in seg]
            return np.array(xs, float), np.array(ys, float)

        self.tree_done.setData(*pairs(done), pen=pg.mkPen(theme.muted, width=1.5))
        self.tree_now.setData(*pairs(seg_of[current]), pen=pg.mkPen(theme.highlight, width=3))
        xs, ys = zip(*nodes, strict=True)
        self.tree_nodes.setData(list(xs), list(ys), brush=pg.mkBrush(theme.text))
        title = f"Merge {current + 1} of {len(merges)} ({now.stage}): m = {now.m:+.3f}, ℓ = {now.l:.3f}"
        plot = self.lane_plot.getPlotItem()
        _style_plot(plot, theme, title, y_label, x_label)
        levels = int(max(x for x, _ in nodes))
        plot.getAxis("bottom").setTicks([[(i, str(i)) for i in range(levels + 1)]])
        plot.enableAutoRange()

    def _lookup_text(self, walk: WalkThrough, token: int) -> str:
        current = None  # a merge or the output reads no block: nothing to underline
        if token >= 0:
            current = next((s.logical_block for s in walk.trace.steps if s.token == token), None)
        lookups = walk.trace.lookups
        centre = current if current is not None else 0
        lo = max(0, centre - 3)
        hi = min(len(lookups), lo + 7)
        parts = []
        for logical, physical in lookups[lo:hi]:
            text = f"L{logical}→#{physical}"
            parts.append(f"<b><u>{text}</u></b>" if logical == current else text)
        before = f"… {lo} · " if lo else ""
        after = f" · … {len(lookups) - hi} more" if hi < len(lookups) else ""
        return f"block table ({len(lookups)} entries): " + before + " · ".join(parts) + after

    def _control(self, key: str) -> None:
        if self.walk is None:
            return
        last = self.walk.num_stages - 1
        if key == "play":
            if self.timer.isActive():
                self.timer.stop()
            else:
                self.timer.start(PLAY_MS)
            return
        target = {"start": 0, "back": self.stage - 1, "next": self.stage + 1, "end": last}[key]
        if key == "next" and target > last:
            self.timer.stop()
            return
        self.show_stage(max(0, min(last, target)))


class WalkThroughTab(QObject):
    """Whether the walk-through shows, and its replay asked of the worker only then. A tabbed
    dock's page stays "visible" behind another tab: the dock's visibility and the current tab
    together say whether it shows. Hidden, it puts out the lookup it lit."""

    def __init__(self, panel: WalkThroughPanel, tabs: QTabWidget, dock: QDockWidget, selection) -> None:
        super().__init__(panel)
        self.panel, self.tabs, self.dock = panel, tabs, dock
        self._selection = selection
        self._controller = None
        self.open = False
        self._dock_shown = False
        self._frame: Frame | None = None
        tabs.currentChanged.connect(lambda _: self._shown(self._dock_shown))
        dock.visibilityChanged.connect(self._dock_visibility)
        panel.traceRequested.connect(lambda *_: self.request_trace())

    def bind(self, controller) -> None:
        """Follow the controller's frames (``selection`` reconciled with each first); replays
        are asked of it and drawn when they come back."""
        self._controller = controller
        controller.traceReady.connect(self.panel.show_walk)
        controller.backendReady.connect(lambda name, _: self.panel.set_default_kernel(name))
        controller.frameChanged.connect(self._on_frame)
        controller.loaded.connect(lambda _: self._on_loaded())

    def _on_loaded(self) -> None:
        """Another scenario: its walk starts at the first stage, on its worst layer (the layer
        and stage chosen on the one before meant nothing to it)."""
        self.panel.stage = 0
        box = self.panel.layer_box
        if box.currentIndex() > 0:
            box.blockSignals(True)
            box.setCurrentIndex(0)
            box.blockSignals(False)

    def _on_frame(self, frame: Frame) -> None:
        self._frame = frame
        self.panel.set_heads(frame.config.num_heads)
        self.panel.layer_box.set_layers(frame.num_layers, frame.worst_layer)
        self.request_trace()

    def _dock_visibility(self, shown: bool) -> None:
        self._dock_shown = shown
        self._shown(shown)

    def show(self) -> None:
        """Bring the walk-through to the front."""
        if not self._dock_shown:
            self.dock.show()
            self.dock.raise_()
        self.tabs.setCurrentWidget(self.panel)
        self._shown(True)

    def _shown(self, dock_shown: bool) -> None:
        shown = dock_shown and self.tabs.currentWidget() is self.panel
        if shown == self.open:
            return
        self.open = shown
        if shown:
            self.request_trace()
        else:
            self.panel.lookupShown.emit("", -1, -1, -1)

    def request_trace(self) -> None:
        """Replay the kernel for the selected sequence, only while the walk-through shows."""
        frame = self._frame
        if not self.open or frame is None or frame.attention is None or self._controller is None:
            return
        seq = self._selection.current
        if seq is None or seq not in frame.attention.seq_ids:
            self.panel.show_walk(None)
            return
        panel = self.panel
        partition = int(panel.partition_box.currentData())
        self._controller.trace_kernel(seq, panel.head_box.value(), panel.kernel, partition, panel.layer_box.layer())
