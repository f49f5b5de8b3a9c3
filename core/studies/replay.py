"""Replays a scenario, or a workload with arrival times, through the engine with memory
management only (``kv_data=False``), one scheduler iteration at a time, and records what
each iteration computed (:class:`Work`), the blocks in use after it, and each request's
arrival, admission, first token and finish on a clock that a step-time model advances.

A scenario's ``schedule`` operation of N steps becomes N single iterations (the engine's
own loop does the same); after the script the replay goes on scheduling until every
request is done (``drain``), the scheduler is stalled, or :data:`MAX_ITERATIONS` pass.
User operations count as iterations too: an ``add`` computes its prompt, a ``grow`` its new
tokens as one chunk, a ``fork`` or ``free`` nothing.

What an iteration computed is read from the scheduler's state, not from events (a run
keeps none): vLLM v1's scheduler says it itself (``last_step``: each request's chunk and
the context before it); for v0's the replay compares each watched request's state before
and after the iteration — admissions computed their prompt (less the blocks the prefix
cache supplied), every decoded sequence one token over its whole context, swaps moved the
blocks the scheduler's swap time accounts for.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.errors import InvalidStudyError, PagesimError
from pagesim.core.operations import CHILD_SEPARATOR, Add, Grow, Operation, Schedule, Submit
from pagesim.core.scenario import Scenario
from pagesim.core.scheduler import shared_prefix_len
from pagesim.core.studies.workload import RequestSpec

MAX_ITERATIONS = 200_000  # a replay still running after this many iterations stops, unfinished
NOMINAL_STEP_SECONDS = 0.02  # without a model and a GPU: every iteration that computes lasts this


@dataclass(frozen=True, slots=True)
class Work:
    """What one iteration computed, summed over the sequences it ran."""

    tokens: int = 0  # tokens whose K/V were computed (prompt chunks and decodes)
    seqs: int = 0  # sequences computed: one row of logits each
    decode_tokens: int = 0  # of ``tokens``, one-token decodes
    attended: int = 0  # Σ over computed tokens of the positions each attends to (causal, itself included)
    kv_read: int = 0  # Σ over sequences of the context the kernel reads (tokens of K/V)
    blocks_read: int = 0  # Σ over sequences of the blocks that context spans
    swapped_blocks: int = 0  # blocks moved between GPU and CPU (out and in)

    @property
    def empty(self) -> bool:
        return not (self.tokens or self.swapped_blocks)


class WorkTally:
    """Adds up one iteration's chunks into a :class:`Work`."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.tokens = self.seqs = self.decode_tokens = self.attended = self.kv_read = self.blocks_read = 0
        self.swapped_blocks = 0

    def chunk(self, tokens: int, context: int) -> None:
        """One sequence computed ``tokens`` new tokens, ending at ``context`` tokens."""
        if tokens <= 0:
            return
        self.tokens += tokens
        self.seqs += 1
        self.decode_tokens += tokens == 1
        # positions context-tokens+1 … context, each attending to itself and all before it
        self.attended += tokens * context - tokens * (tokens - 1) // 2
        self.kv_read += context
        self.blocks_read += -(-context // self.block_size)

    def work(self) -> Work:
        return Work(
            self.tokens,
            self.seqs,
            self.decode_tokens,
            self.attended,
            self.kv_read,
            self.blocks_read,
            self.swapped_blocks,
        )


@dataclass
class RequestRecord:
    """One request's life on the replay's clock (seconds)."""

    request: str
    arrival: float
    prompt_len: int
    admitted: float | None = None  # the start of the iteration that first admitted it
    first_token: float | None = None  # the end of the iteration that produced its first output token
    finished: float | None = None  # the end of the iteration that produced its last one
    output_tokens: int = 0  # each of its sequences' (the per-token latencies divide by these)
    samples: int = 1  # sequences writing them side by side: v0's parallel samples (n)
    preemptions: int = 0
    rejected: bool = False
    rejection: str | None = None  # why it was refused: as it was submitted, or after it ran (aborted)
    aborted: bool = False  # refused after it ran (v0: it outgrew the pool): its outputs are thrown away
    outputs: int | None = None  # every sample's output tokens together, where they differ (None: the product)

    @property
    def state(self) -> str:
        """ "finished", "rejected" (as submitted), "aborted" (after it ran) or "unfinished"."""
        if self.rejected:
            return "aborted" if self.aborted else "rejected"
        return "finished" if self.finished is not None else "unfinished"

    @property
    def total_outputs(self) -> int:
        return self.output_tokens * self.samples if self.outputs is None else self.outputs


@dataclass
class ReplayResult:
    config: CacheConfig
    used_blocks: list[int] = field(default_factory=list)  # after each iteration
    ends: list[float] = field(default_factory=list)  # each iteration's end on the clock
    works: list[Work] = field(default_factory=list)
    requests: dict[str, RequestRecord] = field(default_factory=dict)
    preemptions: int = 0
    recomputed_tokens: int = 0
    swapped_blocks: int = 0
    prefix_hit_rate: float = 0.0
    stalled: str | None = None  # why the scheduler could never finish, if it could not
    unfinished: int = 0  # requests neither finished nor rejected at the end
    never_submitted: int = 0  # of those, the ones still to arrive when the iterations ran out

    @property
    def capped(self) -> bool:
        """It stopped at :data:`MAX_ITERATIONS` with work left."""
        return self.iterations >= MAX_ITERATIONS and (self.unfinished > 0 or self.stalled is not None)

    @property
    def iterations(self) -> int:
        return len(self.works)

    @property
    def clock(self) -> float:
        return self.ends[-1] if self.ends else 0.0


class _V0Watch:
    """v0's iteration, seen through the requests' state before and after it."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler

    def before(self) -> None:
        s = self.scheduler
        # Admission takes from the head of the queue, at most max_num_seqs sequences a step.
        names = itertools.chain(s.running, s.swapped, itertools.islice(s.waiting, s.config.max_num_seqs))
        self.prev = []
        for name in names:
            st = s.requests[name]
            self.prev.append((name, st.status, st.generated, st.preemptions, _admission_chunks(st)))
        self.swap_seconds = s.stats.swap_seconds

    def after(self, tally: WorkTally, hit_tokens: int, started: list[str], first: list[str], done: list[str]) -> None:
        s = self.scheduler
        config = s.config
        for name, status, generated, preemptions, pending in self.prev:
            st = s.requests[name]
            if status == "waiting" and (st.status != "waiting" or st.preemptions > preemptions):
                if st.status == "rejected":
                    continue
                started.append(name)
                for tokens, context, may_hit in pending:
                    skip = min(hit_tokens, tokens) if may_hit else 0  # (hits come with the first sequence's add)
                    hit_tokens -= skip
                    tally.chunk(tokens - skip, context)
            if st.generated > generated:
                context = len(st.prompt) + st.generated
                for _ in range(st.beam_width or st.n):
                    tally.chunk(1, context)
                if generated == 0:
                    first.append(name)
                if st.status == "finished":
                    done.append(name)
        seconds = s.stats.swap_seconds - self.swap_seconds
        tally.swapped_blocks += round(seconds * config.swap_bandwidth_gbs * 1e9 / config.block_bytes)


def _admission_chunks(state) -> list[tuple[int, int, bool]]:
    """(tokens computed, context after them, whether prefix hits may cover them) of each
    sequence a v0 admission computes: the prompt once (forks share it), or, for a group
    preempted by recompute, its first sequence whole and each other's tokens past those they
    all share (:func:`~pagesim.core.scheduler.resume_group`: never the prompt once per sample)."""
    if not state.resume_tokens:
        return [(len(state.prompt), len(state.prompt), True)]
    lengths = [len(t) for t in state.resume_tokens.values()]
    shared = shared_prefix_len(state.resume_tokens.values())
    return [(lengths[0], lengths[0], True)] + [(n - shared, n, False) for n in lengths[1:] if n > shared]


def _v1_iteration(scheduler, tally: WorkTally, started: list[str], first: list[str], done: list[str]) -> None:
    record = scheduler.last_step
    if record is None:
        return
    for s in record.scheduled:
        tally.chunk(s.tokens, s.computed_before + s.tokens)
        if s.kind != "running":
            started.append(s.request)
    for name in record.sampled:
        if scheduler.requests[name].num_outputs == 1:
            first.append(name)
    done.extend(record.finished)


def nominal_seconds(work: Work) -> float:
    return 0.0 if work.empty else NOMINAL_STEP_SECONDS


class Replay:
    """One replay: a simulator, a clock, and the records it fills."""

    def __init__(
        self,
        config: CacheConfig,
        seconds: Callable[[Work], float] = nominal_seconds,
        context_window: int | None = None,
    ) -> None:
        """``context_window``: the real model's the synthetic one stands in for, which bounds
        the sequences as it would."""
        try:
            self.sim = Simulator(config, kv_data=False)
        except (PagesimError, ValueError) as exc:
            raise InvalidStudyError(str(exc)) from None
        self.sim.runner.model.context_window = context_window
        self.seconds = seconds
        self.scheduler = self.sim.scheduler
        self.v1 = config.scheduler == "v1"
        self.watch = None if self.v1 else _V0Watch(self.scheduler)
        self.result = ReplayResult(config)
        self.clock = 0.0
        self._seen = 0  # requests already given a record

    # -- the parts -------------------------------------------------------------------
    def _apply(self, op: Operation) -> None:
        self.sim.apply(op, attend=False, record=False)

    def _close(self, tally: WorkTally, started=(), first=(), done=()) -> None:
        work = tally.work()
        start, self.clock = self.clock, self.clock + self.seconds(work)
        records = self.result.requests
        for name in started:
            if records[name].admitted is None:
                records[name].admitted = start
        for name in first:
            records[name].first_token = self.clock
        for name in done:
            records[name].finished = self.clock
        self.result.works.append(work)
        self.result.ends.append(self.clock)
        self.result.used_blocks.append(self.sim.blocks.pool.num_used)

    def submit(self, op: Submit, arrival: float | None = None) -> None:
        refusal = self.scheduler.refusal(op)
        self._apply(op)
        requests = self.scheduler.requests
        when = self.clock if arrival is None else arrival
        for name in itertools.islice(requests, self._seen, None):  # n samples are n requests in v1
            self.result.requests[name] = RequestRecord(name, when, op.length, rejection=refusal)
        self._seen = len(requests)

    def busy(self) -> bool:
        s = self.scheduler
        return bool(s.running or s.waiting or s.swapped)

    def iterate(self) -> bool:
        """One scheduler iteration; False (and nothing done) when idle or stalled."""
        if not self.busy() or self.scheduler.stalled():
            return False
        if self.result.iterations >= MAX_ITERATIONS:
            return False
        tally = WorkTally(self.sim.config.block_size)
        started: list[str] = []
        first: list[str] = []
        done: list[str] = []
        prefix = self.sim.blocks.prefix
        hits = prefix.hits
        if self.watch is not None:
            self.watch.before()
        self._apply(Schedule(1))
        if self.watch is not None:
            self.watch.after(tally, (prefix.hits - hits) * self.sim.config.block_size, started, first, done)
        else:
            _v1_iteration(self.scheduler, tally, started, first, done)
        self._close(tally, started, first, done)
        return True

    def user_op(self, op: Operation) -> None:
        tally = WorkTally(self.sim.config.block_size)
        self._apply(op)
        if isinstance(op, Add | Grow):
            length = self.sim.sequence(op.seq).num_tokens
            tally.chunk(op.length if isinstance(op, Grow) else length, length)
        self._close(tally)

    def finish(self) -> ReplayResult:
        s, result = self.scheduler, self.result
        result.stalled = s.stalled() if self.busy() else None
        result.preemptions = s.stats.preemptions
        result.recomputed_tokens = s.stats.recomputed_tokens
        result.swapped_blocks = sum(w.swapped_blocks for w in result.works)
        result.prefix_hit_rate = self.sim.metrics().prefix_hit_rate
        for name, record in result.requests.items():
            st = s.requests[name]
            record.rejected = st.status == "rejected"
            if record.rejected:
                record.rejection = record.rejection or st.rejection
                record.aborted = record.admitted is not None
            record.preemptions = st.preemptions
            record.output_tokens = st.num_outputs if self.v1 else st.generated
            if not self.v1 and not st.beam_width:  # (v1 runs the samples as child requests; beams return one text)
                record.samples = st.n
        if self.v1:
            result.requests = _parents(result.requests)
        result.unfinished = sum(1 for r in result.requests.values() if r.finished is None and not r.rejected)
        return result


def _parents(records: dict[str, RequestRecord]) -> dict[str, RequestRecord]:
    """v1's child requests (``r/s0``, ``r/s1`` …: vLLM's parallel sampling) folded into their
    request, as v0 counts it: its first token the first any child wrote, finished when every
    child is, its outputs per sample, its samples the children. Variants of one table then
    count the same requests, whatever their engine."""
    out: dict[str, RequestRecord] = {}
    families: dict[str, list[RequestRecord]] = {}
    for name, record in records.items():
        parent, sep, _ = name.rpartition(CHILD_SEPARATOR)
        if sep and parent:
            families.setdefault(parent, []).append(record)
            out.setdefault(parent, record)  # (a placeholder, in arrival order)
        else:
            out[name] = record
    for parent, children in families.items():
        finished = [c.finished for c in children]
        firsts = [c.first_token for c in children if c.first_token is not None]
        admitted = [c.admitted for c in children if c.admitted is not None]
        rejected = all(c.rejected for c in children)
        out[parent] = RequestRecord(
            parent,
            children[0].arrival,
            children[0].prompt_len,
            admitted=min(admitted, default=None),
            first_token=min(firsts, default=None),
            finished=None if None in finished else max(finished),
            output_tokens=max(c.output_tokens for c in children),
            samples=len(children),
            outputs=sum(c.output_tokens for c in children),
            preemptions=sum(c.preemptions for c in children),
            rejected=rejected,
            rejection=children[0].rejection,
            aborted=rejected and any(c.aborted for c in children),
        )
    return out


def _where(scenario: Scenario, index: int) -> str:
    return f"{scenario.source}, step {index + 1}"


def replay_scenario(
    scenario: Scenario,
    config: CacheConfig | None = None,
    seconds: Callable[[Work], float] = nominal_seconds,
    drain: bool = True,
) -> ReplayResult:
    """Replay ``scenario``'s operations on ``config`` (default: its own)."""
    replay = Replay(config or scenario.config, seconds, scenario.context_window)
    for index, op in enumerate(scenario.operations):
        try:
            if isinstance(op, Submit):
                replay.submit(op)
            elif isinstance(op, Schedule):
                for _ in range(op.steps):
                    if not replay.iterate():
                        break
            else:
                replay.user_op(op)
        except PagesimError as exc:
            raise InvalidStudyError(f"{_where(scenario, index)}: {exc}") from None
    if drain:
        while replay.iterate():
            pass
    return replay.finish()


MAX_ARRIVAL_SECONDS = 1e7  # ~116 days: the clock (float seconds) still resolves nanoseconds


def replay_workload(
    config: CacheConfig, specs: Iterable[RequestSpec], seconds: Callable[[Work], float] = nominal_seconds
) -> ReplayResult:
    """Submit each request when the clock reaches its arrival (an idle engine waits for the
    next one) and schedule until all are done."""
    replay = Replay(config, seconds)
    pending = sorted(specs, key=lambda s: s.arrival)
    if pending and pending[-1].arrival > MAX_ARRIVAL_SECONDS:
        raise InvalidStudyError(
            f"the requests arrive over {pending[-1].arrival:.3g} s of simulated time, more than "
            f"{MAX_ARRIVAL_SECONDS:g} s: a step's milliseconds would be lost in the clock's rounding; raise the "
            "arrival rate"
        )
    i = 0
    try:
        while True:
            if i < len(pending) and not replay.busy():
                replay.clock = max(replay.clock, pending[i].arrival)
            while i < len(pending) and pending[i].arrival <= replay.clock:
                s = pending[i]
                op = Submit(s.request_id, s.output_len, s.prompt_len, None, s.n, s.beam_width, s.shared_prefix)
                replay.submit(op, s.arrival)
                i += 1
            if not replay.iterate() and (i >= len(pending) or replay.busy()):
                break
    except PagesimError as exc:
        raise InvalidStudyError(str(exc)) from None
    result = replay.finish()
    for s in pending[i:]:  # (the iterations ran out before they arrived: unfinished, not absent)
        result.requests[s.request_id] = RequestRecord(
            s.request_id, s.arrival, s.prompt_len, samples=1 if s.beam_width else s.n
        )
    result.never_submitted = len(pending) - i
    result.unfinished += result.never_submitted
    return result
