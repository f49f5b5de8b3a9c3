"""Immutable events the engine emits; a GUI animates these without reading internals.

Each event says which blocks and sequences it touches (``touched_blocks``,
``touched_seqs``) and narrates itself: ``describe()`` is its one sentence,
``summarize(events)`` the sentence for several of its kind in one step. That is the only
narration: a step's caption (:mod:`pagesim.core.captions`) composes these sentences and
words nothing itself. :class:`EventLog` collects the events while an operation runs; the
engine drains it once per step (as vLLM's ``take_events()``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pagesim.core.token_text import quoted


def said(name: str, kind: str = "sequence") -> str:
    """A sequence's (or request's) name in a sentence: a bare number would read as a count
    ("1 took 2 blocks"), so it is called "sequence 1"."""
    return f"{kind} {name}" if name.isdigit() else name


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def block_list(numbers) -> str:
    """ "#3, #7, #1": the first six block ids, and how many more there are."""
    numbers = list(numbers)
    shown = ", ".join(f"#{b}" for b in numbers[:6])
    return shown + (f" and {len(numbers) - 6} more" if len(numbers) > 6 else "")


class Event:
    """Base of every event. ``changes_pool``: the event changes the picture of the pool or
    of a block table (a block's holders, fill or state)."""

    __slots__ = ()
    changes_pool = False
    # Per-token and per-sequence detail of a step (token writes, the decode attention over
    # every sequence): an old step drops these, and a seek that lands there recomputes them.
    detail = False
    _BLOCK_FIELDS = ("block", "src", "dst")
    _SEQ_FIELDS = ("seq", "parent", "child", "request")

    @property
    def touched_blocks(self) -> tuple[int, ...]:
        """GPU blocks this event touches."""
        return tuple(getattr(self, f) for f in self._BLOCK_FIELDS if hasattr(self, f))

    @property
    def touched_seqs(self) -> tuple[str, ...]:
        """Sequences (or requests) this event names."""
        named = tuple(getattr(self, f) for f in self._SEQ_FIELDS if hasattr(self, f))
        return named + tuple(getattr(self, "seqs", ()))

    def describe(self) -> str:
        """One sentence of what happened."""
        return type(self).__name__

    @classmethod
    def summarize(cls, events: Sequence[Event]) -> str:
        """One sentence for several events of this kind in one step."""
        return "; ".join(e.describe() for e in events)

    def status_note(self) -> str | None:
        """A short note worth a status-bar message (what a scheduling decision cost), or None."""
        return None


@dataclass(frozen=True, slots=True)
class SequenceAdded(Event):
    """``num_tokens`` came with the sequence; ``prompt_len``, when it differs, is its whole
    prompt: more (a chunked prefill's first chunk) or fewer (a preempted sequence computed
    again with what it had generated, its newest sample included: under v1 that one was never
    computed, so a preemption drops one token fewer than it brings back)."""

    seq: str
    num_tokens: int
    prompt_len: int | None = None

    changes_pool = True

    def describe(self) -> str:
        prompt = self.prompt_len
        if prompt is None:
            return f"{said(self.seq)} arrived with {plural(self.num_tokens, 'prompt token')}"
        if self.num_tokens <= prompt:
            return f"{said(self.seq)} arrived with the first {self.num_tokens} of its {plural(prompt, 'prompt token')}"
        return (
            f"{said(self.seq)} came back with {plural(self.num_tokens, 'token')} ({prompt} prompt + "
            f"{self.num_tokens - prompt} it had generated)"
        )


@dataclass(frozen=True, slots=True)
class SequenceForked(Event):
    parent: str
    child: str

    changes_pool = True

    def describe(self) -> str:
        return (
            f"{said(self.child)} forked from {said(self.parent)}: it shares every block of {said(self.parent)}'s table"
        )

    @classmethod
    def summarize(cls, events: Sequence[SequenceForked]) -> str:
        return f"{len(events)} forks share their parents' blocks (ref counts up)"


@dataclass(frozen=True, slots=True)
class SequenceFreed(Event):
    seq: str

    changes_pool = True

    def describe(self) -> str:
        return f"{said(self.seq)} was freed"

    @classmethod
    def summarize(cls, events: Sequence[SequenceFreed]) -> str:
        return f"{len(events)} sequences were freed"


@dataclass(frozen=True, slots=True)
class BlockAllocated(Event):
    """``block`` left the free queue to become ``seq``'s logical block ``logical_index``."""

    block: int
    seq: str
    logical_index: int

    changes_pool = True

    def describe(self) -> str:
        return f"block {self.block} left the free queue to hold {said(self.seq)}'s logical block {self.logical_index}"

    @classmethod
    def summarize(cls, events: Sequence[BlockAllocated]) -> str:
        by_seq: dict[str, list[BlockAllocated]] = {}
        for e in events:
            by_seq.setdefault(e.seq, []).append(e)
        if len(by_seq) > 2:  # a decode step of many: one line for all
            mapping = ", ".join(
                f"{said(seq)} L{t[0].logical_index} → #{t[0].block}" for seq, t in list(by_seq.items())[:3]
            )
            return f"{len(by_seq)} sequences took new blocks from the free queue ({mapping} …)"
        lines = []
        for seq, taken in by_seq.items():
            mapping = ", ".join(f"L{e.logical_index} → #{e.block}" for e in taken[:4]) + (
                " …" if len(taken) > 4 else ""
            )
            lines.append(f"{said(seq)} took {plural(len(taken), 'block')} from the free queue ({mapping})")
        return "; ".join(lines)


@dataclass(frozen=True, slots=True)
class BlockShared(Event):
    """``seq``'s table now holds ``block`` too (fork); ``ref_count`` after the change."""

    block: int
    seq: str
    logical_index: int
    ref_count: int

    changes_pool = True

    def describe(self) -> str:
        return (
            f"{said(self.seq)}'s logical block {self.logical_index} is block {self.block} too "
            f"(ref count {self.ref_count})"
        )


@dataclass(frozen=True, slots=True)
class BlockReleased(Event):
    """``seq`` let go of ``block``, which others still hold (``ref_count`` > 0)."""

    block: int
    seq: str
    ref_count: int

    changes_pool = True

    def describe(self) -> str:
        return f"{said(self.seq)} let go of block {self.block}; others still hold it (ref count {self.ref_count})"

    @classmethod
    def summarize(cls, events: Sequence[BlockReleased]) -> str:
        blocks = dict.fromkeys(e.block for e in events)  # (a block two holders let go of is one block)
        return f"{plural(len(blocks), 'shared block')} stayed with other holders ({block_list(blocks)})"


@dataclass(frozen=True, slots=True)
class BlockFreed(Event):
    """``block``'s last holder ``seq`` let go; it joined the free queue's tail."""

    block: int
    seq: str

    changes_pool = True

    def describe(self) -> str:
        return f"block {self.block}'s last holder {said(self.seq)} let go; it joined the free queue"

    @classmethod
    def summarize(cls, events: Sequence[BlockFreed]) -> str:
        blocks = dict.fromkeys(e.block for e in events)  # (freed, taken again and freed again: once)
        return f"{plural(len(blocks), 'block')} joined the free queue ({block_list(blocks)})"


@dataclass(frozen=True, slots=True)
class BlockCopied(Event):
    """Copy-on-write: ``seq`` was about to write into shared ``src``; its KV went to ``dst``."""

    src: int
    dst: int
    seq: str
    logical_index: int

    changes_pool = True

    def describe(self) -> str:
        copy = f"copy-on-write gave it block {self.dst} (a copy of its K/V)"
        return f"{said(self.seq)} wrote into shared block {self.src} → {copy}"

    @classmethod
    def summarize(cls, events: Sequence[BlockCopied]) -> str:
        listed = ", ".join(f"{said(e.seq)} #{e.src} → #{e.dst}" for e in events[:3])
        return f"{len(events)} writes into shared blocks → copy-on-write gave each writer its own copy ({listed} …)"


@dataclass(frozen=True, slots=True)
class BlockReused(Event):
    """Prefix-cache hit: ``seq``'s logical block ``logical_index`` is the cached ``block``
    (taken back from the free queue if ``was_free``); its tokens are not computed again."""

    block: int
    seq: str
    logical_index: int
    ref_count: int
    was_free: bool

    changes_pool = True

    def describe(self) -> str:
        return (
            f"prefix-cache hit: {said(self.seq)}'s logical block {self.logical_index} is cached block {self.block}"
            + (" (taken back from the free queue)" if self.was_free else f" (ref count {self.ref_count})")
        )

    @classmethod
    def summarize(cls, events: Sequence[BlockReused]) -> str:
        return f"the prefix cache served {plural(len(events), 'block')} ({block_list(e.block for e in events)})"


@dataclass(frozen=True, slots=True)
class BlockCached(Event):
    """A full block's tokens were hashed: a later identical prefix can reuse it."""

    block: int
    seq: str
    block_hash: int

    changes_pool = True

    def describe(self) -> str:
        return f"block {self.block} filled up: its tokens' hash now lets an identical prefix reuse it"


def transfer_time(seconds: float) -> str:
    """A simulated copy's duration in the unit that shows it: "3.1 µs", "1.25 ms"."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms"


@dataclass(frozen=True, slots=True)
class BlockEvicted(Event):
    """A free cached block was reallocated: its hash (and cached data) are gone."""

    block: int

    changes_pool = True

    def describe(self) -> str:
        return f"cached block {self.block} was reallocated: its cached prefix is gone"

    @classmethod
    def summarize(cls, events: Sequence[BlockEvicted]) -> str:
        return f"{plural(len(events), 'cached block')} evicted for reuse ({block_list(e.block for e in events)})"


@dataclass(frozen=True, slots=True)
class BlockSwappedOut(Event):
    """Preemption by swap: GPU ``block``'s K/V moved to ``cpu_block`` of the CPU pool."""

    block: int
    cpu_block: int

    changes_pool = True

    def describe(self) -> str:
        return f"block {self.block}'s K/V moved to CPU block {self.cpu_block}"

    @classmethod
    def summarize(cls, events: Sequence[BlockSwappedOut]) -> str:
        return f"{plural(len(events), 'block')} swapped out to the CPU pool"


@dataclass(frozen=True, slots=True)
class BlockSwappedIn(Event):
    cpu_block: int
    block: int

    changes_pool = True

    def describe(self) -> str:
        return f"CPU block {self.cpu_block} came back as block {self.block}"

    @classmethod
    def summarize(cls, events: Sequence[BlockSwappedIn]) -> str:
        return f"{plural(len(events), 'block')} swapped back in from the CPU pool"


@dataclass(frozen=True, slots=True)
class RequestSubmitted(Event):
    request: str
    prompt_len: int
    output_len: int
    num_seqs: int

    def describe(self) -> str:
        samples = f", {self.num_seqs} sequences side by side (samples or beams)" if self.num_seqs > 1 else ""
        return f"request {self.request} queued: {self.prompt_len} prompt tokens, {self.output_len} to generate{samples}"


@dataclass(frozen=True, slots=True)
class RequestAdmitted(Event):
    request: str
    seqs: tuple[str, ...]
    resumed: bool  # after a preemption by recompute

    def describe(self) -> str:
        what = "resumed" if self.resumed else "admitted"
        if self.seqs == (self.request,):  # (one sequence of its own name: nothing more to say)
            return f"request {self.request} {what}"
        return f"request {self.request} {what} as {', '.join(map(said, self.seqs))}"


@dataclass(frozen=True, slots=True)
class RequestPreempted(Event):
    """``mode`` is "recompute" (blocks freed; ``tokens`` will be computed again, but for what
    the prefix cache still holds on its return: ``cached`` of the blocks keep their hash) or
    "swap" (``blocks`` moved to the CPU pool, taking ``swap_seconds`` of simulated time)."""

    request: str
    mode: str
    seqs: tuple[str, ...]
    blocks: int
    tokens: int
    swap_seconds: float
    cached: int = 0

    def describe(self) -> str:
        return self.status_note()

    def status_note(self) -> str | None:
        if self.mode == "swap":
            cost = f"{self.blocks} blocks moved to the CPU pool ({transfer_time(self.swap_seconds)})"
        else:
            # (released, not freed: a block another sequence shares stays in use)
            held = plural(self.blocks, "block")
            if self.cached:
                cost = (
                    f"{held} released ({self.cached} kept in the prefix cache for its return, unless evicted); "
                    f"the rest of its {plural(self.tokens, 'computed token')} computed again then"
                )
            else:
                dropped = plural(self.tokens, "computed token")
                cost = f"{held} released, the K/V of its {dropped} dropped (computed again on its return)"
        return f"{said(self.request, 'request')} preempted by {self.mode}: {cost}"


@dataclass(frozen=True, slots=True)
class RequestSwappedIn(Event):
    request: str
    blocks: int
    swap_seconds: float

    def describe(self) -> str:
        return self.status_note()

    def status_note(self) -> str | None:
        return f"{said(self.request, 'request')} swapped back in: {self.blocks} blocks"


@dataclass(frozen=True, slots=True)
class RequestFinished(Event):
    request: str
    output_tokens: int

    def describe(self) -> str:
        return f"request {self.request} finished after {self.output_tokens} tokens"


@dataclass(frozen=True, slots=True)
class BeamsSelected(Event):
    """A beam search step on a real model: each next beam as (name, parent, token,
    cumulative log-probability), best first, and the beams no candidate chose (freed)."""

    request: str
    beams: tuple[tuple[str, str, int, float], ...]
    dropped: tuple[str, ...]

    @property
    def touched_seqs(self) -> tuple[str, ...]:
        return (self.request, *(b[0] for b in self.beams), *self.dropped)

    def describe(self) -> str:
        kept = ", ".join(
            f"{name} ({'' if parent == name else f'from {parent}, '}{score:.2f})"
            for name, parent, _, score in self.beams[:4]
        )
        gone = f"; dropped {', '.join(self.dropped)}, their blocks freed" if self.dropped else ""
        return f"beam search on {self.request} kept {kept} by cumulative log-probability{gone}"


@dataclass(frozen=True, slots=True)
class RequestRejected(Event):
    request: str
    reason: str

    def describe(self) -> str:
        return self.status_note()

    def status_note(self) -> str | None:
        return f"{said(self.request, 'request')} rejected: {self.reason}"


@dataclass(frozen=True, slots=True)
class TokenWritten(Event):
    detail = True
    seq: str
    position: int
    token_id: int
    block: int
    slot: int

    changes_pool = True

    def describe(self) -> str:
        return f"{said(self.seq)}'s token {self.position} went into block {self.block}, slot {self.slot}"

    @classmethod
    def summarize(
        cls,
        events: Sequence[TokenWritten],
        room_unknown: Iterable[str] | None = (),
        text_of: Callable[[Sequence[int]], str] | None = None,
    ) -> str:
        """Per sequence, or one line for a decode step of many. A sequence not in
        ``room_unknown`` (None: every sequence is) is said to have had room in its last block.
        ``text_of``: a real model's tokenizer (ids to text), to say what was written."""
        tokens: dict[str, list[TokenWritten]] = {}
        for e in events:
            tokens.setdefault(e.seq, []).append(e)
        if text_of is not None:
            return _summarize_text(tokens, room_unknown, text_of)
        if len(tokens) > 2:
            return _summarize_many(tokens, lambda seq, mine: said(seq))
        lines = []
        for seq, mine in tokens.items():
            first, last = mine[0], mine[-1]
            where = f"block {first.block}, slot {first.slot}"
            if last.block != first.block or last.slot != first.slot:
                where += f" … block {last.block}, slot {last.slot}"
            which = f"token {first.position}" if len(mine) == 1 else f"tokens {first.position}–{last.position}"
            room = "" if room_unknown is None or seq in room_unknown else " (room in its last block: no new block)"
            lines.append(f"{said(seq)}'s {which} went into {where}{room}")
        return "; ".join(lines)


def _summarize_many(tokens: dict[str, list[TokenWritten]], name: Callable[[str, list[TokenWritten]], str]) -> str:
    """A step of many sequences in one line: those that decoded one token each, then those
    that wrote a chunk of several (a prompt's, or a preempted request's computed again).
    ``name(seq, its tokens)``: how a sequence is named (with its text, where known)."""
    decoded = [(seq, mine) for seq, mine in tokens.items() if len(mine) == 1]
    chunks = [(seq, mine) for seq, mine in tokens.items() if len(mine) > 1]
    parts = []
    if decoded:
        names = ", ".join(name(seq, mine) for seq, mine in decoded[:4]) + (", …" if len(decoded) > 4 else "")
        each = (
            "one token's K/V each into their last blocks" if len(decoded) > 1 else "one token's K/V into its last block"
        )
        parts.append(f"{plural(len(decoded), 'sequence')} wrote {each} ({names})")
    for seq, mine in chunks[:3]:
        first, last = mine[0], mine[-1]
        parts.append(
            f"{name(seq, mine)}: a prefill chunk of {len(mine)} tokens into block {first.block}, slot {first.slot} "
            f"… block {last.block}, slot {last.slot}"
        )
    if len(chunks) > 3:
        parts.append(f"{len(chunks) - 3} more prefill chunks")
    head = "a decode step: " if not chunks else ""
    return head + "; ".join(parts)


def _summarize_text(
    tokens: dict[str, list[TokenWritten]], room_unknown: Iterable[str] | None, text_of: Callable[[Sequence[int]], str]
) -> str:
    """What each sequence wrote, in words: ``A wrote the K/V of " Paris" into block 5, slot 3``
    (the K/V, not the text: a prompt's tokens are written too, and not generated)."""
    if len(tokens) > 2:
        return _summarize_many(
            tokens, lambda seq, mine: f"{said(seq)} {quoted(text_of([e.token_id for e in mine]), 16)}"
        )
    lines = []
    for seq, mine in tokens.items():
        first, last = mine[0], mine[-1]
        where = f"block {first.block}, slot {first.slot}"
        if last.block != first.block or last.slot != first.slot:
            where += f" … block {last.block}, slot {last.slot}"
        room = "" if room_unknown is None or seq in room_unknown else " (room in its last block: no new block)"
        lines.append(f"{said(seq)} wrote the K/V of {quoted(text_of([e.token_id for e in mine]))} into {where}{room}")
    return "; ".join(lines)


@dataclass(frozen=True, slots=True)
class LookupPerformed(Event):
    """The kernel walked ``seq``'s block table in this order: ``blocks[i]`` is the physical
    block it read for logical block ``i``, up to ``context_len`` tokens."""

    detail = True

    seq: str
    blocks: tuple[int, ...]
    context_len: int

    @property
    def touched_blocks(self) -> tuple[int, ...]:
        return self.blocks

    def describe(self) -> str:
        return f"the kernel read {said(self.seq)}'s {self.context_len} tokens through blocks {list(self.blocks)}"


@dataclass(frozen=True, slots=True)
class AttentionComputed(Event):
    """Paged kernel vs dense attention for one sequence (query = its newest token)."""

    detail = True

    seq: str
    context_len: int
    max_abs_error: float
    head_errors: tuple[float, ...]
    tolerance: float  # the loosest head's bound
    backend: str
    head_tolerances: tuple[float, ...] = ()  # each head's bound (core.dense_check.error_bounds)

    @property
    def passed(self) -> bool:
        if self.head_tolerances:
            return all(e <= t for e, t in zip(self.head_errors, self.head_tolerances, strict=True))
        return self.max_abs_error <= self.tolerance

    def describe(self) -> str:
        return (
            f"{said(self.seq)}: kernel vs dense max |err| {self.max_abs_error:.1e} "
            + ("within" if self.passed else "beyond")
            + f" {self.tolerance:.1e}"
        )


@dataclass(frozen=True, slots=True)
class LayersChecked(Event):
    """A real model's step: every layer's paged attention against dense, and the logits
    against the dense engine's (``sentence``: the verdict in words)."""

    detail = True
    sentence: str
    worst_layer: int
    passed: bool

    def describe(self) -> str:
        return self.sentence


@dataclass(frozen=True, slots=True)
class KernelLaunched(Event):
    detail = True
    backend: str
    device: str
    num_seqs: int
    kernel_seconds: float
    dense_seconds: float

    def describe(self) -> str:
        return f"{self.backend} kernel over {self.num_seqs} sequences in {self.kernel_seconds * 1e3:.2f} ms"


class EventLog:
    """The events of the operation in progress. ``enabled = False`` keeps nothing (large
    headless runs); hot paths use :meth:`add`, which does not even build the event then."""

    __slots__ = ("_events", "enabled")

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._events: list[Event] = []

    def emit(self, event: Event) -> None:
        if self.enabled:
            self._events.append(event)

    def add(self, kind: type[Event], *fields) -> None:
        """Emit ``kind(*fields)``, built only when the log keeps events."""
        if self.enabled:
            self._events.append(kind(*fields))

    def take(self) -> tuple[Event, ...]:
        """Everything emitted since the last take, oldest first; the log is left empty."""
        events, self._events = tuple(self._events), []
        return events

    def clear(self) -> None:
        self._events = []
