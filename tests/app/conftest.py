from pathlib import Path

import pytest
import shiboken6
from pagesim.app.gui.animation import LIVE_ANIMATIONS
from pagesim.app.gui.controller import LIVE_THREADS, LIVE_TIMERS
from pagesim.core.scenario import load_scenario, load_shipped
from PySide6.QtCore import QSettings

from tests.scenarios import synthetic

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture
def settings(tmp_path):
    return QSettings(str(tmp_path / "pagesim.ini"), QSettings.Format.IniFormat)


# Step 3 asks for more blocks than the pool holds: a step that fails when played or replayed.
FAILING_STEP = (
    'name = "tight"\nnum_blocks = 4\nblock_size = 2\nnum_heads = 1\nhead_dim = 8\n'
    '[[steps]]\nop = "add"\nseq = "a"\ntokens = 3\n'
    '[[steps]]\nop = "grow"\nseq = "a"\n'
    '[[steps]]\nop = "grow"\nseq = "a"\ntokens = 50\n'
    '[[steps]]\nop = "grow"\nseq = "a"\n'
)


def wait_idle(qtbot, window, timeout=20_000):
    """Until every request sent to the worker has been answered."""
    qtbot.waitUntil(lambda: window.frame is not None and window.controller.pending == 0, timeout=timeout)
    return window.frame


@pytest.fixture
def make_window(qtbot, settings):
    from pagesim.app.gui.main_window import MainWindow

    windows = []

    def make(scenario="default", speed=0.0, real=False):
        """A window on the shipped ``scenario``: its copy on the synthetic token model
        where the shipped one runs SmolLM2 (the window's own behaviour, at the old speed
        and with the old numbers), or the shipped one itself with ``real``."""
        window = MainWindow("cpu", settings=settings, speed=speed)
        qtbot.addWidget(window)
        window.show()
        copy = Path(synthetic(scenario))
        window.load(load_shipped(scenario) if real or not copy.is_file() else load_scenario(copy))
        wait_idle(qtbot, window)
        windows.append(window)
        return window

    yield make
    for window in windows:
        window.close()


@pytest.fixture
def window(make_window):
    return make_window()


@pytest.fixture(autouse=True)
def nothing_left_running(request):
    """Fail a test that leaves a worker thread, a timer or an animation running."""
    yield
    if "qtbot" not in request.fixturenames:
        return
    # An object whose C++ side Qt already deleted cannot be running (its wrapper may outlive it).
    threads, timers, animations = (
        [o for o in list(s) if shiboken6.isValid(o)] for s in (LIVE_THREADS, LIVE_TIMERS, LIVE_ANIMATIONS)
    )
    running = [t.objectName() for t in threads if t.isRunning()]
    running += [t.objectName() for t in timers if t.isActive()]
    running += ["animation" for a in animations if a.state() == a.State.Running]
    assert not running, f"left running after the test: {running}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        window = item.funcargs.get("window")
        if window is not None:
            ARTIFACTS.mkdir(exist_ok=True)
            window.grab().save(str(ARTIFACTS / f"{item.name}.png"))
