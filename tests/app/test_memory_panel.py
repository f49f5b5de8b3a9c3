"""The memory history redraws at most every HISTORY_REDRAW_MS while frames stream in,
always ends on the newest frame, and a frame after a pause is drawn at once."""

import numpy as np
import pytest
from pagesim.app.gui.palette import THEMES
from pagesim.app.gui.views.plots import HISTORY_REDRAW_MS, MemoryPanel
from pagesim.core.scenario import load_scenario
from pagesim.core.timeline import Timeline
from pagesim.core.view_model import build_frame
from pagesim.kernels.cpu_backend import CpuBackend
from PySide6.QtGui import QImage, QPainter

from tests.scenarios import synthetic


def _frames(count: int):
    timeline = Timeline(load_scenario(synthetic("default")), CpuBackend())
    frame = build_frame(timeline, None, None, None)
    out = [frame]
    for _ in range(count):
        frame = build_frame(timeline, None, timeline.forward(), frame)
        out.append(frame)
    return out


def test_a_burst_of_frames_is_drawn_late_but_never_left_behind(qtbot):
    panel = MemoryPanel(next(iter(THEMES.values())))
    qtbot.addWidget(panel)
    drawn = []
    draw = panel._draw_history
    panel._draw_history = lambda frame: (drawn.append(frame.position), draw(frame))
    frames = _frames(6)
    for frame in frames[:-1]:  # back to back, as at full speed
        panel.show_frame(frame)
        assert str(frame.metrics.used_blocks if frame.metrics else frame.config.num_blocks) in panel.summary.text()
    assert drawn == [0]  # the first at once, the rest wait for the redraw interval
    qtbot.waitUntil(lambda: panel.plotted is frames[-2], timeout=5 * HISTORY_REDRAW_MS)
    assert drawn == [0, frames[-2].position]  # one redraw for the whole burst, of the newest frame
    xs, _ = panel.used_curve.getData()
    assert len(xs) == len(frames[-2].history)
    qtbot.wait(HISTORY_REDRAW_MS + 20)
    panel.show_frame(frames[-1])  # after a pause: drawn at once
    assert panel.plotted is frames[-1] and not panel._redraw_timer.isActive()


def test_flush_draws_what_is_pending(qtbot):
    panel = MemoryPanel(next(iter(THEMES.values())))
    qtbot.addWidget(panel)
    first, second = _frames(1)
    panel.show_frame(first)
    panel.show_frame(second)
    assert panel.plotted is first and panel._redraw_timer.isActive()
    panel.flush()
    assert panel.plotted is second and not panel._redraw_timer.isActive()


def test_before_any_frame_the_axes_are_readable_and_no_pool_is_drawn(qtbot):
    """A real model may load for seconds before the first frame: meanwhile the block axis
    shows a few spaced ticks (not a log axis's default range, its labels on one spot) and
    no "pool size" line; the first frame sets both from its pool."""
    panel = MemoryPanel(next(iter(THEMES.values())))
    qtbot.addWidget(panel)
    # (pyqtgraph has no getter for ticks given with setTicks: its attribute is read)
    labels = [text for level in panel.blocks_plot.getAxis("left")._tickLevels for _, text in level]
    assert sorted(labels, key=int) == ["1", "2", "5", "10"]
    assert not panel.pool_line.isVisible()
    assert panel.blocks_plot.viewRange()[1][0] == 0  # from one block up
    frame = _frames(1)[-1]
    panel.show_frame(frame)
    panel.flush()
    pool = frame.config.num_blocks
    peak = max(pool, *(m.contiguous_blocks for m in frame.history))
    assert panel.pool_line.isVisible() and panel.pool_line.value() == pytest.approx(np.log10(pool))
    assert panel.blocks_plot.viewRange()[1][1] == pytest.approx(np.log10(peak * 1.6))
    # Named on the right axis, beside the curves' ends rather than on them.
    (named,) = panel.blocks_plot.getAxis("right")._tickLevels[0]
    assert named == (pytest.approx(np.log10(pool)), f"pool {pool}")


def test_one_step_over_the_pool_is_drawn_from_where_the_line_crosses_it():
    """A contiguous reservation over the pool at one step only (a long prompt's) is still a
    red segment: from where the line crossed the pool, on the plot's log axis, to the step."""
    from pagesim.app.gui.views.plots import over_the_line

    xs, ys = over_the_line([1, 2], [60, 110], 64)
    assert ys[0] != ys[0] and ys[1:] == [64, 110]  # under (NaN), the crossing, the step over
    assert 1 < xs[1] < 2 and np.log(64 / 60) / np.log(110 / 60) == pytest.approx(xs[1] - 1)
    xs, ys = over_the_line([1, 2, 3, 4], [50, 100, 120, 40], 64)  # in, then out again
    assert [y == y for y in ys] == [False, True, True, True, True, False]
    assert ys[1] == ys[4] == 64 and 1 < xs[1] < 2 and 3 < xs[4] < 4
    assert over_the_line([1, 2, 3], [10, 20, 30], 64) == ([1, 2, 3], [pytest.approx(float("nan"), nan_ok=True)] * 3)


def test_the_current_step_is_a_dot_on_each_curve_even_before_there_is_a_line(qtbot):
    """At step 1 a curve is one point, which a line does not draw: the current step's values
    are dots in their curves' colours (a reservation over the pool in the warning colour)."""
    from pagesim.app.gui.views.plots import DENSE_COLOUR, FRAG_COLOUR, KERNEL_COLOUR, UTIL_COLOUR
    from PySide6.QtGui import QColor

    theme = next(iter(THEMES.values()))
    panel = MemoryPanel(theme)
    qtbot.addWidget(panel)
    frames = _frames(3)
    panel.show_frame(frames[1])
    panel.flush()
    m = frames[1].history[-1]
    xs, ys = panel.blocks_now.getData()
    assert list(xs) == [1, 1] and list(ys) == pytest.approx(np.log10([m.used_blocks, m.contiguous_blocks]))
    over = m.contiguous_blocks > frames[1].config.num_blocks
    colours = [brush.color().name().upper() for brush in panel.blocks_now.opts["symbolBrush"]]
    assert colours == [KERNEL_COLOUR, (theme.bad if over else DENSE_COLOUR).upper()]
    xs, ys = panel.util_now.getData()
    assert list(xs) == [1, 1] and ys[0] == pytest.approx(100 * m.utilisation)
    assert panel.util_now.opts["symbolBrush"][0].color().name().upper() == UTIL_COLOUR
    panel.show_frame(frames[3])  # the dots follow the current step
    panel.flush()
    m = frames[3].history[-1]
    assert list(panel.blocks_now.getData()[0]) == [3, 3] and m.contiguous_blocks > frames[3].config.num_blocks
    assert panel.blocks_now.opts["symbolBrush"][1].color().name() == QColor(theme.bad).name()  # over the pool
    fragmentation = 100 * m.internal_fragmentation / m.slots_allocated
    assert list(panel.util_now.getData()[1]) == pytest.approx([100 * m.utilisation, fragmentation])
    assert [b.color().name().upper() for b in panel.util_now.opts["symbolBrush"]] == [UTIL_COLOUR, FRAG_COLOUR]
    other = next(t for t in THEMES.values() if QColor(t.bad).name() != QColor(theme.bad).name())
    panel.set_theme(other)  # the over-the-pool dot in the new theme's red at once
    assert panel.blocks_now.opts["symbolBrush"][1].color().name() == QColor(other.bad).name()
    panel.show_frame(frames[0])  # back to the start: nothing to mark
    panel.flush()
    assert panel.blocks_now.getData()[0] is None or len(panel.blocks_now.getData()[0]) == 0


def test_the_scheduler_line_counts_one_preemption_in_the_singular(qtbot):
    panel = MemoryPanel(next(iter(THEMES.values())))
    qtbot.addWidget(panel)
    timeline = Timeline(load_scenario(synthetic("preemption_recompute")), CpuBackend())
    frame = build_frame(timeline, None, None, None)
    while frame.scheduler_counts is None or frame.scheduler_counts["preemptions"] != 1:
        frame = build_frame(timeline, None, timeline.forward(), frame)
    panel.show_frame(frame)
    assert "· 1 preemption ·" in panel.summary.text()  # (it said "1 preemptions")


def test_the_slots_plot_labels_the_last_step_as_the_blocks_plot_does(qtbot):
    # (its last tick label, reaching past the plot's edge, was dropped: 27 of 30 steps)
    panel = MemoryPanel(next(iter(THEMES.values())))
    qtbot.addWidget(panel)
    panel.resize(1000, 220)
    panel.show()
    timeline = Timeline(load_scenario(synthetic("preemption_swap")), CpuBackend())
    timeline.run_to_end()
    panel.show_frame(build_frame(timeline, None))
    panel.flush()
    qtbot.wait(50)

    def labels(plot) -> list[str]:
        image = QImage(10, 10, QImage.Format.Format_ARGB32)
        painter = QPainter(image)
        try:
            _, _, texts = plot.getAxis("bottom").generateDrawSpecs(painter)
        finally:
            painter.end()
        return [text for _, _, text in texts]

    last = str(timeline.length)
    assert last in labels(panel.blocks_plot) and last in labels(panel.util_plot)
