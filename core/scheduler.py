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

from core import events as ev
from core.errors import DuplicateSequenceError, InvalidOperationError
from core.operations import Add, Fork, Free, Schedule, Submit

WAITING, RUNNING, SWAPPED, FINISHED, REJECTED = "waiting", "running", "swapped", "finished", "rejected"
# vLLM v0's AllocStatus: admit now, later (not enough free blocks yet), or never (too big).
OK, LATER, NEVER = "ok", "later", "never"
SHARED_PREFIX_ID = "__shared_prefix__"  # the token stream every request's shared prefix comes from
_COUNTERS = ("preemptions", "recomputed_tokens", "swapped_blocks", "swap_seconds", "finished", "rejected")


@dataclass
class RequestState:
    request: str
    order: int  # submission order: the priority (lower first)
    prompt: tuple[int, ...]
    output_len: int
    n: int = 1
    beam_width: int = 0
    status: str = WAITING
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


class Scheduler:
    def __init__(self, sim) -> None:
        self.sim = sim
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

    # -- operations ---------------------------------------------------------------
    def execute(self, op, events: list) -> None:
        if isinstance(op, Submit):
            self.submit(op, events)
        elif isinstance(op, Schedule):
            for _ in range(op.steps):
                self.step(events)
        else:
            raise InvalidOperationError(f"not a scheduler operation: {op!r}")

    def submit(self, op: Submit, events: list) -> None:
        if op.request in self.requests:
            raise DuplicateSequenceError(op.request)
        model = self.sim.model
        if op.prompt is not None:
            prompt = op.prompt
        else:
            shared = min(op.shared_prefix, op.prompt_len)
            prompt = (
                *model.token_ids(SHARED_PREFIX_ID, 0, shared),
                *model.token_ids(op.request, shared, op.prompt_len - shared),
            )
        self.sim._check_vocab(prompt, "prompt")
        state = RequestState(op.request, len(self.requests), tuple(prompt), op.output_len, op.n, op.beam_width)
        self.requests[op.request] = state
        self.waiting.append(op.request)
        events.append(ev.RequestSubmitted(op.request, len(prompt), op.output_len, state.num_seqs))

    @staticmethod
    def _planned_names(state: RequestState) -> list[str]:
        if state.resume_tokens:
            return list(state.resume_tokens)
        fan = state.beam_width or state.n
        tag = "b" if state.beam_width else "s"
        return [state.request] if fan == 1 else [f"{state.request}/{tag}{i}" for i in range(fan)]

    def owner_of(self, seq_id: str) -> str | None:
        """The request a live or swapped sequence belongs to, if the scheduler runs it."""
        request = seq_id.split("/", 1)[0]
        state = self.requests.get(request)
        if state is not None and seq_id in state.seqs and state.status in (RUNNING, SWAPPED):
            return request
        return None

    # -- admission -----------------------------------------------------------------
    @property
    def watermark_blocks(self) -> int:
        return int(self.sim.config.watermark * self.sim.config.num_blocks)

    def admission_blocks(self, state: RequestState) -> int:
        blocks_for = self.sim.config.blocks_for
        if state.resume_tokens:
            return sum(blocks_for(len(tokens)) for tokens in state.resume_tokens.values())
        return blocks_for(len(state.prompt))  # samples and beams fork: they share the prompt

    def alloc_status(self, state: RequestState) -> str:
        needed = self.admission_blocks(state)
        if needed > self.sim.config.num_blocks - self.watermark_blocks:
            return NEVER
        if self.sim.pool.num_free - needed < self.watermark_blocks:
            return LATER
        return OK

    def _admit(self, state: RequestState, events: list) -> None:
        execute = self.sim.execute_direct
        resumed = state.resume_tokens is not None
        if resumed:
            for seq_id, tokens in state.resume_tokens.items():
                execute(Add(seq_id, prompt=tokens), events)
            state.seqs = list(state.resume_tokens)
            state.resume_tokens = None
        else:
            state.seqs = self._planned_names(state)
            state.beam_serial = len(state.seqs)
            execute(Add(state.seqs[0], prompt=state.prompt), events)
            for seq_id in state.seqs[1:]:
                execute(Fork(state.seqs[0], seq_id), events)
        state.status = RUNNING
        self.running.append(state.request)
        events.append(ev.RequestAdmitted(state.request, tuple(state.seqs), resumed))

    # -- preemption ------------------------------------------------------------------
    def _swap_time(self, blocks: int) -> float:
        return blocks * self.sim.config.block_bytes / (self.sim.config.swap_bandwidth_gbs * 1e9)

    def preempt(self, request: str, events: list) -> None:
        state = self.requests[request]
        self.running.remove(request)
        state.preemptions += 1
        self.preemptions += 1
        sim = self.sim
        cpu_free = sim.config.num_cpu_blocks if sim.cpu_pool is None else sim.cpu_pool.num_free
        if sim.config.preemption == "swap" and sim.swap_out_blocks(state.seqs) <= cpu_free:
            blocks = sim.swap_out(state.seqs, events)
            seconds = self._swap_time(blocks)
            self.swapped_blocks += blocks
            self.swap_seconds += seconds
            state.status = SWAPPED
            self.swapped.append(request)
            self.swapped = deque(sorted(self.swapped, key=lambda r: self.requests[r].order))
            events.append(ev.RequestPreempted(request, "swap", tuple(state.seqs), blocks, 0, seconds))
            return
        # Recompute: every token goes, and comes back through a new prefill.
        tokens = {s: tuple(sim.sequence(s).token_ids) for s in state.seqs}
        blocks = len(sim._distinct_blocks(sim.sequence(s).block_table for s in state.seqs))
        for seq_id in state.seqs:
            sim.execute_direct(Free(seq_id), events)
        state.resume_tokens = tokens
        state.status = WAITING
        self.waiting.appendleft(request)  # at the front: no starvation of the preempted
        lost = sum(len(t) for t in tokens.values())
        self.recomputed_tokens += lost
        events.append(ev.RequestPreempted(request, "recompute", tuple(state.seqs), blocks, lost, 0.0))

    # -- one iteration -----------------------------------------------------------------
    def _decode_seq_ids(self, requests: list[str]) -> list[str]:
        return [seq_id for request in requests for seq_id in self.requests[request].seqs]

    def step(self, events: list) -> None:
        sim = self.sim
        # 1. Swapped groups come back first, oldest first, while the watermark allows.
        while self.swapped:
            state = self.requests[self.swapped[0]]
            blocks = sim.swap_in_blocks(state.seqs)
            # Room for the group and its next token, or it would be swapped straight out again
            # (alone, it comes back anyway: there is nobody to make room for).
            headroom = len(state.seqs) if self.running else 0
            if sim.pool.num_free - blocks - headroom < self.watermark_blocks:
                break
            self.swapped.popleft()
            sim.swap_in(state.seqs, events)
            seconds = self._swap_time(blocks)
            self.swap_seconds += seconds
            state.status = RUNNING
            self.running.append(state.request)
            self.running.sort(key=lambda r: self.requests[r].order)
            events.append(ev.RequestSwappedIn(state.request, blocks, seconds))
        # 2. Admit waiting requests in order; a LATER at the head blocks the queue (FCFS).
        decoding = list(self.running)
        decode_ids = self._decode_seq_ids(decoding)
        running_seqs = len(decode_ids)
        while self.waiting and not self.swapped:
            state = self.requests[self.waiting[0]]
            if running_seqs + state.num_seqs > sim.config.max_num_seqs:
                break
            status = self.alloc_status(state)
            if status == LATER:
                break
            self.waiting.popleft()
            if any(name in sim.sequences or name in sim.swapped for name in self._planned_names(state)):
                state.status = REJECTED
                self.rejected += 1
                events.append(ev.RequestRejected(state.request, "a sequence of that name already exists"))
                continue
            if status == NEVER:
                state.status = REJECTED
                self.rejected += 1
                reason = (
                    f"needs {self.admission_blocks(state)} blocks; the pool has {sim.config.num_blocks} "
                    f"with {self.watermark_blocks} kept free"
                )
                events.append(ev.RequestRejected(state.request, reason))
                continue
            self._admit(state, events)
            running_seqs += len(state.seqs)
        # 3. Decode one token for every sequence that was running, preempting from the back.
        sequences = sim.sequences
        decode_seqs = [sequences[s] for s in decode_ids]
        while decoding and sim.decode_blocks_needed(decode_seqs) > sim.pool.num_free:
            if self.running == decoding[:1] and len(decoding) == 1:
                # Alone and still short: preempting it would only bring it back to this point.
                self._abort(decoding.pop(), "grew past what the pool can hold", events)
                break
            victim = max(self.running, key=lambda r: self.requests[r].order)
            self.preempt(victim, events)
            if victim in decoding:
                decoding.remove(victim)
            decode_ids = self._decode_seq_ids(decoding)
            decode_seqs = [sequences[s] for s in decode_ids]
        if decoding:
            sim.decode(decode_ids, events, checked=True)
        for request in decoding:
            state = self.requests[request]
            state.generated += 1
            if state.beam_width > 1:
                self._prune_beams(state, events)
            if state.generated >= state.output_len:
                for seq_id in state.seqs:
                    sim.execute_direct(Free(seq_id), events)
                state.status = FINISHED
                state.seqs = []
                self.running.remove(request)
                self.finished += 1
                events.append(ev.RequestFinished(request, state.generated))

    def _abort(self, request: str, reason: str, events: list) -> None:
        state = self.requests[request]
        for seq_id in state.seqs:
            self.sim.execute_direct(Free(seq_id), events)
        state.seqs = []
        state.status = REJECTED
        self.running.remove(request)
        self.rejected += 1
        events.append(ev.RequestRejected(request, f"{reason} ({self.sim.config.num_blocks} blocks)"))

    def _prune_beams(self, state: RequestState, events: list) -> None:
        """Beam search's shape: the weakest beam is dropped, the strongest forked in its
        place (scores are a stable hash of each beam's tokens)."""

        def score(seq_id: str) -> int:
            return zlib.crc32(repr(self.sim.sequences[seq_id].token_ids[-4:]).encode())

        ranked = sorted(state.seqs, key=score)
        worst, best = ranked[0], ranked[-1]
        self.sim.execute_direct(Free(worst), events)
        state.seqs.remove(worst)
        child = f"{state.request}/b{state.beam_serial}"
        while child in self.sim.sequences or child in self.sim.swapped:  # a user took the name
            state.beam_serial += 1
            child = f"{state.request}/b{state.beam_serial}"
        state.beam_serial += 1
        self.sim.execute_direct(Fork(best, child), events)
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
        )

    def restore(self, snap: SchedulerSnapshot) -> None:
        self.requests = {s.request: s.copy() for s in snap.requests}
        self.waiting, self.running, self.swapped = deque(snap.waiting), list(snap.running), deque(snap.swapped)
        for name, value in zip(_COUNTERS, snap.counters, strict=True):
            setattr(self, name, value)
