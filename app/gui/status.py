"""The status bar's wording: what the window says of a load, each frame, a refusal, and the
worker's news (the backend, the kernel ready, an export)."""

from __future__ import annotations

from pagesim.app.gui.palette import Theme
from pagesim.core.view_model import Frame
from PySide6.QtWidgets import QLabel, QStatusBar


class StatusReporter:
    """Writes the status bar's messages and keeps its backend label; a refusal turns the bar
    red (and is kept in ``last_error``) until the next frame."""

    def __init__(self, bar: QStatusBar, theme: Theme) -> None:
        self.bar = bar
        self.theme = theme
        self.last_error: str | None = None
        self._fresh = True  # no frame of the loaded scenario yet
        self._announced_branch: int | None = None
        self._branch_said = ""  # the branch message shown (cleared when an undo takes the branch away)
        self._notes_said = ""  # a step's preemption or rejection message shown (cleared at another step)
        self.backend_label = QLabel("backend: starting…")
        self.backend_label.setToolTip("Kernel backend and device (compiled at start-up, off the GUI thread)")
        bar.addPermanentWidget(self.backend_label)

    def bind(self, controller) -> None:
        controller.loaded.connect(lambda _: self._loaded())
        controller.frameChanged.connect(self.show_frame)
        controller.errorRaised.connect(self.show_error)
        controller.backendReady.connect(lambda name, device: self.backend_label.setText(f"{name.upper()} · {device}"))
        controller.kernelReady.connect(
            lambda dtype, seconds: self.say(f"kernel ready for {dtype} ({seconds:.1f} s): → steps, Space plays", 6000)
        )
        controller.exported.connect(lambda message: self.say(message, 8000))

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme

    def say(self, message: str, ms: int = 0) -> None:
        self.bar.showMessage(message, ms)

    def show_error(self, message: str) -> None:
        self.bar.showMessage(f"⚠ {message}", 10_000)
        self.bar.setStyleSheet(f"QStatusBar {{ color: {self.theme.bad}; }}")
        self.last_error = message

    def preparing(self, dtype: str) -> None:
        """A load is on its way: the worker compiles (or loads) the kernel for this dtype after
        the first frame; say so, so that a first → that waits for it is not a mystery."""
        self.say(f"preparing the {dtype} kernel…")

    def _loaded(self) -> None:
        self._fresh = True
        self._announced_branch = None
        self._branch_said = ""

    def show_frame(self, frame: Frame) -> None:
        first, self._fresh = self._fresh, False
        backend = f"{frame.backend.upper()} · {frame.device}"  # (a real model chooses its thread count)
        if self.backend_label.text() != backend:
            self.backend_label.setText(backend)
        if self.bar.styleSheet():  # an error turned it red; restyling costs a re-polish
            self.bar.setStyleSheet("")
        if first and frame.position == 0:
            self.say(f"{frame.scenario_name}: {frame.length} steps · Space plays, → steps, A adds a sequence", 10_000)
        branched = frame.branch_step is not None
        if branched and frame.branch_step != self._announced_branch and frame.can_undo:
            # (short: a 1024 px window's status bar cuts a longer line mid-word)
            if frame.branch_step >= frame.script_length:  # past the script's end: nothing was set aside
                said = (
                    f"Your action went on past the script's last step ({frame.script_length}): Undo (Ctrl+Z) takes it "
                    "back, Ctrl+R starts over"
                )
            else:
                said = (
                    f"You branched off the script at step {frame.branch_step}: its later steps are set aside "
                    "(Undo, Ctrl+Z, brings them back)"
                )
            self.say(said, 15_000)
            self._branch_said = said
        elif not branched and self._branch_said and self.bar.currentMessage() == self._branch_said:
            self.bar.clearMessage()  # undone: the branch it spoke of is gone
        if not branched:
            self._branch_said = ""
        self._announced_branch = frame.branch_step
        if frame.status_notes:  # preemptions and rejections say what they cost, dated: a step's news
            self._notes_said = f"step {frame.position}: " + " · ".join(frame.status_notes)
            self.say(self._notes_said, 8000)
        else:
            if self._notes_said and self.bar.currentMessage() == self._notes_said:
                self.bar.clearMessage()  # another step: the news of the one before would read as its own
            self._notes_said = ""
