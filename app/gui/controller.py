"""The controller: one worker thread owns the backend and the timeline; the GUI thread
only sends requests and receives immutable frames by queued signals."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from pagesim.app.report import write_event_log
from pagesim.core.errors import Interrupted, PagesimError, PoolExhaustedError, ScenarioError
from pagesim.core.models.threads import apply_chosen_threads
from pagesim.core.operations import Add, Operation, Submit
from pagesim.core.sampling import SamplingParams
from pagesim.core.scenario import Scenario
from pagesim.core.studies.request_latency import ScenarioLatency, scenario_latency
from pagesim.core.studies.serving_time import gpu, model_shape
from pagesim.core.studies.stand_in import memory_only
from pagesim.core.studies.sweep import Hardware, Source, SweepResult, VariantResult, sweep
from pagesim.core.studies.waste import WastePool, WasteStudy, pool_from_preset, pool_of_blocks, study
from pagesim.core.timeline import Timeline
from pagesim.core.token_text import piece_function, prompt_ids, tokenizer_of
from pagesim.core.view_model import Frame, build_frame
from pagesim.core.walkthrough import WalkThrough, walk_through
from pagesim.kernels.backend import BackendUnavailableError
from pagesim.kernels.selection import select_backend
from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

log = logging.getLogger("pagesim.worker")

# Threads and timers the app started; tests assert they are all stopped afterwards.
LIVE_THREADS: weakref.WeakSet[QThread] = weakref.WeakSet()
LIVE_TIMERS: weakref.WeakSet[QTimer] = weakref.WeakSet()


# -- requests (GUI thread -> worker) and replies (worker -> GUI thread) -------------------
@dataclass(frozen=True)
class Load:
    scenario: Scenario


@dataclass(frozen=True)
class Forward:
    pass


@dataclass(frozen=True)
class Back:
    pass


@dataclass(frozen=True)
class Seek:
    step: int


@dataclass(frozen=True)
class Push:
    op: Operation


@dataclass(frozen=True)
class PushText:
    """Add ``seq`` with a prompt typed as text (a user message in the chat template with
    ``as_chat``), encoded on the worker with the timeline's model."""

    seq: str
    text: str
    as_chat: bool
    sampling: SamplingParams | None
    # A request for the scheduler instead (``seq`` its name): output_len tokens, as n samples or beams.
    output_len: int | None = None
    n: int = 1
    beam_width: int = 0


@dataclass(frozen=True)
class Undo:
    pass


@dataclass(frozen=True)
class Redo:
    pass


@dataclass(frozen=True)
class Focus:
    seq_id: str | None


@dataclass(frozen=True)
class ShowLayer:
    layer: int | None  # a real model's layer for the Check panel (None: the step's worst)


@dataclass(frozen=True)
class ExportEvents:
    path: str


@dataclass(frozen=True)
class ComputeWaste:
    """A waste study on a pool of its own: a model shape on a GPU (the memory after the
    weights), else ``blocks`` blocks; never the scenario's teaching-sized pool."""

    distribution: str
    count: int
    model_shape: str | None = "llama-13b"
    gpu: str | None = "a100-40gb"
    blocks: int | None = None
    block_size: int = 16
    max_len: int = 2048


@dataclass(frozen=True)
class RunSweep:
    """What-if replays of the current scenario; ``cancel`` set (from the GUI thread) stops
    them after the variant in progress."""

    settings: tuple[tuple[str, tuple], ...]
    model_shape: str
    gpu: str
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)


@dataclass(frozen=True)
class ComputeLatency:
    model_shape: str
    gpu: str


@dataclass(frozen=True)
class TraceKernel:
    seq_id: str
    head: int
    kernel: str
    partition_size: int
    layer: int | None = None  # a real model's (None: the step's worst)


Request = (
    Load
    | Forward
    | Back
    | Seek
    | Push
    | PushText
    | Undo
    | Redo
    | Focus
    | ShowLayer
    | ExportEvents
    | ComputeWaste
    | TraceKernel
    | RunSweep
    | ComputeLatency
)


@dataclass(frozen=True)
class FrameReply:
    frame: Frame


@dataclass(frozen=True)
class Failed:
    message: str
    shortfall: tuple[int, int] | None = None  # a full pool: (blocks needed, blocks free)


@dataclass(frozen=True)
class Stopped:
    """The answer to a seek that could not reach its step: the frame of the step the
    timeline is on (the window shows it, so the two agree) and why it stopped there."""

    frame: Frame
    message: str
    shortfall: tuple[int, int] | None = None


@dataclass(frozen=True)
class Loaded:
    """The answer to a Load that went through: the new timeline's first frame."""

    scenario: Scenario
    frame: Frame


@dataclass(frozen=True)
class LoadFailed:
    """The answer to a Load that did not: the old timeline, if any, is still the one."""

    message: str


@dataclass(frozen=True)
class Exported:
    message: str


@dataclass(frozen=True)
class WasteReady:
    study: WasteStudy


@dataclass(frozen=True)
class TokenStreamed:
    """Not an answer: a token a real model's grow just wrote, while the grow goes on."""

    seq_id: str
    piece: str  # its text
    count: int  # the sequence's tokens, this one included


@dataclass(frozen=True)
class SweepProgress:
    """Not an answer: one what-if variant replayed (``index`` of ``count``)."""

    index: int
    count: int
    variant: VariantResult


@dataclass(frozen=True)
class SweepReady:
    result: SweepResult
    note: str = ""  # what was replayed instead of the scenario, if not itself (stand_in)


@dataclass(frozen=True)
class SweepCancelled:
    done: int  # variants replayed before the cancel


@dataclass(frozen=True)
class LatencyReady:
    study: ScenarioLatency


@dataclass(frozen=True)
class StudyFailed:
    """A what-if, latency or waste study that could not run: ``study`` says which, ``message`` why."""

    study: str  # "whatif", "latency" or "waste"
    message: str


@dataclass(frozen=True)
class BackendReady:
    """Not an answer: sent once, before the first frame."""

    name: str
    device: str


@dataclass(frozen=True)
class KernelReady:
    """Not an answer: after a load, the kernel for the scenario's dtype is compiled (or loaded)."""

    dtype: str
    seconds: float


@dataclass(frozen=True)
class TraceReady:
    walk: WalkThrough | None


Reply = (
    FrameReply
    | Stopped
    | Loaded
    | LoadFailed
    | Failed
    | Exported
    | WasteReady
    | SweepProgress
    | TokenStreamed
    | SweepReady
    | SweepCancelled
    | LatencyReady
    | StudyFailed
    | BackendReady
    | KernelReady
    | TraceReady
)


class SimulationWorker(QObject):
    """Lives on the worker thread. One slot takes every request; each request gets exactly
    one answer (a frame, a failure, or its result). Every request leaves the timeline
    untouched on error."""

    replied = Signal(object)  # Reply

    def __init__(self, backend_name: str, cuda_kernel: str = "auto") -> None:
        super().__init__()
        self._backend_name = backend_name
        self._cuda_kernel = cuda_kernel
        self._backend = None
        self._timeline: Timeline | None = None
        self._focus: str | None = None
        self._focus_layer: int | None = None
        self._threads_chosen = False
        self._frame = None  # the last frame sent: the next step's frame is built from it
        # Set from the GUI thread when the window closes: a long seek or replay stops at its next step.
        self.stopping = threading.Event()
        self._handlers = {
            Forward: lambda r: self._emit(self._streaming(self._timeline.forward)),
            Back: self._back,
            Seek: self._seek,
            Push: lambda r: self._emit(self._streaming(lambda: self._timeline.push(r.op))),
            PushText: self._push_text,
            Undo: self._undo,
            Redo: lambda r: self._emit(self._timeline.redo()),
            Focus: self._set_focus,
            ShowLayer: self._show_layer,
            ExportEvents: self._export,
            ComputeWaste: lambda r: self._study("waste", self._waste, r),
            TraceKernel: self._trace,
            RunSweep: lambda r: self._study("whatif", self._sweep, r),
            ComputeLatency: lambda r: self._study("latency", self._latency, r),
        }

    def _streaming(self, run):
        """``run()``, each token a real model's grow writes meanwhile sent as it comes."""
        sim = self._timeline.sim
        piece = piece_function(tokenizer_of(sim.runner.model))
        if piece is None:
            return run()

        def written(seq_id: str, token_ids: list[int]) -> None:
            self.replied.emit(TokenStreamed(seq_id, piece(token_ids, len(token_ids) - 1), len(token_ids)))

        sim.token_written = written
        try:
            return run()
        finally:
            sim.token_written = None

    def _emit(self, result=None) -> None:
        self._frame = build_frame(self._timeline, self._focus, result, self._frame, self._focus_layer)
        self.replied.emit(FrameReply(self._frame))

    @Slot(object)
    def handle(self, request: Request) -> None:
        if isinstance(request, Load):
            self._load(request.scenario)
            return
        if self._timeline is None:
            self.replied.emit(Failed("no scenario is loaded"))
            return
        if self.stopping.is_set():
            return  # closing: what is still queued is dropped
        try:
            self._handlers[type(request)](request)
        except Interrupted:
            return  # the window is closing: nobody waits for an answer
        except PagesimError as exc:  # refused by pagesim itself (state untouched): the user is told why
            self.replied.emit(Failed(str(exc), _shortfall(exc)))
        except Exception as exc:  # anything else is a bug: reported as one, logged whole, the worker lives on
            log.exception("internal error while handling %s", type(request).__name__)
            self.replied.emit(Failed(f"internal error: {exc!r}"))

    def _load(self, scenario: Scenario) -> None:
        try:
            if self._backend is None:
                self._backend = select_backend(self._backend_name, self._cuda_kernel)
                self.replied.emit(BackendReady(self._backend.name, self._backend.device))
            timeline = Timeline(scenario, self._backend)
            if timeline.sim.runner.model.samples_from_logits and not self._threads_chosen:
                # Numba's thread count is per thread: the one the model's first load chose
                # (one per pool on two cores) must be chosen again on this thread, which runs the kernels.
                apply_chosen_threads()
                self._threads_chosen = True
            timeline.stop_requested = self.stopping.is_set
            frame = build_frame(timeline, None, None, None, self._focus_layer)
        except (PagesimError, BackendUnavailableError, ValueError, MemoryError) as exc:
            where = "" if scenario.source == "<memory>" else f"{scenario.source}: "
            stays = "" if self._timeline is None else "; the current scenario stays"
            self.replied.emit(LoadFailed(f"could not load {where}{exc}{stays}"))
            return
        self._timeline = timeline
        self._focus = None
        self._frame = frame
        self.replied.emit(Loaded(scenario, frame))
        # Then compile (or load from cache) the kernel for this dtype, before the first step.
        started = time.perf_counter()
        timeline.sim.runner.warm_up()
        self.replied.emit(KernelReady(timeline.sim.config.dtype, time.perf_counter() - started))

    def _push_text(self, request: PushText) -> None:
        ids = tuple(prompt_ids(self._timeline.sim.runner.model, request.text, request.as_chat))
        if request.output_len is None:
            op = Add(request.seq, prompt=ids, sampling=request.sampling)
        else:
            n, beams, sampling = request.n, request.beam_width, request.sampling
            op = Submit(request.seq, request.output_len, prompt=ids, n=n, beam_width=beams, sampling=sampling)
        self._emit(self._timeline.push(op))

    def _undo(self, _: Undo) -> None:
        self._timeline.undo()
        self._emit()

    def _back(self, _: Back) -> None:
        self._timeline.back()
        self._emit()

    def _seek(self, request: Seek) -> None:
        """A step on the way that cannot be applied stops the seek on the step before it;
        the answer is then that step's frame and the reason (the scrubber was already moved:
        the window must be told where the engine really is)."""
        timeline = self._timeline
        try:
            # One step forward from here is an ordinary step: animate its events.
            if request.step == timeline.position + 1:
                self._emit(timeline.forward())
            else:
                timeline.seek(request.step)
                self._emit()
        except ScenarioError as exc:  # a step that cannot be applied (a step out of range is a plain refusal)
            self._frame = build_frame(timeline, self._focus, None, self._frame, self._focus_layer)
            message = f"{exc} — stopped at step {timeline.position}"
            self.replied.emit(Stopped(self._frame, message, _shortfall(exc)))

    def _set_focus(self, request: Focus) -> None:
        self._focus = request.seq_id or None
        self._emit()

    def _show_layer(self, request: ShowLayer) -> None:
        self._focus_layer = request.layer
        self._emit()

    def _waste(self, request: ComputeWaste) -> None:
        if request.model_shape is not None and request.gpu is not None:
            pool = pool_from_preset(model_shape(request.model_shape), gpu(request.gpu), request.block_size)
        elif request.blocks is not None:
            pool = pool_of_blocks(request.blocks, request.block_size, f"{request.blocks} blocks, as chosen")
        else:
            c = self._timeline.sim.config
            pool = WastePool(c.num_slots, c.block_size, "the scenario's pool")
        result = study(request.distribution, request.count, pool.slots, pool.block_size, request.max_len, pool)
        self.replied.emit(WasteReady(result))

    def _current_scenario(self) -> Scenario:
        """The loaded scenario with the user's own actions: the timeline's operations."""
        timeline = self._timeline
        return timeline.scenario.with_operations(timeline.operations)

    def _study(self, name: str, run, request) -> None:
        """A study always answers: its result, or StudyFailed with the reason (a refusal's
        own words, or an internal error, logged whole)."""
        try:
            run(request)
        except Interrupted:
            raise
        except PagesimError as exc:
            self.replied.emit(StudyFailed(name, str(exc)))
        except Exception as exc:
            log.exception("internal error in the %s study", name)
            self.replied.emit(StudyFailed(name, f"internal error: {exc!r}"))

    def _sweep(self, request: RunSweep) -> None:
        if request.cancel.is_set():  # cancelled while it waited in the queue
            self.replied.emit(SweepCancelled(0))
            return
        scenario, note = memory_only(self._current_scenario())
        source = Source(scenario.name, scenario.config, scenario)
        hardware = Hardware(model_shape(request.model_shape), gpu(request.gpu))
        done = [0]

        def progress(index: int, count: int, variant: VariantResult) -> None:
            done[0] = index
            self.replied.emit(SweepProgress(index, count, variant))
            if self.stopping.is_set() or request.cancel.is_set():
                raise Interrupted(f"what-if stopped after {index} of {count} variants")

        try:
            result = sweep(source, request.settings, hardware, progress)
        except Interrupted:
            if self.stopping.is_set():
                raise  # the window is closing: nobody waits for an answer
            self.replied.emit(SweepCancelled(done[0]))
            return
        self.replied.emit(SweepReady(result, note))

    def _latency(self, request: ComputeLatency) -> None:
        self.replied.emit(LatencyReady(scenario_latency(self._current_scenario(), request.model_shape, request.gpu)))

    def _trace(self, request: TraceKernel) -> None:
        sim = self._timeline.sim
        walk = walk_through(sim, request.seq_id, request.head, request.kernel, request.partition_size, request.layer)
        self.replied.emit(TraceReady(walk))

    def _export(self, request: ExportEvents) -> None:
        steps = self._timeline.position
        try:
            count = write_event_log(Path(request.path), self._timeline.events_through_now())
        except OSError as exc:
            self.replied.emit(Failed(f"could not export the event log to {request.path}: {exc.strerror or exc}"))
            return
        self.replied.emit(Exported(f"wrote {count} events of {steps} steps to {request.path}"))


def _shortfall(exc: PagesimError) -> tuple[int, int] | None:
    """(blocks needed, blocks free) if ``exc`` is, or wraps, a full pool."""
    full = exc if isinstance(exc, PoolExhaustedError) else exc.__cause__
    return (full.needed, full.free) if isinstance(full, PoolExhaustedError) else None


class SimulationController(QObject):
    """GUI-thread face of the worker: requests out, replies in, play/pause timing."""

    loaded = Signal(object)  # Scenario: a load went through (its first frame follows)
    frameChanged = Signal(object)  # Frame
    errorRaised = Signal(str)
    kernelReady = Signal(str, float)  # dtype, seconds the warm-up took
    poolRefused = Signal(object, object)  # (needed, free): more blocks than are free; objects: counts pass 2^31
    backendReady = Signal(str, str)
    playingChanged = Signal(bool)
    exported = Signal(str)
    wasteReady = Signal(object)  # WasteStudy
    sweepProgress = Signal(int, int, object)  # index, count, VariantResult
    tokenStreamed = Signal(str, str, int)  # seq id, the new token's text, the sequence's tokens
    sweepReady = Signal(object, str)  # SweepResult, what was replayed instead of the scenario ("" for itself)
    sweepCancelled = Signal(int)  # variants replayed before the cancel
    latencyReady = Signal(object)  # ScenarioLatency
    seekSent = Signal(int)  # a seek to this step is on its way (its frame comes when the worker is done)
    studyFailed = Signal(str, str)  # "whatif" or "latency", why
    traceReady = Signal(object)  # WalkThrough | None

    _request = Signal(object)  # Request

    def __init__(self, backend_name: str = "auto", parent: QObject | None = None, cuda_kernel: str = "auto") -> None:
        super().__init__(parent)
        self.frame: Frame | None = None
        self.scenario: Scenario | None = None  # the loaded one: a load still pending or failed is not it
        self.pending = 0  # requests sent and not yet answered
        self._sweep_cancel: threading.Event | None = None  # the newest what-if's
        self.kernel_ready = False  # the loaded scenario's kernel is compiled
        self._thread = QThread()
        self._thread.setObjectName("pagesim-simulation")
        LIVE_THREADS.add(self._thread)
        self._worker = SimulationWorker(backend_name, cuda_kernel)
        self._worker.moveToThread(self._thread)
        self._thread.finished.connect(self._worker.deleteLater)
        self._request.connect(self._worker.handle)
        self._worker.replied.connect(self._on_reply)
        self._play_timer = QTimer(self)
        self._play_timer.setObjectName("pagesim-play")
        LIVE_TIMERS.add(self._play_timer)
        self._play_timer.timeout.connect(self._tick)
        self.step_interval_ms = 600
        self._thread.start()

    # -- requests -----------------------------------------------------------------
    def _send(self, request: Request) -> None:
        self.pending += 1
        self._request.emit(request)

    def load(self, scenario: Scenario) -> None:
        self.pause()
        self._send(Load(scenario))

    def forward(self) -> None:
        if self.frame is not None and self.frame.position >= self.frame.length:
            self.errorRaised.emit("at the last step: nothing to step forward to")
            return
        self._send(Forward())

    def back(self) -> None:
        if self.frame is not None and self.frame.position == 0:
            self.errorRaised.emit("at the start: nothing to step back to")
            return
        self._send(Back())

    def seek(self, step: int) -> None:
        self._send(Seek(step))
        self.seekSent.emit(step)

    def apply(self, op: Operation) -> None:
        self.pause()
        self._send(Push(op))

    def add_text(self, seq: str, text: str, as_chat: bool, sampling: SamplingParams | None) -> None:
        """Add ``seq`` with a prompt typed as text (a real model's tokenizer encodes it)."""
        self.pause()
        self._send(PushText(seq, text, as_chat, sampling))

    def submit_text(
        self, request: str, text: str, as_chat: bool, sampling: SamplingParams | None, output_len: int, n: int,
        beams: int,
    ) -> None:  # fmt: skip
        """Submit request ``request`` to the scheduler with a prompt typed as text: ``output_len``
        tokens as ``n`` samples or ``beams`` beams (Schedule runs it)."""
        self.pause()
        self._send(PushText(request, text, as_chat, sampling, output_len, n, beams))

    def undo(self) -> None:
        self._edit(Undo(), lambda f: f.can_undo, "nothing to undo: no action of yours on this timeline")

    def redo(self) -> None:
        self._edit(Redo(), lambda f: f.can_redo, "nothing to redo")

    def _edit(self, request: Undo | Redo, possible, refusal: str) -> None:
        if self.frame is not None and not possible(self.frame):
            self.errorRaised.emit(refusal)
            return
        self.pause()
        self._send(request)

    def set_focus(self, seq_id: str | None) -> None:
        self._send(Focus(seq_id))

    def set_layer(self, layer: int | None) -> None:
        """The layer the Check panel shows on a real model (None: each step's worst)."""
        self._send(ShowLayer(layer))

    def export_events(self, path: str) -> None:
        self._send(ExportEvents(path))

    def trace_kernel(self, seq_id: str, head: int, kernel: str, partition_size: int, layer: int | None = None) -> None:
        """Replay this step's kernel for one (sequence, head), on the worker thread (a real
        model's ``layer``; None: the step's worst)."""
        self._send(TraceKernel(seq_id, head, kernel, partition_size, layer))

    def compute_waste(self, distribution: str, count: int, **pool) -> None:
        """Where KV memory goes for a workload: paged vs contiguous (off the GUI thread), on
        a preset's pool (``model_shape``, ``gpu``) or ``blocks`` (see ComputeWaste)."""
        self._send(ComputeWaste(distribution, count, **pool))

    def run_sweep(self, settings, model_shape: str, gpu: str) -> None:
        """What-if replays of the current scenario, one reply per variant (sweepProgress),
        then sweepReady, sweepCancelled or studyFailed."""
        request = RunSweep(tuple(settings), model_shape, gpu)
        self._sweep_cancel = request.cancel
        self._send(request)

    def cancel_sweep(self) -> None:
        """Stop the running what-if after its variant in progress (set from this thread)."""
        if self._sweep_cancel is not None:
            self._sweep_cancel.set()

    def compute_latency(self, model_shape: str, gpu: str) -> None:
        """Per-request serving time of the current scenario (latencyReady or studyFailed)."""
        self._send(ComputeLatency(model_shape, gpu))

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
        self._send(Forward())

    # -- replies ------------------------------------------------------------------
    def _on_reply(self, reply: Reply) -> None:
        if isinstance(reply, BackendReady):  # not an answer to a request
            self.backendReady.emit(reply.name, reply.device)
            return
        if isinstance(reply, KernelReady):
            self.kernel_ready = True
            self.kernelReady.emit(reply.dtype, reply.seconds)
            return
        if isinstance(reply, SweepProgress):
            self.sweepProgress.emit(reply.index, reply.count, reply.variant)
            return
        if isinstance(reply, TokenStreamed):
            self.tokenStreamed.emit(reply.seq_id, reply.piece, reply.count)
            return
        self.pending = max(0, self.pending - 1)
        if isinstance(reply, Loaded):
            self.scenario = reply.scenario
            self.kernel_ready = False  # until the new dtype's kernel is ready
            self.loaded.emit(reply.scenario)
            reply = FrameReply(reply.frame)
        if isinstance(reply, Stopped):  # the frame where the seek stopped, then why
            self.frame = reply.frame
            self.frameChanged.emit(reply.frame)
            reply = Failed(reply.message, reply.shortfall)
        if isinstance(reply, LoadFailed):
            self.errorRaised.emit(reply.message)
        elif isinstance(reply, FrameReply):
            self.frame = reply.frame
            self.frameChanged.emit(reply.frame)
            if self.playing and reply.frame.position >= reply.frame.length:
                self.pause()
        elif isinstance(reply, Failed):
            self.pause()
            self.errorRaised.emit(reply.message)
            if reply.shortfall is not None:
                self.poolRefused.emit(*reply.shortfall)
        elif isinstance(reply, WasteReady):
            self.wasteReady.emit(reply.study)
        elif isinstance(reply, SweepReady):
            self.sweepReady.emit(reply.result, reply.note)
        elif isinstance(reply, SweepCancelled):
            self.sweepCancelled.emit(reply.done)
        elif isinstance(reply, LatencyReady):
            self.latencyReady.emit(reply.study)
        elif isinstance(reply, StudyFailed):
            self.studyFailed.emit(reply.study, reply.message)
        elif isinstance(reply, Exported):
            self.exported.emit(reply.message)
        elif isinstance(reply, TraceReady):
            self.traceReady.emit(reply.walk)

    def shutdown(self) -> None:
        """Stop the worker: a long seek or replay in progress ends at its next step, so the
        window closes within a step's time whatever the worker is doing."""
        self._worker.stopping.set()
        self.cancel_sweep()
        self.pause()
        self._thread.quit()
        self._thread.wait()
