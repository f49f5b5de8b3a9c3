"""One sentence for a step, in vLLM's words: what the operation did to the block tables and
the pool, and why (copy-on-write, prefix-cache hits, preemption). Written from the step's
events while they are whole (an old step later drops its per-token detail)."""

from __future__ import annotations

from pagesim.core import events as ev
from pagesim.core.engine import StepResult


def _blocks(numbers) -> str:
    numbers = list(numbers)
    shown = ", ".join(f"#{b}" for b in numbers[:6])
    return shown + (f" … ({len(numbers)} in all)" if len(numbers) > 6 else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


_NARRATED = (
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


def step_caption(result: StepResult) -> str:
    """What ``result``'s step did, most telling first, as one or two short sentences."""
    # One pass sorts the events by type (a decode step over 256 sequences has ~500 of them,
    # too many for a pass per question); the narrated ones keep their order.
    of: dict[type, list] = {}
    narrated = []
    for e in result.op_events:  # the attention's lookups and checks narrate nothing here
        of.setdefault(type(e), []).append(e)
        if isinstance(e, _NARRATED):
            narrated.append(e)
    parts: list[str] = []
    copies = of.get(ev.BlockCopied, [])
    released = {e.block: e for e in of.get(ev.BlockReleased, [])}
    copied_to, copied_from = {e.dst for e in copies}, {e.src for e in copies}
    if len(copies) > 2:  # a beam step: one line for all its copies
        listed = ", ".join(f"{e.seq} #{e.src} → #{e.dst}" for e in copies[:3])
        parts.append(
            f"{len(copies)} writes into shared blocks → copy-on-write gave each writer its own copy ({listed} …)"
        )
    else:
        for e in copies:
            after = released.get(e.src)
            left = f"; block {e.src} now ref count {after.ref_count}" if after is not None else ""
            copy = f"copy-on-write gave it block {e.dst} (a copy of its K/V)"
            parts.append(f"{e.seq} wrote into shared block {e.src} → {copy}{left}")
    forks = len(of.get(ev.SequenceForked, []))
    frees = len(of.get(ev.SequenceFreed, []))
    if forks > 2:
        parts.append(f"{forks} forks share their parents' blocks (ref counts up)")
    if frees > 2:
        parts.append(f"{frees} sequences were freed")
    for e in narrated:
        if isinstance(e, ev.SequenceAdded):
            parts.append(f"{e.seq} arrived with {_plural(e.num_tokens, 'prompt token')}")
        elif isinstance(e, ev.SequenceForked) and forks <= 2:
            shared = [s for s in of.get(ev.BlockShared, []) if s.seq == e.child]
            count = f" ({_plural(len(shared), 'block')}, ref counts up)" if shared else ""
            parts.append(f"{e.child} forked from {e.parent}: it shares every block of {e.parent}'s table{count}")
        elif isinstance(e, ev.SequenceFreed) and frees <= 2:
            parts.append(f"{e.seq} was freed")
        elif not isinstance(e, ev.SequenceAdded | ev.SequenceForked | ev.SequenceFreed):
            parts.append(e.describe())  # the scheduler's own: submitted, admitted, preempted, …
    hits = of.get(ev.BlockReused, [])
    if hits:
        parts.append(f"the prefix cache served {_plural(len(hits), 'block')} ({_blocks(e.block for e in hits)})")
    new = [e for e in of.get(ev.BlockAllocated, []) if e.block not in copied_to]
    by_seq: dict[str, list[ev.BlockAllocated]] = {}
    for e in new:
        by_seq.setdefault(e.seq, []).append(e)
    if len(by_seq) > 2:  # a decode step of many: one line for all
        mapping = ", ".join(f"{seq} L{t[0].logical_index} → #{t[0].block}" for seq, t in list(by_seq.items())[:3])
        parts.append(f"{len(by_seq)} sequences took new blocks from the free queue ({mapping} …)")
    else:
        for seq, taken in by_seq.items():
            mapping = ", ".join(f"L{e.logical_index} → #{e.block}" for e in taken[:4]) + (
                " …" if len(taken) > 4 else ""
            )
            parts.append(f"{seq} took {_plural(len(taken), 'block')} from the free queue ({mapping})")
    freed = [e.block for e in of.get(ev.BlockFreed, [])]
    if freed:
        parts.append(f"{_plural(len(freed), 'block')} joined the free queue ({_blocks(freed)})")
    still = [e for e in of.get(ev.BlockReleased, []) if e.block not in copied_from]
    if still:
        parts.append(
            f"{_plural(len(still), 'shared block')} stayed with other holders ({_blocks(e.block for e in still)})"
        )
    evicted = [e.block for e in of.get(ev.BlockEvicted, [])]
    if evicted:
        parts.append(f"{_plural(len(evicted), 'cached block')} evicted for reuse ({_blocks(evicted)})")
    out = of.get(ev.BlockSwappedOut, [])
    back = of.get(ev.BlockSwappedIn, [])
    if out:
        parts.append(f"{_plural(len(out), 'block')} swapped out to the CPU pool")
    if back:
        parts.append(f"{_plural(len(back), 'block')} swapped back in from the CPU pool")
    written = of.get(ev.TokenWritten, [])
    if written and ev.SequenceAdded not in of:
        tokens: dict[str, list[ev.TokenWritten]] = {}
        for e in written:
            tokens.setdefault(e.seq, []).append(e)
        if len(tokens) > 2:
            parts.append(f"a decode step: {len(tokens)} sequences wrote one token each into their last blocks")
            tokens = {}
        for seq, mine in tokens.items():
            first, last = mine[0], mine[-1]
            where = f"block {first.block}, slot {first.slot}"
            if last.block != first.block or last.slot != first.slot:
                where += f" … block {last.block}, slot {last.slot}"
            which = f"token {first.position}" if len(mine) == 1 else f"tokens {first.position}–{last.position}"
            room = "" if seq in by_seq or copies else " (room in its last block: no new block)"
            parts.append(f"{seq}'s {which} went into {where}{room}")
    if not parts:
        parts.append(result.op.describe())
    return "; ".join(parts) + "."
