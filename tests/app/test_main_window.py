import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pytest
from pagesim.app.gui.animation import beats_for
from pagesim.app.gui.palette import THEMES
from pagesim.core import events as ev
from pagesim.core.scenario import load_shipped, shipped_scenarios
from PySide6.QtCore import QPoint, QRect, QRectF, QSizeF, Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QToolBar

from tests.app.conftest import wait_idle
from tests.scenarios import on_the_token_model


def button(window, action):
    for toolbar in window.findChildren(QToolBar):
        widget = toolbar.widgetForAction(action)
        if widget is not None:
            return widget
    raise AssertionError(f"no button for {action.text()}")


def pool_state(window):
    return [(i.ref_count, i.fill, i.holders) for i in window.pool_view.items]


def assert_pool_matches_frame(window):
    frame = window.frame
    for item in window.pool_view.items:
        assert item.ref_count == frame.ref_counts[item.block_id]
        assert item.fill == frame.block_fill[item.block_id]
        assert item.holders == frame.holders.get(item.block_id, ())


def test_opens_on_the_default_scenario_and_names_the_backend(window):
    assert window.frame.position == 0 and window.frame.length == 17
    assert len(window.pool_view.items) == 24
    assert "CPU" in window.status.backend_label.text() and "no CUDA device" in window.status.backend_label.text()
    assert "CPU" in window.kernel_panel.backend_label.text()


def test_step_forward_button_fills_the_pool_as_the_model_says(window, qtbot):
    button(window, window.actions.forward_action).click()
    frame = wait_idle(qtbot, window)
    assert frame.position == 1 and frame.sequence("A").block_table == (0, 1)
    items = window.pool_view.items
    assert (items[0].fill, items[1].fill, items[2].fill) == (4, 2, 0)
    assert items[0].holders == (("A", 0),) and items[2].ref_count == 0
    assert "Physical block 1" in items[1].toolTip() and "2/4 slots" in items[1].toolTip()
    assert_pool_matches_frame(window)


def test_add_grow_fork_free_through_the_widgets(window, qtbot):
    window.actions.prompt_spin.setValue(9)
    button(window, window.actions.add_action).click()
    frame = wait_idle(qtbot, window)
    assert frame.sequence("s1").num_tokens == 9 and len(frame.sequence("s1").block_table) == 3
    assert window.selected_seq == "s1"
    assert_pool_matches_frame(window)

    qtbot.keyClick(window, Qt.Key.Key_G)
    frame = wait_idle(qtbot, window)
    assert frame.sequence("s1").num_tokens == 10

    window.actions.grow_spin.setValue(3)
    qtbot.keyClick(window, Qt.Key.Key_G, Qt.KeyboardModifier.ShiftModifier)
    frame = wait_idle(qtbot, window)
    assert frame.sequence("s1").num_tokens == 13

    button(window, window.actions.fork_action).click()
    frame = wait_idle(qtbot, window)
    child = frame.sequence("s2")
    assert child.block_table == frame.sequence("s1").block_table
    assert all(window.pool_view.items[b].ref_count == 2 for b in child.block_table)
    assert_pool_matches_frame(window)

    window.sequence_view.select("s1")
    qtbot.keyClick(window, Qt.Key.Key_Delete)
    frame = wait_idle(qtbot, window)
    assert frame.sequence("s1") is None
    assert all(window.pool_view.items[b].ref_count == 1 for b in child.block_table)
    assert frame.operations[-1].describe() == "free s1"
    assert_pool_matches_frame(window)


def test_step_back_restores_the_earlier_picture(window, qtbot):
    for _ in range(6):
        qtbot.keyClick(window, Qt.Key.Key_Right)
        wait_idle(qtbot, window)
    before_state, before_image = pool_state(window), window.pool_view.grab().toImage()
    qtbot.keyClick(window, Qt.Key.Key_Right)
    wait_idle(qtbot, window)
    assert pool_state(window) != before_state  # step 7 copies a block on write
    qtbot.keyClick(window, Qt.Key.Key_Left)
    frame = wait_idle(qtbot, window)
    assert frame.position == 6
    assert pool_state(window) == before_state
    assert window.pool_view.grab().toImage() == before_image


def test_block_table_rows_follow_every_step_there_and_back(window, qtbot):
    """The table view sets only what a step changed (a new token count without asking the view
    to re-measure the row): every row must still hold the frame's numbers, forward and back."""
    from pagesim.app.gui.views.sequence_view import TABLE_COLUMN

    def assert_rows_match(frame):
        rows = window.sequence_view._rows
        assert set(rows) == {s.seq_id for s in frame.sequences}
        for seq in frame.sequences:
            item = rows[seq.seq_id]
            # (the Tokens cell may add what the step computed: "6 (+6 prefill)")
            assert (item.text(1).split()[0], item.text(2)) == (str(seq.num_tokens), str(len(seq.block_table)))
            assert tuple(item.data(TABLE_COLUMN, Qt.ItemDataRole.UserRole)) == seq.block_table
            refs = item.data(TABLE_COLUMN, Qt.ItemDataRole.UserRole + 2)
            assert tuple(refs) == tuple(int(frame.ref_counts[b]) for b in seq.block_table)
            assert f"{seq.num_tokens} tokens" in item.toolTip(0)

    while window.frame.position < window.frame.length:
        qtbot.keyClick(window, Qt.Key.Key_Right)
        assert_rows_match(wait_idle(qtbot, window))
    for step in (8, 3, 12):
        window.controller.seek(step)
        assert_rows_match(wait_idle(qtbot, window))


def test_scrubber_and_end_seek(window, qtbot):
    window.actions.scrubber.setValue(9)
    assert wait_idle(qtbot, window).position == 9
    button(window, window.actions.end_action).click()
    assert wait_idle(qtbot, window).position == 17
    assert not window.actions.forward_action.isEnabled()
    button(window, window.actions.start_action).click()
    frame = wait_idle(qtbot, window)
    assert frame.position == 0 and not frame.sequences
    assert all(item.ref_count == 0 for item in window.pool_view.items)


def test_play_advances_and_pause_stops(window, qtbot):
    qtbot.keyClick(window, Qt.Key.Key_Space)
    assert window.controller.playing and window.actions.play_action.text() == "Pause"
    qtbot.waitUntil(lambda: window.frame.position >= 3, timeout=10_000)
    button(window, window.actions.play_action).click()
    assert not window.controller.playing and window.actions.play_action.text() == "Play"
    wait_idle(qtbot, window)
    stopped_at = window.frame.position
    with qtbot.assertNotEmitted(window.controller.frameChanged, wait=400):
        pass
    assert window.frame.position == stopped_at


def test_play_stops_by_itself_at_the_end(make_window, qtbot):
    window = make_window("seed_demo")
    window.controller.play()
    qtbot.waitUntil(lambda: not window.controller.playing, timeout=10_000)
    assert wait_idle(qtbot, window).position == 2


def test_errors_are_shown_and_change_nothing(window, qtbot):
    window.sequence_view.select(None)
    window.selection.current = None
    before = window.frame
    button(window, window.actions.grow_action).click()
    assert "select a sequence to grow" in window.statusBar().currentMessage()
    assert window.controller.pending == 0 and window.frame is before

    window.actions.prompt_spin.setValue(1000)
    with qtbot.waitSignal(window.controller.errorRaised, timeout=10_000):
        button(window, window.actions.add_action).click()
    wait_idle(qtbot, window)
    assert "pool exhausted" in window.statusBar().currentMessage()
    assert window.frame is before and pool_state(window) == [(0, 0, ())] * 24

    assert not window.actions.back_action.isEnabled()
    window.controller.back()
    assert "at the start" in window.statusBar().currentMessage()


def test_kernel_panel_shows_the_match(window, qtbot):
    window.actions.scrubber.setValue(7)
    frame = wait_idle(qtbot, window)
    focus = frame.focus
    assert focus is not None and focus.seq_id == window.selected_seq
    assert "✓ match" in window.kernel_panel.verdict.text()
    window.kernel_panel.head_box.setValue(2)
    _, y = window.kernel_panel.kernel_curve.getData()
    np.testing.assert_array_equal(y, focus.output[2])
    _, dense = window.kernel_panel.dense_curve.getData()
    np.testing.assert_array_equal(dense, focus.dense[2])
    assert "head 2" in window.kernel_panel.verdict.text()
    heights = window.kernel_panel.weight_bars.opts["height"]
    assert len(heights) == focus.context_len and np.isclose(np.sum(heights), 1.0, atol=1e-5)


def test_selecting_a_sequence_highlights_its_blocks_and_focuses_the_kernel(window, qtbot):
    window.actions.scrubber.setValue(6)
    wait_idle(qtbot, window)
    window.sequence_view.select("B")
    frame = wait_idle(qtbot, window)
    assert frame.focus.seq_id == "B"
    b_blocks = set(frame.sequence("B").block_table)
    assert {i.block_id for i in window.pool_view.items if i.selected_seq} == b_blocks


def test_clicking_a_block_selects_its_sequence(window, qtbot):
    window.actions.scrubber.setValue(2)
    wait_idle(qtbot, window)
    view = window.pool_view
    block = window.frame.sequence("B").block_table[0]
    centre = view.mapFromScene(view.items[block].sceneBoundingRect().center())
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(centre.x(), centre.y()))
    assert wait_idle(qtbot, window).focus.seq_id == "B"
    assert window.sequence_view.selected == "B"


def _played_in_the_window() -> list[str]:
    """The shipped scenarios this test plays: every one on the token model, and of those on
    SmolLM2 the tour and beam search (the golden test replays every real one headless with
    the same checks; played here too they cost two minutes of the suite's fifteen)."""
    on_tokens = set(on_the_token_model())
    return sorted(n for n in shipped_scenarios() if n in on_tokens or n in ("default", "beam_search"))


@pytest.mark.parametrize("name", _played_in_the_window())
def test_every_shipped_scenario_plays_to_the_end(make_window, qtbot, name):
    window = make_window(name, real=True)
    window.seek_end()
    frame = wait_idle(qtbot, window, timeout=60_000)
    assert frame.position == frame.length
    assert frame.attention is None or frame.attention.passed
    assert window.last_error is None
    assert_pool_matches_frame(window)


def _step_to_the_copy(make_window, qtbot, speed: float):
    """The tour played into its step 7, where A2's write copies the block it shares with A:
    (the window, the copy's event)."""
    window = make_window(speed=speed)
    window.actions.scrubber.setValue(6)
    wait_idle(qtbot, window)
    qtbot.keyClick(window, Qt.Key.Key_Right)
    frame = wait_idle(qtbot, window)
    (copied,) = [e for e in frame.events if isinstance(e, ev.BlockCopied)]
    return window, copied


def _overlay_texts(window) -> list[str]:
    return [o.text() for o in window.pool_view._overlays if hasattr(o, "text")]


def test_animations_follow_events_and_never_touch_the_model(make_window, qtbot):
    window, copy = _step_to_the_copy(make_window, qtbot, speed=4.0)
    copied = [copy]
    qtbot.waitUntil(lambda: window.pool_view.items[copied[0].dst].glow is not None, timeout=5_000)
    assert window.pool_view._overlays, "the copy-on-write arrow is drawn"
    assert f"copy of #{copied[0].src}" in _overlay_texts(window)  # and labelled, inside the copy's own tile
    assert_pool_matches_frame(window)
    qtbot.waitUntil(lambda: not window.director.running, timeout=10_000)
    assert all(item.glow is None for item in window.pool_view.items)
    assert window.sequence_view.lookup is None
    # The copy stays marked once the step has played (it was gone in under half a second)...
    assert _overlay_texts(window) == [f"copy of #{copied[0].src}"]
    qtbot.keyClick(window, Qt.Key.Key_Right)  # ... until the next step, which copies nothing
    frame = wait_idle(qtbot, window)
    assert not any(isinstance(e, ev.BlockCopied) for e in frame.events)
    qtbot.waitUntil(lambda: not window.director.running, timeout=10_000)
    assert not window.pool_view._overlays
    assert_pool_matches_frame(window)


def test_at_the_instant_speed_a_copy_on_write_is_marked_too(make_window, qtbot):
    # (the instant speed drew no beat at all: a screenshot of the copy step showed no copy)
    window, copied = _step_to_the_copy(make_window, qtbot, speed=0.0)
    qtbot.waitUntil(lambda: bool(window.pool_view._overlays), timeout=5_000)
    assert _overlay_texts(window) == [f"copy of #{copied.src}"]
    # Still there once the pool is laid out again for another width, and once another
    # sequence is selected (its frame, of the same step, carries no events).
    # (the arrow, whose tooltip names it: the label inside the copy goes where tiles are small)
    arrow = f"copy-on-write: block #{copied.src} copied into #{copied.dst}"
    columns = window.pool_view.columns
    window.resize(1600, 600)
    qtbot.waitUntil(lambda: window.pool_view.columns != columns, timeout=5_000)
    assert [o.toolTip() for o in window.pool_view._overlays if o.toolTip()] == [arrow]
    window.select_sequence("B")
    wait_idle(qtbot, window)
    qtbot.wait(50)
    assert [o.toolTip() for o in window.pool_view._overlays if o.toolTip()] == [arrow]


def test_lookup_beats_follow_the_kernels_access_order(window, qtbot):
    window.actions.scrubber.setValue(5)
    wait_idle(qtbot, window)
    qtbot.keyClick(window, Qt.Key.Key_Right)
    frame = wait_idle(qtbot, window)
    beats = beats_for(frame, "A", window.colours, window.colours("A"), speed=1.0)
    lookups = [b.lookup for b in beats if b.lookup is not None]
    assert lookups == [("A", i) for i in range(len(frame.sequence("A").block_table))]
    lookup = next(b for b in beats if b.lookup is not None)
    window.director.play([lookup])  # a lookup beat says what it reads
    (block,) = lookup.glows
    qtbot.waitUntil(
        lambda: any(getattr(o, "text", lambda: "")() == f"L0 → #{block}" for o in window.pool_view._overlays)
    )
    assert beats_for(frame, "A", window.colours, window.colours("A"), speed=0.0) == []


def test_theme_speed_and_recent_files_persist(make_window, settings, qtbot, tmp_path):
    window = make_window()
    window.apply_theme("light")
    window.actions.speed_box.setCurrentIndex(4)
    path = tmp_path / "mine.toml"
    window.files.save_scenario(str(path))
    window.close()
    settings.sync()
    again = make_window(speed=None)
    assert again.theme.name == "light" and again.speed == 2.0
    assert str(path.resolve()) in again.files.recent()


def test_save_and_open_keep_the_users_own_actions(window, qtbot, tmp_path):
    window.actions.scrubber.setValue(3)
    wait_idle(qtbot, window)
    window.actions.prompt_spin.setValue(5)
    window.add_sequence()
    wait_idle(qtbot, window)
    path = tmp_path / "branch.toml"
    window.files.save_scenario(str(path))
    assert window.files.open_scenario(str(path))
    frame = wait_idle(qtbot, window)
    assert frame.length == 4 and frame.operations[-1].describe() == "add s1 (5 tok)"


def test_a_save_dialog_starts_on_the_scenarios_name_where_the_users_files_are(window, qtbot, tmp_path, monkeypatch):
    """Not "scenario.toml" wherever the app was launched (a repository, say), nor among the
    shipped examples: the scenario's own name, in the folder of the last file saved or opened."""
    from pagesim.core.scenario import shipped_folder

    monkeypatch.chdir(tmp_path)
    name = window.files.default_save_path(".toml")
    slug = window.frame.scenario_name.lower().split()[0]
    assert Path(name).name.startswith(slug) and Path(name).suffix == ".toml"
    assert Path(name).parent != Path.cwd() and Path(name).parent.is_dir()
    window.files.open_scenario(str(shipped_folder() / "seed_demo.toml"))  # an example: not a place to save
    wait_idle(qtbot, window)
    assert Path(window.files.default_save_path(".toml")).parent.resolve() != shipped_folder().resolve()
    mine = tmp_path / "mine"
    mine.mkdir()
    window.files.save_scenario(str(mine / "saved.toml"))
    assert Path(window.files.default_save_path(".png")).parent == mine.resolve()
    assert window.files.default_save_path(".png").endswith(".png")


def test_opening_a_malformed_scenario_reports_it(window, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("num_blocks = 4\n")
    assert not window.files.open_scenario(str(bad))
    assert "bad.toml" in window.statusBar().currentMessage() and "block_size" in window.statusBar().currentMessage()


def test_export_event_log(window, qtbot, tmp_path):
    window.actions.scrubber.setValue(7)
    wait_idle(qtbot, window)
    path = tmp_path / "events.jsonl"
    with qtbot.waitSignal(window.controller.exported, timeout=10_000):
        window.controller.export_events(str(path))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert {r["event"] for r in records} >= {"Step", "BlockAllocated", "BlockCopied", "LookupPerformed"}
    assert max(r["step"] for r in records) == 7


@pytest.mark.parametrize(("scenario", "steps"), [("seed_demo", 2), ("default", 3)])
def test_screenshot_command(tmp_path, scenario, steps):
    out = tmp_path / "shot.png"
    script = Path(sys.executable).with_name("pagesim")
    done = subprocess.run(
        [str(script), "gui", scenario, "--steps", str(steps), "--screenshot", str(out), "--size", "1024x700"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # The step asked for (a real model's layer menu asks for a frame of the same step: not a step).
    assert f"at step {steps}" in done.stdout
    image = QImage(str(out))
    # Exactly the size asked for: set before the first frame only, it came out 1024 × 714.
    assert (image.width(), image.height()) == (1024, 700)


def test_waste_panel_compares_allocators_off_the_gui_thread(window, qtbot):
    window.waste_panel.count.setValue(100)
    with qtbot.waitSignal(window.controller.wasteReady, timeout=30_000) as blocker:
        window.waste_panel.run_button.click()
    wait_idle(qtbot, window)
    study = blocker.args[0]
    assert [r.allocator for r in study.allocators] == ["paged", "orca-oracle", "orca-pow2", "orca-max"]
    with pytest.raises(AttributeError):  # a frozen record, not a dict to write into
        study.count = 1
    tops = sum(bar.opts["height"] for bar in window.waste_panel.bars)
    np.testing.assert_allclose(tops, 100.0, atol=1e-6)  # each stack is the whole pool
    assert "token states" in window.waste_panel.summary.text()
    window.files.open_scenario(str(load_shipped("seed_demo").source))  # another pool: the study is stale
    wait_idle(qtbot, window)
    assert window.waste_panel.result is None and window.waste_panel.bars == []
    assert "Run a workload" in window.waste_panel.summary.text()


def test_scheduler_scenarios_show_their_queues(make_window, qtbot):
    window = make_window("preemption_swap")
    window.actions.scrubber.setValue(20)
    frame = wait_idle(qtbot, window)
    assert frame.queues is not None and frame.scheduler_counts["preemptions"] >= 1
    assert "scheduler" in window.memory_panel.summary.text()


def test_a_preemption_says_what_it_cost(make_window, qtbot):
    window = make_window("preemption_recompute")
    frame = None
    while frame is None or not any(type(e).__name__ == "RequestPreempted" for e in frame.events):
        qtbot.keyClick(window, Qt.Key.Key_Right)
        frame = wait_idle(qtbot, window)
        assert frame.position < frame.length, "the scenario should preempt"
    message = window.statusBar().currentMessage()
    assert "preempted by recompute" in message and "computed tokens dropped (computed again on its return)" in message
    assert message.startswith(f"step {frame.position}: ")
    # The next step has news of its own, or none: the preemption's message does not stay as if it were its.
    qtbot.keyClick(window, Qt.Key.Key_Right)
    after = wait_idle(qtbot, window)
    if not any(type(e).__name__ == "RequestPreempted" for e in after.events):
        assert "preempted" not in window.statusBar().currentMessage()


def test_bad_files_and_unwritable_paths_are_shown_not_raised(window, qtbot, tmp_path):
    binary = tmp_path / "binary.toml"
    binary.write_bytes(bytes(range(256)))
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    for path, message in ((binary, "not UTF-8"), (deep, "nested too deeply"), (tmp_path, "cannot read")):
        assert not window.files.open_scenario(str(path))
        assert message in window.last_error
    wait_idle(qtbot, window)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    window.files.save_scenario(str(blocker / "under-a-file.toml"))
    assert "could not save" in window.last_error


def test_an_action_mid_scenario_can_be_undone_redone_and_reloaded(window, qtbot):
    length = window.frame.length
    window.actions.scrubber.setValue(2)
    wait_idle(qtbot, window)
    assert not window.actions.undo_action.isEnabled()
    window.actions.add_action.trigger()  # Add (A): a new sequence, at step 2 of the script
    frame = wait_idle(qtbot, window)
    assert frame.length == 3 and frame.branch_step == 2 and frame.can_undo
    assert window.actions.scrubber.branch == 2 and "your branch from step 2" in window.header.scenario_title.full_text
    assert "set aside" in window.statusBar().currentMessage() and "Undo" in window.statusBar().currentMessage()
    window.actions.undo_action.trigger()  # Ctrl+Z
    frame = wait_idle(qtbot, window)
    assert frame.length == length and frame.position == 2 and frame.branch_step is None
    assert window.actions.scrubber.branch is None and window.actions.redo_action.isEnabled()
    assert "branch" not in window.header.scenario_title.full_text
    window.actions.redo_action.trigger()  # Ctrl+Shift+Z
    frame = wait_idle(qtbot, window)
    assert frame.length == 3 and frame.position == 3 and len(frame.sequences) == 3
    window.actions.reload_action.trigger()  # File → Reload: the script again, from step 0
    frame = wait_idle(qtbot, window)
    assert frame.length == length and frame.position == 0 and not frame.can_undo
    assert window.actions.undo_action.isEnabled() is False


def test_every_step_has_a_caption_and_the_step_log_follows_the_timeline(window, qtbot):
    window.memory_dock.raise_()  # the log behind another tab: it waits, and catches up when shown
    window.actions.scrubber.setValue(7)
    frame = wait_idle(qtbot, window)
    assert window.step_log.visibleRegion().isEmpty()
    window.step_log_dock.raise_()
    qtbot.waitUntil(lambda: window.step_log.currentRow() == 6, timeout=1000)
    caption = window.header.step_caption.plain_text()
    assert "Step 7" in caption and "copy-on-write gave it block 6" in caption
    assert "A2 writes into a block it shares" in caption  # the scenario's own narration of step 7
    log = window.step_log
    assert log.count() == frame.length and log.currentRow() == 6
    assert "copy-on-write" in log.item(6).text()
    log.itemClicked.emit(log.item(2))  # click the 3rd line: the timeline goes to step 3
    frame = wait_idle(qtbot, window)
    assert frame.position == 3 and log.currentRow() == 2 and "Step 3" in window.header.step_caption.plain_text()
    window.actions.add_action.trigger()  # a branch: the log is the new timeline's
    frame = wait_idle(qtbot, window)
    assert log.count() == frame.length == 4 and "arrived with" in log.item(3).text()

    def every_line_is_its_step(frame):
        return [log.item(i).text() for i in range(log.count())] == [
            f"{i + 1} · {text}" for i, text in enumerate(frame.captions)
        ]

    assert every_line_is_its_step(frame)
    window.actions.undo_action.trigger()  # the script's future comes back: the log grows again
    frame = wait_idle(qtbot, window)
    assert log.count() == frame.length > 4 and every_line_is_its_step(frame)
    for _ in range(3):  # played steps replace their "not played yet" lines, one at a time
        window.controller.forward()
        frame = wait_idle(qtbot, window)
        assert every_line_is_its_step(frame)


def test_a_full_pool_shows_its_refusal_in_the_pool_until_the_next_action(window, qtbot):
    window.actions.scrubber.setValue(2)
    frame = wait_idle(qtbot, window)
    free = len(frame.free_queue)
    window.actions.prompt_spin.setValue(4 * (free + 5))  # 5 blocks more than the free queue holds
    window.actions.add_action.trigger()
    qtbot.waitUntil(lambda: window.pool_view.refusal is not None, timeout=10_000)
    pool = window.pool_view
    assert pool.refusal == (free + 5, free) and pool.refusal_banner.isVisible()
    assert "5 short" in pool.refusal_banner.text()
    outlined = {item.block_id for item in pool.items if item.refused is not None}
    assert outlined == set(frame.free_queue)  # every free block, and only those
    assert window.frame.length == frame.length  # refused: nothing changed
    window.actions.forward_action.trigger()  # the next action clears it
    wait_idle(qtbot, window)
    assert pool.refusal is None and not pool.refusal_banner.isVisible()
    assert all(item.refused is None for item in pool.items)


def test_a_refusal_past_two_billion_blocks_is_still_shown_in_the_pool(window, qtbot):
    """The counts went through a Signal(int, int): an OverflowError, and no banner."""
    from pagesim.core.scenario import parse_scenario

    text = 'num_blocks = 8\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\n[[steps]]\nop = "add"\nseq = "<b>a<b>"\n'
    window.load(parse_scenario(text + "tokens = 10000000000\n", "huge.toml"))
    wait_idle(qtbot, window)
    window.controller.forward()
    qtbot.waitUntil(lambda: window.pool_view.refusal is not None, timeout=10_000)
    banner = window.pool_view.refusal_banner.text()
    assert window.pool_view.refusal == (2_500_000_000, 8) and "2499999992 short" in banner
    assert "&lt;b&gt;a&lt;b&gt;" in banner  # (the message's names as text, not markup)


def test_the_memory_plot_marks_where_a_contiguous_reservation_would_not_fit(window, qtbot):
    window.actions.scrubber.setValue(8)
    frame = wait_idle(qtbot, window)
    panel = window.memory_panel
    qtbot.waitUntil(lambda: panel.plotted is frame, timeout=2000)  # the history redraws ≤ 100 ms late
    assert panel.blocks_plot.ctrl.logYCheck.isChecked()  # a log axis: both lines readable
    pool = frame.config.num_blocks
    over = [m.step for m in frame.history if m.contiguous_blocks > pool]
    xs, ys = panel.overflow_curve.xData, panel.overflow_curve.yData
    marked = [int(x) for x, y in zip(xs, ys, strict=True) if y > pool]
    assert over and marked == over  # exactly the steps where it would not fit…
    crossings = [x for x, y in zip(xs, ys, strict=True) if y == pool]
    assert crossings and crossings[0] < over[0]  # …from where the line reaches the pool's
    assert "impossible" in panel.summary.text()


def test_open_example_lists_the_shipped_scenarios_in_a_learners_order(window, qtbot):
    from pagesim.core.scenario import SUGGESTED_ORDER, shipped_folder, shipped_scenarios

    menu = window.actions.examples_menu
    menu.aboutToShow.emit()  # filled when first opened
    titles = [a.text() for a in menu.actions()]
    assert len(titles) == len(shipped_scenarios()) and titles[0] == "1. Two sequences on scattered blocks"
    assert titles[1] == "2. A tour of paged KV memory" and SUGGESTED_ORDER[1] == "default"
    assert all(a.toolTip() for a in menu.actions())  # each says in a line what it shows
    menu.actions()[0].trigger()
    frame = wait_idle(qtbot, window)
    assert frame.scenario_name == "Two sequences on scattered blocks" and frame.position == 0
    assert (shipped_folder() / "default.toml").exists()  # File → Open starts there


def test_no_empty_axes_before_there_is_anything_to_attend(window, qtbot):
    window.check_fold.open()  # folded to its badge by default
    frame = wait_idle(qtbot, window)
    assert frame.position == 0
    assert not window.kernel_panel.plots.isVisible() and "Step forward" in window.kernel_panel.verdict.text()
    window.actions.forward_action.trigger()
    wait_idle(qtbot, window)
    window.select_sequence("A")
    qtbot.waitUntil(lambda: window.kernel_panel.plots.isVisible(), timeout=10_000)


def test_one_colour_system_owners_apart_and_free_never_an_owner_colour(window, qtbot):
    from pagesim.app.gui.palette import SequenceColours

    colours = SequenceColours()
    seqs = [f"s{i}" for i in range(28)]
    looks = {(colours(s).name(), colours.pattern(s)) for s in seqs}
    assert len(looks) == len(seqs)  # 28 owners, each its own colour and hatch
    free = {window.theme.free_block.lower(), "#999999"}
    assert not free & {colours(s).name().lower() for s in seqs}
    window.actions.scrubber.setValue(8)
    frame = wait_idle(qtbot, window)
    seq = window.selected_seq
    owner = window.colours(seq)
    brushes = window.kernel_panel.weight_bars.opts["brushes"]
    assert {b.color().name() for b in brushes} == {
        owner.name(),
        owner.darker(160).name(),
    }  # its colour, a shade a block
    assert window.token_map.colour.name() == owner.name()
    assert frame.focus.seq_id == seq


def test_a_selected_row_is_never_read_as_an_owners_colour(qapp):
    """The selection (a selected row, the scrubber's filled part) is a neutral grey: owners'
    colours are saturated, and the selection had been Okabe-Ito blue, the fifth request's."""
    from pagesim.app.gui.palette import SequenceColours, qpalette
    from PySide6.QtGui import QPalette

    colours = SequenceColours()
    owners = [colours(f"s{i}") for i in range(28)]
    least_saturated = min(owner.hsvSaturationF() for owner in owners)
    for theme in THEMES.values():
        selection = qpalette(theme).color(QPalette.ColorRole.Highlight)
        assert selection.hsvSaturationF() < min(0.25, least_saturated - 0.1), theme.name
        assert selection.name() not in {owner.name() for owner in owners}


def test_the_scheduler_shows_its_queues_as_lanes_and_the_cpu_pool_as_tiles(make_window, qtbot):
    window = make_window("preemption_swap")
    window.actions.scrubber.setValue(15)  # r3 is preempted by swap
    frame = wait_idle(qtbot, window)
    view = window.scheduler_view
    assert window.scheduler_dock.isVisible() and view.isVisible()  # in front for a scheduler scenario
    assert frame.queues["swapped"] == ("r3",) and set(frame.queues["running"]) == {"r1", "r2"}
    held = dict(frame.cpu_holders)
    assert frame.num_cpu_blocks == 32 and len(held) == 8
    assert all(seq.startswith("r3/") for seqs in held.values() for seq in seqs)
    assert view.moved_cpu == set(held)  # the step's swap out is lit on the CPU tiles
    window.actions.scrubber.setValue(24)  # swapped back in, in the step r1 and r2 finish
    frame = wait_idle(qtbot, window)
    assert frame.queues["swapped"] == () and "r3" in frame.queues["running"] and not frame.cpu_holders
    assert view.moved_cpu == set(held)  # the same CPU blocks, now emptied, lit again


def test_zoom_from_the_keys_centres_on_the_selected_sequence(make_window, qtbot):
    window = make_window("stress")
    window.actions.scrubber.setValue(40)
    wait_idle(qtbot, window)
    pool = window.pool_view
    mine = [item for item in pool.items if item.selected_seq]
    assert mine and window.selected_seq
    for _ in range(4):
        window.actions.zoom_in_action.trigger()
    centre = pool.mapToScene(pool.viewport().rect().center())
    area = mine[0].sceneBoundingRect()
    for item in mine[1:]:
        area = area.united(item.sceneBoundingRect())
    visible = pool.mapToScene(pool.viewport().rect()).boundingRect()
    assert visible.contains(area.center()) and abs(centre.y() - area.center().y()) < visible.height() / 2


def test_the_welcome_lists_the_examples_in_order_and_opens_one(window, qtbot, settings):
    assert window.welcome_due  # a first start
    dialog = window.show_welcome()
    qtbot.waitUntil(dialog.isVisible)
    from pagesim.core.scenario import shipped_scenarios

    assert dialog.list.count() == len(shipped_scenarios())
    assert dialog.list.item(0).text().startswith("1. Two sequences on scattered blocks")
    dialog.list.setCurrentRow(3)  # 4. prefix caching
    name = dialog.list.currentItem().data(Qt.ItemDataRole.UserRole)
    dialog.at_start.setChecked(False)
    dialog.accept()
    qtbot.waitUntil(lambda: not window.model_loader.loading, timeout=60_000)  # its model, on its own thread
    frame = wait_idle(qtbot, window)
    assert name == "shared_system_prompt" and frame.scenario_name.startswith("Shared system prompt")
    assert not window.welcome_due  # not again at the next start


def test_the_welcome_and_the_examples_menu_load_no_model_on_the_gui_thread(make_window, monkeypatch):
    """On a first start the welcome opens while the tour's model loads on its own thread
    (the first load dequantises for seconds): listing the examples must not load it again
    on the GUI thread, which would freeze the window for that long."""
    from pagesim.core.models import catalog

    window = make_window()
    loads = []
    monkeypatch.setattr(catalog, "load_model", lambda *a, **k: loads.append(a))
    dialog = window.show_welcome()
    window.actions.examples_menu.aboutToShow.emit()
    assert not loads
    assert dialog.list.count() == len(window.actions.examples_menu.actions()) == len(shipped_scenarios())
    dialog.reject()


def test_the_first_step_after_a_load_is_not_a_silent_wait(make_window, qtbot):
    window = make_window()
    qtbot.waitUntil(lambda: window.controller.kernel_ready, timeout=60_000)  # the default's, first
    with qtbot.waitSignal(window.controller.kernelReady, timeout=60_000) as ready:
        window.load(load_shipped("stress"))  # float16: another kernel to prepare
        assert "preparing the float16 kernel" in window.statusBar().currentMessage()
    dtype, seconds = ready.args
    assert dtype == "float16" and seconds >= 0 and window.controller.kernel_ready
    assert "kernel ready for float16" in window.statusBar().currentMessage()


def _truncated_texts(window) -> list[str]:
    """Every visible label or header cut without "…" and a tooltip, by Qt's font metrics."""
    from PySide6.QtGui import QTextDocument
    from PySide6.QtWidgets import QLabel

    out = []
    for label in window.findChildren(QLabel):
        if not label.isVisible() or not label.text():
            continue
        text = label.text()
        if "<" in text:  # rich text: measure what is shown
            doc = QTextDocument()
            doc.setHtml(text)
            text = doc.toPlainText()
        rect, metrics = label.contentsRect(), label.fontMetrics()
        if label.wordWrap():
            need = metrics.boundingRect(rect.adjusted(0, 0, 0, 100_000), int(Qt.TextFlag.TextWordWrap), text).height()
            cut = need > rect.height() + 2
        else:
            cut = metrics.horizontalAdvance(text) > rect.width() + 1
        if cut and not (text.rstrip().endswith("…") and label.toolTip()):
            out.append(text[:50])
    from pagesim.app.gui.views.live_text import LiveText

    for live in window.findChildren(LiveText):  # per-step labels: cut only with "…" and the text in the tooltip
        if live.isVisible() and live.is_cut and live.plain_text() not in live.toolTip():
            out.append(live.plain_text()[:50])
    header = window.sequence_view.header()
    for i in range(header.count()):
        visible = min(header.sectionSize(i), header.viewport().width() - header.sectionViewportPosition(i))
        if header.sectionSizeHint(i) > visible:
            out.append(window.sequence_view.headerItem().text(i))
    return out


@pytest.mark.parametrize("name", sorted(shipped_scenarios()))
def test_nothing_is_cut_without_an_ellipsis_at_1024_by_700(make_window, qtbot, name):
    window = make_window(name, real=True)
    window.resize(1024, 700)  # the Check panel folds to its badge…
    window.show_walkthrough()  # …and opened by hand, on its tallest page, it stays open
    window.actions.scrubber.setValue(min(8, window.frame.length))
    wait_idle(qtbot, window, timeout=90_000)  # eight steps of SmolLM2, each checked against its dense engine
    qtbot.wait(50)  # the layout settles at the new size
    # The window fits the size at all: the docks' minimum heights once summed to 713 px.
    assert window.size().toTuple() == (1024, 700)
    assert _truncated_texts(window) == []
    description = window.header.scenario_description
    if description.text() != description.full_text:  # a long description is elided…
        assert description.text().endswith("…")
        assert description.toolTip().startswith(description.text()[:-1].rstrip())  # …and whole in its tooltip
    # A long title keeps to one line instead of widening the centre (the block-table column
    # keeps its room) or pushing the pool down; cut, it ends in "…" and is whole in its tooltip.
    title = window.header.scenario_title
    assert title.width() <= window.centralWidget().width()
    assert title.height() < 2 * title.fontMetrics().lineSpacing()
    assert title.text() == title.full_text or (title.text().endswith("…") and title.toolTip() == title.full_text)


@pytest.mark.qt_log_ignore("does not support raise")  # (the offscreen platform, raising the tooltip)
def test_a_click_on_the_cut_description_shows_it_whole(make_window, qtbot):
    # From step 1 on the description keeps to one line: its tooltip, which nothing pointed
    # at, was the only way to read the rest.
    from PySide6.QtWidgets import QToolTip

    window = make_window("default")
    window.resize(1024, 700)
    window.actions.scrubber.setValue(3)
    wait_idle(qtbot, window)
    qtbot.wait(50)
    description = window.header.scenario_description
    assert description.max_lines == 1 and description.elided
    assert description.cursor().shape() == Qt.CursorShape.PointingHandCursor
    description.set_full_text("short")  # (shown whole: nothing to click for)
    assert not description.elided and description.cursor().shape() == Qt.CursorShape.ArrowCursor
    description.set_full_text(window.frame.scenario_description)
    QToolTip.hideText()
    qtbot.mouseClick(description, Qt.MouseButton.LeftButton)
    assert QToolTip.text() == description.full_text
    QToolTip.hideText()


def window_at(make_window, qtbot, scenario: str, size: tuple[int, int], step: int):
    """A window of ``size`` showing ``scenario`` at ``step``, its layout settled."""
    window = make_window(scenario)
    window.resize(*size)
    window.actions.scrubber.setValue(step)
    wait_idle(qtbot, window)
    qtbot.wait(50)
    return window


@pytest.mark.parametrize("size", [(1024, 700), (1280, 800)])
def test_the_match_per_head_and_every_axis_label_fit_in_a_small_window(make_window, qtbot, size):
    window = window_at(make_window, qtbot, "default", size, 6)
    window.check_fold.open()  # folded to its badge by default: opened, it must still fit
    qtbot.wait(50)
    panel = window.kernel_panel
    # The error plot is not below the fold: all of it is inside the window.
    top_left = panel.error_view.mapTo(window, QPoint(0, 0))
    assert panel.error_view.isVisible() and top_left.y() >= 0
    assert top_left.y() + panel.error_view.height() <= window.height()

    # …and none of it under the plots below it (their scroll area covered its lower half, the
    # head numbers with it, at 1024 × 700)
    def on_window(widget) -> QRect:
        return QRect(widget.mapTo(window, QPoint(0, 0)), widget.size())

    assert not on_window(panel.error_view).intersects(on_window(panel.plots))
    # No rotated axis label is longer than its axis ("weight" shown as "eight").
    for plot in (panel.error_plot, panel.output_plot, panel.weights_plot):
        axis = plot.getAxis("left")
        assert axis.label.boundingRect().width() <= axis.height(), axis.labelText


def test_tile_ids_are_readable_at_every_zoom_or_not_drawn(make_window, qtbot):
    from pagesim.app.gui.views.pool_view import COMPACT_ID_DETAIL, MIN_LABEL_PX, SLOTS_DETAIL, label_pixel_size

    for detail in np.linspace(COMPACT_ID_DETAIL, 2.5, 60):
        compact = detail < SLOTS_DETAIL
        assert round(label_pixel_size(detail, compact)) * detail >= MIN_LABEL_PX - 0.5, detail
    window = make_window("default")
    window.resize(1024, 700)
    wait_idle(qtbot, window)
    qtbot.wait(50)
    pool = window.pool_view
    detail = pool.transform().m11()
    assert detail >= COMPACT_ID_DETAIL  # 24 blocks at 1024 × 700: every id is drawn
    _, metrics = pool.sized_font(label_pixel_size(detail, detail < SLOTS_DETAIL))
    assert metrics.horizontalAdvance("#23") <= 60 - 8  # and fits its tile


@pytest.mark.parametrize("step, out", [(15, True), (24, False)])
def test_a_swap_flies_its_tiles_between_the_gpu_and_cpu_pools(make_window, qtbot, step, out):
    window = make_window("preemption_swap", speed=1.0)
    window.resize(1280, 800)
    window.actions.scrubber.setValue(step - 1)
    wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: not window.director.running, timeout=10_000)
    qtbot.keyClick(window, Qt.Key.Key_Right)
    frame = wait_idle(qtbot, window)
    kind = ev.BlockSwappedOut if out else ev.BlockSwappedIn
    swaps = [e for e in frame.events if isinstance(e, kind)]
    assert len(swaps) == 8
    flight = window.swap_flight
    qtbot.waitUntil(lambda: flight.isVisible() and 0.3 < flight.progress < 0.7, timeout=5_000)
    assert len(flight.flights) == len(swaps)
    pool = window.pool_view.viewport()
    cpu = window.scheduler_view
    gpu_area = QRectF(pool.mapTo(window, QPoint(0, 0)), QSizeF(pool.size()))
    cpu_area = QRectF(cpu.mapTo(window, QPoint(0, 0)), QSizeF(cpu.size()))
    for (src, dst, _, label), event in zip(flight.flights, swaps, strict=True):
        start, end = (gpu_area, cpu_area) if out else (cpu_area, gpu_area)
        assert start.contains(src.center()) and end.contains(dst.center())
        assert label == f"#{event.block}"
    now = flight.tile_at(0).center()  # mid-flight: between the two pools
    src, dst = flight.flights[0][0].center(), flight.flights[0][1].center()
    assert min(src.y(), dst.y()) < now.y() < max(src.y(), dst.y())
    qtbot.waitUntil(lambda: not window.director.running, timeout=10_000)
    assert not flight.isVisible() and not flight.flights


def test_a_decode_step_repaints_but_never_re_lays_out_the_window(make_window, qtbot):
    """A relayout of the main window or a dock costs milliseconds and repaints what moved;
    a step that only changes numbers must not cause one (a QLabel's setText or a spin
    box's setMaximum each did, every step)."""
    from pagesim.app.gui.bench import big_scenario
    from PySide6.QtCore import QEvent, QObject
    from PySide6.QtWidgets import QApplication, QDockWidget

    window = make_window()
    window.resize(1400, 860)
    window.load(big_scenario(32, 40))
    wait_idle(qtbot, window)
    window.controller.seek(32)  # every sequence added; then only decode steps
    wait_idle(qtbot, window)
    for _ in range(3):  # a label may grow a line once
        window.controller.forward()
        wait_idle(qtbot, window)
    qtbot.wait(50)

    class Layouts(QObject):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def eventFilter(self, obj, event) -> bool:
            if event.type() == QEvent.Type.LayoutRequest and isinstance(obj, window.__class__ | QDockWidget):
                self.seen.append(obj.objectName() or type(obj).__name__)
            return False

    layouts = Layouts()
    QApplication.instance().installEventFilter(layouts)
    try:
        for _ in range(10):
            window.controller.forward()
            wait_idle(qtbot, window)
            qtbot.wait(5)
    finally:
        QApplication.instance().removeEventFilter(layouts)
    assert window.frame.position == 32 + 3 + 10
    assert layouts.seen == []


@pytest.mark.parametrize("size", [(1024, 700), (1920, 1080)])
def test_the_attention_plots_block_ids_are_inside_the_plot(make_window, qtbot, size):
    """The ids sat on the tallest bar, above the auto-ranged view, and were cut in half."""
    window = window_at(make_window, qtbot, "parallel_sampling", size, 10)
    window.check_fold.open()  # folded to its badge by default
    qtbot.wait(50)
    panel = window.kernel_panel
    view = panel.weights_plot.getViewBox()
    shown = [label for label in panel._block_labels if label.isVisible()]
    assert len(shown) >= 2
    area = view.sceneBoundingRect()
    for label in shown:
        box = label.sceneBoundingRect()
        assert area.top() - 0.5 <= box.top() and box.bottom() <= area.bottom() + 0.5, label.toPlainText()


def test_plot_axes_show_their_values_unscaled_after_a_theme_change(window, qtbot):
    """A weight of 0.03 reads 0.03 on its axis, not 30 with an "(x0.001)" the label lost."""
    from pagesim.app.gui.views.plots import Plot

    window.actions.scrubber.setValue(3)
    wait_idle(qtbot, window)
    for theme in ("light", "dark"):
        window.apply_theme(theme)
        views = window.findChildren(pg.GraphicsView)
        plots = [item for view in views for item in view.items() if isinstance(item, Plot)]
        assert plots
        for plot in plots:
            for side in ("left", "bottom"):
                axis = plot.getAxis(side)
                assert axis.autoSIPrefixScale == 1.0 and axis.labelUnitPrefix == "", (plot.titleLabel, side)


def test_a_v1_scenario_at_step_0_shows_its_empty_lanes_and_its_null_block(make_window):
    window = make_window("prefix_caching_v1")
    assert window.frame.position == 0 and window.frame.metrics is None
    assert window.frame.queues == {"waiting": (), "running": (), "swapped": (), "finished": ()}
    free = window.frame.config.num_blocks - 1
    assert window.memory_panel.summary.text().startswith(f"{free} blocks free (block 0 is the null block)")


def test_the_rounding_bounds_label_takes_the_themes_text_colour(window):
    for theme in ("light", "dark"):
        window.apply_theme(theme)
        assert window.kernel_panel.tolerance_line.label.color.name() == window.theme.text


def test_home_pressed_while_a_seek_to_the_end_runs_wins(make_window, qtbot):
    window = make_window("preemption_recompute")
    window.actions.start_action.trigger()
    wait_idle(qtbot, window)
    assert window.frame.position == 0 and not window.actions.start_action.isEnabled()
    window.actions.end_action.trigger()  # the worker is busy with it now: the frame shown is still step 0
    assert window.frame.position == 0 and window.actions.start_action.isEnabled()
    window.actions.start_action.trigger()
    wait_idle(qtbot, window)
    assert window.frame.position == 0


def test_an_action_past_the_scripts_end_is_not_said_to_set_later_steps_aside(make_window, qtbot):
    window = make_window("seed_demo")
    window.actions.scrubber.setValue(window.frame.length)  # the last step: nothing scripted after it
    wait_idle(qtbot, window)
    window.selection.current = window.frame.sequences[0].seq_id
    button(window, window.actions.grow_action).click()
    wait_idle(qtbot, window)
    message = window.statusBar().currentMessage()
    assert "went on past the script's last step" in message and "set aside" not in message
    window.actions.scrubber.setValue(1)  # mid-script: its later steps are set aside
    wait_idle(qtbot, window)
    button(window, window.actions.grow_action).click()
    wait_idle(qtbot, window)
    assert "branched off the script at step 1: its later steps are set aside" in window.statusBar().currentMessage()
    window.controller.undo()  # the branch is taken back: so is the message about it
    wait_idle(qtbot, window)
    assert "branched" not in window.statusBar().currentMessage()


def test_the_view_menu_marks_the_theme_in_use(make_window, qtbot):
    window = make_window("seed_demo")
    marks = window.actions.theme_actions
    in_use = next(name for name, theme in THEMES.items() if theme is window.theme)
    assert marks[in_use].isChecked() and sum(a.isChecked() for a in marks.values()) == 1
    other = next(name for name in THEMES if name != in_use)
    marks[other].trigger()
    assert window.theme is THEMES[other] and marks[other].isChecked() and not marks[in_use].isChecked()
    window.apply_theme(in_use)  # (from elsewhere, as a saved setting does)
    assert marks[in_use].isChecked() and not marks[other].isChecked()


def test_a_click_on_the_scrubbers_track_goes_to_the_step_under_the_pointer(make_window, qtbot):
    """It moved a page of ten steps toward the click."""
    from PySide6.QtTest import QTest

    window = make_window("stress")
    scrubber = window.actions.scrubber
    assert scrubber.maximum() > 100 and scrubber.value() == 0
    groove, handle = scrubber._rects()
    x = groove.x() + handle.width() // 2 + int(0.75 * (groove.width() - handle.width()))
    QTest.mouseClick(
        scrubber, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, QPoint(x, groove.center().y())
    )
    assert abs(scrubber.value() - 0.75 * scrubber.maximum()) <= 2


def test_the_step_logs_long_lines_end_in_an_ellipsis_not_behind_a_scroll_bar(window, qtbot):
    """Once a sideways scroll bar appeared, long lines were cut without a mark and the current
    line sat half behind the bar."""
    log = window.step_log
    assert log.horizontalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAlwaysOff
    assert log.textElideMode() == Qt.TextElideMode.ElideRight
    window.actions.scrubber.setValue(7)
    wait_idle(qtbot, window)
    window.step_log_dock.raise_()
    window.step_log_dock.show()
    log.catch_up()
    assert log.count() and log.item(0).toolTip() == log.item(0).text()  # the whole line, on hover


def test_on_a_large_screen_the_check_panel_shows_all_of_itself_without_scrolling(make_window, qtbot):
    # (the plots' own size hint made the panel taller than a 1080-px dock: it scrolled)
    window = window_at(make_window, qtbot, "default", (1920, 1080), 5)
    window.check_fold.open()
    qtbot.wait(100)
    scroll = window.kernel_panel.scroll
    assert scroll.verticalScrollBar().maximum() == 0
    assert scroll.widget().height() <= scroll.viewport().height()


def test_names_and_descriptions_from_a_file_show_as_text_not_markup(window, qtbot):
    """A scenario's name drew as a 90-pixel heading; a sequence '<i>it<i>&amp;' as italic 'it&'."""
    from pagesim.core.scenario import parse_scenario

    text = (
        'name = "<h1>BIG</h1>"\ndescription = "<a href=\'x\'>link</a>"\n'
        "num_blocks = 8\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\n"
        '[[steps]]\nop = "add"\nseq = "<i>it<i>&amp;"\ntokens = 3\n'
    )
    window.load(parse_scenario(text, "html.toml"))
    wait_idle(qtbot, window)
    window.controller.forward()
    wait_idle(qtbot, window)
    header = window.header
    assert (
        header.scenario_title.textFormat() == Qt.TextFormat.PlainText and "<h1>BIG</h1>" in header.scenario_title.text()
    )
    assert header.scenario_description.textFormat() == Qt.TextFormat.PlainText
    assert "&lt;i&gt;it&lt;i&gt;&amp;amp;" in window.actions.step_label.text()


def test_a_block_of_millions_of_slots_is_painted_as_a_fill_bar(window, qtbot):
    """Each slot was a rectangle: a block of 10^7 slots froze the window for a minute a paint."""
    from pagesim.core.scenario import parse_scenario

    tile = window.pool_view.items[0]
    assert tile.shows_slots(1.0) and not tile.shows_slots(0.5)  # 16 slots: drawn unless too small
    text = 'num_blocks = 2\nblock_size = 10000000\nnum_heads = 1\nhead_dim = 1\n[[steps]]\nop = "add"\nseq = "a"\n'
    window.load(parse_scenario(text + "tokens = 3\n", "wide.toml"))
    wait_idle(qtbot, window)
    tile = window.pool_view.items[0]
    assert not any(tile.shows_slots(zoom) for zoom in (1.0, 4.0, 20.0))
    assert tile.shows_slots(200.0)  # (each slot a pixel at last)


def test_add_or_fork_pressed_quickly_gives_each_its_own_name(window, qtbot):
    """Each took the next name from the last frame shown: two of three adds were refused as
    'sequence 's1' already exists', a name the user never typed."""
    window.actions.prompt_spin.setValue(1)
    errors = []
    window.controller.errorRaised.connect(errors.append)
    before = {s.seq_id for s in window.frame.sequences}
    for _ in range(3):
        window.actions.add_action.trigger()
    frame = wait_idle(qtbot, window)
    added = {s.seq_id for s in frame.sequences} - before
    assert len(added) == 3 and errors == []
    window.select_sequence(sorted(added)[0])
    for _ in range(3):
        window.actions.fork_action.trigger()
    frame = wait_idle(qtbot, window)
    assert len({s.seq_id for s in frame.sequences} - before - added) == 3 and errors == []
