"""``pagesim gui``: open the window; optionally run N steps, save a screenshot and exit."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from pagesim.app.gui.main_window import MainWindow
from pagesim.app.options import writable_problem
from pagesim.core.errors import PagesimError
from pagesim.core.models.catalog import is_loaded
from pagesim.core.scenario import DEFAULT_SCENARIO, load_scenario, scenario_model
from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication

# The GUI shares the cores with the kernel's and torch's thread pools: threads that
# spin while idle (OpenMP's default) would take the time the GUI needs to repaint. The
# `pagesim` entry point sets it before torch loads (app/__init__.py); this covers an app
# started another way, for the thread pools started after it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
IMAGE_FORMATS = ("png", "jpg", "jpeg", "bmp")


def _application() -> QApplication:
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("pagesim")
    app.setOrganizationName("pagesim")
    return app


# Qt platforms that draw without a screen; any other needs the display it names.
HEADLESS_PLATFORMS = ("offscreen", "minimal", "vnc", "eglfs", "linuxfb", "vkkhrdisplay")


def display_problem() -> str | None:
    """Why no window can open here, or None. Qt aborts the process (no exception to catch)
    when the platform it is told to use, or the one it picks, finds no display: say so
    first. The platform is QT_QPA_PLATFORM's first entry ("xcb;offscreen" lists fallbacks,
    "xcb:arg" passes an argument)."""
    if sys.platform != "linux":
        return None
    requested = os.environ.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0].strip()
    x11, wayland = os.environ.get("DISPLAY"), os.environ.get("WAYLAND_DISPLAY")
    if requested in HEADLESS_PLATFORMS:
        return None
    if requested == "xcb" and not x11:
        return "QT_QPA_PLATFORM=xcb asks for an X display, and DISPLAY is not set"
    if requested.startswith("wayland") and not wayland:
        return f"QT_QPA_PLATFORM={requested} asks for a Wayland display, and WAYLAND_DISPLAY is not set"
    if not requested and not (x11 or wayland):
        return "no display to open the window on (DISPLAY is not set)"
    return None


class StallWatch:
    """The longest the GUI thread went without running its event loop (the largest gap
    between a 10 ms timer's ticks), from now until :meth:`stop`: a window that long frozen."""

    TICK_MS = 10

    def __init__(self, parent) -> None:
        self.longest = 0.0
        self._last = time.perf_counter()
        self._timer = QTimer(parent)
        self._timer.timeout.connect(self._tick)
        self._timer.start(self.TICK_MS)

    def _tick(self) -> None:
        now = time.perf_counter()
        self.longest, self._last = max(self.longest, now - self._last), now

    def stop(self) -> float:
        """Seconds of the longest gap, the one still open included."""
        self._tick()
        self._timer.stop()
        return self.longest


def main(args: argparse.Namespace) -> int:
    # A real model not yet in memory loads once the window is up (its progress bar; the first
    # load of a file takes seconds); a screenshot waits for it here, its errors on stderr.
    model = scenario_model(args.scenario)
    deferred = args.screenshot is None and model is not None and not is_loaded(model)
    scenario = None
    if not deferred:
        try:
            scenario = load_scenario(args.scenario)
        except PagesimError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.screenshot is not None:
        suffix = args.screenshot.suffix.lower().lstrip(".")
        if suffix not in IMAGE_FORMATS:
            print(
                f"error: --screenshot {args.screenshot}: name an image file ending in "
                f"{', '.join('.' + f for f in IMAGE_FORMATS)}",
                file=sys.stderr,
            )
            return 2
        if reason := writable_problem(args.screenshot, "--screenshot"):
            print(f"error: {reason}", file=sys.stderr)
            return 2
    if reason := display_problem():
        if args.screenshot is None or os.environ.get("QT_QPA_PLATFORM"):
            print(
                f"error: {reason}. Run 'pagesim run' for the same simulation headless, or "
                "'pagesim gui --screenshot out.png' (with QT_QPA_PLATFORM unset or offscreen) to render offscreen.",
                file=sys.stderr,
            )
            return 2
        os.environ["QT_QPA_PLATFORM"] = "offscreen"  # a screenshot needs no screen
    app = _application()
    headless = args.screenshot is not None
    settings = None
    if headless:
        # Reproducible pictures: a fresh default layout, and the user's settings left alone.
        scratch = tempfile.mkdtemp(prefix="pagesim-settings-")
        settings = QSettings(os.path.join(scratch, "pagesim.ini"), QSettings.Format.IniFormat)
    window = MainWindow(args.backend, settings=settings, speed=0.0 if headless else None, cuda_kernel=args.cuda_kernel)
    if args.theme:
        window.apply_theme(args.theme)
    if args.size:
        width, height = args.size
        window.resize(width, height)
    window.show()
    stall_watch = None
    if os.environ.get("PAGESIM_REPORT_FIRST_FRAME"):
        window.repaint()  # its first paint, before any scenario's frame (a real model may be loading)
        print(f"first-paint {time.time():.6f}", flush=True)
        stall_watch = StallWatch(window)
    if args.panel:
        window.studies.show_panel(args.panel)
    if deferred:
        window.files.open_scenario(args.scenario)
    else:
        window.load(scenario)
    if not headless and args.scenario == DEFAULT_SCENARIO and window.welcome_due:
        window.show_welcome()  # a first start with no scenario named: where to begin
    target = max(0, args.steps)
    outcome = {"code": 0}

    def on_frame(frame) -> None:
        if args.size and not outcome.get("sized"):
            # Again once the first frame is in: before it the docks ask for more height (the
            # first frame's contents are smaller), and a 700-px request came out 714 px tall.
            outcome["sized"] = True
            window.resize(*args.size)
            if (window.width(), window.height()) != tuple(args.size):  # (the layout's minimum won)
                width, height = args.size
                print(
                    f"note: --size {width}x{height}: the window is {window.width()}x{window.height()} (its "
                    "layout's smallest, or the screen's size)",
                    file=sys.stderr,
                )
        if os.environ.get("PAGESIM_REPORT_FIRST_FRAME") and not outcome.get("reported"):
            window.repaint()
            outcome["reported"] = True
            print(f"gui-stall {stall_watch.stop() * 1e3:.1f}", flush=True)
            print(f"first-frame {time.time():.6f}", flush=True)
        # Step to the position asked for (or the last): counted by the frames' positions,
        # since a view may ask for a frame of the same step (a real model's layer menu does).
        if not outcome.get("stepped"):
            if frame.position < min(target, frame.length):
                if window.controller.pending == 0:
                    window.controller.forward()
                return
            outcome["stepped"] = True
        if headless and (frame.focus is not None or not frame.sequences):
            # Let the last frame paint, then save and quit (after the panel's study, if it has one).
            if args.panel and not outcome.get("studied"):
                outcome["studied"] = True
                window.studies.show_panel(args.panel)  # again: a scheduler's first frame raises its own
                if window.studies.run_panel(args.panel, lambda: QTimer.singleShot(50, window, finish)):
                    return
            QTimer.singleShot(50, window, finish)

    def on_error(message: str) -> None:
        if headless:
            print(f"error: {message}", file=sys.stderr)
            outcome["code"] = 2
            window.close()

    def finish() -> None:
        if window.isVisible():
            if window.files.save_screenshot(str(args.screenshot)):
                print(f"saved {args.screenshot} at step {window.frame.position}")
            else:
                print(f"error: --screenshot: {window.last_error}", file=sys.stderr)
                outcome["code"] = 2
            window.close()

    window.controller.frameChanged.connect(on_frame)
    window.controller.errorRaised.connect(on_error)
    window.destroyed.connect(app.quit)
    code = app.exec()
    return outcome["code"] or code
