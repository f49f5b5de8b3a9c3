"""The main window: pool in the centre, sequences left, kernel check right (folded to a badge
over the pool by default), memory below.

It builds the layout, the docks and the menus and wires them: each view follows the
controller's frames itself (``bind``), the selection first, as they read it; files live in
:mod:`scenario_files`, the status bar's wording in :mod:`status`."""

from __future__ import annotations

from importlib import resources

from pagesim.app.gui import gc_guard
from pagesim.app.gui.actions import LAYOUT_VERSION, SPEEDS, WindowActions
from pagesim.app.gui.add_dialog import AddPromptDialog
from pagesim.app.gui.animation import AnimationDirector, beats_for
from pagesim.app.gui.attach import KVAttach
from pagesim.app.gui.controller import SimulationController
from pagesim.app.gui.guide import GUIDE_HTML
from pagesim.app.gui.model_loader import ModelLoader
from pagesim.app.gui.palette import THEMES, SequenceColours, qpalette
from pagesim.app.gui.scenario_files import ScenarioFiles
from pagesim.app.gui.selection import Selection
from pagesim.app.gui.settings import read_setting
from pagesim.app.gui.status import StatusReporter
from pagesim.app.gui.studies import StudyDocks
from pagesim.app.gui.views.beam_tree import BeamTreeView
from pagesim.app.gui.views.check_badge import CheckBadge, CheckFold
from pagesim.app.gui.views.connectors import TableToPoolLines
from pagesim.app.gui.views.header import ScenarioHeader
from pagesim.app.gui.views.plots import KernelPanel, MemoryPanel, WastePanel
from pagesim.app.gui.views.pool_legend import PoolLegend
from pagesim.app.gui.views.pool_view import PoolView
from pagesim.app.gui.views.scheduler_view import SchedulerView
from pagesim.app.gui.views.sequence_text import SequenceText, TokensAndText
from pagesim.app.gui.views.sequence_view import SequenceView
from pagesim.app.gui.views.step_log import StepLog
from pagesim.app.gui.views.step_work import StepWorkBar
from pagesim.app.gui.views.swap_flight import SwapFlight
from pagesim.app.gui.views.token_budget import TokenBudgetBar, scheduler_panel
from pagesim.app.gui.views.token_map import TokenMap
from pagesim.app.gui.views.walkthrough import WalkThroughPanel, WalkThroughTab
from pagesim.app.gui.welcome import WelcomeDialog
from pagesim.core.errors import PagesimError
from pagesim.core.operations import Add, Fork, Free, Grow, Schedule, Submit, introduced_names, new_sequence_name
from pagesim.core.scenario import Scenario, load_shipped, scenario_model
from pagesim.core.view_model import Frame
from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QHBoxLayout,
    QMainWindow,
    QMenu,
    QScrollArea,
    QSizePolicy,
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
        self._names_in_flight: set[str] = set()  # new names handed out, their operations not yet answered
        self._played_position: int | None = None  # the step the animations last played
        self.selection = Selection()
        gc_guard.acquire(self)  # cyclic GC on this thread only while the worker runs
        self._gc_held = True
        self.setWindowTitle("pagesim — PagedAttention simulator")
        self.resize(1400, 860)

        self.controller = c = SimulationController(backend, self, cuda_kernel)
        self.pool_view = PoolView(self.colours, self.theme)
        self.sequence_view = SequenceView(self.colours, self.theme)
        self.kernel_panel = KernelPanel(self.theme, self.colours)
        self.memory_panel = MemoryPanel(self.theme)
        self.waste_panel = WastePanel(self.theme, c.compute_waste)
        self.walkthrough = WalkThroughPanel(self.theme)
        self.swap_flight = SwapFlight(self)
        self.director = AnimationDirector(self.pool_view, self.sequence_view, self, swap_flight=self.swap_flight)
        self.header = ScenarioHeader()
        self.pool_legend = PoolLegend(self.theme, self.colours)
        self.check_badge = CheckBadge(self.theme)
        self._build_central()
        self._scheduler_raised = self._beam_tree_raised = False
        self._build_docks()
        # The Check panel folds to its badge by default and in narrow windows: the pool gets the width.
        self.check_fold = CheckFold(self, self.kernel_dock, self.kernel_tabs, self.kernel_panel, self.check_badge)
        self.table_lines = TableToPoolLines(self, self.sequence_view, self.pool_view)
        self.table_lines.set_text_widgets(
            [
                *self.header.widgets,
                self.step_work_bar,
                self.header.pool_caption,
                self.pool_legend,
                self.token_map.caption,
            ]
        )
        self.files = ScenarioFiles(self)
        self.status = StatusReporter(self.statusBar(), self.theme)
        self.model_loader = ModelLoader(self.statusBar(), self)  # a real model's first load, off this thread
        self.kv_attach = KVAttach(self)  # File → Attach to vLLM…: live views of a server's prefix cache
        self.actions = WindowActions(self)
        self.studies = StudyDocks(self)  # What-if and Latency, tabbed with Memory; the Studies menu
        self.studies.add_menu()

        # Frames in: the selection first (every view reads it), then the views, each on its own.
        c.loaded.connect(self._on_loaded)
        c.frameChanged.connect(lambda frame: self.colours.follow(frame.operations))  # before the views draw
        self.selection.bind(c)
        self.status.bind(c)
        self.sequence_view.bind(c, self.selection)
        self.pool_view.bind(c, self.selection)
        self.kernel_panel.bind(c)
        self.memory_panel.bind(c)
        self.walkthrough_tab.bind(c)
        self.table_lines.bind(c, self.selection, self.colours, self.theme)
        self.token_map.bind(c, self.selection, self.colours, self.kernel_panel.head_box.value)
        self.sequence_text.bind(c, self.selection)
        self.header.bind(c)
        self.pool_legend.bind(c)
        self.check_badge.bind(c)
        self.actions.bind(c)
        self.step_log.bind(c)
        self.studies.bind(c)
        self.scheduler_view.bind(c)
        self.token_budget.bind(c)
        self.step_work_bar.bind(c)
        self.beam_tree.bind(c)
        self.beam_tree.canvas.beamClicked.connect(self.select_sequence)
        self.files.bind(c)
        c.frameChanged.connect(self._on_frame)
        c.poolRefused.connect(lambda needed, free: self.pool_view.show_refusal(needed, free, self.last_error or ""))
        c.wasteReady.connect(self.waste_panel.show_result)
        c.studyFailed.connect(lambda study, message: study == "waste" and self.waste_panel.show_failure(message))
        self.walkthrough.lookupShown.connect(self._show_walk_lookup)
        self.token_map.tokenHovered.connect(self._show_walk_lookup)
        self.sequence_view.entryHovered.connect(self._show_walk_lookup)
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
            self.status.say(" · ".join(self.settings_notes), 15_000)

    def setting(self, key: str):
        """A saved setting, checked (a bad value: its default, and a note in the status bar)."""
        return read_setting(self.settings, key, self.settings_notes.append)

    # -- layout ----------------------------------------------------------------------
    def _build_central(self) -> None:
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(8, 6, 8, 4)
        for widget in self.header.widgets:
            layout.addWidget(widget)
        self.step_work_bar = StepWorkBar(self.colours, self.theme)  # what the step computed: prefill or decode
        layout.addWidget(self.step_work_bar)
        caption_row = QHBoxLayout()  # the pool's caption, and the kernel check's badge at its right
        caption_row.addWidget(self.header.pool_caption, 1)
        caption_row.addWidget(self.check_badge)
        layout.addLayout(caption_row)
        layout.addWidget(self.pool_legend)
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
        bottom = Qt.DockWidgetArea.BottomDockWidgetArea
        self.token_map = TokenMap(self.theme)
        token_scroll = QScrollArea()
        token_scroll.setWidgetResizable(True)
        token_scroll.setWidget(self.token_map)
        token_scroll.setMinimumHeight(48)
        # It may not widen the dock as the selection changes (the pool would jump).
        token_scroll.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Expanding)
        left_panel = QWidget()
        left_layout = QVBoxLayout(left_panel)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(self.sequence_view, 3)
        self.sequence_text = SequenceText(self.colours, self.theme)  # a real model's text (its tab hidden otherwise)
        self.tokens_and_text = TokensAndText(self.token_map.caption, token_scroll, self.sequence_text)
        left_layout.addWidget(self.tokens_and_text, 1)
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
        self.kernel_dock = self._dock("Kernel · Guide", self.kernel_tabs, right, "kernel")
        self.walkthrough_tab = WalkThroughTab(self.walkthrough, self.kernel_tabs, self.kernel_dock, self.selection)
        self.memory_dock = self._dock("Memory", self.memory_panel, bottom, "memory")
        self.waste_dock = self._dock("Waste vs contiguous", self.waste_panel, bottom, "waste")
        self.tabifyDockWidget(self.memory_dock, self.waste_dock)
        self.scheduler_view = SchedulerView(self.colours, self.theme)
        self.director.scheduler_view = self.scheduler_view
        self.token_budget = TokenBudgetBar(self.colours, self.theme)  # v1's budget, over the queues
        panel = scheduler_panel(self.token_budget, self.scheduler_view)
        self.scheduler_dock = self._dock("Scheduler", panel, bottom, "scheduler")
        self.tabifyDockWidget(self.memory_dock, self.scheduler_dock)  # the same group: no orphaned tab bar
        self.step_log = StepLog()
        self.step_log_dock = self._dock("Step log", self.step_log, bottom, "steplog")
        self.step_log_dock.visibilityChanged.connect(lambda shown: shown and self.step_log.catch_up())
        self.tabifyDockWidget(self.memory_dock, self.step_log_dock)  # into the same group: no orphaned tab bar
        self.beam_tree = BeamTreeView(self.colours, self.theme)
        self.beam_tree_dock = self._dock("Beam tree", self.beam_tree, bottom, "beamtree")
        self.tabifyDockWidget(self.memory_dock, self.beam_tree_dock)
        self.memory_dock.raise_()
        self.resizeDocks([self.sequences_dock, self.kernel_dock], [380, 420], Qt.Orientation.Horizontal)
        self.resizeDocks([self.memory_dock], [200], Qt.Orientation.Vertical)

    # -- scenario --------------------------------------------------------------------
    @property
    def selected_seq(self) -> str | None:
        return self.selection.current

    @property
    def last_error(self) -> str | None:
        return self.status.last_error

    def load(self, scenario: Scenario) -> None:
        """Ask the worker to load ``scenario``. Nothing of the window changes until it has:
        a load that fails (a pool too large to allocate) leaves the current scenario, its
        steps and the recent files as they were. (A model still loading for another
        scenario opens nothing when it is ready: this one was asked for later.)"""
        self.model_loader.supersede()
        self.status.preparing(scenario.config.dtype)
        self.controller.load(scenario)

    def open_shipped(self, name: str) -> None:
        """A shipped scenario by name: its model loaded first if it is not in memory (off the
        GUI thread, with a progress bar), then parsed and loaded."""

        def parse_and_load() -> None:
            try:
                scenario = load_shipped(name)
            except PagesimError as exc:  # said in the status bar: the current scenario stays
                self.status.show_error(str(exc))
                return
            self.load(scenario)

        self.model_loader.ensure(scenario_model(name), parse_and_load, self.status.show_error)

    def _on_loaded(self, scenario: Scenario) -> None:
        """The worker built ``scenario``'s timeline; its first frame comes next."""
        self.colours.reset()
        self.selection.reset()
        self._scheduler_raised = self._beam_tree_raised = False
        self.waste_panel.clear()  # a study of the last scenario's pool says nothing of this one
        self.frame = None

    def show_welcome(self) -> WelcomeDialog:
        """Help → Welcome: what pagesim shows and the examples in a learner's order."""
        show = self.setting("welcome_at_start")
        dialog = WelcomeDialog(self.open_shipped, self, show)
        dialog.finished.connect(lambda _: self.settings.setValue("welcome_at_start", dialog.at_start.isChecked()))
        dialog.finished.connect(lambda _: self._take_focus_back())
        dialog.open()  # window-modal, returns at once
        return dialog

    @property
    def welcome_due(self) -> bool:
        return self.setting("welcome_at_start")

    def show_guide(self) -> None:
        self.kernel_dock.show()
        self.kernel_dock.raise_()
        self.kernel_tabs.setCurrentWidget(self.guide)

    def show_walkthrough(self) -> None:
        """Bring the kernel walk-through to the front."""
        self.walkthrough_tab.show()

    # -- actions ---------------------------------------------------------------------
    def _need_selection(self, verb: str) -> str | None:
        if self.selected_seq is None:
            self.status.show_error(f"select a sequence to {verb} (click it in the list or one of its blocks)")
        return self.selected_seq

    def _new_name(self) -> str:
        """A name no live sequence has and no request of the timeline had (a finished or
        waiting request keeps its name: the scheduler refuses it again)."""
        taken = set(self._names_in_flight)  # (asked for, not yet in a frame: Add pressed twice quickly)
        if self.frame is not None:
            taken |= {*(s.seq_id for s in self.frame.sequences), *introduced_names(self.frame.operations)}
        name = new_sequence_name(taken)
        self._names_in_flight.add(name)
        return name

    def add_sequence(self) -> None:
        if self.frame is not None and self.frame.has_text:  # a real model: a prompt typed as text
            if getattr(self, "add_dialog", None) is not None:
                self.add_dialog.deleteLater()  # the last one's values were read when it closed
            # A scenario whose scheduler runs its requests: a request first.
            scheduled = any(isinstance(op, Submit | Schedule) for op in self.frame.operations)
            self.add_dialog = AddPromptDialog(self._new_name(), self, as_request=scheduled)
            self.add_dialog.accepted.connect(self._add_typed)
            self.add_dialog.finished.connect(lambda _: self._take_focus_back())
            self.add_dialog.open()  # window-modal, returns at once
            return
        self.settings.setValue("prompt_len", self.actions.prompt_spin.value())
        name = self._new_name()
        self.selection.expect(name)
        self.controller.apply(Add(name, self.actions.prompt_spin.value()))

    def _take_focus_back(self) -> None:
        """The window active again once a dialog closes: its shortcuts (G to grow what was just
        added) answer at once, not after a click."""
        self.activateWindow()  # (its last focused widget gets the keyboard back)

    def _add_typed(self) -> None:
        dialog = self.add_dialog
        chat, sampling = dialog.as_chat.isChecked(), dialog.sampling()
        if dialog.as_request:
            out, n, beams = dialog.output_len.value(), dialog.samples.value(), dialog.beam_width.value()
            self.controller.submit_text(dialog.seq, dialog.text, chat, sampling, out, n, beams)
            return
        self.selection.expect(dialog.seq)
        self.controller.add_text(dialog.seq, dialog.text, chat, sampling)

    def schedule_step(self) -> None:
        """One step of the scenario's scheduler: admit, prefill, one token per running sequence."""
        self.controller.apply(Schedule(1))

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
            self.table_lines.show_selected()
            self.token_map.refresh()
            self.sequence_text.refresh()
        self.controller.set_focus(seq_id)

    def _block_clicked(self, block: int) -> None:
        holders = self.frame.holders.get(block, ()) if self.frame else ()
        if holders:
            self.select_sequence(self.selection.next_holder(holders))
        else:
            self.status.say(f"block {block} is free", 4000)

    def _context_menu(self) -> QMenu:
        """A right-click menu: parented to the window (its style and palette) and deleted
        once it closes, with its submenus and actions, so right-clicks leave nothing behind
        (an action it triggers runs before the deletion: that waits for the event loop)."""
        menu = QMenu(self)
        menu.aboutToHide.connect(menu.deleteLater)
        return menu

    def _sequence_menu(self, seq_id: str, global_pos) -> None:
        self.select_sequence(seq_id)
        menu = self._context_menu()
        a = self.actions
        for action in (a.grow_action, a.grow_n_action, a.fork_action, a.free_action):
            menu.addAction(action)
        menu.popup(global_pos)

    def _block_menu(self, block: int, global_pos) -> None:
        holders = self.frame.holders.get(block, ()) if self.frame else ()
        menu = self._context_menu()
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
        if (chosen := getattr(getattr(self, "actions", None), "theme_actions", {}).get(name)) is not None:
            chosen.setChecked(True)  # (the View menu's, once it exists)
        for view in (
            self.pool_view, self.sequence_view, self.kernel_panel, self.memory_panel, self.waste_panel,
            self.walkthrough, self.token_map, self.scheduler_view, self.token_budget, self.table_lines, self.status,
            self.pool_legend, self.check_badge, self.studies, self.sequence_text,
        ):  # fmt: skip
            view.set_theme(self.theme)
        self.step_work_bar.set_theme(self.theme)
        self.beam_tree.set_theme(self.theme)

    # -- frames in -------------------------------------------------------------------
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
            self.table_lines.show_selected(logical if logical >= 0 else None)

    def _on_frame(self, frame: Frame) -> None:
        """After the views: what the window itself does with a frame."""
        if not self.controller.pending:  # every request answered: the frame knows every name
            self._names_in_flight.clear()
        self.frame = frame
        if frame.queues is not None and not self._scheduler_raised:  # a scheduler scenario: its queues in front
            self._scheduler_raised = True
            self.scheduler_dock.raise_()
        if frame.beam_trees and not self._beam_tree_raised:  # the search's first step: its tree in front
            self._beam_tree_raised = True
            self.beam_tree_dock.raise_()
            if self.height() >= 900:  # room for a few branches without scrolling (a small window keeps its pool)
                tall = max(self.beam_tree_dock.height(), self.height() // 3)
                self.resizeDocks([self.beam_tree_dock], [tall], Qt.Orientation.Vertical)
        attended = frame.attention is not None and self.selected_seq in frame.attention.seq_ids
        stale_focus = frame.focus is None or frame.focus.seq_id != self.selected_seq
        if stale_focus and attended:
            self.controller.set_focus(self.selected_seq)
        muted, good, bad = (QColor(c) for c in (self.theme.muted, self.theme.good, self.theme.bad))
        # (a frame of the same step without events: another sequence selected, the copy stays marked)
        same_step = frame.events is None and frame.position == self._played_position
        self._played_position = frame.position
        beats = beats_for(frame, self.selected_seq, self.colours, muted, self.speed, good, bad)
        self.director.play(beats, keep_copies=same_step)

    # -- shutdown --------------------------------------------------------------------
    def closeEvent(self, event) -> None:
        self.settings.setValue("geometry", self.saveGeometry())
        self.settings.setValue("windowState", self.saveState(LAYOUT_VERSION))
        self.director.stop()
        self.walkthrough.timer.stop()
        self.memory_panel.flush()
        self.kv_attach.close_all()
        self.controller.shutdown()
        if self._gc_held:
            self._gc_held = False
            gc_guard.release()
        super().closeEvent(event)
