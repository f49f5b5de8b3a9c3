"""The window's files and settings: atomic saves, failed loads that change nothing, and a
settings file whose bad values fall back to their defaults."""

import math
import os
import subprocess
import sys
import time

import pytest
import shiboken6
from pagesim.app.gui.settings import SETTINGS, SPEED_VALUES, read_setting
from pagesim.core.scenario import load_shipped
from pagesim.core.timeline import Timeline
from PySide6.QtCore import QByteArray, QSettings
from PySide6.QtGui import QPixmap

from tests.app.conftest import FAILING_STEP, wait_idle

HEADER = "num_blocks = 8\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\n"


# -- atomic saves ---------------------------------------------------------------------
def test_a_failed_save_keeps_the_file_it_would_overwrite(window, tmp_path, full_disk):
    path = tmp_path / "mine.toml"
    path.write_text("the old scenario")
    window.files.save_scenario(str(path))
    assert path.read_text() == "the old scenario"
    assert str(path) in window.last_error and "No space left" in window.last_error
    assert not [p.name for p in tmp_path.iterdir() if ".tmp" in p.name]
    assert str(path.resolve()) not in window.files.recent()


def test_a_failed_screenshot_keeps_the_old_picture(window, tmp_path, full_disk):
    path = tmp_path / "shot.png"
    path.write_bytes(b"old picture")
    assert not window.files.save_screenshot(str(path))
    assert path.read_bytes() == b"old picture"
    assert str(path) in window.last_error and "No space left" in window.last_error


def test_a_screenshot_is_written_whole(window, tmp_path, monkeypatch):
    path = tmp_path / "shot.png"
    assert window.files.save_screenshot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p.name for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_a_window_that_cannot_be_captured_says_so_not_could_not_write(window, tmp_path, monkeypatch):
    monkeypatch.setattr(window, "grab", lambda *a: QPixmap())  # what a too-large grab gives
    path = tmp_path / "huge.png"
    assert not window.files.save_screenshot(str(path))
    assert "could not capture the window" in window.last_error and str(path) in window.last_error
    assert not path.exists()


def test_an_export_failure_names_the_path_and_the_reason(window, qtbot, tmp_path, full_disk):
    path = tmp_path / "events.jsonl"
    path.write_text("old log\n")
    with qtbot.waitSignal(window.controller.errorRaised, timeout=10_000) as blocker:
        window.controller.export_events(str(path))
    message = blocker.args[0]
    assert str(path) in message and "No space left" in message and "event log" in message
    assert path.read_text() == "old log\n"


# -- a failed load changes nothing ------------------------------------------------------
@pytest.mark.parametrize("save", ["scenario", "screenshot", "events"])
def test_a_pipe_or_a_device_is_refused_as_a_place_to_save(window, tmp_path, save):
    """A FIFO blocked the window (or, for the event log, the worker, so that the window could
    never close) until a reader came; /dev/null 'saved' and joined the recent files."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (str(fifo), os.devnull):
        started = time.perf_counter()
        if save == "scenario":
            window.files.save_scenario(path)
        elif save == "screenshot":
            assert not window.files.save_screenshot(path)
        else:
            window.files.export_events(path)
        assert time.perf_counter() - started < 5
        assert f"{path} is not a regular file" in window.last_error
        assert path not in window.files.recent()


def test_save_after_a_failed_open_writes_the_current_scenario(window, qtbot, tmp_path):
    window.actions.scrubber.setValue(3)
    before = wait_idle(qtbot, window)
    recent = window.files.recent()
    huge = tmp_path / "huge.toml"  # parses; its pool cannot be allocated
    huge.write_text('name = "Too big"\nnum_blocks = 1000000000\nblock_size = 16\nnum_heads = 8\nhead_dim = 128\n')
    with qtbot.waitSignal(window.controller.errorRaised, timeout=20_000) as blocker:
        assert window.files.open_scenario(str(huge))  # it parsed: the worker is asked to build it
    wait_idle(qtbot, window)
    assert str(huge) in blocker.args[0] and "current scenario stays" in blocker.args[0]
    assert window.controller.scenario.name == before.scenario_name != "Too big"
    assert window.frame is before or window.frame.position == before.position
    assert window.files.recent() == recent  # the failed file did not join Recent
    saved = tmp_path / "saved.toml"
    window.files.save_scenario(str(saved))
    from pagesim.core.scenario import load_scenario

    again = load_scenario(saved)
    assert again.name == before.scenario_name and again.config.num_blocks != 1_000_000_000
    assert again.operations == tuple(before.operations)
    assert str(huge.resolve()) not in window.files.recent()


def test_a_load_that_goes_through_joins_recent(window, qtbot, tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text('name = "ok"\n' + HEADER)
    assert window.files.open_scenario(str(path))
    frame = wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: window.frame.scenario_name == "ok")
    assert frame is not None and window.controller.scenario.name == "ok"
    assert window.files.recent()[0] == str(path.resolve())


# -- a seek that fails shows where it stopped ---------------------------------------------


def engine_position(window) -> int:
    return window.controller._worker._timeline.position  # read while the worker is idle


@pytest.mark.parametrize("start", [0, 2], ids=["scrub-past-it", "scrub-onto-it"])
def test_a_seek_onto_a_failing_step_lands_the_window_and_the_engine_on_the_step_before(window, qtbot, tmp_path, start):
    path = tmp_path / "tight.toml"
    path.write_text(FAILING_STEP)
    assert window.files.open_scenario(str(path))
    qtbot.waitUntil(lambda: window.frame.scenario_name == "tight" and window.controller.pending == 0)
    window.actions.scrubber.setValue(start)
    wait_idle(qtbot, window)
    with qtbot.waitSignal(window.controller.errorRaised, timeout=10_000) as blocker:
        window.actions.scrubber.setValue(4 if start == 0 else 3)
    frame = wait_idle(qtbot, window)
    assert engine_position(window) == frame.position == window.actions.scrubber.value() == 2
    assert frame.sequence("a").num_tokens == 4 and frame.attention is not None and frame.attention.passed
    assert window.actions.step_label.text().startswith("step 2 / 4")
    message = window.statusBar().currentMessage()
    assert message == f"⚠ {blocker.args[0]}"
    assert "step 3" in message and "grow a +50" in message and "stopped at step 2" in message
    assert window.pool_view.refusal is not None  # the pool shows the shortfall, as for an action
    # The next action branches from the state shown.
    window.actions.grow_spin.setValue(1)
    window.select_sequence("a")
    window.grow_selected(1)
    frame = wait_idle(qtbot, window)
    assert engine_position(window) == frame.position == window.actions.scrubber.value() == 3
    assert frame.sequence("a").num_tokens == 5


def test_a_refused_request_puts_a_moved_scrubber_back(window, qtbot):
    wait_idle(qtbot, window)
    window.actions._frame = window.frame
    window.actions.scrubber.blockSignals(True)
    window.actions.scrubber.setValue(5)  # moved, and its seek lost
    window.actions.scrubber.blockSignals(False)
    window.controller.errorRaised.emit("refused")
    assert window.actions.scrubber.value() == window.frame.position == 0


# -- context menus do not pile up --------------------------------------------------------
OFFSCREEN_POPUP = "This plugin does not support"  # a popup grabs the keyboard and raises itself; offscreen cannot


@pytest.mark.qt_log_ignore(OFFSCREEN_POPUP)
def test_right_clicks_leave_no_menus_behind(window, qtbot):
    from PySide6.QtCore import QPoint
    from PySide6.QtWidgets import QApplication, QMenu

    window.actions.scrubber.setValue(3)
    frame = wait_idle(qtbot, window)
    before = len(window.findChildren(QMenu))
    view, pool = window.sequence_view, window.pool_view
    held = frame.sequences[0].block_table[0]
    free = next(b for b in range(len(pool.items)) if b not in frame.holders)
    for n in range(60):
        if n % 3 == 0:
            rect = view.visualItemRect(view.topLevelItem(0))
            view.customContextMenuRequested.emit(rect.center())
        else:
            block = held if n % 3 == 1 else free
            pool.blockContextMenu.emit(block, QPoint(10, 10))
        menu = QApplication.activePopupWidget()
        assert isinstance(menu, QMenu) and menu.actions()
        menu.close()
        qtbot.wait(1)  # deleteLater runs
    assert len(window.findChildren(QMenu)) <= before + 1


@pytest.mark.qt_log_ignore(OFFSCREEN_POPUP)
def test_a_context_menus_action_still_runs_though_the_menu_goes(window, qtbot):
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    window.actions.scrubber.setValue(3)
    frame = wait_idle(qtbot, window)
    view = window.sequence_view
    seq = frame.sequences[0]
    view.customContextMenuRequested.emit(view.visualItemRect(view.topLevelItem(0)).center())
    menu = QApplication.activePopupWidget()
    where = menu.actionGeometry(window.actions.grow_action).center()
    qtbot.mouseClick(menu, Qt.MouseButton.LeftButton, pos=where)
    frame = wait_idle(qtbot, window)
    assert frame.sequence(seq.seq_id).num_tokens == seq.num_tokens + 1
    qtbot.waitUntil(lambda: not shiboken6.isValid(menu))


# -- settings ---------------------------------------------------------------------------
BAD_VALUES = {
    "speed": ["fast", "nan", "inf", "1e-300", 1e308, [1, 2], "-1"],
    "prompt_len": ["10.5", 10.5, str(10**30), "1e400", ["a"], "ten", 0],
    "theme": ["purple", 3, ["dark"]],
    "welcome_at_start": ["maybe", 2],
    "recent": [5, [1, 2]],
    "geometry": ["garbage", 12, ["x"]],
    "windowState": ["garbage", 3.5],
}


@pytest.mark.parametrize("key, bad", [(k, v) for k, vs in BAD_VALUES.items() for v in vs])
def test_a_bad_setting_falls_back_to_its_default_once_with_a_note(tmp_path, key, bad):
    settings = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    settings.setValue(key, bad)
    notes = []
    assert read_setting(settings, key, notes.append) == SETTINGS[key].default
    assert len(notes) == 1 and key in notes[0]
    assert read_setting(settings, key, notes.append) == SETTINGS[key].default
    assert len(notes) == 1  # removed from the file: once


def test_an_undecodable_setting_is_dropped_by_its_own_name_not_the_first_key_read(tmp_path):
    """PySide raises a value it cannot decode at the first read, whichever key: the good
    theme was reset and removed, and the broken windowState never named."""
    path = tmp_path / "s.ini"
    broken = "@Variant(\\0\\0\\0\\x7f\\0\\0\\0\\x18PySide::PyObjectWrapper\\0\\0\\0\\0\\x5\\x80\\x4\\x95\\xff)"
    path.write_text(f"[General]\ntheme=light\nwindowState={broken}\n")
    settings = QSettings(str(path), QSettings.Format.IniFormat)
    notes = []
    assert read_setting(settings, "theme", notes.append) == "light"
    assert len(notes) == 1 and "windowState" in notes[0] and "theme" not in notes[0]
    assert sorted(settings.allKeys()) == ["theme"]


def test_good_settings_read_back_from_the_file(tmp_path):
    path = str(tmp_path / "s.ini")
    settings = QSettings(path, QSettings.Format.IniFormat)
    for key, value in (("speed", 0.25), ("prompt_len", 42), ("theme", "light"), ("welcome_at_start", False)):
        settings.setValue(key, value)
    settings.setValue("recent", ["/a.toml"])
    settings.setValue("geometry", QByteArray(b"\x01\x02"))
    settings.sync()
    fresh = QSettings(path, QSettings.Format.IniFormat)  # as strings from the INI text
    notes = []
    values = {k: read_setting(fresh, k, notes.append) for k in SETTINGS}
    assert notes == []
    assert values["speed"] == 0.25 and values["prompt_len"] == 42 and values["theme"] == "light"
    assert values["welcome_at_start"] is False and values["recent"] == ["/a.toml"]
    assert bytes(values["geometry"]) == b"\x01\x02"


def test_speed_values_are_the_speed_boxs():
    from pagesim.app.gui.actions import SPEEDS

    assert tuple(s for _, s in SPEEDS) == SPEED_VALUES


@pytest.mark.qt_log_ignore("Trying to construct an instance of an invalid type")  # Qt, on @Variant(garbage)
def test_a_settings_file_full_of_garbage_starts_the_app_with_a_note(qtbot, tmp_path):
    from pagesim.app.gui.main_window import MainWindow

    path = tmp_path / "garbage.ini"
    path.write_text(
        "[General]\nspeed=fast\nprompt_len=10.5\ntheme=purple\nwelcome_at_start=maybe\n"
        "geometry=not a geometry\nwindowState=@ByteArray(nonsense)\nrecent=@Variant(garbage)\n"
    )
    settings = QSettings(str(path), QSettings.Format.IniFormat)
    window = MainWindow("cpu", settings=settings)
    qtbot.addWidget(window)
    try:
        assert window.speed == 1.0 and window.theme.name == "dark"
        assert window.actions.prompt_spin.value() == 10
        assert window.welcome_due is True
        assert any("speed" in n for n in window.settings_notes)
        assert "settings: ignored" in window.statusBar().currentMessage()
        window.show()
        window.load(load_shipped("seed_demo"))
        wait_idle(qtbot, window)
    finally:
        window.close()


@pytest.mark.parametrize("speed", [1e-300, math.nan, math.inf, -math.inf, -3.0, 1e308])
def test_odd_speeds_never_break_play(make_window, qtbot, speed):
    window = make_window("seed_demo", speed=speed)
    assert window.speed in SPEED_VALUES
    assert 1 <= window.controller.step_interval_ms <= 10_000
    window.controller.play()
    qtbot.waitUntil(lambda: window.frame.position == window.frame.length, timeout=30_000)
    qtbot.waitUntil(lambda: not window.controller.playing, timeout=10_000)


# -- the display check ------------------------------------------------------------------
@pytest.mark.skipif(sys.platform != "linux", reason="X11 and Wayland are Linux's")
@pytest.mark.parametrize("platform", ["xcb", "wayland"])
def test_an_explicit_platform_without_its_display_is_a_clear_error(platform, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["QT_QPA_PLATFORM"] = platform
    for extra in ([], ["--screenshot", str(tmp_path / "x.png")]):
        done = subprocess.run(
            [sys.executable, "-m", "pagesim.app.cli", "gui", "seed_demo", *extra],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr  # not an abort (negative: killed by SIGABRT)
        lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and f"QT_QPA_PLATFORM={platform}" in lines[0]
        assert "Traceback" not in done.stderr


# -- closing never waits for the worker ---------------------------------------------------
LONG_SCENARIO = (
    'name = "long"\nnum_blocks = 4096\nblock_size = 16\nnum_heads = 2\nhead_dim = 8\n'
    '[[steps]]\nop = "add"\nseq = "a"\ntokens = 4\n' + '[[steps]]\nop = "grow"\nseq = "a"\n' * 6000
)


def test_the_window_closes_within_a_second_during_a_long_seek(make_window, qtbot, tmp_path, monkeypatch):
    check_stop = Timeline._check_stop

    def slow_check_stop(timeline):  # a millisecond a step: the seek takes 6 s on any machine
        time.sleep(0.001)
        check_stop(timeline)

    monkeypatch.setattr(Timeline, "_check_stop", slow_check_stop)
    window = make_window("seed_demo")
    path = tmp_path / "long.toml"
    path.write_text(LONG_SCENARIO)
    assert window.files.open_scenario(str(path))
    qtbot.waitUntil(lambda: window.frame.scenario_name == "long" and window.controller.pending == 0, timeout=30_000)
    window.actions.scrubber.setValue(6001)  # a seek of several seconds on the worker
    qtbot.wait(300)
    assert window.controller.pending == 1  # still seeking
    started = time.perf_counter()
    window.close()
    assert time.perf_counter() - started < 1.0
    assert not window.controller._thread.isRunning()


def test_a_reload_that_fails_says_so_and_keeps_the_scenario(window, qtbot, tmp_path):
    """Its error was at once replaced by 'reloaded …'; a file gone was reloaded without a word."""
    path = tmp_path / "mine.toml"
    path.write_text(HEADER + '[[steps]]\nop = "add"\nseq = "a"\ntokens = 3\n')
    assert window.files.open_scenario(str(path))
    wait_idle(qtbot, window)
    path.write_text("num_blocks = [")
    window.actions.reload_action.trigger()
    assert "mine.toml" in window.last_error and "reloaded" not in window.statusBar().currentMessage()
    assert window.controller.scenario.source == str(path)  # the scenario stays
    path.unlink()
    window.actions.reload_action.trigger()
    assert f"reloaded mine as it was read: {path} is no longer there" in window.statusBar().currentMessage()
    wait_idle(qtbot, window)
