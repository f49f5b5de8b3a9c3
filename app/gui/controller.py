"""The controller: one worker thread owns the backend and the timeline; the GUI thread
only sends requests and receives immutable frames by queued signals."""

from __future__ import annotations

import traceback
import weakref
from pathlib import Path

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

from app.report import write_event_log
from core.errors import PagesimError
from core.operations import Operation
from core.scenario import Scenario
from core.timeline import Timeline
from core.view_model import Frame, build_frame
from kernels.backend import BackendUnavailableError
from kernels.selection import select_backend

# Threads and timers the app started; tests assert they are all stopped afterwards.
LIVE_THREADS: weakref.WeakSet[QThread] = weakref.WeakSet()
LIVE_TIMERS: weakref.WeakSet[QTimer] = weakref.WeakSet()


class SimulationWorker(QObject):
    """Lives on the worker thread. Every slot leaves the timeline untouched on error."""

    frameReady = Signal(object)  # Frame
    failed = Signal(str)
    backendReady = Signal(str, str)  # name, device
    exported = Signal(str)
    wasteReady = Signal(object)  # list of WasteReport dicts

    def __init__(self, backend_name: str, cuda_kernel: str = "auto") -> None:
        super().__init__()
        self._backend_name = backend_name
        self._cuda_kernel = cuda_kernel
        self._backend = None
        self._timeline: Timeline | None = None
        self._focus: str | None = None
        self._frame = None  # the last frame sent: the next step's frame is built from it

    def _emit(self, result=None) -> None:
        self._frame = build_frame(self._timeline, self._focus, result, self._frame)
        self.frameReady.emit(self._frame)

    @Slot(object)
    def load(self, scenario: Scenario) -> None:
        try:
            if self._backend is None:
                self._backend = select_backend(self._backend_name, self._cuda_kernel)
                self.backendReady.emit(self._backend.name, self._backend.device)
            timeline = Timeline(scenario, self._backend)
        except (PagesimError, BackendUnavailableError, ValueError) as exc:
            self.failed.emit(str(exc))
            return
        self._timeline = timeline
        self._focus = None
        self._frame = None
        self._emit()
        # Then compile (or load from cache) the kernel for this dtype, before the first step.
        timeline.sim.warm_up()

    def _guard(self, action) -> None:
        if self._timeline is None:
            self.failed.emit("no scenario is loaded")
            return
        try:
            action()
        except (PagesimError, IndexError, ValueError) as exc:
            self.failed.emit(str(exc))
        except Exception as exc:  # a bug: report it rather than kill the worker
            traceback.print_exc()
            self.failed.emit(f"internal error: {exc!r}")

    @Slot()
    def forward(self) -> None:
        self._guard(lambda: self._emit(self._timeline.forward()))

    @Slot()
    def back(self) -> None:
        def step_back():
            self._timeline.back()
            self._emit()

        self._guard(step_back)

    @Slot(int)
    def seek(self, step: int) -> None:
        def go():
            # One step forward from here is an ordinary step: animate its events.
            if step == self._timeline.position + 1:
                self._emit(self._timeline.forward())
            else:
                self._timeline.seek(step)
                self._emit()

        self._guard(go)

    @Slot(object)
    def push(self, op: Operation) -> None:
        self._guard(lambda: self._emit(self._timeline.push(op)))

    @Slot(str)
    def focus(self, seq_id: str) -> None:
        self._focus = seq_id or None
        self._guard(self._emit)

    @Slot(str, int)
    def waste(self, distribution: str, count: int) -> None:
        def compute():
            from core.studies.waste import compare
            from core.studies.workload import generate

            c = self._timeline.sim.config
            workload = generate(distribution, count, rate=2000.0, seed=0, max_len=c.max_model_len)
            reports = compare(workload, c.num_slots, block_size=c.block_size, max_len=c.max_model_len)
            result = {"distribution": distribution, "count": count, "slots": c.num_slots}
            self.wasteReady.emit(result | {"reports": [r.as_dict() for r in reports]})

        self._guard(compute)

    @Slot(str)
    def export_events(self, path: str) -> None:
        def export():
            results = [r for k in range(1, self._timeline.position + 1) if (r := self._timeline.result(k))]
            count = write_event_log(Path(path), results)
            self.exported.emit(f"wrote {count} events of {len(results)} steps to {path}")

        self._guard(export)


class SimulationController(QObject):
    """GUI-thread face of the worker: requests out, frames in, play/pause timing."""

    frameChanged = Signal(object)  # Frame
    errorRaised = Signal(str)
    backendReady = Signal(str, str)
    playingChanged = Signal(bool)
    exported = Signal(str)
    wasteReady = Signal(object)

    _load = Signal(object)
    _forward = Signal()
    _back = Signal()
    _seek = Signal(int)
    _push = Signal(object)
    _focus = Signal(str)
    _export = Signal(str)
    _waste = Signal(str, int)

    def __init__(self, backend_name: str = "auto", parent: QObject | None = None, cuda_kernel: str = "auto") -> None:
        super().__init__(parent)
        self.frame: Frame | None = None
        self.scenario: Scenario | None = None
        self.pending = 0  # requests sent and not yet answered
        self._thread = QThread()
        self._thread.setObjectName("pagesim-simulation")
        LIVE_THREADS.add(self._thread)
        self._worker = SimulationWorker(backend_name, cuda_kernel)
        self._worker.moveToThread(self._thread)
        self._thread.finished.connect(self._worker.deleteLater)
        for request, slot in (
            (self._load, self._worker.load),
            (self._forward, self._worker.forward),
            (self._back, self._worker.back),
            (self._seek, self._worker.seek),
            (self._push, self._worker.push),
            (self._focus, self._worker.focus),
            (self._export, self._worker.export_events),
            (self._waste, self._worker.waste),
        ):
            request.connect(slot)
        self._worker.frameReady.connect(self._on_frame)
        self._worker.failed.connect(self._on_failed)
        self._worker.backendReady.connect(self.backendReady)
        self._worker.exported.connect(self._on_exported)
        self._worker.wasteReady.connect(self._on_waste)
        self._play_timer = QTimer(self)
        self._play_timer.setObjectName("pagesim-play")
        LIVE_TIMERS.add(self._play_timer)
        self._play_timer.timeout.connect(self._tick)
        self.step_interval_ms = 600
        self._thread.start()

    # -- requests -----------------------------------------------------------------
    def _send(self, signal, *args) -> None:
        self.pending += 1
        signal.emit(*args)

    def load(self, scenario: Scenario) -> None:
        self.pause()
        self.scenario = scenario
        self._send(self._load, scenario)

    def forward(self) -> None:
        if self.frame is not None and self.frame.position >= self.frame.length:
            self.errorRaised.emit("at the last step: nothing to step forward to")
            return
        self._send(self._forward)

    def back(self) -> None:
        if self.frame is not None and self.frame.position == 0:
            self.errorRaised.emit("at the start: nothing to step back to")
            return
        self._send(self._back)

    def seek(self, step: int) -> None:
        self._send(self._seek, step)

    def apply(self, op: Operation) -> None:
        self.pause()
        self._send(self._push, op)

    def set_focus(self, seq_id: str | None) -> None:
        self._send(self._focus, seq_id or "")

    def export_events(self, path: str) -> None:
        self._send(self._export, path)

    def compute_waste(self, distribution: str, count: int) -> None:
        """Where KV memory goes for a workload on this pool: paged vs contiguous (off the GUI thread)."""
        self._send(self._waste, distribution, count)

    # -- playback -----------------------------------------------------------------
    @property
    def playing(self) -> bool:
        return self._play_timer.isActive()

    def play(self) -> None:
        if self.playing:
            return
        if self.frame is not None and self.frame.position >= self.frame.length:
            self.errorRaised.emit("at the last step: step back or seek to replay")
            return
        self._play_timer.start(self.step_interval_ms)
        self.playingChanged.emit(True)

    def pause(self) -> None:
        if self.playing:
            self._play_timer.stop()
            self.playingChanged.emit(False)

    def toggle_play(self) -> None:
        self.pause() if self.playing else self.play()

    def set_step_interval(self, ms: int) -> None:
        self.step_interval_ms = max(1, ms)
        if self.playing:
            self._play_timer.setInterval(self.step_interval_ms)

    def _tick(self) -> None:
        if self.pending:  # the worker is still on the last step: never queue up
            return
        if self.frame is None or self.frame.position >= self.frame.length:
            self.pause()
            return
        self._send(self._forward)

    # -- answers -----------------------------------------------------------------
    def _on_frame(self, frame: Frame) -> None:
        self.pending = max(0, self.pending - 1)
        self.frame = frame
        self.frameChanged.emit(frame)
        if self.playing and frame.position >= frame.length:
            self.pause()

    def _on_failed(self, message: str) -> None:
        self.pending = max(0, self.pending - 1)
        self.pause()
        self.errorRaised.emit(message)

    def _on_waste(self, result) -> None:
        self.pending = max(0, self.pending - 1)
        self.wasteReady.emit(result)

    def _on_exported(self, message: str) -> None:
        self.pending = max(0, self.pending - 1)
        self.exported.emit(message)

    def shutdown(self) -> None:
        self.pause()
        self._thread.quit()
        self._thread.wait()
