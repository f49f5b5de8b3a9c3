"""A serving engine's scheduler: waiting, running and swapped queues (first come, first
served), admission by free blocks with a watermark, and preemption when a decode step
cannot get a block — by recompute (free the blocks, requeue at the front) or by swap
(move the blocks to a CPU pool and back). A forked group (parallel samples, beams) is
admitted, preempted and resumed together. Modelled on vLLM v0's scheduler.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from pagesim.core import events as ev
from pagesim.core.beam_search import finish_beams, select_beams
from pagesim.core.block_manager import BlockManager, distinct_blocks
from pagesim.core.config import CacheConfig
from pagesim.core.errors import DuplicateSequenceError, InvalidOperationError
from pagesim.core.events import EventLog
from pagesim.core.language_model import LanguageModel, request_past_window
from pagesim.core.operations import CHILD_SEPARATOR, Schedule, Submit
from pagesim.core.registry import SequenceRegistry
from pagesim.core.sampling import SamplingParams
from pagesim.core.sequence import Sequence


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
    sampling: SamplingParams | None = None  # how a real model picks the tokens (sample i: index i)
    resume_sampling: dict[str, SamplingParams | None] | None = None  # each resumed sequence's
    # A real model's finished sequences: their generated tokens (a sample that generated the
    # end-of-sequence token finishes before the others).
    outputs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Beam search on a real model (core.beam_search): each beam's cumulative log-probability,
    # the tokens chosen for the next decode, and the finished hypotheses, best first.
    beam_scores: dict[str, float] = field(default_factory=dict)
    next_tokens: dict[str, int] | None = None
    hypotheses: list = field(default_factory=list)
    rejection: str | None = None  # why it was refused, once it is (at submission, or aborted)

    @property
    def num_seqs(self) -> int:
        return len(self.resume_tokens) if self.resume_tokens else (self.beam_width or self.n)

    def copy(self) -> RequestState:
        return replace(
            self,
            seqs=list(self.seqs),
            resume_tokens=None if self.resume_tokens is None else dict(self.resume_tokens),
            resume_sampling=None if self.resume_sampling is None else dict(self.resume_sampling),
            outputs=dict(self.outputs),
            beam_scores=dict(self.beam_scores),
            next_tokens=None if self.next_tokens is None else dict(self.next_tokens),
            hypotheses=list(self.hypotheses),
        )

    def planned_names(self) -> list[str]:
        """The sequences it runs when admitted: ``r``, or ``r/s0`` … (samples), ``r/b0`` … (beams)."""
        if self.resume_tokens:
            return list(self.resume_tokens)
        fan = self.beam_width or self.n
        tag = "b" if self.beam_width else "s"
        return [self.request] if fan == 1 else [f"{self.request}/{tag}{i}" for i in range(fan)]

    def admission_blocks(self, blocks_for) -> int:
        """Blocks its admission takes (``blocks_for``: the config's tokens -> blocks)."""
        if self.resume_tokens:
            return resume_blocks(self.resume_tokens, blocks_for)
        return blocks_for(len(self.prompt))  # samples and beams fork: they share the prompt


def shared_prefix_len(token_lists) -> int:
    """How many leading tokens every one of ``token_lists`` (tuples) has in common: the
    lexicographically first and last share exactly the prefix all of them share."""
    lists = list(token_lists)
    if len(lists) == 1:  # (a single sequence: every recompute of one)
        return len(lists[0])
    first, last = min(lists), max(lists)
    for i, (a, b) in enumerate(zip(first, last, strict=False)):
        if a != b:
            return i
    return len(first)  # the first is a prefix of the last


def resume_blocks(tokens: dict[str, tuple[int, ...]], blocks_for) -> int:
    """Blocks a group recomputed as :func:`resume_group` does takes: the shared tokens'
    blocks once, then each sequence's own tail (a tail that starts in the shared last block
    writes a copy of it, but the last writer, who holds it alone by then)."""
    lengths = [len(t) for t in tokens.values()]
    shared = shared_prefix_len(tokens.values())
    tails = [n for n in lengths if n > shared]
    partial = blocks_for(shared + 1) == blocks_for(shared)  # the shared last block has room
    copies = len(tails) - (len(tails) == len(lengths)) if partial and tails else 0
    return blocks_for(shared) + sum(blocks_for(n) - blocks_for(shared) for n in tails) + copies


@dataclass
class SchedulerStats:
    """Running totals of what scheduling did."""

    preemptions: int = 0
    recomputed_tokens: int = 0
    swapped_blocks: int = 0
    swap_seconds: float = 0.0  # simulated transfer time of every swap
    finished: int = 0
    rejected: int = 0


@dataclass(frozen=True)
class SchedulerSnapshot:
    requests: tuple[RequestState, ...]
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    swapped: tuple[str, ...]
    stats: SchedulerStats
    used: bool = False


def refusal_at_submit(op: Submit, config: CacheConfig) -> str | None:
    """Why a request is refused at once, before its prompt is generated: what no state of the pool can run."""
    if op.num_seqs > config.max_num_seqs:
        field = "beam_width" if op.beam_width else "n"
        return f"{field} = {op.num_seqs} sequences, but max_num_seqs is {config.max_num_seqs}"
    if (need := config.blocks_for(op.length)) > config.num_blocks:
        return f"a {op.length}-token prompt needs {need} blocks; the pool has {config.num_blocks}"
    return None


class PromptSource:
    """Submitted requests' prompts: given (checked against the vocabulary), or generated by
    the token model after a shared prefix that is generated once per length."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self._shared: dict[int, tuple[int, ...]] = {}  # length -> the shared prefix's tokens

    def prompt_of(self, op: Submit) -> tuple[int, ...]:
        if op.prompt is not None:
            prompt = tuple(op.prompt)
            self.model.check_vocab(prompt, "prompt")
            return prompt
        # the token model's ids are in the vocabulary by construction
        shared = min(op.shared_prefix, op.prompt_len)
        if (prefix := self._shared.get(shared)) is None:
            prefix = self._shared[shared] = tuple(self.model.token_ids(SHARED_PREFIX_ID, 0, shared))
        return (*prefix, *self.model.token_ids(op.request, shared, op.prompt_len - shared))


def prune_beams(state: RequestState, registry: SequenceRegistry) -> None:
    """Beam search's shape: the weakest beam is dropped, the strongest forked in its place
    (scores are a stable hash of each beam's tokens)."""

    def score(seq_id: str) -> int:
        return zlib.crc32(repr(list(registry.sequence(seq_id).token_ids[-4:])).encode())

    ranked = sorted(state.seqs, key=score)
    worst, best = ranked[0], ranked[-1]
    registry.free(worst)
    state.seqs.remove(worst)
    child = f"{state.request}/b{state.beam_serial}"
    while registry.is_taken(child):  # a user took the name
        state.beam_serial += 1
        child = f"{state.request}/b{state.beam_serial}"
    state.beam_serial += 1
    registry.fork(best, child, owner=state.request)
    state.seqs.append(child)


def start_sequences(state: RequestState, registry: SequenceRegistry) -> None:
    """An admitted request's sequences: its prompt, then the samples or beams forked from it
    (sample i draws as sequence index i), or, after preemption by recompute, each sequence
    again from its tokens."""
    prompt_len = len(state.prompt)
    if state.resume_tokens is not None:
        resume_group(state, registry)
        return
    state.seqs = state.planned_names()
    state.beam_serial = len(state.seqs)
    params = None if state.sampling is None else state.sampling.for_index(0)
    registry.add(state.seqs[0], list(state.prompt), None, state.request, True, params, prompt_len)
    for index, seq_id in enumerate(state.seqs[1:], start=1):
        registry.fork(state.seqs[0], seq_id, owner=state.request, index=index)


def resume_group(state: RequestState, registry: SequenceRegistry) -> None:
    """A group preempted by recompute comes back as it ran: the tokens its sequences share
    (the prompt, at least) prefilled once, the others forked from it, then each sequence's
    own tokens prefilled into its own blocks — never the prompt once per sample."""
    tokens, sampling = state.resume_tokens or {}, state.resume_sampling or {}
    names = list(tokens)
    shared = shared_prefix_len(tokens.values())
    first = names[0]
    registry.add(first, list(tokens[first][:shared]), None, state.request, True, sampling.get(first), len(state.prompt))
    for seq_id in names[1:]:
        registry.fork(first, seq_id, owner=state.request)
        registry.sequence(seq_id).sampling = sampling.get(seq_id)
    tails = [(seq_id, list(tokens[seq_id][shared:])) for seq_id in names if len(tokens[seq_id]) > shared]
    if tails:
        registry.append(registry.sequences_of([seq_id for seq_id, _ in tails]), [tail for _, tail in tails])
    state.seqs = names
    state.resume_tokens = state.resume_sampling = None


def preemption_mode(state: RequestState, config: CacheConfig, blocks: BlockManager, group: list[Sequence]) -> str:
    """vLLM v0's rule: a single-sequence group is preempted as configured; a forked group
    (samples, beams) is swapped — v0 recomputes only single-sequence groups — when there is
    a CPU pool with room, and otherwise recomputed as :func:`resume_group` brings it back."""
    wants_swap = config.preemption == "swap" or len(state.seqs) > 1
    return "swap" if wants_swap and config.num_cpu_blocks and blocks.can_swap_out(group) else "recompute"


def drop_for_recompute(state: RequestState, registry: SequenceRegistry, group: list[Sequence]) -> tuple[int, int, int]:
    """Preemption by recompute: the group's tokens kept, its blocks freed. Returns the blocks
    freed, the tokens to compute again (the shared ones once) and how many of the blocks stay
    in the prefix cache."""
    tokens = {seq.seq_id: tuple(seq.token_ids) for seq in group}
    state.resume_sampling = {seq.seq_id: seq.sampling for seq in group if seq.sampling is not None} or None
    held = distinct_blocks(group)
    blocks, cached = len(held), sum(map(registry.blocks.pool.is_cached, held))
    for seq_id in state.seqs:
        registry.free(seq_id)
    state.resume_tokens = tokens
    shared = shared_prefix_len(tokens.values())
    return blocks, shared + sum(len(t) - shared for t in tokens.values()), cached


def keep_output(state: RequestState, registry: SequenceRegistry, seq_id: str, eos_id: int | None) -> None:
    """A finished sequence's generated tokens, kept with its request: a real model's text
    (``eos_id`` None: the synthetic model, whose ids are a hash, keeps none)."""
    if eos_id is not None:
        state.outputs[seq_id] = tuple(registry.sequence(seq_id).token_ids[len(state.prompt) :])


def with_names(seqs: list[Sequence]) -> tuple[list[Sequence], list[str]]:
    return seqs, [q.seq_id for q in seqs]


def drop_from_batch(batch: tuple[list[Sequence], list[str]], names: set[str]) -> None:
    """The finished sequences ``names`` leave the running batch (sequences, their names), in
    place: a few a step, each found by a scan in C rather than the batch rebuilt in Python."""
    seqs, ids = batch
    for name in names:
        index = ids.index(name)
        del seqs[index], ids[index]


def plan_beams(states: dict[str, RequestState], decoding: list[str], registry: SequenceRegistry, events) -> bool:
    """Each decoding beam search on a real model picks its next beams from their logits
    (:func:`~pagesim.core.beam_search.select_beams`) before the decode writes their tokens;
    a search that has just been preempted keeps the beams it picked. True if any did."""
    model = registry.runner.model
    planned = False
    for request in decoding:
        state = states[request]
        if state.beam_width > 1 and state.next_tokens is None:
            select_beams(state, registry, model.logits, model.eos_id, events)
            planned = True
    return planned


def chosen_tokens(states: dict[str, RequestState], decoding: list[str]) -> dict[str, int] | None:
    """The tokens beam search picked for this decode, by sequence (None: none did)."""
    picked = [states[r].next_tokens for r in decoding if states[r].next_tokens]
    return {seq_id: token for tokens in picked for seq_id, token in tokens.items()} if picked else None


def close_request(state: RequestState, registry: SequenceRegistry, eos_id: int | None) -> None:
    """A finished request's sequences freed, their outputs kept (a beam search's: its best
    hypotheses)."""
    if state.beam_width > 1 and eos_id is not None:
        if state.seqs:
            finish_beams(state, registry, eos_id)
        return
    for seq_id in state.seqs:
        keep_output(state, registry, seq_id, eos_id)
        registry.free(seq_id)


def finish_at_eos(state: RequestState, registry: SequenceRegistry, eos_id: int) -> bool:
    """A sample that generated the end-of-sequence token (and stops there) finishes: its
    blocks are freed, the others go on (vLLM frees a finished sequence of a group). True
    if one did."""
    finished = False
    for seq_id in list(state.seqs):
        seq = registry.sequence(seq_id)
        if seq.token_ids[-1] == eos_id and (seq.sampling is None or seq.sampling.stop_at_eos):
            keep_output(state, registry, seq_id, eos_id)
            registry.free(seq_id)
            state.seqs.remove(seq_id)
            finished = True
    return finished


class Scheduler:
    """Above the block manager: it reads free blocks and what a step needs from the
    :class:`BlockManager`, and changes sequences only through the :class:`SequenceRegistry`
    (below it: the scheduler never calls back into the simulator)."""

    def __init__(
        self,
        config: CacheConfig,
        model: LanguageModel,
        blocks: BlockManager,
        registry: SequenceRegistry,
        events: EventLog,
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
        self.stats = SchedulerStats()
        self.after_step: Callable[[], None] | None = None  # called after each step of a schedule
        self.prompts = PromptSource(model)
        self.eos_id = model.eos_id if model.samples_from_logits else None  # None: no early finish
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
                if self.after_step is not None:
                    self.after_step()
        else:
            raise InvalidOperationError(f"not a scheduler operation: {op!r}")

    def refusal(self, op: Submit) -> str | None:
        """Why ``op`` would be rejected as soon as it is submitted, or None."""
        return request_past_window(self.model, op.length, op.output_len) or refusal_at_submit(op, self.config)

    def submit(self, op: Submit) -> None:
        if op.request in self.requests:
            raise DuplicateSequenceError(op.request, "a request of that name was submitted already")
        refusal = self.refusal(op)
        prompt = () if refusal else self.prompts.prompt_of(op)  # (checked before any state changes)
        state = RequestState(op.request, len(self.requests), prompt, op.output_len, op.n, op.beam_width)
        state.sampling = op.sampling
        self.requests[op.request] = state
        length = op.length if refusal else len(prompt)
        self.events.add(ev.RequestSubmitted, op.request, length, op.output_len, state.num_seqs)
        if refusal:
            self._reject(state, refusal)
        else:
            self.waiting.append(op.request)

    def reserving(self, seq_id: str) -> str | None:
        """The waiting request that will run a sequence named ``seq_id`` when admitted, if any."""
        for request in self.waiting:
            if seq_id in self.requests[request].planned_names():
                return request
        return None

    def ended(self, seq_id: str) -> tuple[str, str] | None:
        """(the request, "finished" or "rejected") that a sequence named ``seq_id`` ran for, once
        it has ended, or None."""
        for name, state in self.requests.items():
            ran = seq_id == name or seq_id.startswith(name + CHILD_SEPARATOR)
            if ran and state.status in (RequestStatus.FINISHED, RequestStatus.REJECTED):
                return name, str(state.status)
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
        if any(self.registry.is_taken(name) for name in state.planned_names()):
            return None  # the next step rejects it
        if self.alloc_status(state) != AllocStatus.LATER:
            return None
        return (
            f"waiting request {state.request} needs {self.admission_blocks(state)} blocks; {free} of {total} are free "
            f"with {self.watermark_blocks} kept as the watermark, and nothing running will free more"
        )

    # -- admission -----------------------------------------------------------------
    @property
    def watermark_blocks(self) -> int:
        return int(self.config.watermark * self.config.num_blocks)

    def admission_blocks(self, state: RequestState) -> int:
        return state.admission_blocks(self.config.blocks_for)

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
        start_sequences(state, registry)
        state.status = RequestStatus.RUNNING
        self.running.append(state.request)
        if self._batch is not None:
            self._batch[0].extend(registry.sequences_of(state.seqs))
            self._batch[1].extend(state.seqs)
        self.events.add(ev.RequestAdmitted, state.request, tuple(state.seqs), resumed)

    # -- preemption ------------------------------------------------------------------
    def _swap_time(self, blocks: int) -> float:
        """The transfer of ``blocks`` blocks' K/V in every layer of the model (a block id names
        the same slots in each layer's cache)."""
        layers = self.registry.runner.num_layers
        return blocks * layers * self.config.block_bytes / (self.config.swap_bandwidth_gbs * 1e9)

    def _group(self, state: RequestState) -> list[Sequence]:
        return [self.registry.sequence(s) for s in state.seqs]

    def preempt(self, request: str) -> None:
        state = self.requests[request]
        self.running.remove(request)
        self._batch = None
        state.preemptions += 1
        self.stats.preemptions += 1
        group = self._group(state)
        if preemption_mode(state, self.config, self.blocks, group) == "swap":
            blocks = self.registry.swap_out(state.seqs)
            seconds = self._swap_time(blocks)
            self.stats.swapped_blocks += blocks
            self.stats.swap_seconds += seconds
            state.status = RequestStatus.SWAPPED
            self.swapped.append(request)
            self.swapped = deque(sorted(self.swapped, key=lambda r: self.requests[r].order))
            self.events.add(ev.RequestPreempted, request, "swap", tuple(state.seqs), blocks, 0, seconds)
            return
        # Recompute: every token goes, and comes back through a new prefill.
        blocks, lost, cached = drop_for_recompute(state, self.registry, group)
        state.status = RequestStatus.WAITING
        self.waiting.appendleft(request)  # at the front: no starvation of the preempted
        self.stats.recomputed_tokens += lost
        self.events.add(ev.RequestPreempted, request, "recompute", tuple(state.seqs), blocks, lost, 0.0, cached)

    # -- one iteration -----------------------------------------------------------------
    def _decode_sequences(self, requests: list[str]) -> list[Sequence]:
        states = self.requests
        return self.registry.sequences_of([seq_id for request in requests for seq_id in states[request].seqs])

    def _running_batch(self) -> tuple[list[Sequence], list[str]]:
        if self._batch is None:
            seqs = self._decode_sequences(self.running)
            self._batch = (seqs, [q.seq_id for q in seqs])
        return self._batch

    def _swap_in(self) -> None:
        """Swapped groups come back, oldest first, while the watermark allows."""
        registry, blocks, events = self.registry, self.blocks, self.events
        while self.swapped:
            state = self.requests[self.swapped[0]]
            need = len(distinct_blocks(registry.swapped_sequence(s) for s in state.seqs))
            # Room for the group and its next token, or it would be swapped straight out again
            # (alone, it comes back anyway); the watermark keeps room for the running ones.
            headroom = len(state.seqs) if self.running else 0
            floor = self.watermark_blocks if self.running else 0
            if blocks.num_free - need - headroom < floor:
                break
            self.swapped.popleft()
            registry.swap_in(state.seqs)
            seconds = self._swap_time(need)
            self.stats.swap_seconds += seconds
            state.status = RequestStatus.RUNNING
            self.running.append(state.request)
            self.running.sort(key=lambda r: self.requests[r].order)
            self._batch = None
            events.add(ev.RequestSwappedIn, state.request, need, seconds)

    def step(self) -> None:
        try:
            self._step()
        except BaseException:
            self._batch = None  # a step that failed part way: rebuild from the queues
            raise

    def _step(self) -> None:
        registry, blocks, events = self.registry, self.blocks, self.events
        preempted, finished = self.stats.preemptions, self.stats.finished
        self._swap_in()  # 1. Swapped groups come back first, oldest first, while the watermark allows.
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
            if any(registry.is_taken(name) for name in state.planned_names()):
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
        if self.eos_id is not None and plan_beams(self.requests, decoding, registry, events):
            self._batch = None  # beams were freed and forked
            decode_seqs, decode_ids = with_names(self._decode_sequences(decoding))
        while decoding and not blocks.decode_fits(decode_seqs):
            if self.running == decoding[:1] and len(decoding) == 1:
                # Alone and still short: preempting it would only bring it back to this point.
                self._abort(decoding.pop(), "grew past what the pool can hold")
                break
            victim = max(self.running, key=lambda r: self.requests[r].order)
            self.preempt(victim)
            if victim in decoding:
                decoding.remove(victim)
            decode_seqs, decode_ids = with_names(self._decode_sequences(decoding))
        eos_id, states = self.eos_id, self.requests
        if decoding:  # (only beam search on a real model picks tokens ahead: chosen_tokens)
            registry.decode(decode_seqs, decode_ids, True, None if eos_id is None else chosen_tokens(states, decoding))
        done: set[str] = set()
        for request in decoding:
            state = states[request]
            state.generated += 1 if state.seqs else 0  # (a beam search that stopped early decoded nothing)
            state.next_tokens = None
            if state.beam_width > 1 and eos_id is None:
                self._batch = None
                prune_beams(state, registry)
            elif eos_id is not None and finish_at_eos(state, registry, eos_id):
                self._batch = None
            if state.generated >= state.output_len or not state.seqs:
                done.update(state.seqs)
                close_request(state, registry, self.eos_id)
                state.status = RequestStatus.FINISHED
                state.seqs = []
                self.running.remove(request)
                self.stats.finished += 1
                events.add(ev.RequestFinished, request, state.generated)
        if done and self._batch is not None:
            drop_from_batch(self._batch, done)
        if self.stats.finished > finished and self.stats.preemptions == preempted:
            self._swap_in()  # the finished freed blocks: a swapped group returns in this step

    def _reject(self, state: RequestState, reason: str) -> None:
        state.status, state.rejection = RequestStatus.REJECTED, reason
        self.stats.rejected += 1
        self.events.add(ev.RequestRejected, state.request, reason)

    def _abort(self, request: str, reason: str) -> None:
        state = self.requests[request]
        mine = len(distinct_blocks(self.registry.sequence(s) for s in state.seqs))
        used = self.config.num_blocks - self.blocks.num_free - self.blocks.reserved_blocks
        for seq_id in state.seqs:
            self.registry.free(seq_id)
        state.seqs = []
        self.running.remove(request)
        self._batch = None
        if others := used - mine:  # sequences added by hand: the scheduler cannot preempt them
            reason += (
                f" beside the sequences the scheduler does not run, which hold {others} of its "
                f"{self.config.num_blocks} blocks"
            )
        else:
            reason += f" ({self.config.num_blocks} blocks)"
        self._reject(state, reason)

    # -- state ------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        st = self.stats
        return {
            "waiting": len(self.waiting),
            "running": len(self.running),
            "swapped": len(self.swapped),
            "finished": st.finished,
            "rejected": st.rejected,
            "preemptions": st.preemptions,
            "recomputed_tokens": st.recomputed_tokens,
            "swapped_blocks": st.swapped_blocks,
        }

    def snapshot(self) -> SchedulerSnapshot:
        return SchedulerSnapshot(
            tuple(s.copy() for s in self.requests.values()),
            tuple(self.waiting),
            tuple(self.running),
            tuple(self.swapped),
            replace(self.stats),
            self.used,
        )

    def restore(self, snap: SchedulerSnapshot) -> None:
        self.requests = {s.request: s.copy() for s in snap.requests}
        self.waiting, self.running, self.swapped = deque(snap.waiting), list(snap.running), deque(snap.swapped)
        self._batch = None
        self.stats = replace(snap.stats)
        self.used = snap.used
