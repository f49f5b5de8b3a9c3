"""vLLM v1's scheduler: one token budget a step (``max_num_batched_tokens``), spent on the
running requests first, then on waiting ones; chunked prefill; the step that completes a
prompt samples the first token, and the newest sampled token is never in the cache (the
next step computes it). Admission credits prefix-cache hits, also on free cached blocks;
when a running request cannot get its blocks the newest running request (``running[-1]``,
possibly itself) is preempted by recompute, and a step that preempted admits nobody.
``max_num_seqs`` counts requests; n > 1 runs n child requests (``r/s0`` …) that share their
prompt's full blocks through the prefix cache, as vLLM's parallel-sampling parent does.

Block 0 is the null block and freed blocks go back as vLLM v1's ``BlockPool`` returns them
(the block manager's v1 mode); a request's sequence holds exactly the tokens computed so far.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from itertools import repeat
from typing import NamedTuple, cast

from pagesim.core import events as ev
from pagesim.core.block_manager import BlockManager
from pagesim.core.config import CacheConfig
from pagesim.core.errors import DuplicateSequenceError, InvalidOperationError
from pagesim.core.events import EventLog
from pagesim.core.language_model import LanguageModel, request_past_window
from pagesim.core.operations import CHILD_SEPARATOR, Schedule, Submit
from pagesim.core.registry import SequenceRegistry
from pagesim.core.sampling import SamplingParams
from pagesim.core.scheduler import PromptSource, SchedulerStats
from pagesim.core.sequence import TOKEN_CODE, Sequence

WAITING, RUNNING, FINISHED, REJECTED = "waiting", "running", "finished", "rejected"


@dataclass(slots=True)
class RequestV1:
    """One request as vLLM's ``Request``: its tokens (prompt, then samples) and how many of
    them are computed. A parallel sample is a request of its own, ``name/s<i>``."""

    request: str
    order: int
    prompt_len: int
    max_tokens: int
    tokens: array  # vLLM's all_token_ids, 64-bit items (slices and block chunks of it copy as memory)
    computed: int = 0  # num_computed_tokens: the tokens whose K/V are in the cache
    status: str = WAITING
    preemptions: int = 0
    prefix_hits: list[int] = field(default_factory=list)  # hit tokens at each admission
    output: tuple[int, ...] | None = None  # prescribed samples (a replayed trace); None: the model's
    sampling: SamplingParams | None = None  # how a real model draws its tokens (child i: index i)
    block_hashes: list[int] = field(default_factory=list)  # of its tokens' full blocks, as found
    rejection: str | None = None  # why it was refused, once it is
    last_len: int = field(init=False)  # its length when it samples its last token

    def __post_init__(self) -> None:
        self.last_len = self.prompt_len + self.max_tokens - 1

    @property
    def to_compute(self) -> int:
        """Its tokens not yet in the cache: more than one while a prompt has chunks to go."""
        return len(self.tokens) - self.computed

    @property
    def num_outputs(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def seqs(self) -> list[str]:
        return [self.request] if self.status == RUNNING else []

    def copy(self) -> RequestV1:
        return replace(
            self,
            tokens=array(TOKEN_CODE, self.tokens),
            prefix_hits=list(self.prefix_hits),
            block_hashes=list(self.block_hashes),
        )


class Computed(NamedTuple):
    """The requests a step computes up to their last token, in order: each samples a token.
    Their names and lengths ride along, as the step has them (the model asks for both)."""

    states: list[RequestV1]
    names: list[str]
    lengths: list[int]

    def add(self, state: RequestV1) -> None:
        self.states.append(state)
        self.names.append(state.request)
        self.lengths.append(len(state.tokens))


class Scheduled(NamedTuple):  # (a tuple: a step makes one per running request)
    request: str
    kind: str  # "new", "resumed" (admitted again after a preemption) or "running"
    tokens: int
    computed_before: int
    prefix_hit_tokens: int | None  # admissions only


class DecodeRun(NamedTuple):
    """Running requests that each decode one token, scheduled at once: their rows of
    :attr:`StepV1.scheduled`, built when read (a step has one per running request)."""

    names: list[str]
    computed_before: list[int]


@dataclass(eq=False)
class StepV1:
    """What one step decided: vLLM's ``SchedulerOutput`` and ``update_from_output`` in short."""

    parts: list[Scheduled | DecodeRun] = field(default_factory=list)  # in order: see ``scheduled``
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    # The requests that sampled, and their tokens: see ``sampled`` (a dict once read).
    samples: tuple[Iterable[str], Iterable[int]] | dict[str, int] = ((), ())
    free_after_schedule: int = 0
    free_after_update: int = 0
    block_tables: dict[str, list[int]] | None = None  # after scheduling, when ``record_tables``

    @property
    def scheduled(self) -> list[Scheduled]:
        """Each request the step computes: running ones first, then admissions."""
        if any(type(part) is DecodeRun for part in self.parts):
            rows: list[Scheduled | DecodeRun] = []
            for part in self.parts:
                if type(part) is DecodeRun:
                    # (tuple.__new__ directly, in C)
                    row = zip(part.names, repeat("running"), repeat(1), part.computed_before, repeat(None))
                    rows.extend(map(tuple.__new__, repeat(Scheduled), row))
                else:
                    rows.append(part)
            self.parts = rows
        return cast(list[Scheduled], self.parts)  # (no DecodeRun is left)

    @property
    def sampled(self) -> dict[str, int]:
        """Each request that sampled a token this step → the token, in the order computed."""
        if type(self.samples) is not dict:
            self.samples = dict(zip(*self.samples, strict=True))
        return self.samples

    def _fields(self) -> tuple:
        return (
            self.scheduled,
            self.preempted,
            self.finished,
            self.sampled,
            self.free_after_schedule,
            self.free_after_update,
            self.block_tables,
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepV1) and self._fields() == other._fields()


@dataclass(frozen=True)
class SchedulerV1Snapshot:
    requests: tuple[RequestV1, ...]
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    stats: SchedulerStats  # (v1 never swaps: its swap counters stay 0)
    used: bool
    last_step: StepV1 | None


def refusal_at_submit_v1(op: Submit, config: CacheConfig, prompt_len: int) -> str | None:
    """What no state of the pool can run: beams (vLLM v1 searches above the engine), or a
    request whose cached tokens (all but the last sample) outgrow the usable blocks."""
    if op.beam_width:
        return 'the v1 scheduler has no beam search (vLLM v1 runs it above the engine): use scheduler = "v0"'
    usable = config.num_blocks - 1  # block 0 is the null block
    need = config.blocks_for(prompt_len + op.output_len - 1)
    if need > usable:
        return f"{prompt_len} prompt + {op.output_len} output tokens need {need} blocks; {usable} are usable"
    return None


class SchedulerV1:
    """Above the block manager, as the v0 :class:`~pagesim.core.scheduler.Scheduler`: it
    reads free blocks and prefix hits there and changes sequences only through the registry."""

    def __init__(
        self,
        config: CacheConfig,
        model: LanguageModel,
        blocks: BlockManager,
        registry: SequenceRegistry,
        events: EventLog,
    ) -> None:
        self.config, self.model, self.blocks, self.registry, self.events = config, model, blocks, registry, events
        self.used = False
        self.requests: dict[str, RequestV1] = {}
        self.waiting: deque[str] = deque()
        self.running: list[str] = []
        # Beside ``running``, in its order: each request's state and sequence (a decode run
        # slices them instead of looking up every running request by name each step).
        self._running_states: list[RequestV1] = []
        self._running_seqs: list[Sequence] = []
        # Running requests with more than one token still to compute (a prompt's chunks to
        # go): every other running request decodes one token a step.
        self.prompting: set[str] = set()
        self.swapped: deque[str] = deque()  # always empty: v1 preempts by recompute only
        self.stats = SchedulerStats()
        self.prompts = PromptSource(model)
        self.record_tables = False  # keep each step's block tables in last_step (a trace)
        self.last_step: StepV1 | None = None
        self.replaying = False  # some request samples prescribed tokens (a replayed trace)
        self.after_step: Callable[[], None] | None = None  # called after each step of a schedule

    # -- operations ---------------------------------------------------------------------
    def execute(self, op) -> None:
        self.used = True
        if isinstance(op, Submit):
            self.submit(op)
        elif isinstance(op, Schedule):
            self.last_step = None  # (stays None when there is nothing to do)
            for _ in range(op.steps):
                if not (self.running or self.waiting) or self.stalled():
                    break
                self.step()
                if self.after_step is not None:
                    self.after_step()
        else:
            raise InvalidOperationError(f"not a scheduler operation: {op!r}")

    def refusal(self, op: Submit) -> str | None:
        """Why ``op`` would be rejected as soon as it is submitted, or None."""
        return request_past_window(self.model, op.length, op.output_len) or refusal_at_submit_v1(
            op, self.config, op.length
        )

    def submit(self, op: Submit) -> None:
        """Queue ``op`` (its n samples as n requests)."""
        names = [op.request] if op.n == 1 else [f"{op.request}{CHILD_SEPARATOR}s{i}" for i in range(op.n)]
        if op.request in self.requests or any(name in self.requests for name in names):
            raise DuplicateSequenceError(op.request, "a request of that name was submitted already")
        refusal = self.refusal(op)
        prompt = () if refusal else self.prompts.prompt_of(op)
        self.events.add(ev.RequestSubmitted, op.request, len(prompt) or op.length, op.output_len, op.n)
        for index, name in enumerate(names):
            sampling = None if op.sampling is None else op.sampling.for_index(index)
            state = RequestV1(name, len(self.requests), len(prompt), op.output_len, array(TOKEN_CODE, prompt))
            state.sampling = sampling
            self.requests[name] = state
            if refusal:
                self._reject(state, refusal)
            else:
                self.waiting.append(name)

    def prescribe(self, request: str, output: tuple[int, ...]) -> None:
        """The tokens ``request`` will sample instead of the model's (a replayed trace)."""
        self.requests[request].output = output
        self.replaying = True

    def reserving(self, seq_id: str) -> str | None:
        """The waiting request that will run a sequence named ``seq_id`` when admitted, if any."""
        return seq_id if seq_id in self.waiting else None

    def ended(self, seq_id: str) -> tuple[str, str] | None:
        """(the request, "finished" or "rejected") that a sequence named ``seq_id`` ran for, once
        it has ended, or None."""
        state = self.requests.get(seq_id)
        return (state.request, state.status) if state is not None and state.status in (FINISHED, REJECTED) else None

    def stalled(self) -> str | None:
        """Why the waiting requests can never run, or None: nothing runs, and the head of the
        queue cannot get its first chunk's blocks (user sequences hold them)."""
        if self.running or not self.waiting:
            return None
        state = self.requests[self.waiting[0]]
        if self.registry.is_taken(state.request):
            return None  # the next step rejects it
        hits, _ = self._first_chunk(state, self.config.max_num_batched_tokens)
        if self.blocks.can_allocate(len(state.tokens), hits):
            return None
        need, free = self.blocks.allocation_need(len(state.tokens), hits), self.blocks.num_free
        return (
            f"waiting request {state.request} needs {need} blocks; {free} are free and nothing running will free more"
        )

    # -- one step -----------------------------------------------------------------------
    def _first_chunk(self, state: RequestV1, budget: int) -> tuple[list[tuple[int, int]], int]:
        """Its prefix-cache hits (all but the last token may hit) and the tokens it would
        hold after this step's chunk: the hits plus up to ``budget`` tokens to compute."""
        hits = self.blocks.prefix.match(state.tokens, state.block_hashes) if self.config.prefix_caching else []
        hit_tokens = len(hits) * self.config.block_size
        return hits, hit_tokens + min(len(state.tokens) - hit_tokens, budget)

    def step(self) -> StepV1:
        record = StepV1()
        self.last_step = record
        blocks, registry = self.blocks, self.registry
        # 1. The running requests, in order, each as far as its tokens and the budget go.
        done, budget = self._schedule_running(record)
        # 2. Waiting requests, first come first served, unless this step preempted.
        while not record.preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            state = self.requests[self.waiting[0]]
            if registry.is_taken(state.request):
                self.waiting.popleft()
                self._reject(state, "a sequence of that name already exists")
                continue
            hits, held = self._first_chunk(state, budget)
            if not blocks.can_allocate(len(state.tokens), hits):  # its whole sequence must fit (vLLM's
                break  # scheduler_reserve_full_isl), not only this chunk
            self.waiting.popleft()
            hit_tokens = len(hits) * self.config.block_size
            kind = "resumed" if state.preemptions else "new"
            record.parts.append(Scheduled(state.request, kind, held - hit_tokens, hit_tokens, hit_tokens))
            if held == len(state.tokens):
                done.add(state)
            registry.add(
                state.request,
                state.tokens[:held],
                owner=state.request,
                vocab_checked=True,
                hits=hits,
                known_hashes=state.block_hashes,
                prompt_len=state.prompt_len,
                looked_up=len(state.tokens),
            )
            state.computed, state.status = held, RUNNING
            if state.to_compute > 1:
                self.prompting.add(state.request)
            state.prefix_hits.append(hit_tokens)
            self.running.append(state.request)
            self._running_states.append(state)
            self._running_seqs.append(registry.sequences[state.request])
            budget -= held - hit_tokens
            self.events.add(ev.RequestAdmitted, state.request, (state.request,), kind == "resumed")
        record.free_after_schedule = blocks.num_free
        if self.record_tables:
            record.block_tables = {r: list(registry.sequence(r).block_table) for r in self.running}
        # 3. The model's answer: a token for each request now computed up to its end.
        self._sample(record, done)
        record.free_after_update = blocks.num_free
        return record

    def _schedule_running(self, record: StepV1) -> tuple[Computed, int]:
        """The running requests in order, each as far as its tokens and the budget go: runs
        of decoding requests that the pool covers, at once, and between them, one at a time,
        a prompt's next chunk or a request the pool does not cover. Returns the requests now
        computed up to their last token (in order) and the budget left."""
        done = Computed([], [], [])
        budget, index = self.config.max_num_batched_tokens, 0
        while index < len(self.running) and budget > 0:
            count = self._decode_run(record, done, index, budget)
            index, budget = index + count, budget - count
            if index < len(self.running) and budget > 0:
                tokens = self._schedule_one(record, done, index, budget)
                if tokens is None:
                    break  # it preempted itself
                index, budget = index + 1, budget - tokens
        return done, budget

    def _decode_run(self, record: StepV1, done: Computed, start: int, budget: int) -> int:
        """The longest run of running requests from ``start`` that each decode one token and
        that the budget and the free pool cover, at once (in the common step, all of them).
        None of them can be preempted this step: a victim is always the newest running
        request, behind them. Returns how many."""
        names = self.running[start : start + budget]
        count = len(names)
        for name in self.prompting:  # the run stops at the first prompt with chunks to go
            with suppress(ValueError):
                count = names.index(name, 0, count)
        del names[count:]
        states = self._running_states[start : start + count]
        seqs = self._running_seqs[start : start + count]
        computed = [s.computed for s in states]
        ends = [n + 1 for n in computed]  # what each holds once computed
        # (each takes at most one block: mostly, no count is needed; a sequence holds what is computed)
        covered = self.blocks.decode_covered(seqs, computed)
        if covered < count:
            count = covered
            del names[count:], states[count:], seqs[count:], computed[count:], ends[count:]
        record.parts.append(DecodeRun(names, computed))
        for state, end in zip(states, ends, strict=True):
            state.computed = end
        self._compute(seqs, [s.tokens[-1] for s in states], computed)
        done.states.extend(states)
        done.names.extend(names)
        done.lengths.extend(ends)
        return count

    def _schedule_one(self, record: StepV1, done: Computed, index: int, budget: int) -> int | None:
        """The running request at ``index``: a prompt's next chunk, or a token the pool does
        not cover until the newest running requests are preempted (maybe this one). Returns
        the tokens scheduled, or None when it was preempted itself."""
        name = self.running[index]
        state = self.requests[name]
        tokens = min(state.to_compute, budget)
        seq = self.registry.sequences[name]
        while self.blocks.append_need(seq, tokens) > self.blocks.num_free:
            victim = self.running.pop()  # the newest running request
            del self._running_states[-1], self._running_seqs[-1]
            self._preempt(victim)
            record.preempted.append(victim)
            if victim == name:
                return None
        record.parts.append(Scheduled(name, "running", tokens, state.computed, None))
        self._compute([seq], [state.tokens[state.computed : state.computed + tokens]])
        state.computed += tokens
        if state.to_compute <= 1:
            self.prompting.discard(name)
        if state.computed == len(state.tokens):
            done.add(state)
        return tokens

    def _compute(self, seqs: list, token_ids: list, starts: list[int] | None = None) -> None:
        """Tokens join their sequences: one token id per sequence, or one list of them for
        each (``starts``: their lengths before, when known). A model with K/V computes each
        request's tokens in a forward of its own, so the bits of its K/V and logits stay
        those of a single request."""
        if not seqs:
            return
        if self.registry.runner.kv_data:
            for seq, ids in zip(seqs, token_ids, strict=True):
                self.registry.append([seq], [ids])
        else:
            self.registry.append(seqs, token_ids, starts=starts)

    def _sample(self, record: StepV1, done: Computed) -> None:
        """A token for each request ``done`` lists; those that reach ``max_tokens`` or (a real
        model) sample end-of-sequence finish."""
        states, ids, positions = done
        drawn = states
        if self.replaying:  # a replayed trace prescribes its tokens: the model draws the others'
            drawn = [s for s in states if s.output is None]
            ids, positions = [s.request for s in drawn], [len(s.tokens) for s in drawn]
        if self.model.samples_from_logits:
            tokens = list(self.model.next_token_ids(ids, positions, [s.sampling for s in drawn]))
            eos = self.model.eos_id
        else:
            tokens, eos = list(self.model.next_token_ids(ids, positions)), None
        if self.replaying:
            model_tokens = iter(tokens)
            tokens = [next(model_tokens) if s.output is None else s.output[s.num_outputs] for s in states]
        if len(tokens) != len(states):  # (checked here: the samples' dict is built only when read)
            raise ValueError(f"the model gave {len(tokens)} tokens for {len(states)} requests")
        record.samples = (done.names, tokens)
        # (array.append mapped in C: a step samples a token for nearly every running request)
        deque(map(array.append, [s.tokens for s in states], tokens), 0)
        lengths = done.lengths  # each one's length before its new token
        if eos is None:
            finished = [s for s, n in zip(states, lengths, strict=True) if n >= s.last_len]
        else:  # a real model's end-of-sequence token stops a request unless told not to
            finished = [
                s
                for s, n, token in zip(states, lengths, tokens, strict=True)
                if n >= s.last_len or (token == eos and (s.sampling is None or s.sampling.stop_at_eos))
            ]
        for state in finished:
            self._finish(state, record)

    def _finish(self, state: RequestV1, record: StepV1) -> None:
        self.registry.free(state.request)
        index = self.running.index(state.request)
        del self.running[index], self._running_states[index], self._running_seqs[index]
        self.prompting.discard(state.request)
        state.status = FINISHED
        self.stats.finished += 1
        record.finished.append(state.request)
        self.events.add(ev.RequestFinished, state.request, state.num_outputs)

    def _preempt(self, request: str) -> None:
        state = self.requests[request]
        table = self.registry.sequence(request).block_table
        held, cached = len(table), sum(map(self.blocks.pool.is_cached, table))
        self.registry.free(request)
        lost, state.computed = state.computed, 0
        self.prompting.discard(request)
        state.status = WAITING
        state.preemptions += 1
        self.waiting.appendleft(request)
        self.stats.preemptions += 1
        self.stats.recomputed_tokens += lost
        self.events.add(ev.RequestPreempted, request, "recompute", (request,), held, lost, 0.0, cached)

    def _reject(self, state: RequestV1, reason: str) -> None:
        state.status, state.rejection = REJECTED, reason
        self.stats.rejected += 1
        self.events.add(ev.RequestRejected, state.request, reason)

    # -- state ------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        st, queues = self.stats, {"waiting": len(self.waiting), "running": len(self.running), "swapped": 0}
        totals = ("finished", "rejected", "preemptions", "recomputed_tokens", "swapped_blocks")
        return queues | {name: getattr(st, name) for name in totals}

    def snapshot(self) -> SchedulerV1Snapshot:
        requests = tuple(s.copy() for s in self.requests.values())
        return SchedulerV1Snapshot(
            requests, tuple(self.waiting), tuple(self.running), replace(self.stats), self.used, self.last_step
        )

    def restore(self, snap: SchedulerV1Snapshot) -> None:
        self.requests = {s.request: s.copy() for s in snap.requests}
        self.waiting, self.running = deque(snap.waiting), list(snap.running)
        self._running_states = [self.requests[r] for r in self.running]
        self._running_seqs = self.registry.sequences_of(self.running)  # (the engine restored these first)
        self.prompting = {r for r in self.running if self.requests[r].to_compute > 1}
        self.stats, self.used, self.last_step = replace(snap.stats), snap.used, snap.last_step
