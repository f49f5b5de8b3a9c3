"""What the last usability review found, and the layout for learners: the token path's tooltip
stays, one colour per request everywhere, a long table draws only its looked-up line (in a
colour that stands out in both themes, its label inside its own tile), the pool's legend, the
Check panel folded to a badge, a narration that grows, controls that apply to the kernel in
use only, and the welcome's primer in three pictures."""

import re

import pytest
from pagesim.app.gui.palette import OKABE_ITO, THEMES, SequenceColours, contrast, readable_on
from pagesim.core.scenario import load_shipped, parse_scenario
from PySide6.QtCore import QEvent, QPoint, QPointF, QRect, QRectF, Qt
from PySide6.QtGui import QColor, QFontMetrics, QHelpEvent, QIcon
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QToolTip

from tests.app.conftest import wait_idle

# One sequence of 12 blocks, one of 3: a long table and a short one.
LONG_AND_SHORT = (
    'name = "long and short"\nnum_blocks = 32\nblock_size = 4\nnum_heads = 1\nhead_dim = 8\n'
    '[[steps]]\nop = "add"\nseq = "long"\ntokens = 48\n'
    '[[steps]]\nop = "add"\nseq = "short"\ntokens = 10\n'
)


# A synthetic tour (no real model to load): two sequences, a fork, a copy-on-write, notes.
TOUR = """
name = "tour"
description = "Two requests arrive and decode; A is forked and its fork writes into a shared block."
num_blocks = 24
block_size = 4
num_heads = 4
num_kv_heads = 2
head_dim = 32
[[steps]]
op = "add"
seq = "A"
tokens = 6
note = "A's 6 prompt tokens need only two blocks, taken from the free queue."
[[steps]]
op = "add"
seq = "B"
tokens = 9
[[steps]]
op = "grow"
seq = "A"
[[steps]]
op = "grow"
seq = "A"
[[steps]]
op = "grow"
seq = "A"
note = "A's 9th token crosses a block boundary: only now does A take a new block."
[[steps]]
op = "fork"
seq = "A"
as = "A2"
[[steps]]
op = "grow"
seq = "A2"
note = "A2 writes into a block it shares. Copy-on-write: it gets its own copy of that one block first."
"""


SCHEDULE_STEP = '[[steps]]\nop = "schedule"\nsteps = 1\n'
# Preemption by swap on the synthetic model: r3 (two samples) is swapped out at step 15.
SWAP = (
    'name = "swap"\npreemption = "swap"\nnum_cpu_blocks = 32\nnum_blocks = 24\nblock_size = 4\n'
    "num_heads = 2\nnum_kv_heads = 2\nhead_dim = 16\nseed = 4\nwatermark = 0.0\n"
    '[[steps]]\nop = "submit"\nrequest = "r1"\ntokens = 18\noutput = 20\n'
    '[[steps]]\nop = "submit"\nrequest = "r2"\ntokens = 14\noutput = 20\n'
    '[[steps]]\nop = "submit"\nrequest = "r3"\ntokens = 10\noutput = 16\nn = 2\n' + SCHEDULE_STEP * 27
)


@pytest.fixture
def window(qtbot, settings):
    """The window on the synthetic tour (the shipped default may run a real model)."""
    from pagesim.app.gui.main_window import MainWindow

    window = MainWindow("cpu", settings=settings, speed=0.0)
    qtbot.addWidget(window)
    window.show()
    window.load(parse_scenario(TOUR))
    wait_idle(qtbot, window)
    yield window
    window.close()


def at_step(window, qtbot, step: int):
    window.actions.scrubber.setValue(step)
    return wait_idle(qtbot, window)


# -- the token path's tooltip ----------------------------------------------------------------
@pytest.mark.qt_log_ignore("This plugin does not support raise")  # the offscreen platform's tooltip window
def test_the_token_paths_tooltip_is_still_its_path_after_qts_own_tooltip_event(window, qtbot):
    at_step(window, qtbot, 5)
    tokens = window.token_map
    seq = window.frame.sequence(window.selected_seq)
    t = seq.num_tokens - 1
    columns = tokens._columns()
    from pagesim.app.gui.views.token_map import CELL

    pos = QPoint((t % columns) * CELL + CELL // 2, (t // columns) * CELL + CELL // 2)
    # Straight to the widget: through the window system, a move lands on whatever top-level
    # window an earlier test left at that point.
    from PySide6.QtGui import QMouseEvent

    move = QMouseEvent(
        QEvent.Type.MouseMove,
        QPointF(pos),
        QPointF(tokens.mapToGlobal(pos)),
        Qt.MouseButton.NoButton,
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(tokens, move)
    assert tokens.hovered == t
    # What Qt sends ~0.7 s after the mouse stops: it replaced the path with the widget's tip.
    QApplication.sendEvent(tokens, QHelpEvent(QEvent.Type.ToolTip, pos, tokens.mapToGlobal(pos)))
    assert QToolTip.text() == tokens.describe(t)
    assert f"physical block #{seq.block_table[t // window.frame.config.block_size]}" in QToolTip.text()
    QToolTip.hideText()


# -- one colour per request --------------------------------------------------------------------
def test_a_request_its_sequences_and_their_blocks_share_one_colour():
    colours = SequenceColours()
    chip = colours.of_request("r3")  # the scheduler asks first, before r3's sequences are seen
    assert colours("r3/s0") == chip and colours("r3/s1") == chip and colours.pattern("r3/s1") is None
    assert colours("r1") != chip and colours.of_request("r1") == colours("r1/s0")


def test_colours_follow_the_timelines_order_so_undoing_a_branch_gives_them_back(window, qtbot):
    """A branch's own sequence takes the next colour; undone, the script's requests have the
    colours they had before it."""
    at_step(window, qtbot, 1)  # A only: B has not appeared yet
    window.actions.add_action.trigger()  # a branch: the user's s1 arrives at step 2
    wait_idle(qtbot, window)
    assert window.colours("s1").name() == QColor(OKABE_ITO[1]).name()  # the next colour after A's
    window.actions.undo_action.trigger()
    wait_idle(qtbot, window)
    at_step(window, qtbot, 7)  # B and the fork A2 again
    assert [window.colours(s).name() for s in ("A", "B", "A2")] == [QColor(c).name() for c in OKABE_ITO[:3]]


def _pixel(widget, point) -> str:
    return widget.grab().toImage().pixelColor(point).name()


def test_the_chip_and_cpu_tiles_of_a_swapped_request_are_its_sequences_colour(window, qtbot):
    from pagesim.app.gui.views.scheduler_view import LANE_H, LANES

    window.load(parse_scenario(SWAP))
    wait_idle(qtbot, window)
    at_step(window, qtbot, 14)
    window.controller.forward()  # step 15, played: r3 (two samples) swapped out to the CPU pool
    frame = wait_idle(qtbot, window)
    view = window.scheduler_view
    window.scheduler_dock.raise_()
    qtbot.waitUntil(view.isVisible)
    held = dict(frame.cpu_holders)
    owners = {seq for seqs in held.values() for seq in seqs}
    assert owners and all(seq.startswith("r3/") for seq in owners)
    expected = {window.colours(seq).name() for seq in owners}
    assert len(expected) == 1  # every sample of r3, one colour
    cpu_block = min(held)
    tile = view.cpu_tile_rect(cpu_block)
    assert _pixel(view, tile.center().toPoint() + QPoint(0, 4)) in expected
    # The chip in the swapped lane, painted in the same colour.
    lane = [key for key, _ in LANES].index("swapped")
    label_w = max(view.fontMetrics().horizontalAdvance(title) for _, title in LANES) + 14
    chip_point = QPoint(6 + label_w + 4, 6 + lane * LANE_H + LANE_H // 2)
    assert _pixel(view, chip_point) in expected
    # And the swap's flight carries it: the tile that lands keeps its colour.
    from pagesim.app.gui.animation import beats_for

    beats = beats_for(frame, window.selected_seq, window.colours, QColor("grey"), speed=1.0)
    flights = [colour.name() for beat in beats for _, _, _, colour in beat.swaps]
    assert flights and set(flights) == expected


# -- table → pool lines --------------------------------------------------------------------
@pytest.fixture
def long_and_short(window, qtbot):
    window.load(parse_scenario(LONG_AND_SHORT))
    wait_idle(qtbot, window)
    window.controller.seek(2)
    wait_idle(qtbot, window)
    window.select_sequence("long")
    qtbot.wait(20)
    return window


def test_with_twelve_entries_only_the_looked_up_entrys_line_is_drawn(long_and_short, qtbot):
    from pagesim.app.gui.views.connectors import LINES_ALL_MAX

    window = long_and_short
    lines = window.table_lines
    table = window.frame.sequence("long").block_table
    assert len(table) == 12 > LINES_ALL_MAX
    assert lines.segments() == []  # no spaghetti: nothing is looked up
    window.token_map.tokenHovered.emit("long", 7, table[7], 1)  # a token of logical block 7
    drawn = lines.segments()
    assert [logical for logical, _, _ in drawn] == [7]
    end = drawn[0][2].toPoint()
    tile = window.pool_view.tile_rect(table[7])
    port = window.pool_view.viewport()
    assert tile.translated(port.mapTo(window, QPoint(0, 0))).adjusted(-1, -1, 1, 1).contains(end)
    window.token_map.tokenHovered.emit("long", -1, -1, -1)
    assert lines.segments() == []
    # Hovering a box of the table does the same, and lights its tile.
    view = window.sequence_view
    _, box = view.entry_rects("long")[3]
    QTest.mouseMove(view.viewport(), box.center())
    assert [lg for lg, _, _ in lines.segments()] == [3] and view.lookup == ("long", 3)
    assert window.pool_view.items[table[3]].glow is not None
    window.select_sequence("short")  # three entries: a line each
    assert [lg for lg, _, _ in lines.segments()] == [0, 1, 2]


def test_the_lines_stay_over_the_pool_when_a_tabbed_panel_comes_to_the_front(window, qtbot):
    """Raising a tabbed dock (Latency, Step log…) restacks the window's central widget over
    its siblings; the lines must stay on top, or the pool hides their ends."""
    at_step(window, qtbot, 7)
    lines = window.table_lines
    assert lines.segments() and lines.isVisible()

    def stacked_above_the_pool() -> bool:
        siblings = [c for c in window.children() if c.isWidgetType()]
        return siblings.index(lines) > siblings.index(window.centralWidget())

    assert stacked_above_the_pool()
    for name in ("latency", "steplog", "whatif", "memory"):
        window.studies.docks[name].raise_()  # a tab clicked: no resize, so nothing else redraws the lines
        QApplication.processEvents()
        assert stacked_above_the_pool(), name
    # What is seen: a pixel of a line over the pool is the line's, not the pool's.
    _, _, end = lines.segments()[0]
    point = end.toPoint() + QPoint(-6, 0)
    assert window.pool_view.viewport().rect().contains(window.pool_view.viewport().mapFrom(window, point))
    assert (
        window.grab().toImage().pixelColor(point).name()
        != window.pool_view.grab().toImage().pixelColor(window.pool_view.mapFrom(window, point)).name()
    )


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_line_colours_stand_out_from_the_background_in_either_theme(window, qtbot, theme):
    at_step(window, qtbot, 5)
    window.apply_theme(theme)
    background = QColor(THEMES[theme].window)
    for owner in OKABE_ITO:  # the yellow vanished on the light theme's grey
        assert contrast(readable_on(QColor(owner), background), background) >= 3.0, owner
    lines = window.table_lines
    seq = window.frame.sequence(window.selected_seq)
    lines.show_sequence(seq.seq_id, seq.block_table, QColor("#F0E442"))
    assert contrast(lines.colour, background) >= 3.0


def test_a_lookup_label_stays_inside_its_own_tile(long_and_short, qtbot):
    pool = long_and_short.pool_view
    colour = long_and_short.colours("long")
    for block, text in ((31, "L21 → #31"), (20, "L11 → #20"), (0, "L0 → #0"), (12, "copy of #11")):
        pool.clear_overlays()
        label = pool.add_block_label(block, text, colour)
        assert label is not None and label.text() == text
        box = label.sceneBoundingRect()
        own = QRectF(pool.items[block].pos(), pool.items[block].boundingRect().adjusted(2, 2, -2, -2).size())
        assert own.contains(box), text
        others = [item.block_id for item in pool.items if item.block_id != block]
        assert not [b for b in others if pool.items[b].sceneBoundingRect().adjusted(2, 2, -2, -2).intersects(box)]
    pool.clear_overlays()


# -- the pool's legend -----------------------------------------------------------------------
@pytest.mark.parametrize("theme", ["dark", "light"])
def test_the_pool_legend_names_each_kind_of_tile_in_the_themes_colours(window, qtbot, theme):
    window.apply_theme(theme)
    legend = window.pool_legend
    assert legend.isVisible()
    assert legend.labels() == ["free", "cached", "in use: owner's colour", "shared ×N", "copy-on-write"]
    # Its swatches are drawn as the tiles are, in the theme's colours.
    free = legend.swatch_rect("free")
    assert _pixel(legend, (free.topLeft() + QRectF(0, 0, 3, 3).bottomRight()).toPoint()) == THEMES[theme].free_block
    assert legend.height() <= 2 * legend._row_height()  # compact: never more than two lines


def test_the_legend_explains_the_hatch_only_while_a_hatched_owner_is_on_screen(window, qtbot):
    legend = window.pool_legend
    assert "hatch" not in [entry.key for entry in legend.entries()]
    for request in range(9):
        window.colours(f"extra{request}")
    legend.show_frame(window.frame)  # colours handed out, but to no sequence of this frame
    assert window.colours.pattern("extra8") is not None and "hatch" not in [e.key for e in legend.entries()]


def test_a_shared_blocks_tooltip_says_copy_on_write_only_where_a_write_can_come(window, qtbot):
    """After the fork, A and A2 share three blocks: the two full ones are never written again
    (read-only, never copied); the partly filled last one is copied by whichever writes first."""
    frame = at_step(window, qtbot, 6)
    table = frame.sequence("A2").block_table
    items = window.pool_view.items
    full, last = items[table[0]], items[table[-1]]
    assert full.ref_count == last.ref_count == 2 and full.fill == 4 and last.fill < 4
    assert "read-only" in full.toolTip() and "copy-on-write" not in full.toolTip()
    assert "gets its own copy first (copy-on-write)" in last.toolTip()


def test_the_hatch_is_explained_when_an_eighth_request_arrives_not_before(window, qtbot):
    """Colours are placed in the timeline's order from its first frame, but handed out (and the
    hatch explained) only as requests appear."""
    nine = "".join(f'[[steps]]\nop = "add"\nseq = "q{i}"\ntokens = 3\n' for i in range(9))
    window.load(parse_scenario('name = "nine"\nnum_blocks = 32\nblock_size = 4\nnum_heads = 1\nhead_dim = 8\n' + nine))
    wait_idle(qtbot, window)
    legend = window.pool_legend
    at_step(window, qtbot, 7)
    assert "hatch" not in [entry.key for entry in legend.entries()] and not window.colours.hatched
    at_step(window, qtbot, 8)  # q7, the eighth, arrives: its tiles are hatched
    assert window.colours.pattern("q7") is not None and legend.entries()[-1].key == "hatch"
    assert "8th" in legend.labels()[-1] and legend.swatch_rect("hatch") is not None
    at_step(window, qtbot, 7)  # back before it: nothing hatched on screen, nothing to explain
    assert window.colours.hatched and "hatch" not in [entry.key for entry in legend.entries()]


def test_a_v1_pool_shows_its_null_block_and_the_legend_says_what_it_is(make_window, qtbot):
    """vLLM v1 keeps block 0 as its null block: held from the start, never a request's. It
    is drawn hatched, its tooltip and the legend say what it is; a v0 pool has none."""
    window = make_window("prefix_caching_v1")
    frame = wait_idle(qtbot, window)
    assert frame.config.scheduler == "v1" and frame.ref_counts[0] > 0 and 0 not in frame.holders
    pool, legend = window.pool_view, window.pool_legend
    assert pool.items[0].null and not any(item.null for item in pool.items[1:])
    assert "null block" in pool.items[0].toolTip() and "never gives it to a request" in pool.items[0].toolTip()
    assert "null block" in legend.labels() and legend.swatch_rect("null") is not None
    window.load(load_shipped("seed_demo"))  # a v0 pool
    frame = wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: window.frame.scenario_name.startswith("Two sequences"), timeout=10_000)
    assert not any(item.null for item in pool.items) and "null block" not in legend.labels()


# -- the Check panel folded to a badge ---------------------------------------------------------
def test_at_1024_the_check_panel_is_a_badge_that_opens_and_gives_the_pool_its_width(window, qtbot):
    window.resize(1024, 700)
    at_step(window, qtbot, 5)
    qtbot.wait(50)
    badge, dock = window.check_badge, window.kernel_dock
    assert badge.isVisible() and not dock.isVisible()
    assert badge.text().startswith("✓") and window.frame.attention.passed
    folded = window.pool_view.viewport().width()
    badge.click()
    qtbot.waitUntil(dock.isVisible)
    qtbot.wait(50)
    assert window.kernel_tabs.currentWidget() is window.kernel_panel and badge.isChecked()
    opened = window.pool_view.viewport().width()
    assert folded > opened + 200  # the panel's width went to the pool
    # …but not all of it: the sequences' column gave some up too (the pool was left 200 px,
    # its tiles without numbers and its legend without words)
    assert opened >= 340 and 290 <= window.sequences_dock.width() < 340
    left = window.sequences_dock.width()
    badge.click()
    qtbot.waitUntil(lambda: not dock.isVisible())
    assert not badge.isChecked()
    qtbot.wait(50)
    assert window.sequences_dock.width() > left + 60  # (folded, the panel gives its column back)


def test_narrowing_a_wide_window_folds_the_open_check_panel(window, qtbot):
    window.resize(1600, 900)
    qtbot.wait(20)
    window.check_badge.click()
    qtbot.waitUntil(window.kernel_dock.isVisible)
    window.resize(1200, 800)
    qtbot.waitUntil(lambda: not window.kernel_dock.isVisible())
    window.check_badge.click()  # opened by hand in a narrow window: it stays open
    window.resize(1100, 800)
    qtbot.wait(20)
    assert window.kernel_dock.isVisible()


# -- the narration -----------------------------------------------------------------------------
def test_the_narration_grows_to_its_text_with_the_scenarios_note_first(window, qtbot):
    window.resize(1024, 700)
    frame = at_step(window, qtbot, 7)  # a step with the scenario's own note
    qtbot.wait(20)
    narration = window.header.step_caption
    assert not isinstance(narration, QAbstractScrollArea)  # no box that scrolls
    assert frame.note and frame.caption
    text = narration.plain_text()
    assert text.startswith(f"Step 7 · {frame.note}")
    assert text.find(frame.caption) > text.find(frame.note) >= 0  # then the engine's sentence
    assert not narration.is_cut and narration.lines >= 3  # taller than one line: it grew
    assert narration.height() >= narration.lines * narration.fontMetrics().lineSpacing()


def test_a_long_narration_on_a_small_screen_is_cut_and_does_not_grow_the_window(window, qtbot):
    long_note = " ".join(["A's 6 prompt tokens need only two blocks, taken from the free queue."] * 8)  # 575 chars
    window.load(parse_scenario(TOUR.replace("taken from the free queue.", long_note[:-1], 1)))
    wait_idle(qtbot, window)
    window.resize(1024, 700)
    qtbot.wait(20)
    at_step(window, qtbot, 1)
    qtbot.wait(20)
    narration = window.header.step_caption
    assert narration.lines > 2  # it grew as far as the room left by the rest of the centre
    assert window.height() == 700 and window.minimumSizeHint().height() <= 700
    assert narration.is_cut and long_note[:200] in narration.toolTip()  # the whole note on hover


# -- controls that apply to the kernel in use -----------------------------------------------------
def test_the_walkthrough_hides_what_does_not_apply_to_its_kernel(window, qtbot):
    at_step(window, qtbot, 5)
    window.show_walkthrough()
    panel = window.walkthrough
    qtbot.waitUntil(lambda: panel.walk is not None, timeout=20_000)
    assert panel.kernel == "cpu"
    assert not panel.partition_box.isVisible() and not panel.partition_label.isVisible()
    panel.show_stage(1)  # a short context is one CPU tile: no plot of zeros
    assert len(panel.walk.trace.block_folds) == 1 and not panel.lane_plot.isVisible()
    panel.buttons["end"].click()  # the output needs that plot
    assert panel.lane_plot.isVisible()
    panel.kernel_box.setCurrentIndex(2)  # CUDA v2: its partitions can be chosen
    qtbot.waitUntil(lambda: panel.walk is not None and panel.walk.kernel == "cuda-v2", timeout=20_000)
    assert panel.partition_box.isVisible()
    panel.show_stage(1)
    assert panel.lane_plot.isVisible()  # warps and thread groups: lanes that differ
    wait_idle(qtbot, window)


# -- the welcome's primer ----------------------------------------------------------------------
def test_the_welcome_opens_with_a_primer_in_three_pictures(window, qtbot):
    dialog = window.show_welcome()
    qtbot.waitUntil(dialog.isVisible)
    pictures = dialog.primer_pictures
    assert [p.kind for p in pictures] == ["attention", "cache", "paging"]
    for picture, caption in zip(pictures, dialog.primer_captions, strict=True):
        assert picture.isVisible() and picture.height() >= 90
        assert caption.text().count(". ") == 0 and caption.text().endswith(".")  # one sentence each
        image = picture.grab().toImage()
        shades = {
            image.pixelColor(x, y).name() for x in range(0, image.width(), 4) for y in range(0, image.height(), 4)
        }
        assert len(shades) >= 4, picture.kind  # drawn, not an empty box
        # Above the list of examples: the ideas first, then where to see them.
        assert picture.mapTo(dialog, QPoint(0, 0)).y() < dialog.list.mapTo(dialog, QPoint(0, 0)).y()
    dialog.reject()


def test_every_closable_panel_can_be_brought_back_from_a_menu(window):
    """A panel closed with its × must be reachable again: View lists the docks, Studies the
    study panels (the Beam tree was in neither)."""
    menus = [a.menu() for a in window.menuBar().actions() if a.menu() is not None]
    reachable = {a for m in menus for a in m.actions()}
    studies = window.studies
    for dock in window.findChildren(type(window.beam_tree_dock)):
        listed = dock.toggleViewAction() in reachable
        via_studies = dock in (studies.whatif_dock, studies.latency_dock)
        assert listed or via_studies, dock.windowTitle()


def test_the_rows_follow_the_frames_order_however_the_step_was_reached(window, qtbot):
    """A freed name added again goes to the end; a jump from a step where it was first must not
    leave its row first (one step, two orders, and a click on the wrong sequence)."""
    text = 'name = "again"\nnum_blocks = 16\nblock_size = 4\nnum_heads = 1\nhead_dim = 8\n' + "".join(
        f'[[steps]]\nop = "{op}"\nseq = "{seq}"\n' + ("tokens = 3\n" if op == "add" else "")
        for op, seq in (("add", "A"), ("add", "B"), ("free", "A"), ("add", "A"))
    )
    window.load(parse_scenario(text))
    wait_idle(qtbot, window)
    view = window.sequence_view

    def rows() -> list[str]:
        return [view.topLevelItem(i).text(0) for i in range(view.topLevelItemCount())]

    at_step(window, qtbot, 2)
    assert rows() == ["A", "B"]
    frame = at_step(window, qtbot, 4)  # a jump: A is live at both steps
    assert [s.seq_id for s in frame.sequences] == ["B", "A"] == rows()


def test_a_right_click_on_a_row_below_an_unfolded_one_opens_that_rows_menu(long_and_short, qtbot):
    """The press selects "short", "long" folds and "short" moves up from under the pointer:
    the menu must still be short's (it opened for nothing, or for another row)."""
    window = long_and_short
    view = window.sequence_view
    asked = []
    view.contextMenuRequested.disconnect(window._sequence_menu)  # (the menu itself: not this test's)
    view.contextMenuRequested.connect(lambda seq, _: asked.append(seq))
    row = view.visualItemRect(view._rows["short"])
    pos = QPoint(20, row.bottom() - 2)  # the bottom of short's row, under the unfolded long one
    QTest.mousePress(view.viewport(), Qt.MouseButton.RightButton, Qt.KeyboardModifier.NoModifier, pos)
    QApplication.processEvents()
    view.executeDelayedItemsLayout()  # long folds: short's row moves up
    assert view.itemAt(pos) is not view._rows["short"]
    view.customContextMenuRequested.emit(pos)  # what Qt sends next, at the same place
    QTest.mouseRelease(view.viewport(), Qt.MouseButton.RightButton, Qt.KeyboardModifier.NoModifier, pos)
    assert asked == ["short"]


def test_the_more_box_of_a_long_table_says_what_it_holds(long_and_short, qtbot):
    window = long_and_short
    view = window.sequence_view
    grid = view._entry_grid("long")
    length, head, tail = grid[3:]
    if head + tail >= length:  # the panel is wide enough for every entry: make it narrow
        window.resizeDocks([window.sequences_dock], [220], Qt.Orientation.Horizontal)
        QApplication.processEvents()
        view.executeDelayedItemsLayout()
        grid = view._entry_grid("long")
        length, head, tail = grid[3:]
    assert head + tail < length
    box = view._grid_box(grid, head)
    table = window.frame.sequence("long").block_table
    tip = view.more_tooltip(box.center())
    hidden = length - head - tail
    assert tip.startswith(f"long's table has {hidden} more entries") and f"L{head}→#{table[head]}" in tip
    assert f"L{length - 1}→" not in tip  # (the last entry has its own box)
    assert view.more_tooltip(view._grid_box(grid, 0).center()) is None  # an entry of its own: its usual tip


# -- the guide -----------------------------------------------------------------------------------
def test_the_guide_explains_the_v1_engine_and_where_the_queues_are(window, qtbot):
    window.show_guide()
    text = window.guide.toPlainText()
    for term in ("token budget", "max_num_batched_tokens", "chunked", "null block", "What-if", "Scheduler tab"):
        assert term in text, term
    assert "memory panel lists the queues" not in text  # they are drawn in the Scheduler tab


def test_table_to_pool_lines_are_faint_where_they_cross_the_narration_and_the_pool_legend(make_window, qtbot):
    window = make_window("prefix_caching_v1")
    window.resize(1024, 700)
    window.actions.scrubber.setValue(4)
    wait_idle(qtbot, window)
    lines = window.table_lines
    qtbot.waitUntil(lambda: lines._pixmap is not None)
    image = lines._pixmap.toImage()
    origin, ratio = lines._origin, lines._pixmap.devicePixelRatio()

    def strongest(rect) -> int:
        area = rect.translated(-origin).intersected(QRect(QPoint(0, 0), image.size() / ratio))
        return max(
            (image.pixelColor(int(x * ratio), int(y * ratio)).alpha()
             for x in range(area.left(), area.right()) for y in range(area.top(), area.bottom())),
            default=0,
        )  # fmt: skip

    text = lines._text_rects()
    over_text = [strongest(r) for r in text]
    assert any(over_text) and max(over_text) <= 80  # faint, and some line crosses some text
    assert strongest(QRect(origin, image.size() / ratio)) >= 160  # full strength elsewhere
    # Leaving the table, they cross the rows below the selected one faint too, and the
    # nearer tiles of the pool on their way, arriving at their own at full strength.
    segments = lines.segments()
    (below,) = lines._rows_below(segments)
    assert 0 < strongest(below) <= 80
    from pagesim.app.gui.views.connectors import ARRIVAL

    for _, _, end in segments:
        assert strongest(ARRIVAL.translated(end.toPoint())) >= 160
    (pool,) = lines._pool_rect()
    arrivals = [ARRIVAL.translated(end.toPoint()) for _, _, end in segments]
    area = pool.translated(-origin).intersected(QRect(QPoint(0, 0), image.size() / ratio))
    on_the_way = [
        image.pixelColor(int(x * ratio), int(y * ratio)).alpha()
        for x in range(area.left(), area.right(), 2)
        for y in range(area.top(), area.bottom(), 2)
        if not any(r.contains(QPoint(x, y) + origin) for r in arrivals)
    ]
    assert 0 < max(on_the_way) <= 80  # (some line crosses the pool before its arrival)


def test_a_shared_block_shows_each_holders_band_on_a_small_tile_too(make_window, qtbot):
    window = make_window("prefix_caching_v1")
    window.resize(1024, 700)
    window.actions.scrubber.setValue(5)
    wait_idle(qtbot, window)
    view = window.pool_view
    # Small tiles (a fill bar, no slots), zoomed as a user does: a resize still pending on a
    # loaded machine refitted a view scaled behind its back.
    view.zoom(0.5 / view.transform().m11())
    qtbot.wait(50)
    from pagesim.app.gui.views.pool_view import SLOTS_DETAIL

    assert view.transform().m11() < SLOTS_DETAIL
    tile = view.items[1]
    assert len(tile.holders) == 3  # the system prompt's first block, held by three requests
    rect = view.tile_rect(1)
    image = view.viewport().grab().toImage()
    ratio = image.devicePixelRatio()
    seen = {
        image.pixelColor(int(x * ratio), int(y * ratio)).name()
        for x in range(int(rect.left()) + 3, int(rect.right()) - 3)
        for y in range(int(rect.center().y()), int(rect.bottom()) - 1)
    }
    holders = {window.colours(seq).name() for seq, _ in tile.holders}
    assert len(holders & seen) >= 2, (holders, seen)


def test_table_to_pool_lines_follow_a_column_that_is_resized(make_window, qtbot):
    window = make_window("prefix_caching_v1")
    window.actions.scrubber.setValue(4)
    wait_idle(qtbot, window)
    window.select_sequence("chat1")
    lines = window.table_lines
    qtbot.waitUntil(lambda: bool(lines.segments()))
    header = window.sequence_view.header()
    header.resizeSection(1, header.sectionSize(1) + 40)  # as a column fitted to new contents (an undo) does

    def drawn() -> tuple:
        return tuple((logical, s.toTuple(), e.toTuple()) for logical, s, e in lines.segments())

    assert lines._key[0] == drawn()


def test_after_a_fork_undone_each_line_starts_on_its_own_entry(make_window, qtbot):
    window = make_window("preemption_v1")
    window.actions.scrubber.setValue(16)
    wait_idle(qtbot, window)
    seq = next(s.seq_id for s in window.frame.sequences if len(s.block_table) > 1)
    window.select_sequence(seq)
    window.actions.fork_action.trigger()
    wait_idle(qtbot, window)
    window.actions.undo_action.trigger()
    wait_idle(qtbot, window)
    lines, view = window.table_lines, window.sequence_view
    qtbot.waitUntil(lambda: bool(lines._key and lines._key[0]))
    at = view.viewport().mapTo(window, QPoint(0, 0))
    boxes = dict(view.entry_rects(seq))
    for logical, start, _ in lines._key[0]:
        assert boxes[logical].translated(at).left() <= start[0] <= boxes[logical].translated(at).right()


def test_a_smaller_window_keeps_the_selected_row_in_view(make_window, qtbot):
    """At 1024 × 700 the selected row (and its lines to the pool) ended below the table's bottom."""
    window = make_window("default")
    window.resize(1920, 1080)
    steps = "".join(f'[[steps]]\nop = "add"\nseq = "s{i}"\ntokens = 3\n' for i in range(24))
    window.load(parse_scenario("num_blocks = 64\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\n" + steps))
    wait_idle(qtbot, window)
    window.actions.scrubber.setValue(24)
    wait_idle(qtbot, window)
    view = window.sequence_view
    last = window.frame.sequences[-1].seq_id
    window.select_sequence(last)
    QApplication.processEvents()
    window.resize(1024, 700)
    item = view._rows[last]

    def in_view() -> bool:
        QApplication.processEvents()
        return view.viewport().rect().intersects(view.visualItemRect(item))

    qtbot.waitUntil(in_view, timeout=5_000)
    assert view.selected == last


def test_a_selection_passed_on_by_a_free_or_a_seek_is_brought_into_view(make_window, qtbot):
    """At 1024 × 700 the row that took a freed selection's place was highlighted off screen."""
    window = make_window("default")
    window.resize(1024, 700)
    steps = "".join(f'[[steps]]\nop = "add"\nseq = "s{i}"\ntokens = 60\n' for i in range(24))
    steps += '[[steps]]\nop = "free"\nseq = "s22"\n'
    window.load(parse_scenario("num_blocks = 400\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\n" + steps))
    wait_idle(qtbot, window)
    window.actions.scrubber.setValue(24)
    wait_idle(qtbot, window)
    view = window.sequence_view
    window.select_sequence("s22")
    QApplication.processEvents()
    view.verticalScrollBar().setValue(0)  # the user scrolled back to the top
    window.controller.forward()  # s22 is freed: s23 takes the selection
    wait_idle(qtbot, window)
    item = view._rows["s23"]

    def in_view() -> bool:
        QApplication.processEvents()
        return view.selected == "s23" and view.viewport().rect().contains(view.visualItemRect(item).center())

    qtbot.waitUntil(in_view, timeout=5_000)
    window.select_sequence("s0")  # the first row, then rows come and go below and above it: it stays in view
    window.controller.seek(24)
    wait_idle(qtbot, window)
    window.controller.seek(25)
    wait_idle(qtbot, window)
    top = view._rows["s0"]
    qtbot.waitUntil(lambda: view.viewport().rect().contains(view.visualItemRect(top).center()), timeout=5_000)


def test_the_guide_says_what_the_app_does(window, qtbot):
    """It said a branch drops the later steps (undo brings them back), that the waste study runs
    on this pool (it has its own), and its keys left out S, L, undo and redo, reload and F1."""
    window.show_guide()
    text = window.guide.toPlainText()
    assert "set aside (Edit → Undo brings them back)" in text and "steps are\ndropped" not in text
    assert "not on the scenario's" in text
    for key in ("S", "L", "Ctrl+Z / Ctrl+Shift+Z", "Ctrl+R", "F1"):
        assert f"\n{key}\t" in text or f"{key} " in text or f"{key}\n" in text, key


def test_the_badge_shows_a_failure_at_an_earlier_engine_step_of_the_schedule(qtbot):
    # (it read only the op's last check: an engine step that failed before it showed ✓)
    from types import SimpleNamespace

    from pagesim.app.gui.palette import THEMES
    from pagesim.app.gui.views.check_badge import CheckBadge

    badge = CheckBadge(THEMES["dark"])
    qtbot.addWidget(badge)
    badge.show_frame(SimpleNamespace(attention=SimpleNamespace(passed=True), engine_steps_failed=0))
    assert badge.passed is True and badge.text().startswith("✓")
    badge.show_frame(SimpleNamespace(attention=SimpleNamespace(passed=True), engine_steps_failed=1))
    assert badge.passed is False and "earlier engine step" in badge.toolTip()
    badge.show_frame(SimpleNamespace(attention=None, engine_steps_failed=2))
    assert badge.passed is False


def test_a_small_shared_tile_keeps_its_ref_count_before_its_hash_sign(make_window, qtbot):
    # (beam search's 48 small tiles showed "#0" on every shared block, no "×3" anywhere)
    window = make_window("default")
    tile = window.pool_view.items[5]
    tile.ref_count = 3
    metrics = QFontMetrics(window.font())

    def fits(text: str) -> float:
        return metrics.horizontalAdvance(text)

    assert tile.compact_label(metrics, fits("#5 ×3")) == "#5 ×3"
    assert tile.compact_label(metrics, fits("5 ×3")) == "5 ×3"  # the "#" goes first
    assert tile.compact_label(metrics, fits("#5")) == "#5"
    assert tile.compact_label(metrics, fits("5")) == "5"
    tile.ref_count = 1
    assert tile.compact_label(metrics, fits("5 ×3")) == "#5"
    # A two-digit id gives up the space before its count, not the count ("#12" showed no sharing).
    wide = window.pool_view.items[12]
    wide.ref_count = 2
    assert wide.compact_label(metrics, fits("12\u2009×2")) == "12\u2009×2"
    assert wide.compact_label(metrics, fits("12×2")) == "12×2"


def test_a_sequence_swatch_keeps_an_edge_on_a_row_selected_in_its_own_colour(make_window, qtbot):
    # (a dark-blue request's swatch vanished into the dark theme's blue selection)
    window = make_window("default")
    view = window.sequence_view
    seq_id = "A"  # (a name is enough: its colour is the palette's)
    colour = view.colours(seq_id)
    image = view._swatch(seq_id).pixmap(12, 12, QIcon.Mode.Selected).toImage()
    assert image.pixelColor(6, 6).rgb() == QColor(colour).rgb()
    edge, ring = image.pixelColor(0, 6), image.pixelColor(1, 6)
    assert edge.lightness() < 80 and ring.lightness() > 180  # dark, then light: an edge on any background


def test_token_labels_under_the_weights_are_thinned_to_the_plots_width(make_window, qtbot):
    # (at 1920 px a 17-token context's labels ran together: "Onceuponatime,·in·asmall…")
    window = make_window("default")
    window.check_fold.open()
    panel = window.kernel_panel
    panel._token_labels = [(t, f"tok{t:02}·") for t in range(17)]
    axis = panel.weights_plot.getAxis("bottom")
    metrics = QFontMetrics(axis.style.get("tickFont") or axis.font())
    for width in (240, 900):
        panel.weights_plot.setFixedWidth(width)
        QApplication.processEvents()
        panel._fit_token_labels()
        first, rest = axis._tickLevels
        assert sorted(first + rest) == panel._token_labels  # every token keeps its label, on one level or the other
        span = panel.weights_plot.getViewBox().width() / 17
        step = first[1][0] - first[0][0] if len(first) > 1 else 17
        assert step * span >= metrics.horizontalAdvance("tok00·")  # the first level's labels do not overlap
    assert step == 1 and not rest  # a wide plot labels every token on the first level


def test_text_on_a_coloured_cell_takes_the_ink_that_reads_best():
    from pagesim.app.gui.palette import contrast, ink_on

    # (white on the first request's orange read at about 2:1; dark on a dark blue, barely)
    for fill in ("#e69f00", "#56b4e9", "#009e73", "#0072b2", "#d55e00", "#cc79a7", "#f0e442", "#202020", "#f8f8f8"):
        ink = ink_on(fill)
        other = QColor("#ffffff") if ink.rgb() == QColor("#000000").rgb() else QColor("#000000")
        assert contrast(ink, QColor(fill)) >= contrast(other, QColor(fill)) and contrast(ink, QColor(fill)) >= 4.5


def test_the_pool_caption_drops_whole_parts_where_it_does_not_fit(qtbot):
    # (at 1024 px it read "… · 20 in the free queue · 9 …": the "9" of "9 heads (3 KV) × head dim 64")
    from pagesim.app.gui.views.elided_label import ElidedLabel

    label = ElidedLabel(max_lines=1, separator=" · ")
    qtbot.addWidget(label)
    text = "Physical KV-cache pool · 48 blocks × block size 4 · 36 in the free queue · 9 heads (3 KV) × head dim 64"
    label.set_full_text(text)
    metrics = label.fontMetrics()
    label.resize(metrics.horizontalAdvance("Physical KV-cache pool · 48 blocks × block size 4 · 36 in the free q"), 30)
    label.show()
    QApplication.processEvents()
    assert label.text() == "Physical KV-cache pool · 48 blocks × block size 4 · …" and label.toolTip() == text


def test_an_eighth_requests_chip_is_hatched_as_its_tiles_are(window, qtbot):
    """Its pool tiles were yellow and hatched, its chip in the lanes plain yellow."""
    eight = "".join(f'[[steps]]\nop = "submit"\nrequest = "q{i}"\ntokens = 3\noutput = 4\n' for i in range(8))
    header = 'name = "eight"\nnum_blocks = 32\nblock_size = 4\nnum_heads = 1\nhead_dim = 8\nwatermark = 0.0\n'
    window.load(parse_scenario(header + eight + '[[steps]]\nop = "schedule"\nsteps = 1\n'))
    wait_idle(qtbot, window)
    at_step(window, qtbot, 9)
    view = window.scheduler_view
    window.scheduler_dock.raise_()
    qtbot.waitUntil(view.isVisible)
    view.grab()  # (paints: the chips' places are found while painting)
    chips = {request: rect for rect, request, _ in view.chips}
    assert {"q0", "q7"} <= set(chips)
    image = view.grab().toImage()

    def colours_in(rect) -> set[str]:
        inner = rect.adjusted(4, 3, -4, -3).toRect()
        return {image.pixelColor(x, inner.top() + 1).name() for x in range(inner.left(), inner.right())}

    hatch = QColor(window.theme.window).name()
    assert hatch in colours_in(chips["q7"]) and hatch not in colours_in(chips["q0"])

    # Its row's swatch too.
    def swatch_colours(seq_id: str) -> set[str]:
        image = window.sequence_view._swatch(seq_id).pixmap(12, 12).toImage()
        return {image.pixelColor(x, y).name() for x in range(2, 10) for y in range(2, 10)}

    assert hatch in swatch_colours("q7") and swatch_colours("q0") == {window.colours("q0").name()}


def test_the_memory_summary_says_what_length_the_contiguous_baseline_reserves(window, qtbot):
    # ("contiguous would hold 96 blocks … impossible" read as rigged: the 128 tokens each
    # sequence reserves, the whole pool here, were said nowhere)
    at_step(window, qtbot, 3)
    length = window.frame.config.max_model_len
    assert f"contiguous (each sequence reserving max_model_len, {length} tokens) would hold" in (
        window.memory_panel.summary.text()
    )


def test_a_line_of_the_narration_never_breaks_inside_a_quoted_token():
    """A token that is one space, quoted in a sentence, had wrapped into a stray quote at the
    end of one line and another at the start of the next."""
    from pagesim.app.gui.views.header import unbreakable_quotes

    text = 'wrote one token\'s K/V each (r1 "ara", r2 " ", r3/s0 " the")'
    fixed = unbreakable_quotes(text)
    assert fixed == 'wrote one token\'s K/V each (r1\u00a0"ara", r2\u00a0"\u00a0", r3/s0\u00a0"\u00a0the")'
    assert unbreakable_quotes("no quotes here") == "no quotes here"


def test_the_step_caption_keeps_each_quoted_token_on_one_line(make_window, qtbot):
    window = make_window("preemption_v1")
    window.actions.scrubber.setValue(12)
    frame = wait_idle(qtbot, window)
    shown = window.header.step_caption.text()
    assert frame.caption and '"' in frame.caption
    quoted = re.findall(r"&quot;([^&]*)&quot;", shown)
    assert quoted and not [q for q in quoted if " " in q]
