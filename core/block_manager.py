"""The block manager: which physical blocks each sequence holds, and nothing else.

In the spirit of nano-vllm's ``BlockManager`` and vLLM's ``KVCacheManager``: it owns the
GPU block pool (free queue, ref counts, the prefix cache's hashes), the holders of every
block, how many slots of each block are filled, the CPU pool that swapped blocks wait
in, and the running usage counters. Every change comes in a check/act pair —
``can_allocate``/``allocate``, ``can_append``/``append``, ``fork``, ``free``,
``can_swap_out``/``swap_out``, ``can_swap_in``/``swap_in`` — and the act is only called
after its check passed, so an act never fails halfway.

It moves no K/V data: the acts return the slots to write, the blocks to copy (copy-on-
write) and the block mappings of a swap, and the engine applies those to the KV cache.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import abc
from collections.abc import Iterable
from dataclasses import dataclass, fields
from itertools import accumulate
from typing import Any, cast

from pagesim.core import events as ev
from pagesim.core.blocks import BlockPool, PoolSnapshot
from pagesim.core.config import CacheConfig
from pagesim.core.errors import InvalidOperationError
from pagesim.core.events import EventLog
from pagesim.core.prefix_cache import PrefixCache
from pagesim.core.sequence import Sequence, TokenIds

NULL_BLOCK = 0  # the v1 scheduler's placeholder block (vLLM's null_block): held from the start


@dataclass
class Usage:
    """Running totals, so metrics are O(1) per step. Only :class:`BlockManager` changes them."""

    slots_filled: int = 0  # tokens held by referenced blocks
    shared_blocks: int = 0  # blocks with ref count > 1
    logical_tokens: int = 0  # tokens of every live sequence
    contiguous_blocks: int = 0  # what max-length contiguous reservations would take

    def copy(self) -> Usage:
        return Usage(*(getattr(self, f.name) for f in fields(self)))

    def count_tokens(self, old: int | None, new: int | None, reservation) -> None:
        """A sequence's length went from ``old`` to ``new`` (None: it did not exist / is gone);
        ``reservation(n)``: the blocks a contiguous allocator reserves for ``n`` tokens."""
        self.logical_tokens += (new or 0) - (old or 0)
        self.contiguous_blocks += (0 if new is None else reservation(new)) - (0 if old is None else reservation(old))

    def ref_changed(self, ref_count: int, up: bool) -> None:
        """A block's ref count went up or down to ``ref_count``."""
        if up and ref_count == 2:
            self.shared_blocks += 1
        elif not up and ref_count == 1:
            self.shared_blocks -= 1


@dataclass(frozen=True)
class AppendPlan:
    """What one append does to the pool: the blocks it takes from the free queue."""

    new_blocks: int
    copy_on_write: bool

    @property
    def blocks_needed(self) -> int:
        return self.new_blocks + int(self.copy_on_write)


@dataclass(frozen=True)
class Appended:
    """The result of :meth:`BlockManager.append`: where the new tokens go."""

    slots: list[int]  # flat slot (block * block_size + offset) of each token written
    copies: list[tuple[int, int]]  # (src, dst) blocks to copy before the writes


@dataclass(frozen=True)
class BlockManagerSnapshot:
    pool: PoolSnapshot
    block_fill: tuple[int, ...]
    usage: Usage  # no holders: the sequences' block tables name them (see restore)
    prefix_counts: tuple[int, int]
    cpu_pool: PoolSnapshot | None


def distinct_blocks(seqs: Iterable[Sequence]) -> list[int]:
    """The blocks a group of sequences holds, shared ones once, in table order."""
    return list(dict.fromkeys(b for seq in seqs for b in seq.block_table))


def holders_from_tables(sequences: Iterable[Sequence]) -> dict[int, dict[str, int]]:
    """block -> {sequence: logical index}, from the sequences' block tables."""
    holders: dict[int, dict[str, int]] = {}
    for seq in sequences:
        for index, block in enumerate(seq.block_table):
            holders.setdefault(block, {})[seq.seq_id] = index
    return holders


class CpuBlocks:
    """The CPU pool that swapped-out blocks wait in, created by the first swap out; one CPU
    reference per table entry, like the GPU's."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.pool: BlockPool | None = None

    @property
    def num_free(self) -> int:
        return self.num_blocks if self.pool is None else self.pool.num_free

    def _ensure(self) -> BlockPool:
        if self.pool is None:
            if self.num_blocks < 1:
                raise InvalidOperationError("preemption by swap needs num_cpu_blocks ≥ 1 in the scenario header")
            self.pool = BlockPool(self.num_blocks)
        return self.pool

    def take(self, seqs: list[Sequence], gpu_blocks: list[int]) -> dict[int, int]:
        """A CPU block for each of ``gpu_blocks`` (the group's, distinct), held by every table entry."""
        pool = self._ensure()
        to_cpu = dict(zip(gpu_blocks, pool.allocate(len(gpu_blocks)), strict=True))
        first_use = set()
        for block in (b for seq in seqs for b in seq.block_table):
            if to_cpu[block] in first_use:
                pool.share(to_cpu[block])
            first_use.add(to_cpu[block])
        return to_cpu

    def release(self, seqs: list[Sequence]) -> None:
        pool = self.pool
        assert pool is not None, "nothing was swapped out"
        for seq in seqs:
            for block in seq.block_table:
                pool.release(block)

    def snapshot(self) -> PoolSnapshot | None:
        return None if self.pool is None else self.pool.snapshot()

    def restore(self, snap: PoolSnapshot | None) -> None:
        if snap is None:
            self.pool = None
        else:
            self._ensure().restore(snap)


class BlockManager:
    def __init__(self, config: CacheConfig, events: EventLog) -> None:
        self.config = config
        self._max_model_len = cast(int, config.max_model_len)  # (CacheConfig always sets it)
        self.events = events
        self.pool = BlockPool(config.num_blocks)
        self.reserved_blocks = 0  # held from the start, by no sequence
        if config.scheduler == "v1" or config.prefix_caching:
            # Freed unhashed blocks are reused first, cached ones only once none is left: vLLM
            # v1's free queue, and v0's prefix-caching allocator (a hashless block, else it
            # evicts the least recently used cached one).
            self.pool.uncached_first = True
        if config.scheduler == "v1":  # vLLM v1: block 0 is the null block, never handed out
            self.pool.allocate_specific([NULL_BLOCK])
            self.reserved_blocks = 1
        self.cpu = CpuBlocks(config.num_cpu_blocks)
        self.usage = Usage()
        self._fill = [0] * config.num_blocks  # tokens held by each physical block
        # block -> {seq: logical index}: O(1) to drop one holder of a widely shared block.
        self._holders: dict[int, dict[str, int]] = {}
        self.prefix = PrefixCache(config, self.pool, events)
        # Whether a partly filled block may be shared (only a fork or a swapped-in group shares
        # one; a prefix-cache hit shares full blocks): until then a decode step takes a block
        # only at a boundary. Never cleared but by a restore that finds none.
        self._partial_shared = False

    # -- queries ----------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self.pool.num_free

    def fill(self, block: int) -> int:
        return self._fill[block]

    def fills(self) -> list[int]:  # a copy: the caller may keep it
        return list(self._fill)

    def holders(self, block: int) -> list[tuple[str, int]]:
        """(sequence, logical index) pairs whose tables hold ``block``."""
        return list(self._holders.get(block, {}).items())

    def holders_map(self) -> dict[int, tuple[tuple[str, int], ...]]:
        return {block: tuple(h.items()) for block, h in self._holders.items()}

    @property
    def cpu_pool(self) -> BlockPool | None:
        return self.cpu.pool

    @property
    def cpu_free(self) -> int:
        return self.cpu.num_free

    def contiguous_reservation(self, num_tokens: int) -> int:
        return self.config.blocks_for(max(self._max_model_len, num_tokens))

    def _add_fill(self, block: int, tokens: int) -> None:
        self._fill[block] += tokens
        self.usage.slots_filled += tokens

    # -- holding and releasing -----------------------------------------------------------
    def _hold(self, block: int, seq_id: str, index: int) -> None:
        self._holders.setdefault(block, {})[seq_id] = index

    def _take(self, count: int, placement: list[int] | None = None) -> list[int]:
        """Blocks off the free queue (LRU first, or the placement's); evictions announced."""
        evicted: list[int] = []
        if placement is not None:
            blocks = self.pool.allocate_specific(placement, evicted)
        elif count == 1:  # (once a block of tokens: the pool's single-block path)
            block, was_cached = self.pool.allocate_one()
            blocks, evicted = [block], [block] if was_cached else evicted
        else:
            blocks = self.pool.allocate(count, evicted)
        if self.events.enabled:  # (a run without events evicts most blocks it takes: no call each)
            for block in evicted:
                self.events.emit(ev.BlockEvicted(block))
        for block in blocks:
            self._fill[block] = 0  # an evicted block's old tokens no longer count
        return blocks

    def _append_blocks(self, seq: Sequence, blocks: list[int]) -> None:
        """``blocks``, just off the free queue (no holders yet), become ``seq``'s next ones."""
        table, holders, seq_id = seq.block_table, self._holders, seq.seq_id
        first = len(table)
        table.extend(blocks)
        for index, block in enumerate(blocks, first):
            holders[block] = {seq_id: index}
        if self.events.enabled:
            for index, block in enumerate(blocks, first):
                self.events.emit(ev.BlockAllocated(block, seq_id, index))

    def _new_block(self, seq: Sequence) -> None:
        """One block off the free queue becomes ``seq``'s next logical block (once a block of
        tokens): :meth:`_take` and :meth:`_append_blocks` of one block, in one call."""
        block, was_cached = self.pool.allocate_one()
        if was_cached and self.events.enabled:
            self.events.emit(ev.BlockEvicted(block))
        self._fill[block] = 0
        table = seq.block_table
        index = len(table)
        table.append(block)
        self._holders[block] = {seq.seq_id: index}
        if self.events.enabled:
            self.events.emit(ev.BlockAllocated(block, seq.seq_id, index))

    def _release(self, blocks, seq_id: str) -> None:
        """``seq_id`` lets go of each of ``blocks``, in order (a freed table's, last first)."""
        release, hash_of, holders_of, fill, usage = (
            self.pool.release,
            self.pool._hash_of,
            self._holders,
            self._fill,
            self.usage,
        )
        add_event = self.events.add if self.events.enabled else None
        for block in blocks:
            ref_count = release(block)
            holders = holders_of[block]
            del holders[seq_id]
            if not holders:
                del holders_of[block]
            if ref_count == 0:
                usage.slots_filled -= fill[block]
                if block not in hash_of:  # a cached block keeps its tokens for reuse
                    fill[block] = 0
                if add_event is not None:
                    add_event(ev.BlockFreed, block, seq_id)
            else:
                usage.ref_changed(ref_count, up=False)
                if add_event is not None:
                    add_event(ev.BlockReleased, block, seq_id, ref_count)

    # -- allocate: a new sequence's blocks ---------------------------------------------------
    def allocation_need(self, num_tokens: int, hits: list[tuple[int, int]]) -> int:
        """Blocks an allocation takes off the free queue (a hit on a free cached block too)."""
        new = self.config.blocks_for(num_tokens) - len(hits)
        refs = self.pool._ref_counts  # (hits name blocks of this pool: no id to check)
        return new + [refs[block] for block, _ in hits].count(0)

    def can_allocate(self, num_tokens: int, hits: list[tuple[int, int]]) -> bool:
        return self.allocation_need(num_tokens, hits) <= self.pool.num_free

    def allocate(
        self, seq: Sequence, num_tokens: int, hits: list[tuple[int, int]], placement: list[int] | None = None
    ) -> None:
        """The empty ``seq``'s prefix-cache hits, then fresh blocks (``placement``: these) for the rest
        of a ``num_tokens`` prompt, whose tokens :meth:`append` adds; :meth:`can_allocate` was checked."""
        refs, usage, reuse, add_event = self.pool._ref_counts, self.usage, self.pool.reuse, self.events.add
        for index, (block, _) in enumerate(hits):  # (hits name cached blocks of this pool)
            was_free = refs[block] == 0
            ref_count = reuse(block)
            if was_free:
                usage.slots_filled += self._fill[block]  # its cached tokens count again
            usage.ref_changed(ref_count, up=True)
            self._hold(block, seq.seq_id, index)
            if self.events.enabled:
                add_event(ev.BlockReused, block, seq.seq_id, index, ref_count, was_free)
        seq.block_table.extend(block for block, _ in hits)
        seq.block_hashes.extend(h for _, h in hits)
        self.usage.count_tokens(None, 0, self.contiguous_reservation)
        needed = self.config.blocks_for(num_tokens) - len(hits)
        self._append_blocks(seq, self._take(needed, placement))  # all at once: evictions are announced first

    # -- append: new tokens of a live sequence -------------------------------------------------
    def append_plan(self, seq: Sequence, num_new: int) -> AppendPlan:
        bs = self.config.block_size
        n = seq.num_tokens
        copy = n % bs != 0 and bool(seq.block_table) and self.pool.ref_count(seq.block_table[-1]) > 1
        return AppendPlan(self.config.blocks_for(n + num_new) - len(seq.block_table), copy)

    def append_need(self, seq: Sequence, num_new: int) -> int:
        """:meth:`append_plan`'s ``blocks_needed``, without building the plan (once a grow)."""
        table, n, bs = seq.block_table, len(seq.token_ids), self.config.block_size
        need = (n + num_new + bs - 1) // bs - len(table)
        if self._partial_shared and n % bs and table and self.pool._ref_counts[table[-1]] > 1:
            need += 1  # copy-on-write of the shared, partly filled last block
        return need

    def can_append(self, seq: Sequence, num_new: int) -> bool:
        return self.append_need(seq, num_new) <= self.pool.num_free

    def decode_blocks_needed(self, seqs: list[Sequence]) -> int:
        """Blocks a decode step may take: one at each boundary, one per shared last block (an
        upper bound)."""
        bs, refs = self.config.block_size, self.pool._ref_counts
        if not self._partial_shared:  # (a last block off a boundary is partly filled: none is shared)
            return len([q for q in seqs if len(q.token_ids) % bs == 0])
        return len([q for q in seqs if len(q.token_ids) % bs == 0 or refs[q.block_table[-1]] > 1])

    def decode_needs(self, seqs: list[Sequence]) -> list[int]:
        """:meth:`append_need` of one token for each of ``seqs``, at once."""
        bs, refs = self.config.block_size, self.pool._ref_counts
        needs = [len(q.token_ids) // bs + 1 - len(q.block_table) for q in seqs]
        if self._partial_shared:  # copy-on-write of a shared, partly filled last block
            copies = [len(q.token_ids) % bs != 0 and refs[q.block_table[-1]] > 1 for q in seqs]
            needs = [n + copy for n, copy in zip(needs, copies, strict=True)]
        return needs

    def decode_fits(self, seqs: list[Sequence]) -> bool:
        """The free pool covers a decode step of ``seqs`` (each takes at most one block)."""
        free = self.pool.num_free
        return len(seqs) <= free or self.decode_blocks_needed(seqs) <= free

    def decode_covered(self, seqs: list[Sequence], lengths: list[int]) -> int:
        """How many of ``seqs``, from the first, the free pool covers a decode step of
        (``lengths``: theirs). A sequence off a block boundary takes no block unless its
        shared last block must be copied, so mostly only the boundaries are looked at."""
        free = self.pool.num_free
        if len(seqs) <= free:
            return len(seqs)
        if self._partial_shared:
            return bisect_right(list(accumulate(self.decode_needs(seqs))), free)
        bs, taken, i = self.config.block_size, 0, -1
        offsets = [n % bs for n in lengths]
        try:
            while True:  # (each boundary found by list.index, in C)
                i = offsets.index(0, i + 1)
                taken += lengths[i] // bs + 1 - len(seqs[i].block_table)
                if taken > free:
                    return i
        except ValueError:  # no boundary left
            return len(seqs)

    def append(
        self,
        seqs: list[Sequence],
        token_ids: abc.Sequence[Any],  # a TokenIds per sequence, or one int each
        skip: int = 0,
        with_slots: bool = True,
        starts: list[int] | None = None,
    ) -> Appended:
        """The one append path (a prompt, a grow, a decode step): ``token_ids[i]`` join
        ``seqs[i]`` with copy-on-write of a shared last block, new blocks at boundaries, the
        fills, the slots (but the first ``skip``, held by prefix hits) and the hashes of
        blocks that filled up. ``token_ids`` may instead hold one plain int per sequence: a
        decode step's one token each. The caller has checked the blocks needed against the pool.
        ``with_slots=False``: no K/V is written, so unless events are on no slot is listed.
        ``starts``: the sequences' lengths before, when the caller has them."""
        done = Appended([], [])
        if starts is None:
            starts = [len(seq.token_ids) for seq in seqs]
        if token_ids and type(token_ids[0]) is int:
            self._append_one_each(seqs, token_ids, starts, with_slots, done)
            added = len(seqs)
        elif not skip and all(len(ids) == 1 for ids in token_ids):  # (a grow by one)
            self._append_one_each(seqs, [ids[0] for ids in token_ids], starts, with_slots, done)
            added = len(seqs)
        else:
            self._append_lists(seqs, token_ids, starts, skip, with_slots, done)
            added = sum(map(len, token_ids))
        self.usage.logical_tokens += added
        # (skip < each prompt's length: the last prompt block is never a hit)
        self.usage.slots_filled += added - skip * len(seqs)
        return done

    def _append_one_each(
        self, seqs: list[Sequence], tokens: abc.Sequence[int], starts: list[int], with_slots: bool, done: Appended
    ) -> None:
        """:meth:`append` of a decode step: one token each, into the last block's next slot
        (``starts``: the sequences' lengths before)."""
        bs, refs, fill, slots = self.config.block_size, self.pool._ref_counts, self._fill, done.slots
        emit = self.events.emit if self.events.enabled else None
        list_slots = with_slots or emit is not None
        limit = self._max_model_len
        fills_at = bs - 1 if self.config.prefix_caching else -1  # a token at this offset fills its block
        partial_shared = self._partial_shared  # (else no last block off a boundary is shared)
        for seq, token, start in zip(seqs, tokens, starts, strict=True):
            table = seq.block_table
            offset = start % bs
            if not offset:
                if len(table) * bs <= start:  # (a one-token prompt's block came with the sequence)
                    self._new_block(seq)
            elif partial_shared and refs[table[-1]] > 1:
                done.copies.append(self._copy_on_write(seq))
            seq.token_ids.append(token)
            block = table[-1]
            fill[block] += 1
            if list_slots:
                slots.append(block * bs + offset)
                if emit is not None:
                    emit(ev.TokenWritten(seq.seq_id, start, token, block, offset))
            if start >= limit:  # past a contiguous reservation's length, the baseline grows too
                self._grow_reservation(start, start + 1)
            if offset == fills_at:  # the block filled up: hash it for the prefix cache
                self.prefix.cache_full_blocks(seq)

    def _append_lists(
        self,
        seqs: list[Sequence],
        token_ids: abc.Sequence[TokenIds],
        starts: list[int],
        skip: int,
        with_slots: bool,
        done: Appended,
    ) -> None:
        """:meth:`append` of a list of tokens per sequence (a prompt, a grow, a recompute)."""
        bs, refs, fill, slots = self.config.block_size, self.pool._ref_counts, self._fill, done.slots
        emit = self.events.emit if self.events.enabled else None
        list_slots = with_slots or emit is not None
        caching, limit = self.config.prefix_caching, self._max_model_len
        for seq, ids, start in zip(seqs, token_ids, starts, strict=True):
            table = seq.block_table
            if start % bs and refs[table[-1]] > 1:
                done.copies.append(self._copy_on_write(seq))
            end = start + len(ids)
            while len(table) * bs < end:
                self._new_block(seq)
            seq.token_ids.extend(ids)
            first = start + skip
            if list_slots:
                for position in range(first, end):
                    block, at = table[position // bs], position % bs
                    slots.append(block * bs + at)
                    if emit is not None:
                        emit(ev.TokenWritten(seq.seq_id, position, ids[position - start], block, at))
            for index in range(first // bs, (end - 1) // bs + 1):  # the fills, a block at a time
                fill[table[index]] += min(index * bs + bs, end) - max(index * bs, first)
            if end > limit:
                self._grow_reservation(start, end)
            if caching and end // bs != start // bs:  # a block filled up: hash it for the prefix cache
                self.prefix.cache_full_blocks(seq)

    def _grow_reservation(self, old: int, new: int) -> None:
        """A sequence grew from ``old`` to ``new`` tokens past a contiguous reservation's length."""
        self.usage.contiguous_blocks += self.contiguous_reservation(new) - self.contiguous_reservation(old)

    def _copy_on_write(self, seq: Sequence) -> tuple[int, int]:
        index = len(seq.block_table) - 1
        src = seq.block_table[index]
        (dst,) = self._take(1)
        self._add_fill(dst, self._fill[src])
        seq.block_table[index] = dst
        self._hold(dst, seq.seq_id, index)
        self.events.add(ev.BlockAllocated, dst, seq.seq_id, index)
        self.events.add(ev.BlockCopied, src, dst, seq.seq_id, index)
        self._release((src,), seq.seq_id)
        return src, dst

    # -- fork and free ----------------------------------------------------------------------------
    def fork(self, parent: Sequence, child: Sequence) -> None:
        """``child`` (a copy of ``parent``'s tokens and table) shares every block."""
        if child.num_tokens % self.config.block_size:
            self._partial_shared = True
        self.usage.count_tokens(None, child.num_tokens, self.contiguous_reservation)
        for index, block in enumerate(child.block_table):
            ref_count = self.pool.share(block)
            self._hold(block, child.seq_id, index)
            self.usage.ref_changed(ref_count, up=True)
            self.events.add(ev.BlockShared, block, child.seq_id, index, ref_count)

    def free(self, seq: Sequence) -> None:
        self.pool.begin_release()
        self._release(reversed(seq.block_table), seq.seq_id)
        self.usage.count_tokens(seq.num_tokens, None, self.contiguous_reservation)

    # -- swapping -----------------------------------------------------------------------------------
    def can_swap_out(self, seqs: list[Sequence]) -> bool:
        return len(distinct_blocks(seqs)) <= self.cpu_free

    def swap_out(self, seqs: list[Sequence]) -> list[tuple[int, int]]:
        """Move a group's blocks to the CPU pool (shared blocks once) and free them on the
        GPU; the tables then name CPU blocks. Returns the (gpu, cpu) block pairs to copy."""
        to_cpu = self.cpu.take(seqs, distinct_blocks(seqs))
        for gpu, cpu in to_cpu.items():
            self.events.add(ev.BlockSwappedOut, gpu, cpu)
        for seq in seqs:
            self.free(seq)
            seq.block_table = [to_cpu[b] for b in seq.block_table]
        return list(to_cpu.items())

    def can_swap_in(self, seqs: list[Sequence]) -> bool:
        return len(distinct_blocks(seqs)) <= self.pool.num_free

    def swap_in(self, seqs: list[Sequence]) -> list[tuple[int, int]]:
        """Bring a swapped group back: new GPU blocks, the same sharing, the hashes again.
        Returns the (cpu, gpu) block pairs to copy."""
        cpu_blocks = distinct_blocks(seqs)
        gpu_blocks = self._take(len(cpu_blocks))
        to_gpu = dict(zip(cpu_blocks, gpu_blocks, strict=True))
        for cpu, gpu in to_gpu.items():
            self.events.add(ev.BlockSwappedIn, cpu, gpu)
        bs = self.config.block_size
        placed = set()
        self.cpu.release(seqs)
        for seq in seqs:
            seq.block_table = [to_gpu[b] for b in seq.block_table]
            for index, block in enumerate(seq.block_table):
                if block in placed:
                    self._partial_shared = True
                    self.usage.ref_changed(self.pool.share(block), up=True)
                else:
                    placed.add(block)
                    self._add_fill(block, min(bs, seq.num_tokens - index * bs))
                self._hold(block, seq.seq_id, index)
            self.usage.count_tokens(None, seq.num_tokens, self.contiguous_reservation)
            if self.config.prefix_caching:
                self.prefix.recache(seq)
        return list(to_gpu.items())

    # -- snapshots ---------------------------------------------------------------------------------
    def snapshot(self) -> BlockManagerSnapshot:
        return BlockManagerSnapshot(
            pool=self.pool.snapshot(),
            block_fill=tuple(self._fill),
            usage=self.usage.copy(),
            prefix_counts=(self.prefix.lookups, self.prefix.hits),
            cpu_pool=self.cpu.snapshot(),
        )

    def restore(self, snap: BlockManagerSnapshot, sequences: Iterable[Sequence]) -> None:
        """Back to ``snap``, with ``sequences`` (the GPU ones, in the engine's order) as they
        were then. Holders are rebuilt from the tables: a sequence only starts sharing a block
        when it is created (fork, prefix hit), so walking the sequences in the order they were
        added gives each block's holders in the order they took it."""
        self.pool.restore(snap.pool)
        self._fill = list(snap.block_fill)
        self._holders = holders_from_tables(sequences)
        self.usage = snap.usage.copy()
        self.prefix.lookups, self.prefix.hits = snap.prefix_counts
        self.cpu.restore(snap.cpu_pool)
        bs, fill = self.config.block_size, self._fill
        self._partial_shared = any(refs > 1 and fill[b] < bs for b, refs in enumerate(self.pool._ref_counts))
