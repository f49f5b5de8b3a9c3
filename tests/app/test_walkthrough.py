"""The kernel walk-through dock: traced on the worker only while it is shown, stepped stage
by stage, v2's partitions on the long-context scenario."""

import pytest
from pagesim.core.scenario import load_shipped
from PySide6.QtCore import QRect
from PySide6.QtWidgets import QApplication

from tests.app.conftest import wait_idle


def open_walkthrough(window, qtbot):
    window.show_walkthrough()
    qtbot.waitUntil(lambda: window.walkthrough.walk is not None, timeout=20_000)
    return window.walkthrough


def test_nothing_is_traced_while_the_walkthrough_is_hidden(window, qtbot):
    traced = []
    window.controller.traceReady.connect(traced.append)
    window.actions.scrubber.setValue(5)
    wait_idle(qtbot, window)
    assert not window.walkthrough_tab.open and traced == []


def test_stages_step_forward_and_back_and_end_at_the_kernels_output(window, qtbot):
    window.actions.scrubber.setValue(6)
    wait_idle(qtbot, window)
    panel = open_walkthrough(window, qtbot)
    walk = panel.walk
    assert walk.seq_id == window.selected_seq and walk.kernel == "cpu"
    panel.buttons["start"].click()
    first = panel.stage_label.text()
    assert first.startswith("stage 1 /") and "logical block 0 → physical block #" in first
    panel.buttons["next"].click()
    assert panel.stage == 1 and panel.stage_label.text() != first
    panel.buttons["back"].click()
    assert panel.stage_label.text() == first
    panel.buttons["end"].click()
    last = panel.stage_label.text()
    assert "replay vs kernel" in last and walk.trace_error <= walk.bound
    # The last stage draws the three outputs over the head's dimensions.
    assert panel.out_kernel.isVisible() and not panel.lanes.isVisible()
    assert len(panel.out_trace.getData()[0]) == len(walk.kernel_output)
    # Its title keeps the key whole: a narrow dock cut "(|replay − kernel| 2…" mid-number.
    plot = panel.lane_plot.getPlotItem()
    full, key = plot.title_choices[0]
    assert full.startswith(key) and "replay − kernel" in full and "replay − kernel" not in key
    fitting = [t for t, w in zip(plot.title_choices[0], plot._title_widths, strict=True) if w <= plot.width() - 4]
    assert plot.title_item.text == (fitting or [key])[0]
    panel.buttons["back"].click()
    assert panel.lanes.isVisible() and not panel.out_kernel.isVisible()
    assert plot.title_choices is None and "Who reads each token" in plot.title_item.text  # a fixed title again


def test_cuda_v2_shows_its_partitions_on_the_long_context(make_window, qtbot):
    window = make_window("long_context")
    window.actions.scrubber.setValue(2)
    wait_idle(qtbot, window)
    panel = open_walkthrough(window, qtbot)
    panel.kernel_box.setCurrentIndex(2)  # CUDA v2
    qtbot.waitUntil(lambda: panel.walk is not None and panel.walk.kernel == "cuda-v2", timeout=20_000)
    n = panel.walk.trace.context_len
    assert len(panel.bands) == -(-n // 512)  # the real partition size
    panel.partition_box.setCurrentIndex(0)  # 8 tokens: a teaching size
    qtbot.waitUntil(lambda: panel.walk.partition_size == 8, timeout=20_000)
    assert len(panel.walk.trace.partitions) == -(-n // 8)
    panel.buttons["end"].click()
    assert "replay vs kernel" in panel.stage_label.text()
    assert panel.walk.trace_error <= panel.walk.bound
    wait_idle(qtbot, window)


def test_each_stage_lights_the_block_it_reads_in_the_pool_and_the_table(window, qtbot):
    window.actions.scrubber.setValue(6)
    wait_idle(qtbot, window)
    panel = open_walkthrough(window, qtbot)
    panel.show_stage(5)
    step = panel.walk.trace.steps[5]
    assert window.pool_view.items[step.physical_block].glow is not None
    assert window.pool_view.items[step.physical_block].glow_slot == step.slot
    assert window.sequence_view.lookup == (panel.walk.seq_id, step.logical_block)
    panel.buttons["end"].click()  # the output: no lookup
    assert window.pool_view.items[step.physical_block].glow is None and window.sequence_view.lookup is None


def test_the_token_map_says_where_each_token_lives_and_lights_it(window, qtbot):
    window.actions.scrubber.setValue(6)
    wait_idle(qtbot, window)
    tokens = window.token_map
    seq = window.frame.sequence(window.selected_seq)
    assert tokens.seq_id == seq.seq_id and tokens.num_tokens == seq.num_tokens
    bs = window.frame.config.block_size
    t = seq.num_tokens - 1
    text = tokens.describe(t)
    physical = seq.block_table[t // bs]
    assert f"logical block {t // bs}" in text and f"physical block #{physical} · slot {t % bs}" in text
    assert "attention weight" in text  # the selected sequence is the focus: its weights are known
    tokens.tokenHovered.emit(seq.seq_id, t // bs, physical, t % bs)
    assert window.pool_view.items[physical].glow is not None
    assert window.pool_view.items[physical].glow_slot == t % bs  # the token's own slot is ringed
    tokens.tokenPointed.emit(seq.seq_id, t)  # and its weight in the attention plot
    panel = window.kernel_panel
    assert panel.hovered_weight.data["x"].tolist() == [t] and panel.hovered_label.isVisible()
    assert f"token {t}:" in panel.hovered_label.toPlainText()
    tokens.tokenPointed.emit(seq.seq_id, -1)
    assert not panel.hovered_label.isVisible()
    assert window.sequence_view.lookup == (seq.seq_id, t // bs)
    # The reverse: a pool tile names the tokens of every sequence that holds it.
    item = window.pool_view.items[seq.block_table[0]]
    assert f"{seq.seq_id} (logical block 0: tokens 0–" in item.describe()


def test_cyclic_gc_runs_on_the_gui_thread_only_while_a_window_lives(make_window, qtbot):
    """A collection triggered on the worker thread could destroy widgets there and
    deadlock against the GUI thread (seen once in CI): app.gui.gc_guard."""
    import gc

    window = make_window("seed_demo")
    assert not gc.isenabled()
    window.close()
    assert gc.isenabled()


def test_lines_join_each_table_entry_of_the_selection_to_its_pool_tile(window, qtbot):
    window.actions.scrubber.setValue(8)
    wait_idle(qtbot, window)
    seq = window.frame.sequence(window.selected_seq)
    lines = window.table_lines
    segments = lines.segments()
    assert [logical for logical, _, _ in segments] == list(range(len(seq.block_table)))
    port = window.pool_view.viewport()
    for logical, _, end in segments:
        tile = window.pool_view.tile_rect(seq.block_table[logical])
        tile_in_window = QRect(port.mapTo(window, tile.topLeft()), tile.size())
        assert tile_in_window.adjusted(-1, -1, 1, 1).contains(end.toPoint()), f"L{logical} misses its tile"
    window.select_sequence("B")  # another selection, other lines
    b = window.frame.sequence("B")
    assert len(lines.segments()) == len(b.block_table) and lines.table == tuple(b.block_table)
    window.actions.lines_action.trigger()  # View → Block-table → pool lines: off
    assert lines.segments() == []
    window.actions.lines_action.trigger()
    assert len(lines.segments()) == len(b.block_table)


def _points(item) -> int:
    xs = item.getData()[0]
    return 0 if xs is None else len(xs)


def test_merge_stages_draw_the_tree_the_states_fold_through(window, qtbot):
    window.actions.scrubber.setValue(8)
    wait_idle(qtbot, window)
    panel = open_walkthrough(window, qtbot)
    panel.kernel_box.setCurrentIndex(1)  # CUDA v1
    qtbot.waitUntil(lambda: panel.walk is not None and panel.walk.kernel == "cuda-v1", timeout=20_000)
    walk = panel.walk
    first = len(walk.trace.steps)
    panel.show_stage(first)  # the first xor shuffle: a butterfly between two thread groups
    merge = walk.trace.merges[0]
    assert merge.stage == "group" and panel.tree_now.isVisible() and not panel.lanes.isVisible()
    assert not panel.score_plot.isVisible()  # the tree gets the panel's height
    xs, ys = panel.tree_now.getData()
    assert set(ys.tolist()) == {merge.into, merge.other} and set(xs.tolist()) == {0.0, 1.0}
    assert _points(panel.tree_done) == 0
    warp_stage = next(i for i, m in enumerate(walk.trace.merges) if m.stage == "warp")
    panel.show_stage(first + warp_stage + 1)  # the second warp joins through shared memory
    xs, ys = panel.tree_now.getData()
    assert ys[0] == walk.trace.merges[warp_stage + 1].other and "warp" in panel.stage_label.text()
    assert _points(panel.tree_done) == 2  # the first warp's line, done
    panel.show_stage(first - 1)  # back to the last token: lanes again
    assert panel.lanes.isVisible() and not panel.tree_now.isVisible() and panel.score_plot.isVisible()


def test_the_running_sum_and_each_rescale_grow_with_the_stages(make_window, qtbot):
    window = make_window("long_context")
    window.actions.scrubber.setValue(2)
    wait_idle(qtbot, window)
    panel = open_walkthrough(window, qtbot)
    walk = panel.walk
    stage = 2000
    panel.show_stage(stage)
    read = walk.trace.steps[: stage + 1]
    xs, ys = panel.running_sum.getData()
    assert len(xs) == stage + 1 and ys[-1] == max(read, key=lambda s: s.token).l_after
    expected = [s.token for s in read if s.correction < 1.0 and s.m_before > float("-inf")]
    assert expected, "a long context always sees new maxima"
    assert sorted(panel.rescales.data["x"].tolist()) == sorted(expected)
    shown = [label for label in panel.rescale_labels if label.isVisible()]
    assert shown and all(label.toPlainText().startswith("×") for label in shown)
    panel.show_stage(10)  # back: fewer tokens read, fewer rescales
    assert len(panel.running_sum.getData()[0]) == 11
    assert len(panel.rescales.data["x"]) <= len(expected)


def _long_doc_selected(make_window, qtbot):
    """The long-context scenario at step 3 with its long sequence "doc" selected: the window and its table view."""
    window = make_window("long_context")
    window.actions.scrubber.setValue(3)
    wait_idle(qtbot, window)
    window.select_sequence("doc")
    return window, window.sequence_view


def test_a_long_block_table_wraps_in_the_selected_row_and_counts_the_rest(make_window, qtbot):
    from pagesim.app.gui.views.sequence_view import MAX_LINES

    window, view = _long_doc_selected(make_window, qtbot)
    table = window.frame.sequence("doc").block_table
    per_line = view.entries_per_line("doc", len(table))
    assert 1 < per_line < len(table)
    rects = view.entry_rects("doc")
    lines = view.max_lines("doc")
    assert 1 < lines <= MAX_LINES
    assert len(rects) == per_line * lines - 1  # one box counts the middle
    assert len({r.y() for _, r in rects}) == lines  # on that many lines
    # The table's last entries keep their boxes (where the next token goes), after the count.
    assert [logical for logical, _ in rects[-2:]] == [len(table) - 2, len(table) - 1]
    chat = view.entry_rects("chat")  # not selected: one line
    assert len({r.y() for _, r in chat}) == 1 and len(chat) == len(window.frame.sequence("chat").block_table)


def test_an_unselected_long_block_table_takes_one_line_and_counts_the_rest(make_window, qtbot):
    """It ran past the panel's edge, cut off mid-box, with nothing saying how many were hidden."""
    window = make_window("long_context")
    window.actions.scrubber.setValue(3)
    wait_idle(qtbot, window)
    window.select_sequence("chat")
    view = window.sequence_view
    view.executeDelayedItemsLayout()
    table = window.frame.sequence("doc").block_table
    per_line = view.entries_per_line("doc", len(table))
    assert 1 < per_line < len(table)
    rects = view.entry_rects("doc")
    assert len(rects) == per_line - 1 and len({r.y() for _, r in rects}) == 1
    assert rects[-1][0] == len(table) - 1  # the last entry keeps a box of its own
    head = next(i for i, (logical, _) in enumerate(rects) if logical != i)
    cell = view.visualRect(view.indexFromItem(view._rows["doc"], 3))
    more = view.entry_box("doc", head)  # a hidden entry: the box that counts it
    assert more.right() <= view.viewport().width() and cell.contains(more)
    assert more.left() > rects[head - 1][1].left() and more.right() < rects[head][1].left()  # between the two
    hidden = len(table) - len(rects)
    assert view.more_tooltip(more.center()).startswith(f"doc's table has {hidden} more entries")


@pytest.mark.parametrize("size", [(1024, 700), (1920, 1080)])
def test_the_walkthrough_plots_stay_inside_their_widgets_and_their_axis_labels_fit(make_window, qtbot, size):
    """A long title made a plot wider than its dock (the right axis's "0.2" showed as "0"),
    and a rotated label longer than a short plot ran over the plot above it."""
    window = make_window("default")
    window.resize(*size)
    window.actions.scrubber.setValue(8)
    wait_idle(qtbot, window)
    panel = open_walkthrough(window, qtbot)
    panel.kernel_box.setCurrentIndex(1)  # CUDA v1: the lane axis says "lane (warp, group)"
    qtbot.waitUntil(lambda: panel.walk is not None and panel.walk.kernel == "cuda-v1", timeout=20_000)
    wait_idle(qtbot, window)
    qtbot.wait(50)
    for widget in (panel.score_plot, panel.lane_plot):
        plot = widget.getPlotItem()
        assert plot.geometry().width() <= widget.width() + 0.5  # nothing past the widget's edge
        for side in ("left", "right") if widget is panel.score_plot else ("left",):
            axis = plot.getAxis(side)
            assert axis.geometry().right() <= widget.width() + 0.5
            full = axis.toolTip()
            assert full in ("q·k·scale", "lane (warp, group)", "ℓ (running sum)")  # whole, in the tooltip
            if axis.label.isVisible():
                assert axis.label.boundingRect().width() <= plot.getViewBox().height() + 0.5, axis.labelText
                assert full.startswith(axis.labelText)
    if size == (1920, 1080):  # room for every label, whole
        assert panel.lane_plot.getPlotItem().getAxis("left").labelText == "lane (warp, group)"
        assert panel.score_plot.getPlotItem().getAxis("right").labelText == "ℓ (running sum)"


def test_another_scenario_walks_from_its_first_stage_on_its_worst_layer(make_window, qtbot):
    """Layer 20 and stage 5 chosen on the tour stayed on long_context, whose Check tab showed its worst."""
    window = make_window("default", real=True)
    window.actions.scrubber.setValue(3)
    wait_idle(qtbot, window, timeout=60_000)
    panel = open_walkthrough(window, qtbot)
    panel.layer_box.setCurrentIndex(panel.layer_box.findData(20))
    qtbot.waitUntil(lambda: panel.walk is not None and panel.walk.layer == 20, timeout=60_000)
    panel.show_stage(5)
    window.load(load_shipped("seed_demo"))
    wait_idle(qtbot, window, timeout=60_000)
    window.load(load_shipped("default"))
    wait_idle(qtbot, window, timeout=60_000)
    assert panel.layer_box.layer() is None and panel.stage == 0


def test_the_selected_rows_lines_leave_every_other_row_in_sight(make_window, qtbot):
    # (at 1024 × 700 beam/b0's four lines filled the dock and hid b1 and b2)
    _, view = _long_doc_selected(make_window, qtbot)
    for height in range(140, 174):  # (every remainder of a line's height: a row's margin once left one out)
        view.setFixedHeight(height)
        QApplication.processEvents()
        view.executeDelayedItemsLayout()
        rows = [view.topLevelItem(i) for i in range(view.topLevelItemCount())]
        assert len(rows) >= 2
        bottom = max(view.visualItemRect(item).bottom() for item in rows)
        assert bottom <= view.viewport().height(), (height, view.max_lines("doc"))


def test_a_table_with_room_for_two_boxes_keeps_its_last_entry(make_window, qtbot):
    # (room 2 showed "L0, +N more": the last entry, where the next token goes, hidden)
    _, view = _long_doc_selected(make_window, qtbot)
    view.entries_per_line = lambda seq_id, count: 2
    view.max_lines = lambda seq_id: 1
    assert view.entries_shown("doc", 10) == (2, 0, 1)
    assert view.entries_shown("doc", 2) == (2, 2, 0)
    view.entries_per_line = lambda seq_id, count: 4
    assert view.entries_shown("doc", 10) == (4, 1, 2)
