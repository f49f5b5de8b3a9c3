"""The serving-study docks: what-if replays and latency, tabbed with Memory at the bottom,
and the Studies menu that brings each to the front (with the Waste tab)."""

from __future__ import annotations

import weakref

from pagesim.app.gui.views.latency import LatencyPanel
from pagesim.app.gui.views.whatif import WhatIfPanel
from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDockWidget, QMenu

WHATIF_SHORTCUT = "Ctrl+Shift+W"
LATENCY_SHORTCUT = "Ctrl+Shift+L"
STUDY_HEIGHT, STUDY_SHARE = 380, 0.4  # px, share of the window: what a study panel asks for when shown


class StudyDocks:
    def __init__(self, window) -> None:
        self._window = weakref.ref(window)  # no Python cycle window ↔ docks (see gc_guard)
        c = window.controller
        self.whatif = WhatIfPanel(window.theme, c.run_sweep, c.cancel_sweep)
        self.latency = LatencyPanel(window.theme, c.compute_latency)
        bottom = Qt.DockWidgetArea.BottomDockWidgetArea
        self.whatif_dock = self._dock("What-if", self.whatif, "whatif")
        self.latency_dock = self._dock("Latency", self.latency, "latency")
        for dock in (self.whatif_dock, self.latency_dock):
            window.addDockWidget(bottom, dock)
            window.tabifyDockWidget(window.memory_dock, dock)  # the Memory group: no orphaned tab bar
        window.memory_dock.raise_()
        self.docks = {
            "memory": window.memory_dock,
            "waste": window.waste_dock,
            "scheduler": window.scheduler_dock,
            "steplog": window.step_log_dock,
            "whatif": self.whatif_dock,
            "latency": self.latency_dock,
        }

    @property
    def window(self):
        return self._window()

    def _dock(self, title: str, widget, name: str) -> QDockWidget:
        dock = QDockWidget(title, self.window)
        dock.setObjectName(name)
        dock.setWidget(widget)
        return dock

    def bind(self, controller) -> None:
        self.whatif.bind(controller)
        self.latency.bind(controller)

    def set_theme(self, theme) -> None:
        self.whatif.set_theme(theme)
        self.latency.set_theme(theme)

    def show_panel(self, name: str) -> None:
        """Bring a bottom panel to the front by its name (a key of ``docks``); a study panel
        gets room for its plot and table if the bottom area is short."""
        dock = self.docks[name]
        dock.show()
        dock.raise_()
        w = self.window
        if dock in (self.whatif_dock, self.latency_dock):
            want = min(STUDY_HEIGHT, int(STUDY_SHARE * w.height()))
            if dock.height() < want:
                w.resizeDocks([dock], [want], Qt.Orientation.Vertical)

    def run_panel(self, name: str, then) -> bool:
        """Run a study panel's default study and call ``then()`` once it answered (a
        screenshot of the panel with its figures); False for a panel with nothing to run."""
        w = self.window
        c = w.controller
        answers = {
            "whatif": (self.whatif.run, (c.sweepReady, c.sweepCancelled, c.studyFailed)),
            "latency": (self.latency.run, (c.latencyReady, c.studyFailed)),
            "waste": (w.waste_panel.run, (c.wasteReady, c.studyFailed)),
        }
        if name not in answers:
            return False
        start, signals = answers[name]
        for signal in signals:
            signal.connect(lambda *_: then())
        start()
        return True

    def add_menu(self) -> QMenu:
        """A Studies menu before Help: each panel with its shortcut."""
        w = self.window
        bar = w.menuBar()
        menu = QMenu("St&udies", w)
        menu.setToolTipsVisible(True)
        entries = (
            ("What-if replays", "whatif", WHATIF_SHORTCUT,
             "Replay this scenario with other engine settings, side by side with the original"),
            ("Latency", "latency", LATENCY_SHORTCUT,
             "Each request's queue time, TTFT and TPOT on a model shape and a GPU"),
            ("Waste vs contiguous", "waste", None,
             "Where KV memory goes under load: paging against contiguous reservations"),
        )  # fmt: skip
        self.actions: dict[str, QAction] = {}
        for text, name, shortcut, tip in entries:
            action = QAction(text, w)
            if shortcut:
                action.setShortcut(QKeySequence(shortcut))
            action.setToolTip(f"{tip} ({shortcut})" if shortcut else tip)
            action.setStatusTip(tip)
            action.triggered.connect(lambda _=False, n=name: self.show_panel(n))
            w.addAction(action)
            menu.addAction(action)
            self.actions[name] = action
        help_action = next((a for a in bar.actions() if a.text() == "&Help"), None)
        bar.insertMenu(help_action, menu) if help_action is not None else bar.addMenu(menu)
        return menu
