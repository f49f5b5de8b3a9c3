"""The main window: pool in the centre, sequences left, kernel check right, memory below."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QAction, QColor, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QDockWidget,
    QFileDialog,
    QLabel,
    QMainWindow,
    QMenu,
    QSlider,
    QSpinBox,
    QStyle,
    QTextBrowser,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from app.gui.animation import AnimationDirector, beats_for
from app.gui.controller import SimulationController
from app.gui.guide import GUIDE_HTML
from app.gui.palette import THEMES, SequenceColours, qpalette
from app.gui.views.plots import KernelPanel, MemoryPanel, WastePanel
from app.gui.views.pool_view import PoolView
from app.gui.views.sequence_view import SequenceView
from core.errors import PagesimError
from core.operations import Add, Fork, Free, Grow
from core.scenario import Scenario, load_scenario
from core.view_model import Frame

SPEEDS = [("Instant", 0.0), ("0.25×", 0.25), ("0.5×", 0.5), ("1×", 1.0), ("2×", 2.0), ("4×", 4.0)]
BASE_STEP_MS = 1100  # between steps while playing at 1×
INSTANT_STEP_MS = 60
MAX_RECENT = 8
LAYOUT_VERSION = 2  # bump when docks change: an older saved layout is then ignored


class MainWindow(QMainWindow):
    def __init__(
        self,
        backend: str = "auto",
        settings: QSettings | None = None,
        speed: float | None = None,
        cuda_kernel: str = "auto",
    ):
        super().__init__()
        self.settings = settings or QSettings("pagesim", "pagesim")
        self.colours = SequenceColours()
        self.theme = THEMES.get(str(self.settings.value("theme", "dark")), THEMES["dark"])
        self.frame: Frame | None = None
        self.selected_seq: str | None = None
        self._syncing = False
        self._pending_select: str | None = None
        self.last_error: str | None = None
        self.setWindowTitle("pagesim — PagedAttention simulator")
        self.resize(1400, 860)

        self.controller = SimulationController(backend, self, cuda_kernel)
        self.pool_view = PoolView(self.colours, self.theme)
        self.sequence_view = SequenceView(self.colours, self.theme)
        self.kernel_panel = KernelPanel(self.theme)
        self.memory_panel = MemoryPanel(self.theme)
        self.waste_panel = WastePanel(self.theme, self.controller.compute_waste)
        self.director = AnimationDirector(self.pool_view, self.sequence_view, self)
        self._build_central()
        self._build_docks()
        self._build_actions()
        self._build_toolbars()
        self._build_menus()
        self.backend_label = QLabel("backend: starting…")
        self.backend_label.setToolTip("Kernel backend and device (compiled at start-up, off the GUI thread)")
        self.statusBar().addPermanentWidget(self.backend_label)

        self.controller.frameChanged.connect(self._on_frame)
        self.controller.errorRaised.connect(self.show_error)
        self.controller.backendReady.connect(self._on_backend)
        self.controller.playingChanged.connect(self._on_playing)
        self.controller.exported.connect(lambda msg: self.statusBar().showMessage(msg, 8000))
        self.controller.wasteReady.connect(self.waste_panel.show_result)
        self.sequence_view.sequenceSelected.connect(self.select_sequence)
        self.sequence_view.contextMenuRequested.connect(self._sequence_menu)
        self.pool_view.blockClicked.connect(self._block_clicked)
        self.pool_view.blockContextMenu.connect(self._block_menu)

        initial_speed = speed if speed is not None else float(self.settings.value("speed", 1.0))
        self.set_speed(initial_speed)
        self.apply_theme(self.theme.name)
        geometry = self.settings.value("geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        self._default_state = self.saveState(LAYOUT_VERSION)
        state = self.settings.value("windowState")
        if state is not None:
            self.restoreState(state, LAYOUT_VERSION)

    # -- layout ----------------------------------------------------------------------
    def _build_central(self) -> None:
        self.scenario_title = QLabel("loading…")
        self.scenario_title.setObjectName("scenarioTitle")
        self.scenario_description = QLabel()
        self.scenario_description.setObjectName("scenarioDescription")
        self.scenario_description.setWordWrap(True)
        self.scenario_description.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        # Three lines at most: the pool is the picture; the full text is in the tooltip.
        lines = self.scenario_description.fontMetrics().lineSpacing()
        self.scenario_description.setMaximumHeight(3 * lines + 4)
        self.pool_caption = QLabel()
        self.pool_caption.setWordWrap(True)
        self.pool_caption.setToolTip("The physical KV-cache pool: one tile per block, one cell per token slot")
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(8, 6, 8, 4)
        layout.addWidget(self.scenario_title)
        layout.addWidget(self.scenario_description)
        layout.addWidget(self.pool_caption)
        layout.addWidget(self.pool_view, 1)
        self.setCentralWidget(central)

    def _dock(self, title: str, widget: QWidget, area: Qt.DockWidgetArea, name: str) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(name)
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        return dock

    def _build_docks(self) -> None:
        left, right = Qt.DockWidgetArea.LeftDockWidgetArea, Qt.DockWidgetArea.RightDockWidgetArea
        self.sequences_dock = self._dock("Sequences and block tables", self.sequence_view, left, "seqs")
        self.kernel_dock = self._dock("Kernel vs dense attention", self.kernel_panel, right, "kernel")
        self.memory_dock = self._dock("Memory", self.memory_panel, Qt.DockWidgetArea.BottomDockWidgetArea, "memory")
        self.waste_dock = self._dock(
            "Waste vs contiguous", self.waste_panel, Qt.DockWidgetArea.BottomDockWidgetArea, "waste"
        )
        self.tabifyDockWidget(self.memory_dock, self.waste_dock)
        self.memory_dock.raise_()
        self.guide = QTextBrowser()
        self.guide.setHtml(GUIDE_HTML)
        self.guide_dock = self._dock("Guide", self.guide, right, "guide")
        self.tabifyDockWidget(self.kernel_dock, self.guide_dock)
        self.kernel_dock.raise_()
        self.resizeDocks([self.sequences_dock, self.kernel_dock], [380, 420], Qt.Orientation.Horizontal)
        self.resizeDocks([self.memory_dock], [200], Qt.Orientation.Vertical)

    def _action(self, text: str, slot, shortcut=None, tip: str = "") -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.setToolTip(f"{tip} ({action.shortcut().toString()})" if shortcut else tip)
        action.setStatusTip(tip)
        action.triggered.connect(slot)
        self.addAction(action)
        return action

    def _build_actions(self) -> None:
        a = self._action
        self.add_action = a("Add", self.add_sequence, "A", "Add a sequence with a prompt of the given length")
        self.grow_action = a(
            "Grow +1", lambda: self.grow_selected(1), "G", "Decode one token for the selected sequence"
        )
        self.grow_n_action = a(
            "Grow +N",
            lambda: self.grow_selected(self.grow_spin.value()),
            "Shift+G",
            "Decode N tokens for the selected sequence",
        )
        self.fork_action = a("Fork", self.fork_selected, "F", "Fork the selected sequence: share all its blocks")
        self.free_action = a("Free", self.free_selected, Qt.Key.Key_Delete, "Free the selected sequence's blocks")
        self.start_action = a("Start", lambda: self.controller.seek(0), Qt.Key.Key_Home, "Go to the start")
        self.back_action = a("Back", self.controller.back, Qt.Key.Key_Left, "Step back")
        self.play_action = a("Play", self.controller.toggle_play, Qt.Key.Key_Space, "Play / pause the scenario")
        self.forward_action = a("Forward", self.controller.forward, Qt.Key.Key_Right, "Step forward")
        self.end_action = a("End", self.seek_end, Qt.Key.Key_End, "Go to the last step")
        icons = {
            self.start_action: QStyle.StandardPixmap.SP_MediaSkipBackward,
            self.back_action: QStyle.StandardPixmap.SP_MediaSeekBackward,
            self.play_action: QStyle.StandardPixmap.SP_MediaPlay,
            self.forward_action: QStyle.StandardPixmap.SP_MediaSeekForward,
            self.end_action: QStyle.StandardPixmap.SP_MediaSkipForward,
        }
        for action, icon in icons.items():
            action.setIcon(self.style().standardIcon(icon))
        self.zoom_in_action = a(
            "Zoom in", lambda: self.pool_view.zoom(1.25), QKeySequence.StandardKey.ZoomIn, "Zoom the pool in"
        )
        self.zoom_out_action = a(
            "Zoom out", lambda: self.pool_view.zoom(0.8), QKeySequence.StandardKey.ZoomOut, "Zoom the pool out"
        )
        self.fit_action = a("Fit pool", self.pool_view.fit, "Ctrl+0", "Fit the whole pool in view")

    def _build_toolbars(self) -> None:
        ops = QToolBar("Operations")
        ops.setObjectName("operations")
        self.addToolBar(ops)
        self.prompt_spin = QSpinBox()
        self.prompt_spin.setRange(1, 100_000)
        self.prompt_spin.setValue(int(self.settings.value("prompt_len", 10)))
        self.prompt_spin.setPrefix("prompt ")
        self.prompt_spin.setToolTip("Prompt length (tokens) for Add")
        self.grow_spin = QSpinBox()
        self.grow_spin.setRange(1, 10_000)
        self.grow_spin.setValue(4)
        self.grow_spin.setPrefix("N = ")
        self.grow_spin.setToolTip("Tokens decoded by Grow +N")
        for widget in (
            self.add_action,
            self.prompt_spin,
            None,
            self.grow_action,
            self.grow_n_action,
            self.grow_spin,
            None,
            self.fork_action,
            self.free_action,
            None,
            self.zoom_in_action,
            self.zoom_out_action,
            self.fit_action,
        ):
            if widget is None:
                ops.addSeparator()
            elif isinstance(widget, QAction):
                ops.addAction(widget)
            else:
                ops.addWidget(widget)

        timeline = QToolBar("Timeline")
        timeline.setObjectName("timeline")
        timeline.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.addToolBar(Qt.ToolBarArea.BottomToolBarArea, timeline)
        for action in (self.start_action, self.back_action, self.play_action, self.forward_action, self.end_action):
            timeline.addAction(action)
        self.scrubber = QSlider(Qt.Orientation.Horizontal)
        self.scrubber.setToolTip("Scrub through the scenario's steps; going back shows exactly the earlier state")
        self.scrubber.setMinimumWidth(120)
        self.scrubber.valueChanged.connect(self._scrubbed)
        timeline.addWidget(self.scrubber)
        self.step_label = QLabel("step 0 / 0")
        timeline.addWidget(self.step_label)
        self.speed_box = QComboBox()
        for label, _ in SPEEDS:
            self.speed_box.addItem(label)
        self.speed_box.setToolTip("Animation and playback speed (Instant: no animation)")
        self.speed_box.currentIndexChanged.connect(lambda i: self.set_speed(SPEEDS[i][1]))
        timeline.addWidget(QLabel(" speed "))
        timeline.addWidget(self.speed_box)

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        file_menu.addAction(
            self._action("Open scenario…", self._open_dialog, QKeySequence.StandardKey.Open, "Open a scenario (TOML)")
        )
        self.recent_menu = file_menu.addMenu("Open recent")
        file_menu.addAction(
            self._action(
                "Save scenario as…",
                self._save_dialog,
                QKeySequence.StandardKey.SaveAs,
                "Save the scenario, with your own actions, as TOML",
            )
        )
        file_menu.addSeparator()
        file_menu.addAction(
            self._action("Export screenshot…", self._screenshot_dialog, "Ctrl+Shift+P", "Save a PNG of the window")
        )
        file_menu.addAction(
            self._action(
                "Export event log…", self._events_dialog, "Ctrl+Shift+E", "Save every event so far as JSON lines"
            )
        )
        file_menu.addSeparator()
        file_menu.addAction(self._action("Quit", self.close, QKeySequence.StandardKey.Quit, "Quit pagesim"))
        seq_menu = bar.addMenu("&Sequence")
        for action in (self.add_action, self.grow_action, self.grow_n_action, self.fork_action, self.free_action):
            seq_menu.addAction(action)
        play_menu = bar.addMenu("&Timeline")
        for action in (self.play_action, self.back_action, self.forward_action, self.start_action, self.end_action):
            play_menu.addAction(action)
        view_menu = bar.addMenu("&View")
        for name in THEMES:
            view_menu.addAction(
                self._action(
                    f"{name.title()} theme",
                    lambda _=False, n=name: self.apply_theme(n),
                    tip=f"Switch to the {name} theme",
                )
            )
        view_menu.addSeparator()
        for action in (self.zoom_in_action, self.zoom_out_action, self.fit_action):
            view_menu.addAction(action)
        view_menu.addAction(
            self._action(
                "Reset layout",
                lambda: self.restoreState(self._default_state, LAYOUT_VERSION),
                tip="Put every panel back where it started",
            )
        )
        view_menu.addSeparator()
        for dock in (self.sequences_dock, self.kernel_dock, self.memory_dock, self.waste_dock, self.guide_dock):
            view_menu.addAction(dock.toggleViewAction())
        help_menu = bar.addMenu("&Help")
        help_menu.addAction(
            self._action(
                "Guide",
                self._show_guide,
                QKeySequence.StandardKey.HelpContents,
                "What every element means, in vLLM's words",
            )
        )
        self._rebuild_recent()

    # -- scenario --------------------------------------------------------------------
    def load(self, scenario: Scenario) -> None:
        self.colours.reset()
        self.selected_seq = None
        self.frame = None
        self.controller.load(scenario)
        if Path(scenario.source).exists():
            self._remember(scenario.source)

    def open_scenario(self, path: str) -> bool:
        try:
            scenario = load_scenario(path)
        except PagesimError as exc:
            self.show_error(str(exc))
            return False
        self.load(scenario)
        return True

    def save_scenario(self, path: str) -> None:
        if self.controller.scenario is None or self.frame is None:
            self.show_error("nothing to save yet")
            return
        # The worker's timeline is the truth; the frame's steps mirror it.
        scenario = self._current_scenario()
        Path(path).write_text(scenario.to_toml(), encoding="utf-8")
        self._remember(path)
        self.statusBar().showMessage(f"saved {path}", 6000)

    def _current_scenario(self) -> Scenario:
        return self.controller.scenario.with_operations(self.operations)

    @property
    def operations(self):
        return self.frame.operations if self.frame is not None else ()

    def _remember(self, path: str) -> None:
        path = str(Path(path).resolve())
        recent = [p for p in self._recent() if p != path]
        self.settings.setValue("recent", [path, *recent][:MAX_RECENT])
        self._rebuild_recent()

    def _recent(self) -> list[str]:
        value = self.settings.value("recent", [])
        return [value] if isinstance(value, str) else list(value or [])

    def _rebuild_recent(self) -> None:
        self.recent_menu.clear()
        for path in self._recent():
            self.recent_menu.addAction(Path(path).name, lambda p=path: self.open_scenario(p)).setToolTip(path)
        self.recent_menu.setEnabled(bool(self._recent()))

    def _open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open scenario", "", "Scenarios (*.toml)")
        if path:
            self.open_scenario(path)

    def _save_to(self, title: str, default: str, kinds: str, then) -> None:
        path, _ = QFileDialog.getSaveFileName(self, title, default, kinds)
        if path:
            then(path)

    def _save_dialog(self) -> None:
        self._save_to("Save scenario", "scenario.toml", "Scenarios (*.toml)", self.save_scenario)

    def save_screenshot(self, path: str) -> bool:
        ok = self.grab().save(path)
        self.statusBar().showMessage(f"saved {path}" if ok else f"could not write {path}", 6000)
        return ok

    def _screenshot_dialog(self) -> None:
        self._save_to("Export screenshot", "pagesim.png", "PNG (*.png)", self.save_screenshot)

    def _events_dialog(self) -> None:
        self._save_to("Export event log", "events.jsonl", "JSON lines (*.jsonl)", self.controller.export_events)

    def _show_guide(self) -> None:
        self.guide_dock.show()
        self.guide_dock.raise_()

    # -- actions ---------------------------------------------------------------------
    def _need_selection(self, verb: str) -> str | None:
        if self.selected_seq is None:
            self.show_error(f"select a sequence to {verb} (click it in the list or one of its blocks)")
        return self.selected_seq

    def _new_name(self) -> str:
        live = {s.seq_id for s in self.frame.sequences} if self.frame else set()
        n = 1
        while f"s{n}" in live:
            n += 1
        return f"s{n}"

    def add_sequence(self) -> None:
        self.settings.setValue("prompt_len", self.prompt_spin.value())
        name = self._new_name()
        self._pending_select = name
        self.controller.apply(Add(name, self.prompt_spin.value()))

    def grow_selected(self, tokens: int) -> None:
        if seq := self._need_selection("grow"):
            self.controller.apply(Grow(seq, tokens))

    def fork_selected(self) -> None:
        if seq := self._need_selection("fork"):
            self.controller.apply(Fork(seq, self._new_name()))

    def free_selected(self) -> None:
        if seq := self._need_selection("free"):
            self.controller.apply(Free(seq))

    def seek_end(self) -> None:
        if self.frame is not None:
            self.controller.seek(self.frame.length)

    def select_sequence(self, seq_id: str | None) -> None:
        seq_id = seq_id or None
        if seq_id == self.selected_seq:
            return
        self.selected_seq = seq_id
        self.sequence_view.select(seq_id)  # echoes back here, and stops at the check above
        if self.frame is not None:
            self.pool_view.show_frame(self.frame, seq_id)
        self.controller.set_focus(seq_id)

    def _block_clicked(self, block: int) -> None:
        holders = self.frame.holders.get(block, ()) if self.frame else ()
        if holders:
            # Clicking a shared block cycles through its holders.
            seqs = [seq for seq, _ in holders]
            nxt = seqs[(seqs.index(self.selected_seq) + 1) % len(seqs)] if self.selected_seq in seqs else seqs[0]
            self.select_sequence(nxt)
        else:
            self.statusBar().showMessage(f"block {block} is free", 4000)

    def _sequence_menu(self, seq_id: str, global_pos) -> None:
        self.select_sequence(seq_id)
        menu = QMenu(self)
        for action in (self.grow_action, self.grow_n_action, self.fork_action, self.free_action):
            menu.addAction(action)
        menu.popup(global_pos)

    def _block_menu(self, block: int, global_pos) -> None:
        holders = self.frame.holders.get(block, ()) if self.frame else ()
        menu = QMenu(self)
        if not holders:
            menu.addAction(f"Block {block}: free").setEnabled(False)
        for seq, index in holders:
            sub = menu.addMenu(f"{seq} (logical block {index})")
            sub.addAction("Select", lambda s=seq: self.select_sequence(s))
            sub.addAction("Grow +1", lambda s=seq: self.controller.apply(Grow(s, 1)))
            sub.addAction("Fork", lambda s=seq: self.controller.apply(Fork(s, self._new_name())))
            sub.addAction("Free", lambda s=seq: self.controller.apply(Free(s)))
        menu.popup(global_pos)

    # -- speed and theme -------------------------------------------------------------
    def set_speed(self, speed: float) -> None:
        self.speed = speed
        index = next((i for i, (_, s) in enumerate(SPEEDS) if s == speed), 3)
        if self.speed_box.currentIndex() != index:
            self.speed_box.setCurrentIndex(index)
        self.settings.setValue("speed", speed)
        self.controller.set_step_interval(int(BASE_STEP_MS / speed) if speed > 0 else INSTANT_STEP_MS)
        if speed <= 0:
            self.director.stop()

    def apply_theme(self, name: str) -> None:
        self.theme = THEMES[name]
        app = QApplication.instance()
        app.setPalette(qpalette(self.theme))
        style = resources.files("assets") / "styles" / f"{name}.qss"
        self.setStyleSheet(style.read_text(encoding="utf-8") if style.is_file() else "")
        self.settings.setValue("theme", name)
        for view in (self.pool_view, self.sequence_view, self.kernel_panel, self.memory_panel, self.waste_panel):
            view.set_theme(self.theme)

    # -- frames in -------------------------------------------------------------------
    def _on_backend(self, name: str, device: str) -> None:
        self.backend_label.setText(f"{name.upper()} · {device}")
        self.kernel_panel.set_backend(name, device)

    def _on_playing(self, playing: bool) -> None:
        self.play_action.setText("Pause" if playing else "Play")
        icon = QStyle.StandardPixmap.SP_MediaPause if playing else QStyle.StandardPixmap.SP_MediaPlay
        self.play_action.setIcon(self.style().standardIcon(icon))

    def _on_frame(self, frame: Frame) -> None:
        first = self.frame is None
        self.frame = frame
        self.statusBar().setStyleSheet("")
        if first and frame.position == 0:
            self.statusBar().showMessage(
                f"{frame.scenario_name}: {frame.length} steps · Space plays, → steps, A adds a sequence", 10_000
            )
        live = {s.seq_id for s in frame.sequences}
        pending = self._pending_select
        if pending in live:
            self.selected_seq = pending
        self._pending_select = None
        if self.selected_seq not in live:
            self.selected_seq = frame.focus.seq_id if frame.focus else (frame.sequences[0].seq_id if live else None)
        self.sequence_view.show_frame(frame)
        self.sequence_view.select(self.selected_seq)
        self.pool_view.show_frame(frame, self.selected_seq)
        self.kernel_panel.show_frame(frame)
        self.memory_panel.show_frame(frame)
        c = frame.config
        self.scenario_title.setText(frame.scenario_name)
        description = " ".join(frame.scenario_description.split())
        self.scenario_description.setText(description)
        self.scenario_description.setToolTip(description)
        self.pool_caption.setText(
            f"Physical KV-cache pool · {c.num_blocks} blocks × block size {c.block_size} · {c.num_heads} heads "
            f"({c.num_kv_heads} KV) × head dim {c.head_dim} · {c.dtype} · {len(frame.free_queue)} in the free queue"
        )
        self._sync_timeline(frame)
        self._announce_scheduler_events(frame)
        attended = frame.attention is not None and self.selected_seq in frame.attention.seq_ids
        stale_focus = frame.focus is None or frame.focus.seq_id != self.selected_seq
        if stale_focus and attended:
            self.controller.set_focus(self.selected_seq)
        muted, good, bad = (QColor(c) for c in (self.theme.muted, self.theme.good, self.theme.bad))
        self.director.play(beats_for(frame, self.selected_seq, self.colours, muted, self.speed, good, bad))

    def _announce_scheduler_events(self, frame: Frame) -> None:
        """Preemptions and rejections say what they cost, in the status bar."""
        if frame.result is None:
            return
        notes = [note for event in frame.result.events if (note := event.status_note())]
        if notes:
            self.statusBar().showMessage(" · ".join(notes), 8000)

    def _sync_timeline(self, frame: Frame) -> None:
        self._syncing = True
        self.scrubber.setMaximum(frame.length)
        self.scrubber.setValue(frame.position)
        self._syncing = False
        attention = frame.attention
        check = ""
        if attention is not None:
            check = " · ✓ kernel = dense" if attention.passed else " · ✗ kernel ≠ dense"
        self.step_label.setText(f"step {frame.position} / {frame.length} · {frame.label}{check}")
        self.back_action.setEnabled(frame.position > 0)
        self.start_action.setEnabled(frame.position > 0)
        self.forward_action.setEnabled(frame.position < frame.length)
        self.end_action.setEnabled(frame.position < frame.length)

    def _scrubbed(self, value: int) -> None:
        if not self._syncing and self.frame is not None and value != self.frame.position:
            self.controller.seek(value)

    def show_error(self, message: str) -> None:
        self.statusBar().showMessage(f"⚠ {message}", 10_000)
        self.statusBar().setStyleSheet(f"QStatusBar {{ color: {self.theme.bad}; }}")
        self.last_error = message

    # -- shutdown --------------------------------------------------------------------
    def closeEvent(self, event) -> None:
        self.settings.setValue("geometry", self.saveGeometry())
        self.settings.setValue("windowState", self.saveState(LAYOUT_VERSION))
        self.director.stop()
        self.controller.shutdown()
        super().closeEvent(event)
