"""The main window's actions, toolbars and menus, and its list of recent files.

What each action does is a window, file or controller method, named here, so the
keyboard map and the menus can be read in one place; the timeline's controls (scrubber,
step label, which actions are enabled) follow the frames themselves.
"""

from __future__ import annotations

import html
import weakref

from pagesim.app.gui.palette import THEMES
from pagesim.app.gui.views.live_text import LiveText
from pagesim.core.scenario import examples
from pagesim.core.view_model import Frame
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QAction, QActionGroup, QColor, QKeySequence, QPainter, QPolygon
from PySide6.QtWidgets import QComboBox, QLabel, QSlider, QSpinBox, QStyle, QStyleOptionSlider, QToolBar, QToolButton

STEP_LABEL_CHARS = 50  # "step 120 / 376 · grow r255 by 1 · ✓ kernel = dense"; longer ones end in "…"
SPEEDS = [("Instant", 0.0), ("0.25×", 0.25), ("0.5×", 0.5), ("1×", 1.0), ("2×", 2.0), ("4×", 4.0)]
LAYOUT_VERSION = 8  # bump when docks change: an older saved layout is then ignored


class BranchSlider(QSlider):
    """The timeline's scrubber, with the step where the user's actions left the script marked."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.branch: int | None = None

    def set_branch(self, step: int | None) -> None:
        if step != self.branch:
            self.branch = step
            self.update()

    def _rects(self):
        option = QStyleOptionSlider()
        self.initStyleOption(option)
        style, control = self.style(), QStyle.ComplexControl.CC_Slider
        groove = style.subControlRect(control, option, QStyle.SubControl.SC_SliderGroove, self)
        handle = style.subControlRect(control, option, QStyle.SubControl.SC_SliderHandle, self)
        return groove, handle

    def mousePressEvent(self, event) -> None:
        """A click on the track goes to the step under the pointer (it moved a page of ten
        steps toward it), and the handle then follows a drag from there."""
        if event.button() == Qt.MouseButton.LeftButton and self.maximum() > self.minimum():
            groove, handle = self._rects()
            point = event.position().toPoint()
            if not handle.contains(point):
                span = max(1, groove.width() - handle.width())
                x = point.x() - groove.x() - handle.width() // 2
                self.setValue(QStyle.sliderValueFromPosition(self.minimum(), self.maximum(), x, span))
        super().mousePressEvent(event)

    def paintEvent(self, event) -> None:
        super().paintEvent(event)
        if self.branch is None or self.maximum() <= self.minimum():
            return
        groove, handle = self._rects()
        span = groove.width() - handle.width()
        x = (
            groove.x()
            + handle.width() // 2
            + QStyle.sliderPositionFromValue(self.minimum(), self.maximum(), self.branch, span)
        )
        painter = QPainter(self)
        painter.setPen(QColor("#e8a33d"))
        painter.setBrush(QColor("#e8a33d"))
        painter.drawPolygon(QPolygon([QPoint(x - 5, 0), QPoint(x + 5, 0), QPoint(x, 7)]))
        painter.drawLine(x, 0, x, self.height())
        painter.end()


class WindowActions:
    def __init__(self, window) -> None:
        self._window = weakref.ref(window)  # no Python cycle window ↔ actions (see gc_guard)
        self._frame: Frame | None = None  # the newest frame (the scrubber seeks from it)
        self._syncing = False  # the scrubber follows a frame: no seek
        self._build_actions()
        self._build_toolbars()
        self._build_menus()

    @property
    def window(self):
        return self._window()

    def _action(self, text: str, slot, shortcut=None, tip: str = "") -> QAction:
        w = self.window
        action = QAction(text, w)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.setToolTip(f"{tip} ({action.shortcut().toString()})" if shortcut else tip)
        action.setStatusTip(tip)
        action.triggered.connect(slot)
        w.addAction(action)
        return action

    def _build_actions(self) -> None:
        w = self.window
        a = self._action
        self.add_action = a("Add", w.add_sequence, "A", "Add a sequence with a prompt of the given length")
        self.grow_action = a("Grow +1", lambda: w.grow_selected(1), "G", "Decode one token for the selected sequence")
        self.grow_n_action = a(
            "Grow +N",
            lambda: w.grow_selected(self.grow_spin.value()),
            "Shift+G",
            "Decode N tokens for the selected sequence",
        )
        self.fork_action = a("Fork", w.fork_selected, "F", "Fork the selected sequence: share all its blocks")
        self.free_action = a("Free", w.free_selected, Qt.Key.Key_Delete, "Free the selected sequence's blocks")
        self.schedule_action = a(
            "Schedule",
            w.schedule_step,
            "S",
            "One scheduler step for the submitted requests: admit waiting ones (prefill), one token for each "
            "running one, preempt if the pool runs out (your own sequences grow with Grow)",
        )
        self.start_action = a("Start", lambda: w.controller.seek(0), Qt.Key.Key_Home, "Go to the start")
        self.back_action = a("Back", w.controller.back, Qt.Key.Key_Left, "Step back")
        self.play_action = a("Play", w.controller.toggle_play, Qt.Key.Key_Space, "Play / pause the scenario")
        self.forward_action = a("Forward", w.controller.forward, Qt.Key.Key_Right, "Step forward")
        self.end_action = a("End", w.seek_end, Qt.Key.Key_End, "Go to the last step")
        icons = {
            self.start_action: QStyle.StandardPixmap.SP_MediaSkipBackward,
            self.back_action: QStyle.StandardPixmap.SP_MediaSeekBackward,
            self.play_action: QStyle.StandardPixmap.SP_MediaPlay,
            self.forward_action: QStyle.StandardPixmap.SP_MediaSeekForward,
            self.end_action: QStyle.StandardPixmap.SP_MediaSkipForward,
        }
        for action, icon in icons.items():
            action.setIcon(w.style().standardIcon(icon))
        self.zoom_in_action = a(
            "Zoom in", lambda: w.pool_view.zoom(1.25), QKeySequence.StandardKey.ZoomIn, "Zoom the pool in"
        )
        self.zoom_out_action = a(
            "Zoom out", lambda: w.pool_view.zoom(0.8), QKeySequence.StandardKey.ZoomOut, "Zoom the pool out"
        )
        self.fit_action = a("Fit pool", w.pool_view.fit, "Ctrl+0", "Fit the whole pool in view")

    def _build_toolbars(self) -> None:
        w = self.window
        ops = QToolBar("Operations")
        ops.setObjectName("operations")
        w.addToolBar(ops)
        self.prompt_spin = QSpinBox()
        self.prompt_spin.setRange(1, 100_000)
        self.prompt_spin.setValue(w.setting("prompt_len"))
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
            self.schedule_action,
            None,
            self.zoom_in_action,
            self.zoom_out_action,
            self.fit_action,
        ):
            if widget is None:
                ops.addSeparator()
            elif isinstance(widget, QAction) and widget is not self.schedule_action:
                ops.addAction(widget)
            elif widget is self.prompt_spin:
                self.prompt_spin_action = ops.addWidget(widget)  # hidden on a real model (Add asks for text)
            elif widget is self.schedule_action:
                # Shown in place of the prompt length, on a real model (Add can submit a request);
                # the menu item and S work on any scenario.
                button = QToolButton()
                button.setDefaultAction(widget)
                button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
                self.schedule_button_action = ops.addWidget(button)
                self.schedule_button_action.setVisible(False)
            else:
                ops.addWidget(widget)

        timeline = QToolBar("Timeline")
        timeline.setObjectName("timeline")
        timeline.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        w.addToolBar(Qt.ToolBarArea.BottomToolBarArea, timeline)
        for action in (self.start_action, self.back_action, self.play_action, self.forward_action, self.end_action):
            timeline.addAction(action)
        self.scrubber = BranchSlider(Qt.Orientation.Horizontal)
        self.scrubber.setToolTip("Scrub through the scenario's steps; going back shows exactly the earlier state")
        self.scrubber.setMinimumWidth(120)
        self.scrubber.valueChanged.connect(self._scrubbed)
        timeline.addWidget(self.scrubber)
        # Its text changes every step: a fixed-size live label, so the toolbar keeps its layout.
        self.step_label = LiveText(lines=1, width_chars=STEP_LABEL_CHARS)
        self.step_label.setText("step 0 / 0")
        timeline.addWidget(self.step_label)
        self.speed_box = QComboBox()
        for label, _ in SPEEDS:
            self.speed_box.addItem(label)
        self.speed_box.setToolTip("Animation and playback speed (Instant: no animation)")
        self.speed_box.currentIndexChanged.connect(lambda i: w.set_speed(SPEEDS[i][1]))
        timeline.addWidget(QLabel(" speed "))
        timeline.addWidget(self.speed_box)

    def _fill_examples(self) -> None:
        if self.examples_menu.actions():
            return
        w = self.window
        for number, example in enumerate(examples(), start=1):
            action = self.examples_menu.addAction(f"{number}. {example.title}")
            first_line = example.summary()
            action.setToolTip(first_line)
            action.setStatusTip(first_line)
            action.triggered.connect(lambda _=False, n=example.name: w.open_shipped(n))

    def _build_menus(self) -> None:
        w = self.window
        bar = w.menuBar()
        file_menu = bar.addMenu("&File")
        file_menu.addAction(
            self._action("Open scenario…", w.files.open_dialog, QKeySequence.StandardKey.Open, "Open a scenario (TOML)")
        )
        self.examples_menu = file_menu.addMenu("Open example")
        self.examples_menu.setToolTipsVisible(True)
        # Filled when first opened: reading every scenario file would slow the start.
        self.examples_menu.aboutToShow.connect(self._fill_examples)
        self.recent_menu = file_menu.addMenu("Open recent")
        self.reload_action = self._action(
            "Reload scenario",
            w.files.reload_scenario,
            "Ctrl+R",
            "Open the scenario again from its file: its script, from step 0",
        )
        file_menu.addAction(self.reload_action)
        file_menu.addAction(
            self._action(
                "Save scenario as…",
                w.files.save_dialog,
                QKeySequence.StandardKey.SaveAs,
                "Save the scenario, with your own actions, as TOML",
            )
        )
        file_menu.addSeparator()
        file_menu.addAction(
            self._action("Export screenshot…", w.files.screenshot_dialog, "Ctrl+Shift+P", "Save a PNG of the window")
        )
        file_menu.addAction(
            self._action(
                "Export event log…", w.files.events_dialog, "Ctrl+Shift+E", "Save every event so far as JSON lines"
            )
        )
        file_menu.addSeparator()
        self.attach_action = self._action(
            "Attach to vLLM…",
            w.kv_attach.open_dialog,
            "Ctrl+Shift+A",
            "Follow a vLLM server's prefix cache live, from the KV events it publishes (ZeroMQ)",
        )
        file_menu.addAction(self.attach_action)
        file_menu.addSeparator()
        file_menu.addAction(self._action("Quit", w.close, QKeySequence.StandardKey.Quit, "Quit pagesim"))
        edit_menu = bar.addMenu("&Edit")
        self.undo_action = self._action(
            "Undo",
            w.controller.undo,
            QKeySequence.StandardKey.Undo,
            "Take back your last action (its scripted future returns)",
        )
        self.redo_action = self._action(
            "Redo", w.controller.redo, QKeySequence.StandardKey.Redo, "Apply again the action you took back"
        )
        for action in (self.undo_action, self.redo_action):
            action.setEnabled(False)
            edit_menu.addAction(action)
        seq_menu = bar.addMenu("&Sequence")
        for action in (
            self.add_action, self.grow_action, self.grow_n_action, self.fork_action, self.free_action,
            self.schedule_action,
        ):  # fmt: skip
            seq_menu.addAction(action)
        play_menu = bar.addMenu("&Timeline")
        for action in (self.play_action, self.back_action, self.forward_action, self.start_action, self.end_action):
            play_menu.addAction(action)
        view_menu = bar.addMenu("&View")
        themes = QActionGroup(view_menu)  # one checked: the theme in use
        self.theme_actions = {}
        for name in THEMES:
            action = self._action(
                f"{name.title()} theme", lambda _=False, n=name: w.apply_theme(n), tip=f"Switch to the {name} theme"
            )
            action.setCheckable(True)
            action.setChecked(w.theme is THEMES[name])
            themes.addAction(action)
            view_menu.addAction(action)
            self.theme_actions[name] = action
        view_menu.addSeparator()
        self.lines_action = self._action(
            "Block-table → pool lines",
            w.table_lines.set_enabled,
            shortcut="L",
            tip="Draw a line from each block-table entry of the selected sequence to the pool block it names "
            "(past six entries, only the line of the entry looked up: hover a token or a box of the table)",
        )
        self.lines_action.setCheckable(True)
        self.lines_action.setChecked(True)
        view_menu.addAction(self.lines_action)
        for action in (self.zoom_in_action, self.zoom_out_action, self.fit_action):
            view_menu.addAction(action)
        view_menu.addAction(
            self._action(
                "Reset layout",
                lambda: w.restoreState(w.default_state, LAYOUT_VERSION),
                tip="Put every panel back where it started",
            )
        )
        view_menu.addSeparator()
        docks = (w.sequences_dock, w.kernel_dock, w.memory_dock, w.waste_dock, w.scheduler_dock, w.step_log_dock)
        for dock in (*docks, w.beam_tree_dock):  # (What-if and Latency: the Studies menu)
            view_menu.addAction(dock.toggleViewAction())
        help_menu = bar.addMenu("&Help")
        self.welcome_action = self._action(
            "Welcome…", w.show_welcome, tip="What pagesim shows, and the examples in a learner's order"
        )
        help_menu.addAction(self.welcome_action)
        help_menu.addAction(
            self._action(
                "Guide",
                w.show_guide,
                QKeySequence.StandardKey.HelpContents,
                "What every element means, in vLLM's words",
            )
        )
        w.files.attach_recent_menu(self.recent_menu)

    # -- the timeline's controls follow the frames -------------------------------------
    def bind(self, controller) -> None:
        controller.frameChanged.connect(self.show_frame)
        controller.seekSent.connect(self._on_seek_sent)
        controller.playingChanged.connect(self._on_playing)
        controller.errorRaised.connect(lambda _: self._follow_frame())

    def _follow_frame(self) -> None:
        """A refused request: the scrubber goes back to the step shown, if it was moved."""
        if self._frame is not None and self.scrubber.value() != self._frame.position:
            self._syncing = True
            self.scrubber.setValue(self._frame.position)
            self._syncing = False

    def _enable_moves(self, position: int, length: int) -> None:
        self.back_action.setEnabled(position > 0)
        self.start_action.setEnabled(position > 0)
        self.forward_action.setEnabled(position < length)
        self.end_action.setEnabled(position < length)

    def _on_seek_sent(self, step: int) -> None:
        """While a long seek runs (End from the start: seconds on a real model), the moves
        are those from where it goes, not from the frame still shown: Home pressed meanwhile
        is not ignored, and the last move pressed wins."""
        if self._frame is not None:
            self._enable_moves(step, self._frame.length)

    def show_frame(self, frame: Frame) -> None:
        self._frame = frame
        self._syncing = True
        self.scrubber.setMaximum(frame.length)
        self.scrubber.setValue(frame.position)
        self._syncing = False
        attention = frame.attention
        check = ""
        if attention is not None:
            check = " · ✓ kernel = dense" if attention.passed else " · ✗ kernel ≠ dense"
        self.step_label.setText(f"step {frame.position} / {frame.length} · {html.escape(frame.label)}{check}")
        if self.prompt_spin_action.isVisible() == frame.has_text:
            self.prompt_spin_action.setVisible(not frame.has_text)
            self.schedule_button_action.setVisible(frame.has_text)
            self.add_action.setToolTip(
                "Add a sequence with a prompt you type (and how the model samples) (A)"
                if frame.has_text
                else "Add a sequence with a prompt of the given length (A)"
            )
        self._enable_moves(frame.position, frame.length)
        self.undo_action.setEnabled(frame.can_undo)
        self.redo_action.setEnabled(frame.can_redo)
        self.scrubber.set_branch(frame.branch_step)
        branch = "" if frame.branch_step is None else f" · your branch from step {frame.branch_step} (marked)"
        self.scrubber.setToolTip(
            "Scrub through the scenario's steps; going back shows exactly the earlier state" + branch
        )

    def _scrubbed(self, value: int) -> None:
        if not self._syncing and self._frame is not None and value != self._frame.position:
            self.window.controller.seek(value)

    def _on_playing(self, playing: bool) -> None:
        self.play_action.setText("Pause" if playing else "Play")
        icon = QStyle.StandardPixmap.SP_MediaPause if playing else QStyle.StandardPixmap.SP_MediaPlay
        self.play_action.setIcon(self.window.style().standardIcon(icon))
