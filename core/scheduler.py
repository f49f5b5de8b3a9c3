"""A serving engine's scheduler: waiting, running and swapped queues (first come, first
served), admission by free blocks with a watermark, and preemption when a decode step
cannot get a block — by recompute (free the blocks, requeue at the front) or by swap
(move the blocks to a CPU pool and back). A forked group (parallel samples, beams) is
admitted, preempted and resumed together. Modelled on vLLM v0's scheduler.
"""

from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass, field, replace
from enum import StrEnum

from pagesim.core import events as ev
from pagesim.core.block_manager import BlockManager, distinct_blocks
from pagesim.core.config import CacheConfig
from pagesim.core.errors import DuplicateSequenceError, InvalidOperationError
from pagesim.core.events import EventLog
from pagesim.core.operations import Schedule, Submit
from pagesim.core.registry import SequenceRegistry
from pagesim.core.sequence import Sequence
from pagesim.core.token_model import TokenModel, check_vocab


class RequestStatus(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"


class AllocStatus(StrEnum):
    """vLLM v0's AllocStatus: admit now, later (not enough free blocks yet), or never (too big)."""

    OK = "ok"
    LATER = "later"
    NEVER = "never"


WAITING, RUNNING, SWAPPED, FINISHED, REJECTED = RequestStatus
OK, LATER, NEVER = AllocStatus


SHARED_PREFIX_ID = "__shared_prefix__"  # the token stream every request's shared prefix comes from
_COUNTERS = ("preemptions", "recomputed_tokens", "swapped_blocks", "swap_seconds", "finished", "rejected")


@dataclass(slots=True)
class RequestState:
    request: str
    order: int  # submission order: the priority (lower first)
    prompt: tuple[int, ...]
    output_len: int
    n: int = 1
    beam_width: int = 0
    status: RequestStatus = RequestStatus.WAITING
    seqs: list[str] = field(default_factory=list)
    generated: int = 0  # decode steps done (every sequence of the group advances together)
    resume_tokens: dict[str, tuple[int, ...]] | None = None  # after preemption by recompute
    beam_serial: int = 0
    preemptions: int = 0

    @property
    def num_seqs(self) -> int:
        return len(self.resume_tokens) if self.resume_tokens else (self.beam_width or self.n)

    def copy(self) -> RequestState:
        return replace(
            self,
            seqs=list(self.seqs),
            resume_tokens=None if self.resume_tokens is None else dict(self.resume_tokens),
        )


@dataclass(frozen=True)
class SchedulerSnapshot:
    requests: tuple[RequestState, ...]
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    swapped: tuple[str, ...]
    counters: tuple[int, int, int, float, int, int]
    used: bool = False


class Scheduler:
    """Above the block manager: it reads free blocks and what a step needs from the
    :class:`BlockManager`, and changes sequences only through the :class:`SequenceRegistry`
    (below it: the scheduler never calls back into the simulator)."""

    def __init__(
        self, config: CacheConfig, model: TokenModel, blocks: BlockManager, registry: SequenceRegistry, events: EventLog
    ) -> None:
        self.config = config
        self.model = model
        self.blocks = blocks
        self.registry = registry
        self.events = events
        self.used = False  # a Submit or Schedule has run: the queues are worth showing
        self.requests: dict[str, RequestState] = {}
        self.waiting: deque[str] = deque()
        self.running: list[str] = []
        self.swapped: deque[str] = deque()
        self.preemptions = 0
        self.recomputed_tokens = 0
        self.swapped_blocks = 0
        self.swap_seconds = 0.0
        self.finished = 0
        self.rejected = 0
        self._shared_tokens: dict[int, tuple[int, ...]] = {}  # length -> the shared prefix's tokens
        # The running groups' sequences and their names, in running order (None: to be rebuilt).
        # Kept between steps: a step admits or finishes a few groups of a hundred or more.
        self._batch: tuple[list[Sequence], list[str]] | None = None

    # -- operations ---------------------------------------------------------------
    def execute(self, op) -> None:
        self.used = True
        if isinstance(op, Submit):
            self.submit(op)
        elif isinstance(op, Schedule):
            for _ in range(op.steps):
                if not (self.running or self.waiting or self.swapped) or self.stalled():
                    break  # idle or stalled: no later step changes anything (steps may be 2**31)
                self.step()
        else:
            raise InvalidOperationError(f"not a scheduler operation: {op!r}")

    def submit(self, op: Submit) -> None:
        if op.request in self.requests:
            raise DuplicateSequenceError(op.request, "a request of that name was submitted already")
        c = self.config
        # Refused at once, before its prompt is generated: what no state of the pool can run.
        refusal = None
        if op.num_seqs > c.max_num_seqs:
            field = "beam_width" if op.beam_width else "n"
            refusal = f"{field} = {op.num_seqs} sequences, but max_num_seqs is {c.max_num_seqs}"
        elif c.blocks_for(op.length) > c.num_blocks:
            refusal = f"a {op.length}-token prompt needs {c.blocks_for(op.length)} blocks; the pool has {c.num_blocks}"
        if refusal is not None:
            state = RequestState(op.request, len(self.requests), (), op.output_len, op.n, op.beam_width)
            self.requests[op.request] = state
            self.events.add(ev.RequestSubmitted, op.request, op.length, op.output_len, state.num_seqs)
            self._reject(state, refusal)
            return
        if op.prompt is not None:
            prompt = tuple(op.prompt)
            check_vocab(prompt, "prompt")
        else:  # the token model's ids are in the vocabulary by construction
            shared = min(op.shared_prefix, op.prompt_len)
            own = self.model.token_ids(op.request, shared, op.prompt_len - shared)
            prompt = (*self._shared_prefix(shared), *own)
        state = RequestState(op.request, len(self.requests), prompt, op.output_len, op.n, op.beam_width)
        self.requests[op.request] = state
        self.waiting.append(op.request)
        self.events.add(ev.RequestSubmitted, op.request, len(prompt), op.output_len, state.num_seqs)

    def _shared_prefix(self, length: int) -> tuple[int, ...]:
        """The first ``length`` tokens every request's shared prefix comes from (generated once)."""
        tokens = self._shared_tokens.get(length)
        if tokens is None:
            tokens = self._shared_tokens[length] = tuple(self.model.token_ids(SHARED_PREFIX_ID, 0, length))
        return tokens

    def reserving(self, seq_id: str) -> str | None:
        """The waiting request that will run a sequence named ``seq_id`` when admitted, if any."""
        for request in self.waiting:
            if seq_id in self._planned_names(self.requests[request]):
                return request
        return None

    def stalled(self) -> str | None:
        """Why the unfinished requests can never make progress, or None. With nothing
        running, scheduling alone frees no block: if the next step could neither swap the
        oldest swapped group in nor admit (or reject) the head of the queue, no later step
        can (the blocks are held by the user's own sequences, or the watermark keeps them)."""
        if self.running or not (self.waiting or self.swapped):
            return None
        free, total = self.blocks.num_free, self.config.num_blocks
        if self.swapped:
            state = self.requests[self.swapped[0]]
            need = len(distinct_blocks(self.registry.swapped_sequence(s) for s in state.seqs))
            if need <= free:
                return None
            return f"swapped-out request {state.request} needs {need} blocks to come back; {free} of {total} are free"
        state = self.requests[self.waiting[0]]
        if any(self.registry.is_taken(name) for name in self._planned_names(state)):
            return None  # the next step rejects it
        if self.alloc_status(state) != AllocStatus.LATER:
            return None
        return (
            f"waiting request {state.request} needs {self.admission_blocks(state)} blocks; {free} of {total} are free "
            f"with {self.watermark_blocks} kept as the watermark, and nothing running will free more"
        )

    @staticmethod
    def _planned_names(state: RequestState) -> list[str]:
        if state.resume_tokens:
            return list(state.resume_tokens)
        fan = state.beam_width or state.n
        tag = "b" if state.beam_width else "s"
        return [state.request] if fan == 1 else [f"{state.request}/{tag}{i}" for i in range(fan)]

    # -- admission -----------------------------------------------------------------
    @property
    def watermark_blocks(self) -> int:
        return int(self.config.watermark * self.config.num_blocks)

    def admission_blocks(self, state: RequestState) -> int:
        blocks_for = self.config.blocks_for
        if state.resume_tokens:
            return sum(blocks_for(len(tokens)) for tokens in state.resume_tokens.values())
        return blocks_for(len(state.prompt))  # samples and beams fork: they share the prompt

    def alloc_status(self, state: RequestState) -> AllocStatus:
        needed = self.admission_blocks(state)
        if needed > self.config.num_blocks - self.watermark_blocks:
            return AllocStatus.NEVER
        if self.blocks.num_free - needed < self.watermark_blocks:
            return AllocStatus.LATER
        return AllocStatus.OK

    def _admit(self, state: RequestState) -> None:
        registry = self.registry
        resumed = state.resume_tokens is not None
        if resumed:
            for seq_id, tokens in state.resume_tokens.items():
                registry.add(seq_id, list(tokens), owner=state.request, vocab_checked=True)
            state.seqs = list(state.resume_tokens)
            state.resume_tokens = None
        else:
            state.seqs = self._planned_names(state)
            state.beam_serial = len(state.seqs)
            registry.add(state.seqs[0], list(state.prompt), owner=state.request, vocab_checked=True)
            for seq_id in state.seqs[1:]:
                registry.fork(state.seqs[0], seq_id, owner=state.request)
        state.status = RequestStatus.RUNNING
        self.running.append(state.request)
        if self._batch is not None:
            self._batch[0].extend(registry.sequences_of(state.seqs))
            self._batch[1].extend(state.seqs)
        self.events.add(ev.RequestAdmitted, state.request, tuple(state.seqs), resumed)

    # -- preemption ------------------------------------------------------------------
    def _swap_time(self, blocks: int) -> float:
        return blocks * self.config.block_bytes / (self.config.swap_bandwidth_gbs * 1e9)

    def _group(self, state: RequestState) -> list[Sequence]:
        return [self.registry.sequence(s) for s in state.seqs]

    def preempt(self, request: str) -> None:
        state = self.requests[request]
        self.running.remove(request)
        self._batch = None
        state.preemptions += 1
        self.preemptions += 1
        group = self._group(state)
        if self.config.preemption == "swap" and self.blocks.can_swap_out(group):
            blocks = self.registry.swap_out(state.seqs)
            seconds = self._swap_time(blocks)
            self.swapped_blocks += blocks
            self.swap_seconds += seconds
            state.status = RequestStatus.SWAPPED
            self.swapped.append(request)
            self.swapped = deque(sorted(self.swapped, key=lambda r: self.requests[r].order))
            self.events.add(ev.RequestPreempted, request, "swap", tuple(state.seqs), blocks, 0, seconds)
            return
        # Recompute: every token goes, and comes back through a new prefill.
        tokens = {seq.seq_id: tuple(seq.token_ids) for seq in group}
        blocks = len(distinct_blocks(group))
        for seq_id in state.seqs:
            self.registry.free(seq_id)
        state.resume_tokens = tokens
        state.status = RequestStatus.WAITING
        self.waiting.appendleft(request)  # at the front: no starvation of the preempted
        lost = sum(len(t) for t in tokens.values())
        self.recomputed_tokens += lost
        self.events.add(ev.RequestPreempted, request, "recompute", tuple(state.seqs), blocks, lost, 0.0)

    # -- one iteration -----------------------------------------------------------------
    def _decode_sequences(self, requests: list[str]) -> list[Sequence]:
        states = self.requests
        return self.registry.sequences_of([seq_id for request in requests for seq_id in states[request].seqs])

    def _running_batch(self) -> tuple[list[Sequence], list[str]]:
        if self._batch is None:
            seqs = self._decode_sequences(self.running)
            self._batch = (seqs, [q.seq_id for q in seqs])
        return self._batch

    def step(self) -> None:
        try:
            self._step()
        except BaseException:
            self._batch = None  # a step that failed part way: rebuild from the queues
            raise

    def _step(self) -> None:
        registry, blocks, events = self.registry, self.blocks, self.events
        # 1. Swapped groups come back first, oldest first, while the watermark allows.
        while self.swapped:
            state = self.requests[self.swapped[0]]
            need = len(distinct_blocks(registry.swapped_sequence(s) for s in state.seqs))
            # Room for the group and its next token, or it would be swapped straight out again
            # (alone, it comes back anyway: there is nobody to make room for).
            # The watermark keeps room for the running ones to decode; with none, it is moot.
            headroom = len(state.seqs) if self.running else 0
            floor = self.watermark_blocks if self.running else 0
            if blocks.num_free - need - headroom < floor:
                break
            self.swapped.popleft()
            registry.swap_in(state.seqs)
            seconds = self._swap_time(need)
            self.swap_seconds += seconds
            state.status = RequestStatus.RUNNING
            self.running.append(state.request)
            self.running.sort(key=lambda r: self.requests[r].order)
            self._batch = None
            events.add(ev.RequestSwappedIn, state.request, need, seconds)
        # 2. Admit waiting requests in order; a LATER at the head blocks the queue (FCFS).
        decoding = list(self.running)
        # (admission cannot change these: a new request never takes a live sequence's name)
        decode_seqs, decode_ids = (list(batch) for batch in self._running_batch())
        running_seqs = len(decode_seqs)
        while self.waiting and not self.swapped:
            state = self.requests[self.waiting[0]]
            if running_seqs + state.num_seqs > self.config.max_num_seqs:
                break
            status = self.alloc_status(state)
            if status == AllocStatus.LATER:
                break
            self.waiting.popleft()
            if any(registry.is_taken(name) for name in self._planned_names(state)):
                self._reject(state, "a sequence of that name already exists")
                continue
            if status == AllocStatus.NEVER:
                reason = (
                    f"needs {self.admission_blocks(state)} blocks; the pool has {self.config.num_blocks} "
                    f"with {self.watermark_blocks} kept free"
                )
                self._reject(state, reason)
                continue
            self._admit(state)
            running_seqs += len(state.seqs)
        # 3. Decode one token for every sequence that was running, preempting from the back.
        while decoding and not blocks.decode_fits(decode_seqs):
            if self.running == decoding[:1] and len(decoding) == 1:
                # Alone and still short: preempting it would only bring it back to this point.
                self._abort(decoding.pop(), "grew past what the pool can hold")
                break
            victim = max(self.running, key=lambda r: self.requests[r].order)
            self.preempt(victim)
            if victim in decoding:
                decoding.remove(victim)
            decode_seqs = self._decode_sequences(decoding)
            decode_ids = [q.seq_id for q in decode_seqs]
        if decoding:
            registry.decode(decode_seqs, decode_ids, checked=True)
        states = self.requests
        done: set[str] = set()
        for request in decoding:
            state = states[request]
            state.generated += 1
            if state.beam_width > 1:
                self._prune_beams(state)
            if state.generated >= state.output_len:
                for seq_id in state.seqs:
                    registry.free(seq_id)
                done.update(state.seqs)
                state.status = RequestStatus.FINISHED
                state.seqs = []
                self.running.remove(request)
                self.finished += 1
                events.add(ev.RequestFinished, request, state.generated)
        if done and self._batch is not None:
            seqs, ids = self._batch
            self._batch = ([q for q in seqs if q.seq_id not in done], [i for i in ids if i not in done])

    def _reject(self, state: RequestState, reason: str) -> None:
        state.status = RequestStatus.REJECTED
        self.rejected += 1
        self.events.add(ev.RequestRejected, state.request, reason)

    def _abort(self, request: str, reason: str) -> None:
        state = self.requests[request]
        for seq_id in state.seqs:
            self.registry.free(seq_id)
        state.seqs = []
        self.running.remove(request)
        self._batch = None
        self._reject(state, f"{reason} ({self.config.num_blocks} blocks)")

    def _prune_beams(self, state: RequestState) -> None:
        """Beam search's shape: the weakest beam is dropped, the strongest forked in its
        place (scores are a stable hash of each beam's tokens)."""

        def score(seq_id: str) -> int:
            return zlib.crc32(repr(list(self.registry.sequence(seq_id).token_ids[-4:])).encode())

        ranked = sorted(state.seqs, key=score)
        worst, best = ranked[0], ranked[-1]
        self._batch = None
        self.registry.free(worst)
        state.seqs.remove(worst)
        child = f"{state.request}/b{state.beam_serial}"
        while self.registry.is_taken(child):  # a user took the name
            state.beam_serial += 1
            child = f"{state.request}/b{state.beam_serial}"
        state.beam_serial += 1
        self.registry.fork(best, child, owner=state.request)
        state.seqs.append(child)

    # -- state ------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        return {
            "waiting": len(self.waiting),
            "running": len(self.running),
            "swapped": len(self.swapped),
            "finished": self.finished,
            "rejected": self.rejected,
            "preemptions": self.preemptions,
            "recomputed_tokens": self.recomputed_tokens,
            "swapped_blocks": self.swapped_blocks,
        }

    def snapshot(self) -> SchedulerSnapshot:
        return SchedulerSnapshot(
            tuple(s.copy() for s in self.requests.values()),
            tuple(self.waiting),
            tuple(self.running),
            tuple(self.swapped),
            tuple(getattr(self, name) for name in _COUNTERS),
            self.used,
        )

    def restore(self, snap: SchedulerSnapshot) -> None:
        self.requests = {s.request: s.copy() for s in snap.requests}
        self.waiting, self.running, self.swapped = deque(snap.waiting), list(snap.running), deque(snap.swapped)
        self._batch = None
        for name, value in zip(_COUNTERS, snap.counters, strict=True):
            setattr(self, name, value)
        self.used = snap.used
