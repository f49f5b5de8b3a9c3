"""The main window: pool in the centre, sequences left, kernel check right, memory below."""

from __future__ import annotations

import html
from importlib import resources
from pathlib import Path

from pagesim.app.gui import gc_guard
from pagesim.app.gui.actions import LAYOUT_VERSION, SPEEDS, WindowActions
from pagesim.app.gui.animation import AnimationDirector, beats_for
from pagesim.app.gui.controller import SimulationController
from pagesim.app.gui.guide import GUIDE_HTML
from pagesim.app.gui.palette import THEMES, SequenceColours, qpalette
from pagesim.app.gui.selection import Selection
from pagesim.app.gui.settings import read_setting
from pagesim.app.gui.views.connectors import TableToPoolLines
from pagesim.app.gui.views.elided_label import ElidedLabel
from pagesim.app.gui.views.plots import KernelPanel, MemoryPanel, WastePanel
from pagesim.app.gui.views.pool_view import PoolView
from pagesim.app.gui.views.scheduler_view import SchedulerView
from pagesim.app.gui.views.sequence_view import SequenceView
from pagesim.app.gui.views.step_log import StepLog
from pagesim.app.gui.views.swap_flight import SwapFlight
from pagesim.app.gui.views.token_map import TokenMap
from pagesim.app.gui.views.walkthrough import WalkThroughPanel
from pagesim.app.gui.welcome import WelcomeDialog
from pagesim.core.atomic_write import atomic_path, atomic_write
from pagesim.core.errors import PagesimError
from pagesim.core.operations import Add, Fork, Free, Grow, new_sequence_name
from pagesim.core.scenario import Scenario, load_scenario, load_shipped, shipped_folder
from pagesim.core.view_model import Frame
from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QFrame,
    QLabel,
    QMainWindow,
    QMenu,
    QScrollArea,
    QSizePolicy,
    QStyle,
    QTabWidget,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

BASE_STEP_MS = 1100  # between steps while playing at 1×
INSTANT_STEP_MS = 60


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
        self.settings_notes: list[str] = []  # saved settings that could not be used, and why
        self.colours = SequenceColours()
        self.theme = THEMES[self.setting("theme")]
        self.frame: Frame | None = None
        self.selection = Selection()
        self._syncing = False
        self.last_error: str | None = None
        gc_guard.acquire(self)  # cyclic GC on this thread only while the worker runs
        self._gc_held = True
        self.setWindowTitle("pagesim — PagedAttention simulator")
        self.resize(1400, 860)

        self.controller = SimulationController(backend, self, cuda_kernel)
        self.pool_view = PoolView(self.colours, self.theme)
        self.sequence_view = SequenceView(self.colours, self.theme)
        self.kernel_panel = KernelPanel(self.theme, self.colours)
        self.memory_panel = MemoryPanel(self.theme)
        self.waste_panel = WastePanel(self.theme, self.controller.compute_waste)
        self.walkthrough = WalkThroughPanel(self.theme)
        self.walkthrough_open = False
        self.swap_flight = SwapFlight(self)
        self.director = AnimationDirector(self.pool_view, self.sequence_view, self, swap_flight=self.swap_flight)
        self._build_central()
        self._announced_branch: int | None = None
        self._scheduler_raised = False
        self._caption_html = ""
        self._build_docks()
        self.table_lines = TableToPoolLines(self, self.sequence_view, self.pool_view)
        self.actions = WindowActions(self)
        self.backend_label = QLabel("backend: starting…")
        self.backend_label.setToolTip("Kernel backend and device (compiled at start-up, off the GUI thread)")
        self.statusBar().addPermanentWidget(self.backend_label)

        self.controller.loaded.connect(self._on_loaded)
        self.controller.frameChanged.connect(self._on_frame)
        self.controller.errorRaised.connect(self.show_error)
        self.controller.poolRefused.connect(
            lambda needed, free: self.pool_view.show_refusal(needed, free, self.last_error or "")
        )
        self.controller.backendReady.connect(self._on_backend)
        self.controller.kernelReady.connect(
            lambda dtype, seconds: self.statusBar().showMessage(
                f"kernel ready for {dtype} ({seconds:.1f} s): → steps, Space plays", 6000
            )
        )
        self.controller.playingChanged.connect(self._on_playing)
        self.controller.exported.connect(lambda msg: self.statusBar().showMessage(msg, 8000))
        self.controller.wasteReady.connect(self.waste_panel.show_result)
        self.controller.traceReady.connect(self.walkthrough.show_walk)
        self.walkthrough.traceRequested.connect(lambda *_: self.request_trace())
        self.walkthrough.lookupShown.connect(self._show_walk_lookup)
        self.token_map.tokenHovered.connect(self._show_walk_lookup)
        self.token_map.tokenPointed.connect(self.kernel_panel.show_hovered_token)
        self.sequence_view.sequenceSelected.connect(self.select_sequence)
        self.sequence_view.contextMenuRequested.connect(self._sequence_menu)
        self.pool_view.blockClicked.connect(self._block_clicked)
        self.pool_view.blockContextMenu.connect(self._block_menu)

        self.set_speed(speed if speed is not None else self.setting("speed"))
        self.apply_theme(self.theme.name)
        geometry = self.setting("geometry")
        if geometry is not None and not self.restoreGeometry(geometry):
            self.settings.remove("geometry")
            self.settings_notes.append("settings: ignored the saved window geometry (unreadable); using the default")
        self.default_state = self.saveState(LAYOUT_VERSION)
        state = self.setting("windowState")
        if state is not None:
            self.restoreState(state, LAYOUT_VERSION)  # False for an older layout too: not worth a note
        if self.settings_notes:
            self.statusBar().showMessage(" · ".join(self.settings_notes), 15_000)

    def setting(self, key: str):
        """A saved setting, checked (a bad value: its default, and a note in the status bar)."""
        return read_setting(self.settings, key, self.settings_notes.append)

    # -- layout ----------------------------------------------------------------------
    def _build_central(self) -> None:
        # A long title keeps to one line ending in "…" (whole in its tooltip) rather than
        # widen the centre and squeeze the docks beside it, or push the pool down.
        self.scenario_title = ElidedLabel(max_lines=1)
        self.scenario_title.setObjectName("scenarioTitle")
        self.scenario_title.set_full_text("loading…")
        # Three lines at most, ending in "…" where it goes on (the whole text in the tooltip).
        self.scenario_description = ElidedLabel(max_lines=3)
        self.scenario_description.setObjectName("scenarioDescription")
        self.pool_caption = QLabel()
        self.pool_caption.setWordWrap(True)
        # What the step just did, in one sentence (and the scenario's own narration of it).
        # A fixed height (the pool must not jump as captions grow and shrink); a long one scrolls.
        self.step_caption = QTextBrowser()
        self.step_caption.setFrameShape(QFrame.Shape.NoFrame)
        self.step_caption.setFixedHeight(4 * self.fontMetrics().lineSpacing() + 8)
        self.step_caption.viewport().setAutoFillBackground(False)
        self.step_caption.viewport().setStyleSheet("background: transparent;")  # not the scroll bar
        self.step_caption.setToolTip("What this step did to the block tables and the pool (Step log: every step)")
        self.pool_caption.setToolTip("The physical KV-cache pool: one tile per block, one cell per token slot")
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(8, 6, 8, 4)
        layout.addWidget(self.scenario_title)
        layout.addWidget(self.scenario_description)
        layout.addWidget(self.pool_caption)
        layout.addWidget(self.step_caption)
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
        self.token_map = TokenMap(self.theme)
        self.token_caption = QLabel()
        self.token_caption.setWordWrap(True)
        # Neither may widen the dock as the selection changes (the pool would jump).
        self.token_caption.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        token_scroll = QScrollArea()
        token_scroll.setWidgetResizable(True)
        token_scroll.setWidget(self.token_map)
        token_scroll.setMinimumHeight(48)
        token_scroll.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Expanding)
        left_panel = QWidget()
        left_layout = QVBoxLayout(left_panel)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(self.sequence_view, 3)
        left_layout.addWidget(self.token_caption)
        left_layout.addWidget(token_scroll, 1)
        self.sequences_dock = self._dock("Sequences and block tables", left_panel, left, "seqs")
        # The kernel's two views share one dock as tabs: the check, and the walk-through.
        self.kernel_tabs = QTabWidget()
        self.kernel_tabs.setDocumentMode(True)
        self.kernel_tabs.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.kernel_tabs.addTab(self.kernel_panel, "Check")
        self.kernel_tabs.addTab(self.walkthrough, "Walk-through")
        self.kernel_tabs.setTabToolTip(
            0, "The paged kernel's output against dense attention, for the selected sequence"
        )
        self.kernel_tabs.setTabToolTip(
            1, "The kernel walk-through: this step's kernel replayed stage by stage for the selected sequence and head"
        )
        # The guide is a tab here, not a dock of its own: tabifying a second group of docks
        # (beside Memory | Waste) leaves an orphaned copy of its tab bar on screen (Qt 6).
        self.guide = QTextBrowser()
        self.guide.setHtml(GUIDE_HTML)
        self.kernel_tabs.addTab(self.guide, "Guide")
        self.kernel_tabs.setTabToolTip(2, "What every element means, in vLLM's words (F1)")
        self.kernel_tabs.currentChanged.connect(lambda _: self._walkthrough_shown(self._kernel_dock_shown))
        self._kernel_dock_shown = False
        self.kernel_dock = self._dock("Kernel · Guide", self.kernel_tabs, right, "kernel")
        self.kernel_dock.visibilityChanged.connect(self._kernel_dock_visibility)
        self.memory_dock = self._dock("Memory", self.memory_panel, Qt.DockWidgetArea.BottomDockWidgetArea, "memory")
        self.waste_dock = self._dock(
            "Waste vs contiguous", self.waste_panel, Qt.DockWidgetArea.BottomDockWidgetArea, "waste"
        )
        self.tabifyDockWidget(self.memory_dock, self.waste_dock)
        self.scheduler_view = SchedulerView(self.colours, self.theme)
        self.director.scheduler_view = self.scheduler_view
        self.scheduler_dock = self._dock(
            "Scheduler", self.scheduler_view, Qt.DockWidgetArea.BottomDockWidgetArea, "scheduler"
        )
        self.tabifyDockWidget(self.memory_dock, self.scheduler_dock)  # the same group: no orphaned tab bar
        self.step_log = StepLog()
        self.step_log.seekRequested.connect(lambda step: self.controller.seek(step))
        self.step_log_dock = self._dock("Step log", self.step_log, Qt.DockWidgetArea.BottomDockWidgetArea, "steplog")
        self.step_log_dock.visibilityChanged.connect(lambda shown: shown and self.step_log.catch_up())
        self.tabifyDockWidget(self.memory_dock, self.step_log_dock)  # into the same group: no orphaned tab bar
        self.memory_dock.raise_()
        self.resizeDocks([self.sequences_dock, self.kernel_dock], [380, 420], Qt.Orientation.Horizontal)
        self.resizeDocks([self.memory_dock], [200], Qt.Orientation.Vertical)

    # -- scenario --------------------------------------------------------------------
    @property
    def selected_seq(self) -> str | None:
        return self.selection.current

    def load(self, scenario: Scenario) -> None:
        """Ask the worker to load ``scenario``. Nothing of the window changes until it has:
        a load that fails (a pool too large to allocate) leaves the current scenario, its
        steps and the recent files as they were."""
        # The worker compiles (or loads) the kernel for this dtype after the first frame:
        # say so, so that a first → that waits for it is not a mystery.
        self.statusBar().showMessage(f"preparing the {scenario.config.dtype} kernel…")
        self.controller.load(scenario)

    def _on_loaded(self, scenario: Scenario) -> None:
        """The worker built ``scenario``'s timeline; its first frame comes next."""
        self.colours.reset()
        self.selection.reset()
        self._announced_branch = None
        self._scheduler_raised = False
        self.waste_panel.clear()  # a study of the last scenario's pool says nothing of this one
        self.frame = None
        if Path(scenario.source).is_file():
            self.actions.remember(scenario.source)

    def show_welcome(self) -> WelcomeDialog:
        """Help → Welcome: what pagesim shows and the examples in a learner's order."""
        show = self.setting("welcome_at_start")
        dialog = WelcomeDialog(lambda name: self.load(load_shipped(name)), self, show)
        dialog.finished.connect(lambda _: self.settings.setValue("welcome_at_start", dialog.at_start.isChecked()))
        dialog.open()  # window-modal, returns at once
        return dialog

    @property
    def welcome_due(self) -> bool:
        return self.setting("welcome_at_start")

    def reload_scenario(self) -> None:
        """The scenario again from its file (or as shipped): its script from step 0, your actions gone."""
        scenario = self.controller.scenario
        if scenario is None:
            self.show_error("no scenario to reload")
            return
        if Path(scenario.source).exists():
            self.open_scenario(scenario.source)
        else:
            self.load(scenario)  # built in memory: its script as it was given
        self.statusBar().showMessage(f"reloaded {scenario.name}", 5000)

    def open_scenario(self, path: str) -> bool:
        try:
            scenario = load_scenario(path)
        except (PagesimError, OSError) as exc:
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
        try:
            atomic_write(path, scenario.to_toml())
        except OSError as exc:
            self.show_error(f"could not save {path}: {exc.strerror or exc}")
            return
        self.actions.remember(path)
        self.statusBar().showMessage(f"saved {path}", 6000)

    def _current_scenario(self) -> Scenario:
        return self.controller.scenario.with_operations(self.operations)

    @property
    def operations(self):
        return self.frame.operations if self.frame is not None else ()

    def open_dialog(self) -> None:
        # Start among the shipped scenarios (the examples), not wherever the app was launched.
        start = str(shipped_folder() or "")
        path, _ = QFileDialog.getOpenFileName(self, "Open scenario", start, "Scenarios (*.toml)")
        if path:
            self.open_scenario(path)

    def _save_to(self, title: str, default: str, kinds: str, then) -> None:
        path, _ = QFileDialog.getSaveFileName(self, title, default, kinds)
        if path:
            then(path)

    def save_dialog(self) -> None:
        self._save_to("Save scenario", "scenario.toml", "Scenarios (*.toml)", self.save_scenario)

    def save_screenshot(self, path: str) -> bool:
        """A PNG (or JPEG, BMP: by the suffix) of the window, written atomically. On failure
        the reason is shown and kept in ``last_error``."""
        self.memory_panel.flush()  # its history redraws a little late while frames stream in
        picture = self.grab()
        if picture.isNull():
            size = self.size()
            self.show_error(
                f"could not capture the window at {size.width()}×{size.height()} (too large for an image?); "
                f"{path} was not written"
            )
            return False
        try:
            with atomic_path(path) as tmp:
                if not picture.save(tmp, Path(path).suffix.lstrip(".").upper() or "PNG"):
                    raise OSError(f"the image writer refused it (format {Path(path).suffix or 'none'})")
        except OSError as exc:
            self.show_error(f"could not write {path}: {exc.strerror or exc}")
            return False
        self.statusBar().showMessage(f"saved {path}", 6000)
        return True

    def screenshot_dialog(self) -> None:
        self._save_to("Export screenshot", "pagesim.png", "PNG (*.png)", self.save_screenshot)

    def events_dialog(self) -> None:
        self._save_to("Export event log", "events.jsonl", "JSON lines (*.jsonl)", self.controller.export_events)

    def show_guide(self) -> None:
        self.kernel_dock.show()
        self.kernel_dock.raise_()
        self.kernel_tabs.setCurrentWidget(self.guide)

    # -- actions ---------------------------------------------------------------------
    def _need_selection(self, verb: str) -> str | None:
        if self.selected_seq is None:
            self.show_error(f"select a sequence to {verb} (click it in the list or one of its blocks)")
        return self.selected_seq

    def _new_name(self) -> str:
        return new_sequence_name(s.seq_id for s in self.frame.sequences) if self.frame else new_sequence_name(())

    def add_sequence(self) -> None:
        self.settings.setValue("prompt_len", self.actions.prompt_spin.value())
        name = self._new_name()
        self.selection.expect(name)
        self.controller.apply(Add(name, self.actions.prompt_spin.value()))

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
        if seq_id == self.selection.current:
            return
        self.selection.current = seq_id
        self.sequence_view.select(seq_id)  # echoes back here, and stops at the check above
        if self.frame is not None:
            self.pool_view.show_frame(self.frame, seq_id)
            self._show_tokens(self.frame)
        self.controller.set_focus(seq_id)

    def _block_clicked(self, block: int) -> None:
        holders = self.frame.holders.get(block, ()) if self.frame else ()
        if holders:
            self.select_sequence(self.selection.next_holder(holders))
        else:
            self.statusBar().showMessage(f"block {block} is free", 4000)

    def _sequence_menu(self, seq_id: str, global_pos) -> None:
        self.select_sequence(seq_id)
        menu = QMenu(self)
        a = self.actions
        for action in (a.grow_action, a.grow_n_action, a.fork_action, a.free_action):
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
        # One of the speed box's choices, the nearest (NaN: 1×): play's interval stays sane.
        if speed != speed:
            speed = 1.0
        index = min(range(len(SPEEDS)), key=lambda i: abs(SPEEDS[i][1] - speed))
        speed = SPEEDS[index][1]
        self.speed = speed
        if self.actions.speed_box.currentIndex() != index:
            self.actions.speed_box.setCurrentIndex(index)
        self.settings.setValue("speed", speed)
        self.controller.set_step_interval(int(BASE_STEP_MS / speed) if speed > 0 else INSTANT_STEP_MS)
        if speed <= 0:
            self.director.stop()

    def apply_theme(self, name: str) -> None:
        self.theme = THEMES[name]
        app = QApplication.instance()
        app.setPalette(qpalette(self.theme))
        style = resources.files("pagesim.assets") / "styles" / f"{name}.qss"
        self.setStyleSheet(style.read_text(encoding="utf-8") if style.is_file() else "")
        self.settings.setValue("theme", name)
        for view in (
            self.pool_view, self.sequence_view, self.kernel_panel, self.memory_panel, self.waste_panel,
            self.walkthrough, self.token_map, self.scheduler_view,
        ):  # fmt: skip
            view.set_theme(self.theme)

    # -- frames in -------------------------------------------------------------------
    def _show_lines(self, frame: Frame | None, lit: int | None = None) -> None:
        """Table-to-pool lines for the selected sequence (none when nothing is selected)."""
        state = frame.sequence(self.selected_seq) if frame is not None and self.selected_seq else None
        if state is None:
            self.table_lines.show_sequence(None, (), QColor(self.theme.text))
        else:
            self.table_lines.show_sequence(state.seq_id, state.block_table, self.colours(state.seq_id), lit)

    def _show_tokens(self, frame: Frame) -> None:
        self._show_lines(frame)
        state = frame.sequence(self.selected_seq) if self.selected_seq else None
        if state is None:
            self.token_map.show_sequence(None, [], 0, frame.config.block_size)
            self.token_caption.setText("Tokens: select a sequence")
            return
        weights = None
        if frame.focus is not None and frame.focus.seq_id == state.seq_id:
            head = min(self.kernel_panel.head_box.value(), frame.focus.weights.shape[0] - 1)
            weights = frame.focus.weights[head]
        self.token_map.show_sequence(
            state.seq_id,
            state.block_table,
            state.num_tokens,
            frame.config.block_size,
            weights,
            self.colours(state.seq_id),
        )
        self.token_caption.setText(
            f"Tokens of {state.seq_id}: {state.num_tokens}, a shade per block (hover one: where its K/V lives)"
        )
        self.token_caption.setToolTip(
            f"token t lives in logical block ⌊t/{frame.config.block_size}⌋ at offset t mod "
            f"{frame.config.block_size}; the block table maps the logical block to a physical one"
        )

    def _show_walk_lookup(self, seq: str, logical: int, physical: int, slot: int = -1) -> None:
        """Light the block (and the slot in it) that the walk-through's stage reads or the
        hovered token lives in, in the pool and in the table."""
        previous = getattr(self, "_walk_block", -1)
        if 0 <= previous < len(self.pool_view.items):
            self.pool_view.items[previous].set_glow(None)
        self._walk_block = physical
        if 0 <= physical < len(self.pool_view.items) and not self.director.running:
            self.pool_view.items[physical].set_glow(QColor(self.theme.highlight), slot=slot)
        self.sequence_view.set_lookup((seq, logical) if logical >= 0 else None)
        if seq == self.selected_seq:
            self._show_lines(self.frame, logical if logical >= 0 else None)

    def _kernel_dock_visibility(self, shown: bool) -> None:
        self._kernel_dock_shown = shown
        self._walkthrough_shown(shown)

    def show_walkthrough(self) -> None:
        """Bring the kernel walk-through to the front."""
        if not self._kernel_dock_shown:
            self.kernel_dock.show()
            self.kernel_dock.raise_()
        self.kernel_tabs.setCurrentWidget(self.walkthrough)
        self._walkthrough_shown(True)

    def _walkthrough_shown(self, dock_shown: bool) -> None:
        # A tabbed dock's content stays "visible" behind another tab: the dock and the tab say when it shows.
        shown = dock_shown and self.kernel_tabs.currentWidget() is self.walkthrough
        if shown == self.walkthrough_open:
            return
        self.walkthrough_open = shown
        if shown:
            self.request_trace()
        else:
            self._show_walk_lookup("", -1, -1, -1)

    def request_trace(self) -> None:
        """Replay the kernel for the selected sequence, only while the walk-through is shown."""
        if not self.walkthrough_open or self.frame is None or self.frame.attention is None:
            return
        seq = self.selected_seq
        if seq is None or seq not in self.frame.attention.seq_ids:
            self.walkthrough.show_walk(None)
            return
        w = self.walkthrough
        self.controller.trace_kernel(seq, w.head_box.value(), w.kernel, int(w.partition_box.currentData()))

    def _on_backend(self, name: str, device: str) -> None:
        self.backend_label.setText(f"{name.upper()} · {device}")
        self.kernel_panel.set_backend(name, device)
        self.walkthrough.set_default_kernel(name)

    def _on_playing(self, playing: bool) -> None:
        self.actions.play_action.setText("Pause" if playing else "Play")
        icon = QStyle.StandardPixmap.SP_MediaPause if playing else QStyle.StandardPixmap.SP_MediaPlay
        self.actions.play_action.setIcon(self.style().standardIcon(icon))

    def _on_frame(self, frame: Frame) -> None:
        self.pool_view.clear_refusal()  # an action went through: the refusal is history
        first = self.frame is None
        self.frame = frame
        if self.statusBar().styleSheet():  # an error turned it red; restyling costs a re-polish
            self.statusBar().setStyleSheet("")
        if first and frame.position == 0:
            self.statusBar().showMessage(
                f"{frame.scenario_name}: {frame.length} steps · Space plays, → steps, A adds a sequence", 10_000
            )
        self.selection.reconcile(frame)
        self.sequence_view.show_frame(frame)
        self.sequence_view.select(self.selected_seq)
        self.pool_view.show_frame(frame, self.selected_seq)
        self.kernel_panel.show_frame(frame)
        self.memory_panel.show_frame(frame)
        self.walkthrough.set_heads(frame.config.num_heads)
        self._show_tokens(frame)
        self.request_trace()
        c = frame.config
        branched = frame.branch_step is not None
        self.scenario_title.set_full_text(
            frame.scenario_name + (f" — your branch from step {frame.branch_step}" if branched else "")
        )
        if branched and frame.branch_step != self._announced_branch and frame.can_undo:
            self.statusBar().showMessage(
                f"Your action branched off the script at step {frame.branch_step}: its later steps are set aside. "
                "Edit → Undo (Ctrl+Z) brings them back; File → Reload starts over.",
                15_000,
            )
        self._announced_branch = frame.branch_step
        description = " ".join(frame.scenario_description.split())
        self.scenario_description.set_full_text(description)
        self.pool_caption.setText(
            f"Physical KV-cache pool · {c.num_blocks} blocks × block size {c.block_size} · {c.num_heads} heads "
            f"({c.num_kv_heads} KV) × head dim {c.head_dim} · {c.dtype} · {len(frame.free_queue)} in the free queue"
        )
        self._sync_timeline(frame)
        self._show_caption(frame)
        self.step_log.show_frame(frame)
        self.scheduler_view.show_frame(frame)
        if frame.queues is not None and not self._scheduler_raised:  # a scheduler scenario: its queues in front
            self._scheduler_raised = True
            self.scheduler_dock.raise_()
        self._announce_scheduler_events(frame)
        attended = frame.attention is not None and self.selected_seq in frame.attention.seq_ids
        stale_focus = frame.focus is None or frame.focus.seq_id != self.selected_seq
        if stale_focus and attended:
            self.controller.set_focus(self.selected_seq)
        muted, good, bad = (QColor(c) for c in (self.theme.muted, self.theme.good, self.theme.bad))
        self.director.play(beats_for(frame, self.selected_seq, self.colours, muted, self.speed, good, bad))

    def _show_caption(self, frame: Frame) -> None:
        if frame.position == 0:
            text = f"Step 0 of {frame.length}: nothing yet. → plays the first step; the Step log lists them all."
        else:
            text = f"<b>Step {frame.position}</b> · {html.escape(frame.caption or frame.label)}"
        if frame.note:  # the scenario's narration, after what happened
            text += f"<br><i>{html.escape(frame.note)}</i>"
        if text != self._caption_html:  # relaying out rich text on every step costs
            self._caption_html = text
            self.step_caption.setHtml(text)

    def _announce_scheduler_events(self, frame: Frame) -> None:
        """Preemptions and rejections say what they cost, in the status bar."""
        if frame.status_notes:
            self.statusBar().showMessage(" · ".join(frame.status_notes), 8000)

    def _sync_timeline(self, frame: Frame) -> None:
        self._syncing = True
        self.actions.scrubber.setMaximum(frame.length)
        self.actions.scrubber.setValue(frame.position)
        self._syncing = False
        attention = frame.attention
        check = ""
        if attention is not None:
            check = " · ✓ kernel = dense" if attention.passed else " · ✗ kernel ≠ dense"
        self.actions.step_label.setText(f"step {frame.position} / {frame.length} · {frame.label}{check}")
        self.actions.back_action.setEnabled(frame.position > 0)
        self.actions.start_action.setEnabled(frame.position > 0)
        self.actions.forward_action.setEnabled(frame.position < frame.length)
        self.actions.end_action.setEnabled(frame.position < frame.length)
        self.actions.undo_action.setEnabled(frame.can_undo)
        self.actions.redo_action.setEnabled(frame.can_redo)
        self.actions.scrubber.set_branch(frame.branch_step)
        branch = "" if frame.branch_step is None else f" · your branch from step {frame.branch_step} (marked)"
        self.actions.scrubber.setToolTip(
            "Scrub through the scenario's steps; going back shows exactly the earlier state" + branch
        )

    def scrubbed(self, value: int) -> None:
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
        self.walkthrough.timer.stop()
        self.memory_panel.flush()
        self.controller.shutdown()
        if self._gc_held:
            self._gc_held = False
            gc_guard.release()
        super().closeEvent(event)
