"""The simulated serving engine: validates the user's operations, dispatches them, keeps
the step count and the events, and runs attention after each step.

Every operation is checked against the current state first (raising a
:class:`~pagesim.core.errors.PagesimError` if it cannot be done) and only then applied, so
a refused operation leaves the pool, the tables and the KV data exactly as they were.

Who owns what: :class:`~pagesim.core.registry.SequenceRegistry` the live and swapped
sequences and the operations that change them; :class:`~pagesim.core.block_manager.BlockManager`
the blocks (pool, holders, fills, CPU pool, usage counters);
:class:`~pagesim.core.model_runner.ModelRunner` the token model, the K/V data (paged cache,
swap space, dense reference) and the attention backend; :class:`~pagesim.core.scheduler.Scheduler`
the request queues. The scheduler changes sequences through the registry, below it: it never
calls back into the ``Simulator``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
from pagesim.core import events as ev
from pagesim.core.block_manager import BlockManager, BlockManagerSnapshot
from pagesim.core.config import CacheConfig
from pagesim.core.errors import (
    DuplicateSequenceError,
    InvalidOperationError,
    PoolExhaustedError,
)
from pagesim.core.events import EventLog
from pagesim.core.language_model import window_passed
from pagesim.core.layer_check import LayerDetail
from pagesim.core.metrics import Metrics
from pagesim.core.model_runner import AttentionReport, RunnerSnapshot
from pagesim.core.operations import Add, Fork, Free, Grow, Operation, Schedule, Submit
from pagesim.core.registry import SequenceRegistry
from pagesim.core.runners import make_runner
from pagesim.core.sampling import GREEDY
from pagesim.core.scheduler import Scheduler, SchedulerSnapshot
from pagesim.core.scheduler_v1 import SchedulerV1
from pagesim.core.sequence import Sequence, SequenceSnapshot
from pagesim.kernels.backend import Backend
from pagesim.kernels.selection import select_backend


class _EngineStepChecks:
    """The attention check after each engine step of one schedule op: the newest report
    whole (the op's own, once it ends), each earlier one kept as (passed, max |error|) only,
    so a schedule of many steps holds one report's arrays, not one per step. An error of
    the check stops the checks and is raised once the op's step is counted."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.newest: AttentionReport | None = None
        self.ran = False
        self.before_newest: list[tuple[bool, float]] = []
        self.error: Exception | None = None

    def check(self) -> None:
        if self.error is not None:
            return
        try:
            report = self.sim.runner.attend(list(self.sim.sequences.values()))
        except Exception as exc:  # (a backend's failure: raised after the op, not inside it)
            self.error = exc
            return
        if self.newest is not None:
            self.before_newest.append((bool(self.newest.passed), float(self.newest.max_abs_error)))
        self.newest, self.ran = report, True


@dataclass(frozen=True, init=False)
class StepResult:
    step: int  # 1-based: the state after this many operations
    op: Operation
    op_events: tuple[ev.Event, ...]  # what the operation did to blocks, tokens and requests
    metrics: Metrics
    attention: AttentionReport | None
    detail_dropped: bool = False  # an old step: its attention and detail events recompute on a seek
    recorded: bool = True  # False: a run that keeps no events (apply's record=False)
    # A real model's forwards in the step, ("prefill" | "decode", tokens, seconds) each: kept
    # with it, since a step back restores the state without running them again.
    forwards: tuple[tuple[str, int, float], ...] = ()
    # A schedule of several steps: each engine step's check but the last (whose is
    # ``attention``), as (passed, max |error|), for the steps that had a live sequence.
    inner_checks: tuple[tuple[bool, float], ...] = ()

    def __init__(
        self,
        step: int,
        op: Operation,
        op_events: tuple[ev.Event, ...],
        metrics: Metrics,
        attention: AttentionReport | None,
        detail_dropped: bool = False,
        recorded: bool = True,
        forwards: tuple[tuple[str, int, float], ...] = (),
        inner_checks: tuple[tuple[bool, float], ...] = (),
    ) -> None:
        # Every step of every run makes one: a frozen dataclass's own __init__ sets each field
        # through object.__setattr__, two and a half times the time of one update of its dict.
        self.__dict__.update(
            step=step, op=op, op_events=op_events, metrics=metrics, attention=attention,
            detail_dropped=detail_dropped, recorded=recorded, forwards=forwards, inner_checks=inner_checks,
        )  # fmt: skip

    @functools.cached_property
    def events(self) -> tuple[ev.Event, ...]:
        """Every event of the step: the operation's, then the attention's (a lookup and a
        check per sequence, the launch), built from the report when first asked for — the
        window reads one sequence's lookup (:meth:`lookup_of`), the event log all of them."""
        if self.attention is None or not self.recorded:
            return self.op_events
        return self.op_events + self.attention.events()

    def lookup_of(self, seq_id: str | None) -> tuple[int, ...] | None:
        """The blocks the kernel read for ``seq_id`` this step, in logical order (None: not attended)."""
        report = self.attention
        if report is None or not self.recorded or seq_id not in report.seq_ids:
            return None
        return report.table_of(report.index_of(seq_id))


@dataclass(frozen=True)
class SimulatorSnapshot:
    step: int
    blocks: BlockManagerSnapshot
    sequences: tuple[SequenceSnapshot, ...]
    swapped: tuple[SequenceSnapshot, ...]
    runner: RunnerSnapshot
    last_attention: AttentionReport | None
    scheduler: SchedulerSnapshot

    @property
    def has_data(self) -> bool:
        """It holds K/V data (a restore rolls the cache back rather than rebuilding it)."""
        return self.runner.has_data


class Simulator:
    def __init__(self, config: CacheConfig, backend: Backend | None = None, kv_data: bool = True) -> None:
        """``kv_data=False`` simulates memory management only: token ids, blocks, tables and
        the prefix cache, with no K/V computed or stored and no attention (for large
        workloads through the scheduler)."""
        self.config = config
        self.kv_data = kv_data
        backend = backend or select_backend("auto" if kv_data else "cpu")
        self.runner = make_runner(config, backend, kv_data)  # refuses caches that cannot fit first
        self.events = EventLog()
        self.blocks = BlockManager(config, self.events)
        self.registry = SequenceRegistry(config, self.blocks, self.runner, self.events)
        # Submit and Schedule go to vLLM v0's scheduler or v1's (the scenario's ``scheduler``).
        scheduler = SchedulerV1 if config.scheduler == "v1" else Scheduler
        self.scheduler = scheduler(config, self.runner.model, self.blocks, self.registry, self.events)
        self.step = 0
        self.last_attention: AttentionReport | None = None
        # Told of each token a real model's Grow writes, as it is written (the app streams the
        # text while a long grow runs): (sequence id, its token ids so far).
        self.token_written: Callable[[str, list[int]], None] | None = None

    # -- queries ------------------------------------------------------------------------
    @property
    def pool(self):
        return self.blocks.pool

    @property
    def cpu_pool(self):
        return self.blocks.cpu_pool

    @property
    def sequences(self) -> dict[str, Sequence]:
        """The live sequences, in the order they were added (the registry's)."""
        return self.registry.sequences

    @property
    def swapped(self) -> dict[str, Sequence]:
        return self.registry.swapped

    def sequence(self, seq_id: str) -> Sequence:
        return self.registry.sequence(seq_id)

    def is_taken(self, seq_id: str) -> bool:
        return self.registry.is_taken(seq_id)

    def block_fill(self, block_id: int) -> int:
        return self.blocks.fill(block_id)

    def block_fills(self) -> list[int]:
        return self.blocks.fills()

    def holders(self, block_id: int) -> list[tuple[str, int]]:
        """(sequence, logical index) pairs whose tables hold ``block_id``."""
        return self.blocks.holders(block_id)

    def holders_map(self) -> dict[int, tuple[tuple[str, int], ...]]:
        """Every held block -> its (sequence, logical index) pairs."""
        return self.blocks.holders_map()

    def metrics(self) -> Metrics:
        c, u, pool = self.config, self.blocks.usage, self.blocks.pool
        used = pool.num_used
        return Metrics(
            step=self.step,
            num_sequences=len(self.sequences),
            used_blocks=used,
            free_blocks=pool.num_free,
            shared_blocks=u.shared_blocks,
            logical_tokens=u.logical_tokens,
            slots_allocated=(used - self.blocks.reserved_blocks) * c.block_size,
            slots_filled=u.slots_filled,
            contiguous_blocks=u.contiguous_blocks,
            prefix_lookup_blocks=self.blocks.prefix.lookups,
            prefix_hit_blocks=self.blocks.prefix.hits,
            cached_free_blocks=pool.num_cached_free() if c.prefix_caching else 0,
        )

    def verify_kv(self, seq_id: str) -> str | None:
        """Compare, bit for bit, the K/V the kernel reads for ``seq_id`` through its block
        table with what the token model wrote (see :meth:`ModelRunner.verify_kv`)."""
        return self.runner.verify_kv(self.sequence(seq_id))

    def dense_kv(self, seq_id: str) -> tuple[np.ndarray, np.ndarray]:
        """The sequence's K/V as the dense reference holds them (contiguous, from the tokens)."""
        self.sequence(seq_id)
        return self.runner.dense_kv(seq_id)

    def attention_weights(self, seq_id: str) -> tuple[np.ndarray, np.ndarray]:
        """Softmax weights (num_heads, context_len) of ``seq_id``'s newest token, from its
        dense K/V, and the physical block each context token was read from."""
        return self.runner.attention_weights(self.sequence(seq_id))

    def worst_layer(self) -> int | None:
        """The layer with the least margin in the last step's check of every layer (None: the
        step ran no forward, or the model attends once)."""
        report = self.last_attention
        layers = report.layers if report is not None else None
        return layers.worst_layer if layers is not None and layers.seq_ids else None

    def shown_layer(self, layer: int | None) -> int:
        """The layer a view shows: ``layer`` (clamped to the model's), or with None the last
        step's worst, else the one the step's report shows."""
        runner = self.runner
        if layer is not None:
            return min(max(0, layer), runner.num_layers - 1)
        worst = self.worst_layer()
        return worst if worst is not None else runner.check_layer

    def layer_detail(self, seq_id: str, layer: int, context_len: int) -> LayerDetail:
        """A real model's layer ``layer`` for ``seq_id``'s newest token (see
        :meth:`LlamaRunner.layer_detail`)."""
        seq = self.sequence(seq_id)
        if self.runner.num_layers == 1:
            raise InvalidOperationError("the synthetic model has one attention: no layer to choose")
        return self.runner.layer_detail(seq, layer, context_len)

    # -- operations -----------------------------------------------------------------------
    def apply(self, op: Operation, attend: bool = True, record: bool = True) -> StepResult:
        """Validate ``op``, apply it, then (if ``attend``) run decode attention for every
        sequence. ``record=False`` keeps no events (large simulations)."""
        self.events.enabled = record
        self.events.clear()
        self.registry.forwards.clear()
        # A schedule of several engine steps on the synthetic model: each one's attention is
        # checked as it ends, not only the last (a request could run and finish between two
        # checks, never compared). A real model checks every layer in each forward already.
        engine_steps = None
        if attend and isinstance(op, Schedule) and op.steps > 1 and self.runner.num_layers == 1:
            engine_steps = _EngineStepChecks(self)
            self.scheduler.after_step = engine_steps.check
        try:
            self.execute(op)
        except Exception:
            self.events.clear()
            raise
        finally:
            self.scheduler.after_step = None
        self.step += 1
        if engine_steps is not None and engine_steps.error is not None:
            raise engine_steps.error  # (once the step is counted: the state is the op's, as after attend's error)
        if not attend:
            self.last_attention = None
        elif engine_steps is not None and engine_steps.ran:  # (the last step's check is the state's now)
            self.last_attention = engine_steps.newest
        else:
            self.last_attention = self.runner.attend(list(self.sequences.values()))
        checks = () if engine_steps is None else tuple(engine_steps.before_newest)
        return StepResult(
            self.step,
            op,
            self.events.take(),
            self.metrics(),
            self.last_attention,
            recorded=record,
            forwards=tuple(self.registry.forwards),
            inner_checks=checks,
        )

    def execute(self, op: Operation) -> None:
        """Validate and apply one operation (its events go to the log); no attention, no step."""
        if isinstance(op, Submit | Schedule):
            self.scheduler.execute(op)
            return
        handler = self._HANDLERS.get(type(op))
        if handler is None:
            raise InvalidOperationError(f"not an operation: {op!r}")
        if isinstance(op, Grow | Free):
            target = self.sequences.get(op.seq) or self.swapped.get(op.seq)
            owner = self.scheduler.reserving(op.seq) if target is None else target.owner
            if target is None and owner is None and (ended := self.scheduler.ended(op.seq)) is not None:
                request, status = ended
                raise InvalidOperationError(
                    f"sequence {op.seq!r} was request {request!r}'s, which has {status}: its blocks are free"
                )
            if owner is not None:
                waiting = " (still waiting)" if target is None else ""
                raise InvalidOperationError(
                    f"sequence {op.seq!r} belongs to request {owner!r}{waiting}: the scheduler grows and frees it"
                )
        handler(self, op)

    def _check_new_id(self, seq_id: str) -> None:
        """A new name of the user's must be free: no live or swapped sequence holds it, and
        no waiting request of the scheduler will take it when admitted."""
        self.registry.check_new_id(seq_id)
        if (request := self.scheduler.reserving(seq_id)) is not None:
            raise DuplicateSequenceError(seq_id, f"request {request!r} will run a sequence of that name")

    def _add(self, op: Add) -> None:
        self._check_new_id(op.seq)
        if op.prompt is None:
            # Refuse what cannot fit before generating the prompt (a long one costs time and memory).
            c, blocks = self.config, self.blocks
            reusable = blocks.pool.num_used if c.prefix_caching else 0  # hits on held blocks take none
            if c.blocks_for(op.num_tokens) > blocks.num_free + reusable:
                need = c.blocks_for(op.num_tokens)
                raise PoolExhaustedError(need, blocks.num_free, f"add {op.seq} ({op.num_tokens} tokens)")
        model = self.runner.model
        if window := window_passed(model, op.length):
            raise InvalidOperationError(
                f"sequence {op.seq!r} would hold {op.length} tokens, past the model's context window of {window}"
            )
        token_ids = list(op.prompt) if op.prompt is not None else model.token_ids(op.seq, 0, op.num_tokens)
        self.registry.add(op.seq, token_ids, op.blocks, sampling=op.sampling)

    def _grow(self, op: Grow) -> None:
        seq = self.sequence(op.seq)
        grown = seq.num_tokens + op.length
        # (whole or not at all: refused even where the sequence would stop, at its end-of-sequence, short of it)
        if window := window_passed(self.runner.model, grown):
            raise InvalidOperationError(
                f"sequence {op.seq!r} would hold {seq.num_tokens} + {op.length} = {grown} tokens, past the model's "
                f"context window of {window}"
            )
        needed = self.blocks.append_need(seq, op.length)  # before generating the tokens
        if needed > self.blocks.num_free:
            raise PoolExhaustedError(needed, self.blocks.num_free, f"grow {op.seq} by {op.length}")
        if op.token_ids is None and self.runner.model.samples_from_logits:
            # A real model: each token from the last one's logits, until the sequence finishes
            # (its end-of-sequence token, or its max_tokens); a finished one is not grown.
            if (reason := self._finished(seq)) is not None:
                raise InvalidOperationError(f"sequence {op.seq!r} has finished: {reason}")
            for _ in range(op.num_tokens):
                self.registry.decode([seq])
                if self.token_written is not None:
                    self.token_written(seq.seq_id, seq.token_ids)
                if self._finished(seq) is not None:
                    break
            return
        if op.token_ids is not None:
            token_ids = list(op.token_ids)
        else:
            token_ids = self.runner.model.token_ids(op.seq, seq.num_tokens, op.num_tokens)
        self.runner.model.check_vocab(token_ids, "token_ids")
        self.registry.append([seq], [token_ids])

    def _finished(self, seq: Sequence) -> str | None:
        params = seq.sampling or GREEDY
        reason = params.finished(seq.generated, seq.token_ids[-1], self.runner.model.eos_id)
        if reason == "eos":
            return "it generated the end-of-sequence token"
        return None if reason is None else f"it generated max_tokens = {params.max_tokens} tokens"

    def _fork(self, op: Fork) -> None:
        self.sequence(op.seq)
        self._check_new_id(op.new_seq)
        self.registry.fork(op.seq, op.new_seq)

    def _free(self, op: Free) -> None:
        self.registry.free(op.seq)

    # The handler of each user operation (built once, not at every operation).
    _HANDLERS: ClassVar[dict[type, Callable[[Simulator, Operation], None]]] = {
        Add: _add,
        Grow: _grow,
        Fork: _fork,
        Free: _free,
    }

    # -- snapshots --------------------------------------------------------------------------
    def snapshot(self, with_data: bool = True) -> SimulatorSnapshot:
        """The whole state; ``with_data=False`` leaves out the K/V arrays and the attention
        report (as :func:`without_data`, with nothing copied first): :meth:`restore` then
        rebuilds the data from the tokens."""
        live = self.registry.live_blocks() if with_data and self.kv_data else ()
        return SimulatorSnapshot(
            step=self.step,
            blocks=self.blocks.snapshot(),
            sequences=tuple(s.snapshot() for s in self.sequences.values()),
            swapped=tuple(s.snapshot() for s in self.swapped.values()),
            runner=self.runner.snapshot(live, with_data),
            last_attention=self.last_attention if with_data else None,
            scheduler=self.scheduler.snapshot(),
        )

    def restore(self, snap: SimulatorSnapshot) -> None:
        if not self.runner.can_restore(snap.runner):
            snap = without_data(snap)  # a newer checkpoint replaced its undo log: rebuild instead
        self.step = snap.step
        registry = self.registry
        registry.sequences = {s.seq_id: s.restore() for s in snap.sequences}
        registry.swapped = {s.seq_id: s.restore() for s in snap.swapped}
        self.blocks.restore(snap.blocks, registry.sequences.values())
        self.runner.restore(snap.runner, registry.sequences.values(), registry.swapped.values(), self.blocks.pool)
        self.last_attention = snap.last_attention
        self.scheduler.restore(snap.scheduler)


def without_data(snap: SimulatorSnapshot) -> SimulatorSnapshot:
    """The snapshot less its K/V arrays (paged cache, swap space, dense reference) and its
    attention report: what an older snapshot keeps, so that memory does not grow with steps."""
    return replace(snap, runner=snap.runner.without_data(), last_attention=None)
