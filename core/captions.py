"""One caption for a step: the events' own sentences (``describe()``, ``summarize()``),
in the order the step did them, with what only the step as a whole knows — the ref count
each copy left on its source, which new blocks were copy-on-write copies, whether a written
token found room in its last block. Written from the step's events while they are whole (an old
step later drops its per-token detail)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from pagesim.core import events as ev
from pagesim.core.engine import StepResult
from pagesim.core.sequence import family_of
from pagesim.core.token_text import quoted

# Sequence and request events, told one by one in the order they happened.
_IN_ORDER = (
    ev.SequenceAdded,
    ev.SequenceForked,
    ev.SequenceFreed,
    ev.RequestSubmitted,
    ev.RequestAdmitted,
    ev.RequestPreempted,
    ev.RequestRejected,
    ev.RequestSwappedIn,
    ev.RequestFinished,
)
# Block events, each kind in one sentence, in this order.
_BY_KIND = (ev.BlockReused, ev.BlockAllocated, ev.BlockFreed, ev.BlockReleased, ev.BlockEvicted)
_SWAPS = (ev.BlockSwappedOut, ev.BlockSwappedIn)
MANY = 2  # more events of a kind than this: one sentence for all of them


def step_caption(result: StepResult, text_of: Callable[[Sequence[int]], str] | None = None) -> str:
    """What ``result``'s step did, as one or two short sentences: its copies, sequence and
    request events and writes in the order they happened, the pool's changes after them.
    ``text_of``: a real model's tokenizer (ids to text), to say what was written."""
    # One pass sorts the events by kind (a decode step over 256 sequences has ~500 of them),
    # each with its place in the step.
    of: dict[type, list] = {}
    at: dict[type, list[int]] = {}
    in_order: list[tuple[int, ev.Event]] = []
    let_go: dict[int, type] = {}  # per block, the step's last release or free of it
    copy_left: dict[int, int] = {}  # a copy's index -> the ref count its own release left on the source
    copying: dict[int, int] = {}  # a source block -> the index of the copy waiting for its release
    for i, e in enumerate(result.op_events):  # the attention's lookups and checks are told elsewhere
        kind = type(e)
        of.setdefault(kind, []).append(e)
        at.setdefault(kind, []).append(i)
        if isinstance(e, _IN_ORDER):
            in_order.append((i, e))
        elif isinstance(e, ev.BlockReleased | ev.BlockFreed):
            let_go[e.block] = kind
            if e.block in copying and kind is ev.BlockReleased:
                copy_left[copying.pop(e.block)] = e.ref_count
        elif isinstance(e, ev.BlockCopied):
            copying[e.src] = i
    # A finished request's sequences are freed with it: its finishing says so (and its blocks'
    # sentence where they went), not a "was freed" per sequence.
    # (A request is its sequences' family, "r1" of "r1/s0", or in v1 a child request "r1/s0" itself.)
    finished = {e.request for e in of.get(ev.RequestFinished, [])}
    # A request preempted by recompute frees its sequences too: its preemption's sentence says so.
    preempted = {seq for e in of.get(ev.RequestPreempted, []) for seq in e.seqs}

    def told(e) -> bool:
        if not isinstance(e, ev.SequenceFreed):
            return True
        return e.seq not in finished and family_of(e.seq) not in finished and e.seq not in preempted

    def keep(kind: type, wanted) -> None:
        pairs = [(i, e) for i, e in zip(at.get(kind, ()), of.get(kind, ()), strict=True) if wanted(e)]
        at[kind], of[kind] = [i for i, _ in pairs], [e for _, e in pairs]

    keep(ev.SequenceFreed, told)
    copies = list(zip(at.get(ev.BlockCopied, ()), of.get(ev.BlockCopied, ()), strict=True))
    copied_to, copied_from = {e.dst for _, e in copies}, {e.src for _, e in copies}
    # A copy's new block and the shared block it left are told with the copy.
    keep(ev.BlockAllocated, lambda e: e.block not in copied_to)
    # A shared block its last holder also let go of later in the step joined the free queue: not "stayed".
    keep(ev.BlockReleased, lambda e: e.block not in copied_from and let_go[e.block] is ev.BlockReleased)

    parts: list[tuple[float, str]] = []  # (where in the step, the sentence)
    if len(copies) > MANY:
        parts.append((copies[0][0], ev.BlockCopied.summarize([e for _, e in copies])))
    for i, e in copies if len(copies) <= MANY else ():
        left = copy_left.get(i)
        parts.append((i, e.describe() + (f"; block {e.src} now ref count {left}" if left is not None else "")))
    crowded = {kind for kind in (ev.SequenceForked, ev.SequenceFreed) if len(of.get(kind, [])) > MANY}
    parts += [
        (at[kind][0], kind.summarize(of[kind])) for kind in (ev.SequenceForked, ev.SequenceFreed) if kind in crowded
    ]
    freed: set[str] = set()  # a beam search frees a beam and forks its name anew in one step
    events = result.op_events
    # A prompt's writes are told by its arrival; writes past them (a resumed sequence's own
    # tail, a later engine step's decode), as writes.
    arrival_writes = {i: _writes_of_arrival(events, i) for i, e in in_order if isinstance(e, ev.SequenceAdded)}
    told_by_arrival = {id(w) for writes in arrival_writes.values() for w in writes}
    for i, e in in_order:
        if isinstance(e, ev.SequenceFreed):
            freed.add(e.seq)  # (also a finished request's, untold: its name forked anew is still "a new" one)
        if type(e) in crowded or not told(e):
            continue
        text = e.describe()
        if isinstance(e, ev.SequenceForked):
            shared = sum(1 for s in of.get(ev.BlockShared, []) if s.seq == e.child)
            text += f" ({ev.plural(shared, 'block')}, ref counts up)" if shared else ""
            text = f"a new {text}" if e.child in freed else text
        if isinstance(e, ev.SequenceAdded):
            admission = _admission_of(events, i, e.seq)
            back = admission is not None and admission.resumed
            if back:
                text = _return_of(e, admission)
            text += _arrival_split(e, [w.token_id for w in arrival_writes[i]], text_of, back)
        parts.append((i, text))
    # The block sentences sum up what the sequence and request events did to the pool: told
    # after the last of those (a free, then where its blocks went), or first when there are none.
    blocks_at = in_order[-1][0] + 0.5 if in_order else -1.0
    # A request's swap is told by the request (its blocks, its transfer time): not again block by block.
    told_swaps = {ev.BlockSwappedOut} if any(e.mode == "swap" for e in of.get(ev.RequestPreempted, [])) else set()
    told_swaps |= {ev.BlockSwappedIn} if ev.RequestSwappedIn in of else set()
    kinds = [kind for kind in _BY_KIND + _SWAPS if of.get(kind) and kind not in told_swaps]
    parts += [(blocks_at, kind.summarize(of[kind])) for kind in kinds]
    written = [w for w in of.get(ev.TokenWritten, []) if id(w) not in told_by_arrival]
    if written:
        room_unknown = None if copies else {e.seq for e in of[ev.BlockAllocated]}
        # Where the writing began, but after the copies that made room for it.
        where = max(at[ev.TokenWritten][0], copies[-1][0] + 0.5 if copies else 0)
        parts.append((where, ev.TokenWritten.summarize(written, room_unknown, text_of)))
    if not parts:
        return result.op.describe() + "."
    parts.sort(key=lambda part: part[0])  # (stable: sentences of one place keep their order)
    return "; ".join(text for _, text in parts) + "."


def _writes_of_arrival(events, index: int) -> list:
    """The writes of the prompt the :class:`SequenceAdded` at ``index`` brought: the run of
    its sequence's writes that follows it, up to the tokens it came with."""
    added = events[index]
    out = []
    for e in itertools.islice(events, index + 1, None):
        if isinstance(e, ev.TokenWritten) and e.seq == added.seq and e.position < added.num_tokens:
            out.append(e)
        elif out or (isinstance(e, ev.SequenceAdded | ev.SequenceFreed) and e.seq == added.seq):
            break  # (a prompt's writes come in one run, after its blocks)
    return out


def _admission_of(events, index: int, seq: str) -> ev.RequestAdmitted | None:
    """The scheduler's admission that the :class:`SequenceAdded` at ``index`` was part of
    (the next one naming its sequence), or None: a sequence added by hand."""
    for e in itertools.islice(events, index + 1, None):
        if isinstance(e, ev.RequestAdmitted) and seq in e.seqs:
            return e
        if isinstance(e, ev.SequenceAdded) and e.seq == seq:
            return None
    return None


def _return_of(e: ev.SequenceAdded, admission: ev.RequestAdmitted) -> str:
    """A resumed request's sequence coming back: v0 adds a group's shared tokens once (the
    samples fork from it), and a single sequence or a v1 chunk says what it brought again."""
    if e.prompt_len is None and len(admission.seqs) > 1:
        return f"{ev.said(e.seq)} came back with the {ev.plural(e.num_tokens, 'token')} its samples share"
    if e.prompt_len is None:
        return f"{ev.said(e.seq)} came back with its {ev.plural(e.num_tokens, 'prompt token')}"
    return e.describe().replace(" arrived with ", " came back with ", 1)


def _arrival_split(
    e: ev.SequenceAdded, computed: list[int], text_of: Callable[[Sequence[int]], str] | None, back: bool = False
) -> str:
    """What an arrival computed: its tokens less those a prefix-cache hit served, with their
    text where a tokenizer gives it. ``back``: a preempted request's return."""
    again = back or (e.prompt_len is not None and e.num_tokens > e.prompt_len)
    served = e.num_tokens - len(computed)
    said = quoted(text_of(computed), 60) if text_of is not None and computed else ""
    if served:
        verb = "computed again" if again else "computed"
        return f": {served} served by the prefix cache, {len(computed)} {verb}" + (f" ({said})" if said else "")
    return (", all computed again" if again else "") + (f": {said}" if said else "")
