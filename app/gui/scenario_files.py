"""The window's files: File → Open, Open recent, Reload, Save as, and the exports (a
picture of the window, the event log). Scenario files are read and written here, the
recent ones kept in the settings; a failure is shown, never raised."""

from __future__ import annotations

import os
import re
import stat
import weakref
from pathlib import Path

from pagesim.app.gui.settings import MAX_RECENT
from pagesim.core.errors import PagesimError
from pagesim.core.scenario import Scenario, load_scenario, scenario_model, shipped_folder
from pagesim.kernels.atomic_write import atomic_path, atomic_write
from PySide6.QtCore import QStandardPaths
from PySide6.QtWidgets import QFileDialog, QMenu


def not_a_file_problem(path: str) -> str | None:
    """Why the app will not save to ``path``: something that is there and is no regular file
    (a pipe would block the app until a reader came; a device would swallow the file and be
    remembered as one), or None."""
    try:
        st = os.stat(path)
    except OSError:  # (nothing there, or unreachable: the write says why)
        return None
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):  # (a folder: the write names it)
        return None
    return f"{path} is not a regular file (a pipe, a device or a socket): choose a file to save to"


class ScenarioFiles:
    def __init__(self, window) -> None:
        self._window = weakref.ref(window)  # no Python cycle window ↔ files (see gc_guard)
        self.recent_menu: QMenu | None = None

    @property
    def window(self):
        return self._window()

    def bind(self, controller) -> None:
        """A load that went through puts its file first in Recent (a failed one never joins)."""
        controller.loaded.connect(self._loaded)

    def _loaded(self, scenario: Scenario) -> None:
        if Path(scenario.source).is_file():
            self.remember(scenario.source)

    # -- scenarios -------------------------------------------------------------------
    def open_scenario(self, path: str) -> bool:
        """Open the scenario file at ``path`` (or a shipped one by name). False when it
        cannot be read, said in the status bar. A real model not yet in memory is loaded
        first, off the GUI thread (the window's progress bar): the file opens when it is."""
        w = self.window
        opened = [True]

        def parse_and_load() -> None:
            try:
                scenario = load_scenario(path)
            except (PagesimError, OSError) as exc:
                w.status.show_error(str(exc))
                opened[0] = False
                return
            w.load(scenario)

        w.model_loader.ensure(scenario_model(path), parse_and_load, w.status.show_error)
        return opened[0]

    def reload_scenario(self) -> None:
        """The scenario again from its file (or as shipped): its script from step 0, your actions gone."""
        w = self.window
        scenario = w.controller.scenario
        if scenario is None:
            w.status.show_error("no scenario to reload")
            return
        source = scenario.source
        if Path(source).exists():
            if self.open_scenario(source):  # (else the status bar says why, and the scenario stays)
                w.status.say(f"reloaded {scenario.name}", 5000)
            return
        w.load(scenario)  # built in memory, or its file gone: its script as it was read
        gone = "" if source.startswith("<") else f" as it was read: {source} is no longer there"
        w.status.say(f"reloaded {scenario.name}{gone}", 5000)

    def save_scenario(self, path: str) -> None:
        w = self.window
        if w.controller.scenario is None or w.frame is None:
            w.status.show_error("nothing to save yet")
            return
        # The worker's timeline is the truth; the frame's steps mirror it.
        scenario = w.controller.scenario.with_operations(w.frame.operations)
        if problem := not_a_file_problem(path):
            w.status.show_error(problem)
            return
        try:
            atomic_write(path, scenario.to_toml())
        except OSError as exc:
            w.status.show_error(f"could not save {path}: {exc.strerror or exc}")
            return
        self.remember(path)
        w.status.say(f"saved {path}", 6000)

    def open_dialog(self) -> None:
        # Start among the shipped scenarios (the examples), not wherever the app was launched.
        start = str(shipped_folder() or "")
        path, _ = QFileDialog.getOpenFileName(self.window, "Open scenario", start, "Scenarios (*.toml)")
        if path:
            self.open_scenario(path)

    def _save_to(self, title: str, suffix: str, kinds: str, then) -> None:
        path, _ = QFileDialog.getSaveFileName(self.window, title, self.default_save_path(suffix), kinds)
        if path:
            then(path)

    def default_save_path(self, suffix: str) -> str:
        """Where a save dialog starts: the scenario's own name plus ``suffix``, in the folder of
        the last file opened or saved, else the user's documents; never the folder the app was
        launched from, nor the shipped examples' (a save there would sit among them)."""
        frame = self.window.frame
        name = re.sub(r"[^a-z0-9]+", "-", (frame.scenario_name if frame else "").lower()).strip("-")[:60]
        shipped = shipped_folder()
        shipped = shipped.resolve() if shipped is not None else None
        folders = [Path(p).parent for p in self.recent()]
        folder = next((f for f in folders if f.is_dir() and f.resolve() != shipped), None)
        if folder is None:
            documents = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
            folder = Path(documents) if documents and Path(documents).is_dir() else Path.home()
        return str(folder / f"{name or 'pagesim'}{suffix}")

    def save_dialog(self) -> None:
        self._save_to("Save scenario", ".toml", "Scenarios (*.toml)", self.save_scenario)

    # -- exports ---------------------------------------------------------------------
    def save_screenshot(self, path: str) -> bool:
        """A PNG (or JPEG, BMP: by the suffix) of the window, written atomically. On failure
        the reason is shown and kept in ``last_error``."""
        w = self.window
        if problem := not_a_file_problem(path):
            w.status.show_error(problem)
            return False
        w.memory_panel.flush()  # its history redraws a little late while frames stream in
        picture = w.grab()
        if picture.isNull():
            size = w.size()
            w.status.show_error(
                f"could not capture the window at {size.width()}×{size.height()} (too large for an image?); "
                f"{path} was not written"
            )
            return False
        try:
            with atomic_path(path) as tmp:
                if not picture.save(tmp, Path(path).suffix.lstrip(".").upper() or "PNG"):
                    raise OSError(f"the image writer refused it (format {Path(path).suffix or 'none'})")
        except OSError as exc:
            w.status.show_error(f"could not write {path}: {exc.strerror or exc}")
            return False
        w.status.say(f"saved {path}", 6000)
        return True

    def screenshot_dialog(self) -> None:
        self._save_to("Export screenshot", ".png", "PNG (*.png)", self.save_screenshot)

    def events_dialog(self) -> None:
        self._save_to("Export event log", "-events.jsonl", "JSON lines (*.jsonl)", self.export_events)

    def export_events(self, path: str) -> None:
        """The event log so far, written by the worker (``path`` checked here first)."""
        if problem := not_a_file_problem(path):
            self.window.status.show_error(problem)
            return
        self.window.controller.export_events(path)

    # -- recent files ----------------------------------------------------------------
    def attach_recent_menu(self, menu: QMenu) -> None:
        self.recent_menu = menu
        self._rebuild_recent()

    def remember(self, path: str) -> None:
        path = str(Path(path).resolve())
        recent = [p for p in self.recent() if p != path]
        self.window.settings.setValue("recent", [path, *recent][:MAX_RECENT])
        self._rebuild_recent()

    def recent(self) -> list[str]:
        return self.window.setting("recent")

    def _rebuild_recent(self) -> None:
        if self.recent_menu is None:
            return
        self.recent_menu.clear()
        for path in self.recent():
            self.recent_menu.addAction(Path(path).name, lambda p=path: self.open_scenario(p)).setToolTip(path)
        self.recent_menu.setEnabled(bool(self.recent()))
