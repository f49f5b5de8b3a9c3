"""One caption for a step: the events' own sentences (``describe()``, ``summarize()``),
composed most telling first, with what only the step as a whole knows — which copy left a
block with one holder, which new blocks were copy-on-write copies, whether a written token
found room in its last block. Written from the step's events while they are whole (an old
step later drops its per-token detail)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pagesim.core import events as ev
from pagesim.core.engine import StepResult
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
    """What ``result``'s step did, most telling first, as one or two short sentences.
    ``text_of``: a real model's tokenizer (ids to text), to say what was written."""
    # One pass sorts the events by kind (a decode step over 256 sequences has ~500 of them);
    # the sequence and request events keep their order.
    of: dict[type, list] = {}
    in_order = []
    let_go: dict[int, type] = {}  # per block, the step's last release or free of it
    for e in result.op_events:  # the attention's lookups and checks are told elsewhere
        of.setdefault(type(e), []).append(e)
        if isinstance(e, _IN_ORDER):
            in_order.append(e)
        elif isinstance(e, ev.BlockReleased | ev.BlockFreed):
            let_go[e.block] = type(e)
    # A finished request's sequences are freed with it: its finishing says so (and its blocks'
    # sentence where they went), not a "was freed" per sequence.
    # (A request is its sequences' family, "r1" of "r1/s0", or in v1 a child request "r1/s0" itself.)
    finished = {e.request for e in of.get(ev.RequestFinished, [])}

    def told(e) -> bool:
        return not isinstance(e, ev.SequenceFreed) or (e.seq not in finished and e.seq.split("/", 1)[0] not in finished)

    if finished and ev.SequenceFreed in of:
        of[ev.SequenceFreed] = [e for e in of[ev.SequenceFreed] if told(e)]
    copies = of.get(ev.BlockCopied, [])
    copied_to, copied_from = {e.dst for e in copies}, {e.src for e in copies}
    # A copy's new block and the shared block it left are told with the copy.
    of[ev.BlockAllocated] = [e for e in of.get(ev.BlockAllocated, []) if e.block not in copied_to]
    released = {e.block: e for e in of.get(ev.BlockReleased, [])}  # (the last release of each block)
    # A shared block its last holder also let go of later in the step joined the free queue: not "stayed".
    of[ev.BlockReleased] = [
        e for e in of.get(ev.BlockReleased, []) if e.block not in copied_from and let_go[e.block] is ev.BlockReleased
    ]

    parts: list[str] = []
    if len(copies) > MANY:
        parts.append(ev.BlockCopied.summarize(copies))
    for e in copies if len(copies) <= MANY else ():
        left = released.get(e.src)
        parts.append(e.describe() + (f"; block {e.src} now ref count {left.ref_count}" if left else ""))
    crowded = {kind for kind in (ev.SequenceForked, ev.SequenceFreed) if len(of.get(kind, [])) > MANY}
    parts += [kind.summarize(of[kind]) for kind in (ev.SequenceForked, ev.SequenceFreed) if kind in crowded]
    freed: set[str] = set()  # a beam search frees a beam and forks its name anew in one step
    for e in in_order:
        if isinstance(e, ev.SequenceFreed):
            freed.add(e.seq)  # (also a finished request's, untold: its name forked anew is still "a new" one)
        if type(e) in crowded or not told(e):
            continue
        text = e.describe()
        if isinstance(e, ev.SequenceForked):
            shared = sum(1 for s in of.get(ev.BlockShared, []) if s.seq == e.child)
            text += f" ({ev.plural(shared, 'block')}, ref counts up)" if shared else ""
            text = f"a new {text}" if e.child in freed else text
        if isinstance(e, ev.SequenceAdded) and text_of is not None:
            prompt = [w.token_id for w in of.get(ev.TokenWritten, []) if w.seq == e.seq]
            text += f": {quoted(text_of(prompt), 60)}" if prompt else ""
        parts.append(text)
    parts += [kind.summarize(of[kind]) for kind in _BY_KIND + _SWAPS if of.get(kind)]
    written = of.get(ev.TokenWritten, [])
    if written and ev.SequenceAdded not in of:  # a prompt's tokens are told by its arrival
        room_unknown = None if copies else {e.seq for e in of[ev.BlockAllocated]}
        parts.append(ev.TokenWritten.summarize(written, room_unknown, text_of))
    if not parts:
        parts.append(result.op.describe())
    return "; ".join(parts) + "."
