"""The simulated serving engine: applies operations atomically, runs attention, emits events.

Every ``apply`` first plans the operation against the current state (raising a
:class:`~core.errors.PagesimError` if it cannot be done) and only then mutates, so a
refused operation leaves the pool, the tables and the KV data exactly as they were.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from core import events as ev
from core.blocks import BlockPool, PoolSnapshot
from core.config import CacheConfig
from core.errors import (
    DuplicateSequenceError,
    InvalidOperationError,
    InvalidPlacementError,
    PoolExhaustedError,
    UnknownSequenceError,
)
from core.kv_cache import ContiguousKVCache, PagedKVCache
from core.metrics import Metrics
from core.operations import Add, Fork, Free, Grow, Operation, Schedule, Submit
from core.sequence import Sequence, block_hash
from core.token_model import VOCAB_SIZE, TokenModel
from kernels.backend import Backend, default_scale, select_backend
from kernels.reference import dense_attention_rows


class DiscardedEvents(list):
    """An event sink that keeps nothing."""

    def append(self, event) -> None:
        pass


@dataclass(frozen=True)
class AttentionReport:
    """One decode step over every live sequence: the kernel's inputs, its output and dense's."""

    backend: str
    device: str
    seq_ids: tuple[str, ...]
    query: np.ndarray  # (num_seqs, num_heads, head_dim), cache dtype
    block_tables: np.ndarray  # (num_seqs, max_blocks) int32
    context_lens: np.ndarray  # (num_seqs,) int32
    scale: float
    output: np.ndarray  # (num_seqs, num_heads, head_dim) float32, the paged kernel's
    dense: np.ndarray  # same shape, dense SDPA on the same tokens
    tolerance: float
    kernel_seconds: float
    dense_seconds: float

    @property
    def head_errors(self) -> np.ndarray:
        """Max abs error per (sequence, head)."""
        return np.abs(self.output - self.dense).max(axis=2)

    @property
    def max_abs_error(self) -> float:
        return float(self.head_errors.max()) if self.seq_ids else 0.0

    @property
    def passed(self) -> bool:
        return self.max_abs_error <= self.tolerance

    def index_of(self, seq_id: str) -> int:
        return self.seq_ids.index(seq_id)


@dataclass(frozen=True)
class StepResult:
    step: int  # 1-based: the state after this many operations
    op: Operation
    events: tuple[ev.Event, ...]
    metrics: Metrics
    attention: AttentionReport | None


@dataclass(frozen=True)
class SimulatorSnapshot:
    step: int
    pool: PoolSnapshot
    sequences: tuple[Sequence, ...]
    block_fill: tuple[int, ...]
    cache: tuple[object, object]
    dense: ContiguousKVCache
    last_query: dict[str, np.ndarray]
    prefix_counts: tuple[int, int]
    last_attention: AttentionReport | None
    swapped: tuple[Sequence, ...] = ()
    cpu: tuple | None = None  # (CPU pool snapshot, keys, values)
    scheduler: object | None = None  # SchedulerSnapshot


class Simulator:
    def __init__(self, config: CacheConfig, backend: Backend | None = None, kv_data: bool = True) -> None:
        """``kv_data=False`` simulates memory management only: token ids, blocks, tables and
        the prefix cache, with no K/V computed or stored and no attention (for large
        workloads through the scheduler)."""
        self.config = config
        self.kv_data = kv_data
        self.backend = backend or select_backend("auto" if kv_data else "cpu")
        self.model = TokenModel(config)
        self.pool = BlockPool(config.num_blocks)
        self.cache = PagedKVCache(config, self.backend) if kv_data else None
        self.sequences: dict[str, Sequence] = {}
        self.step = 0
        self.last_attention: AttentionReport | None = None
        self._dense = ContiguousKVCache(config.num_kv_heads, config.head_dim)
        self._block_fill = [0] * config.num_blocks  # tokens held by each physical block
        # Running totals, so metrics() is O(1) per step.
        self._slots_filled = 0
        self._shared_blocks = 0
        self._logical_tokens = 0
        self._contiguous_blocks = 0
        # block -> {seq: logical index}: O(1) to drop one holder of a widely shared block.
        self._holders: dict[int, dict[str, int]] = {}
        self._last_query: dict[str, np.ndarray] = {}  # q of each sequence's newest token (float32)
        # Dense reference outputs by sequence, with the write count they were computed at:
        # a sequence whose tokens did not change has the same dense answer as last step.
        self._writes: dict[str, int] = {}
        self._dense_out: dict[str, tuple[int, np.ndarray]] = {}
        self._prefix_lookups = 0  # full prompt blocks looked up in the prefix cache
        self._prefix_hits = 0  # ... and found there
        self._scheduler = None
        # Preemption by swap: sequences whose blocks wait in a CPU pool, off the GPU.
        self.swapped: dict[str, Sequence] = {}
        self.cpu_pool: BlockPool | None = None
        self._cpu_key: np.ndarray | None = None
        self._cpu_value: np.ndarray | None = None

    # -- queries ----------------------------------------------------------------
    def sequence(self, seq_id: str) -> Sequence:
        try:
            return self.sequences[seq_id]
        except KeyError:
            raise UnknownSequenceError(seq_id, list(self.sequences)) from None

    def block_fill(self, block_id: int) -> int:
        return self._block_fill[block_id]

    def block_fills(self) -> list[int]:
        return list(self._block_fill)

    def holders(self, block_id: int) -> list[tuple[str, int]]:
        """(sequence, logical index) pairs whose tables hold ``block_id``."""
        return list(self._holders.get(block_id, {}).items())

    def holders_map(self) -> dict[int, tuple[tuple[str, int], ...]]:
        """Every held block -> its (sequence, logical index) pairs."""
        return {block: tuple(holders.items()) for block, holders in self._holders.items()}

    def _hold(self, block: int, seq_id: str, index: int) -> None:
        self._holders.setdefault(block, {})[seq_id] = index

    def _contiguous_reservation(self, num_tokens: int) -> int:
        return self.config.blocks_for(max(self.config.max_model_len, num_tokens))

    def metrics(self) -> Metrics:
        c = self.config
        used = self.pool.num_used
        return Metrics(
            step=self.step,
            num_sequences=len(self.sequences),
            used_blocks=used,
            free_blocks=self.pool.num_free,
            shared_blocks=self._shared_blocks,
            logical_tokens=self._logical_tokens,
            slots_allocated=used * c.block_size,
            slots_filled=self._slots_filled,
            contiguous_blocks=self._contiguous_blocks,
            prefix_lookup_blocks=self._prefix_lookups,
            prefix_hit_blocks=self._prefix_hits,
            cached_free_blocks=self.pool.num_cached_free() if c.prefix_caching else 0,
        )

    def dense_kv(self, seq_id: str) -> tuple[np.ndarray, np.ndarray]:
        """The sequence's K/V as the dense reference holds them (contiguous, from the tokens)."""
        self.sequence(seq_id)
        return self._dense.view(seq_id)

    def warm_up(self) -> None:
        """Compile (or load from the on-disk cache) the kernel for this cache's dtype."""
        c = self.config
        query = self.backend.to_device(np.zeros((1, c.num_heads, c.head_dim), dtype=self.cache.dtype))
        tables, lens = np.zeros((1, 1), np.int32), np.ones(1, np.int32)
        self.backend.paged_attention(query, self.cache.key_cache, self.cache.value_cache, tables, lens, 1.0)

    # -- operations -------------------------------------------------------------
    def apply(self, op: Operation, attend: bool = True, record: bool = True) -> StepResult:
        """Validate ``op``, apply it, then (if ``attend``) run decode attention for every
        sequence. ``record=False`` drops the step's events (large simulations)."""
        events: list[ev.Event] = [] if record else DiscardedEvents()
        self.execute(op, events)
        self.step += 1
        self.last_attention = self._attend(events) if attend and self.kv_data else None
        return StepResult(self.step, op, tuple(events), self.metrics(), self.last_attention)

    def execute(self, op: Operation, events: list) -> None:
        """Validate and apply one operation, appending its events; no attention, no step."""
        if isinstance(op, Submit | Schedule):
            self.scheduler.execute(op, events)
            return
        if isinstance(op, Grow | Free) and self._scheduler is not None:
            owner = self._scheduler.owner_of(op.seq)
            if owner is not None:
                raise InvalidOperationError(
                    f"sequence {op.seq!r} belongs to request {owner!r}: the scheduler grows and frees it"
                )
        self.execute_direct(op, events)

    def execute_direct(self, op: Operation, events: list) -> None:
        """:meth:`execute` without the ownership check: the scheduler's own path."""
        handler = {Add: self._add, Grow: self._grow, Fork: self._fork, Free: self._free}.get(type(op))
        if handler is None:
            raise InvalidOperationError(f"not an operation: {op!r}")
        handler(op, events)

    @property
    def scheduler(self):
        """The request scheduler (created on first use; its state is part of this engine's)."""
        if self._scheduler is None:
            from core.scheduler import Scheduler

            self._scheduler = Scheduler(self)
        return self._scheduler

    def _check_new_id(self, seq_id: str) -> None:
        if seq_id in self.sequences:
            raise DuplicateSequenceError(seq_id)

    @staticmethod
    def _check_vocab(token_ids, field: str) -> None:
        if not token_ids or (min(token_ids) >= 0 and max(token_ids) < VOCAB_SIZE):
            return
        bad = [t for t in token_ids if not 0 <= t < VOCAB_SIZE]
        if bad:
            raise InvalidOperationError(f"{field}: token id {bad[0]} is outside the vocabulary [0, {VOCAB_SIZE})")

    def _cached_prefix(self, token_ids: list[int]) -> list[tuple[int, int]]:
        """(block, hash) of the cached full blocks this prompt starts with. The block of the
        last prompt token is never reused: its query must be computed."""
        bs = self.config.block_size
        hits: list[tuple[int, int]] = []
        parent = None
        for i in range((len(token_ids) - 1) // bs):
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            h = block_hash(parent, chunk)
            block = self.pool.cached_block(h, chunk)
            if block is None:
                break
            hits.append((block, h))
            parent = h
        return hits

    def _add(self, op: Add, events: list) -> None:
        self._check_new_id(op.seq)
        token_ids = list(op.prompt) if op.prompt is not None else self.model.token_ids(op.seq, 0, op.num_tokens)
        self._check_vocab(token_ids, "prompt")
        caching = self.config.prefix_caching and op.blocks is None
        hits = self._cached_prefix(token_ids) if caching else []
        needed = self.config.blocks_for(len(token_ids)) - len(hits)
        if op.blocks is not None:
            blocks = self.pool.check_placement(op.blocks)
            if len(blocks) != needed:
                raise InvalidPlacementError(
                    f"{len(token_ids)} tokens at block size {self.config.block_size} need exactly "
                    f"{needed} block(s); placement names {len(blocks)}"
                )
        else:
            # A hit on a free cached block takes it out of the free queue too.
            taken = needed + sum(1 for block, _ in hits if self.pool.ref_count(block) == 0)
            if taken > self.pool.num_free:
                raise PoolExhaustedError(taken, self.pool.num_free, f"add {op.seq} ({len(token_ids)} tokens)")
        # -- validated; mutate --
        seq = Sequence(op.seq)
        self.sequences[op.seq] = seq
        self._dense.add(op.seq)
        events.append(ev.SequenceAdded(op.seq, len(token_ids)))
        for index, (block, h) in enumerate(hits):
            was_free = self.pool.ref_count(block) == 0
            ref_count = self.pool.reuse(block)
            if was_free:
                self._slots_filled += self._block_fill[block]
            self._shared_blocks += ref_count == 2
            seq.block_table.append(block)
            seq.block_hashes.append(h)
            self._hold(block, op.seq, index)
            events.append(ev.BlockReused(block, op.seq, index, ref_count, was_free))
        if caching:
            self._prefix_lookups += (len(token_ids) - 1) // self.config.block_size
            self._prefix_hits += len(hits)
        blocks = self._allocate(needed, events, op.blocks)
        for index, block in enumerate(blocks, start=len(hits)):
            seq.block_table.append(block)
            self._hold(block, op.seq, index)
            events.append(ev.BlockAllocated(block, op.seq, index))
        self._write_tokens(seq, token_ids, events, cached=len(hits) * self.config.block_size)

    def _allocate(self, count: int, events: list, placement=None) -> list[int]:
        evicted: list[int] = []
        if placement is not None:
            blocks = self.pool.allocate_specific(placement, evicted)
        else:
            blocks = self.pool.allocate(count, evicted)
        for block in evicted:
            events.append(ev.BlockEvicted(block))
        for block in blocks:
            self._block_fill[block] = 0  # an evicted block's old tokens no longer count
        return blocks

    def _grow(self, op: Grow, events: list) -> None:
        seq = self.sequence(op.seq)
        if op.token_ids is not None:
            token_ids = list(op.token_ids)
        else:
            token_ids = self.model.token_ids(op.seq, seq.num_tokens, op.num_tokens)
        self._check_vocab(token_ids, "token_ids")
        bs = self.config.block_size
        n = seq.num_tokens
        needs_copy = n % bs != 0 and self.pool.ref_count(seq.block_table[-1]) > 1
        new_blocks = self.config.blocks_for(n + len(token_ids)) - len(seq.block_table)
        needed = new_blocks + int(needs_copy)
        if needed > self.pool.num_free:
            raise PoolExhaustedError(needed, self.pool.num_free, f"grow {op.seq} by {len(token_ids)}")
        # -- validated; mutate --
        if needs_copy:
            self._copy_on_write(seq, events)
        for _ in range(new_blocks):
            (block,) = self._allocate(1, events)
            seq.block_table.append(block)
            self._hold(block, seq.seq_id, len(seq.block_table) - 1)
            events.append(ev.BlockAllocated(block, seq.seq_id, len(seq.block_table) - 1))
        self._write_tokens(seq, token_ids, events)

    def _copy_on_write(self, seq: Sequence, events: list) -> None:
        index = len(seq.block_table) - 1
        src = seq.block_table[index]
        (dst,) = self._allocate(1, events)
        if self.kv_data:
            self.cache.copy_block(src, dst)
        self._block_fill[dst] = self._block_fill[src]
        self._slots_filled += self._block_fill[src]
        seq.block_table[index] = dst
        self._hold(dst, seq.seq_id, index)
        events.append(ev.BlockAllocated(dst, seq.seq_id, index))
        events.append(ev.BlockCopied(src, dst, seq.seq_id, index))
        self._release(src, seq.seq_id, events)

    def _fork(self, op: Fork, events: list) -> None:
        parent = self.sequence(op.seq)
        self._check_new_id(op.new_seq)
        child = parent.copy(op.new_seq)
        self.sequences[op.new_seq] = child
        self._dense.fork(op.seq, op.new_seq)
        self._writes[op.new_seq] = 0
        if self.kv_data:
            self._last_query[op.new_seq] = self._last_query[op.seq]
        self._logical_tokens += child.num_tokens
        self._contiguous_blocks += self._contiguous_reservation(child.num_tokens)
        events.append(ev.SequenceForked(op.seq, op.new_seq))
        for index, block in enumerate(child.block_table):
            ref_count = self.pool.share(block)
            self._hold(block, op.new_seq, index)
            self._shared_blocks += ref_count == 2
            events.append(ev.BlockShared(block, op.new_seq, index, ref_count))

    def _free(self, op: Free, events: list) -> None:
        seq = self.sequence(op.seq)
        for block in reversed(seq.block_table):
            self._release(block, op.seq, events)
        del self.sequences[op.seq]
        self._dense.free(op.seq)
        self._last_query.pop(op.seq, None)
        self._writes.pop(op.seq, None)
        self._dense_out.pop(op.seq, None)
        self._logical_tokens -= seq.num_tokens
        self._contiguous_blocks -= self._contiguous_reservation(seq.num_tokens)
        events.append(ev.SequenceFreed(op.seq))

    def _release(self, block: int, seq_id: str, events: list) -> None:
        ref_count = self.pool.release(block)
        holders = self._holders[block]
        del holders[seq_id]
        if not holders:
            del self._holders[block]
        if ref_count == 0:
            self._slots_filled -= self._block_fill[block]
            if not self.pool.is_cached(block):  # a cached block keeps its tokens for reuse
                self._block_fill[block] = 0
            events.append(ev.BlockFreed(block, seq_id))
        else:
            self._shared_blocks -= ref_count == 1
            events.append(ev.BlockReleased(block, seq_id, ref_count))

    # -- KV writes --------------------------------------------------------------
    def _write_tokens(self, seq: Sequence, token_ids: list[int], events: list, cached: int = 0) -> None:
        """Append tokens: every one to the dense reference, all but the first ``cached``
        (already in reused prefix blocks) to the paged cache."""
        bs = self.config.block_size
        start = seq.num_tokens
        written = range(cached, len(token_ids))
        blocks = [seq.block_table[(start + i) // bs] for i in written]
        if self.kv_data:
            positions = np.arange(start, start + len(token_ids))
            queries, keys, values = self.model.qkv(token_ids, positions)
            self._last_query[seq.seq_id] = queries[-1]  # the decode query until the next write
            keys, values = keys.astype(self.cache.dtype), values.astype(self.cache.dtype)
            slots = np.array([b * bs + (start + i) % bs for b, i in zip(blocks, written, strict=True)], np.int64)
            if len(slots):
                self.cache.write(slots, keys[cached:], values[cached:])
            self._dense.append(seq.seq_id, keys, values)
        self._contiguous_blocks += self._contiguous_reservation(start + len(token_ids))
        self._contiguous_blocks -= self._contiguous_reservation(start) if start else 0
        self._logical_tokens += len(token_ids)
        seq.token_ids.extend(token_ids)
        self._writes[seq.seq_id] = self._writes.get(seq.seq_id, 0) + 1
        emit = not isinstance(events, DiscardedEvents)
        for block, i in zip(blocks, written, strict=True):
            self._block_fill[block] += 1
            if emit:
                position = start + i
                events.append(ev.TokenWritten(seq.seq_id, position, token_ids[i], block, position % bs))
        self._slots_filled += len(blocks)
        if self.config.prefix_caching:
            self._cache_full_blocks(seq, events)

    def decode_blocks_needed(self, seqs: list[Sequence]) -> int:
        """Blocks a decode step of ``seqs`` may take: one at each block boundary, one for
        each shared last block (copy-on-write); an upper bound when siblings share one."""
        bs, refs = self.config.block_size, self.pool._ref_counts
        return sum(1 for q in seqs if len(q.token_ids) % bs == 0 or refs[q.block_table[-1]] > 1)

    def decode(self, seq_ids: list[str], events: list, checked: bool = False) -> None:
        """One new token for each sequence at once (a decode step), validated as a whole:
        a new block at a block boundary, copy-on-write into a shared last block.
        ``checked``: the caller has just compared :meth:`decode_blocks_needed` with the pool."""
        bs = self.config.block_size
        seqs = [self.sequence(s) for s in seq_ids]
        refs = self.pool._ref_counts
        positions = [len(q.token_ids) for q in seqs]
        if not checked and (need := self.decode_blocks_needed(seqs)) > self.pool.num_free:
            raise PoolExhaustedError(need, self.pool.num_free, f"a decode step of {len(seqs)} sequences")
        tokens = self.model.next_token_ids(seq_ids, positions)
        emit = not isinstance(events, DiscardedEvents)
        fill, limit = self._block_fill, self.config.max_model_len
        for seq, token, n in zip(seqs, tokens, positions, strict=True):
            if n % bs == 0:
                (block,) = self._allocate(1, events)
                seq.block_table.append(block)
                self._hold(block, seq.seq_id, len(seq.block_table) - 1)
                if emit:
                    events.append(ev.BlockAllocated(block, seq.seq_id, len(seq.block_table) - 1))
            elif refs[seq.block_table[-1]] > 1:
                self._copy_on_write(seq, events)
            block = seq.block_table[-1]
            seq.token_ids.append(token)
            self._writes[seq.seq_id] = self._writes.get(seq.seq_id, 0) + 1
            fill[block] += 1
            if n + 1 > limit:
                self._contiguous_blocks += self._contiguous_reservation(n + 1) - self._contiguous_reservation(n)
            if emit:
                events.append(ev.TokenWritten(seq.seq_id, n, token, block, n % bs))
            if self.config.prefix_caching and (n + 1) % bs == 0:
                self._cache_full_blocks(seq, events)
        self._slots_filled += len(seqs)
        self._logical_tokens += len(seqs)
        if self.kv_data and seqs:
            queries, keys, values = self.model.qkv(tokens, positions)
            keys, values = keys.astype(self.cache.dtype), values.astype(self.cache.dtype)
            slots = np.array([q.block_table[n // bs] * bs + n % bs for q, n in zip(seqs, positions, strict=True)])
            self.cache.write(slots.astype(np.int64), keys, values)
            for i, seq in enumerate(seqs):
                self._dense.append(seq.seq_id, keys[i : i + 1], values[i : i + 1])
                self._last_query[seq.seq_id] = queries[i]

    def _cache_full_blocks(self, seq: Sequence, events: list) -> None:
        bs = self.config.block_size
        for index in range(len(seq.block_hashes), seq.num_tokens // bs):
            chunk = tuple(seq.token_ids[index * bs : (index + 1) * bs])
            h = block_hash(seq.block_hashes[-1] if seq.block_hashes else None, chunk)
            seq.block_hashes.append(h)
            block = seq.block_table[index]
            if self.pool.register(block, h, chunk):
                events.append(ev.BlockCached(block, seq.seq_id, h))

    # -- swapping ---------------------------------------------------------------
    def _ensure_cpu_pool(self) -> BlockPool:
        if self.cpu_pool is None:
            c = self.config
            if c.num_cpu_blocks < 1:
                raise InvalidOperationError("preemption by swap needs num_cpu_blocks ≥ 1 in the scenario header")
            self.cpu_pool = BlockPool(c.num_cpu_blocks)
            if self.kv_data:
                shape = (c.num_cpu_blocks, c.block_size, c.num_kv_heads, c.head_dim)
                self._cpu_key = np.zeros(shape, self.cache.dtype)
                self._cpu_value = np.zeros(shape, self.cache.dtype)
        return self.cpu_pool

    @staticmethod
    def _distinct_blocks(tables) -> list[int]:
        return list(dict.fromkeys(b for table in tables for b in table))

    def swap_out_blocks(self, seq_ids: list[str]) -> int:
        return len(self._distinct_blocks(self.sequence(s).block_table for s in seq_ids))

    def swap_in_blocks(self, seq_ids: list[str]) -> int:
        return len(self._distinct_blocks(self.swapped[s].block_table for s in seq_ids))

    def swap_out(self, seq_ids: list[str], events: list) -> int:
        """Move a group's blocks to the CPU pool (shared blocks once) and free them on the GPU."""
        seqs = [self.sequence(s) for s in seq_ids]
        gpu_blocks = self._distinct_blocks(s.block_table for s in seqs)
        cpu_pool = self._ensure_cpu_pool()
        if len(gpu_blocks) > cpu_pool.num_free:
            raise PoolExhaustedError(len(gpu_blocks), cpu_pool.num_free, "swap to the CPU pool")
        cpu_blocks = cpu_pool.allocate(len(gpu_blocks))
        if self.kv_data:
            keys, values = self.backend.read_blocks(self.cache.key_cache, self.cache.value_cache, gpu_blocks)
            self._cpu_key[cpu_blocks], self._cpu_value[cpu_blocks] = keys, values
        to_cpu = dict(zip(gpu_blocks, cpu_blocks, strict=True))
        for gpu, cpu in to_cpu.items():
            events.append(ev.BlockSwappedOut(gpu, cpu))
        first_use = set()
        for seq in seqs:
            for block in seq.block_table:  # one CPU reference per table entry, like the GPU's
                if to_cpu[block] in first_use:
                    cpu_pool.share(to_cpu[block])
                first_use.add(to_cpu[block])
            for block in reversed(seq.block_table):
                self._release(block, seq.seq_id, events)
            del self.sequences[seq.seq_id]
            self._logical_tokens -= seq.num_tokens
            self._contiguous_blocks -= self._contiguous_reservation(seq.num_tokens)
            seq.block_table = [to_cpu[b] for b in seq.block_table]
            self.swapped[seq.seq_id] = seq
        return len(gpu_blocks)

    def swap_in(self, seq_ids: list[str], events: list) -> int:
        """Bring a swapped group back: new GPU blocks, bit-identical K/V, the same sharing."""
        seqs = [self.swapped[s] for s in seq_ids]
        cpu_blocks = self._distinct_blocks(s.block_table for s in seqs)
        if len(cpu_blocks) > self.pool.num_free:
            raise PoolExhaustedError(len(cpu_blocks), self.pool.num_free, "swap in")
        gpu_blocks = self._allocate(len(cpu_blocks), events)
        if self.kv_data:
            self.backend.write_blocks(
                self.cache.key_cache,
                self.cache.value_cache,
                gpu_blocks,
                self._cpu_key[cpu_blocks],
                self._cpu_value[cpu_blocks],
            )
        to_gpu = dict(zip(cpu_blocks, gpu_blocks, strict=True))
        for cpu, gpu in to_gpu.items():
            events.append(ev.BlockSwappedIn(cpu, gpu))
        bs = self.config.block_size
        placed = set()
        for seq in seqs:
            for block in seq.block_table:
                self.cpu_pool.release(block)
            seq.block_table = [to_gpu[b] for b in seq.block_table]
            for index, block in enumerate(seq.block_table):
                if block in placed:
                    self._shared_blocks += self.pool.share(block) == 2
                else:
                    placed.add(block)
                    self._block_fill[block] = min(bs, seq.num_tokens - index * bs)
                    self._slots_filled += self._block_fill[block]
                self._hold(block, seq.seq_id, index)
            del self.swapped[seq.seq_id]
            self.sequences[seq.seq_id] = seq
            self._logical_tokens += seq.num_tokens
            self._contiguous_blocks += self._contiguous_reservation(seq.num_tokens)
            if self.config.prefix_caching:
                for index, h in enumerate(seq.block_hashes):
                    chunk = tuple(seq.token_ids[index * bs : (index + 1) * bs])
                    if self.pool.register(seq.block_table[index], h, chunk):
                        events.append(ev.BlockCached(seq.block_table[index], seq.seq_id, h))
        return len(gpu_blocks)

    # -- attention --------------------------------------------------------------
    def attention_inputs(self) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray]:
        """(seq ids, query, block_tables, context_lens) for a decode step over every sequence."""
        seqs = list(self.sequences.values())
        ids = tuple(s.seq_id for s in seqs)
        max_blocks = max((len(s.block_table) for s in seqs), default=0)
        block_tables = np.zeros((len(seqs), max(max_blocks, 1)), dtype=np.int32)
        for row, s in enumerate(seqs):
            block_tables[row, : len(s.block_table)] = s.block_table
        context_lens = np.array([s.num_tokens for s in seqs], dtype=np.int32)
        c = self.config
        query = np.stack([self._last_query[i] for i in ids]) if ids else np.empty((0, c.num_heads, c.head_dim))
        return ids, query.astype(self.cache.dtype), block_tables, context_lens

    def _dense_attention(self, ids: tuple[str, ...], query: np.ndarray, scale: float) -> np.ndarray:
        """Dense SDPA from each sequence's contiguous K/V; only for sequences whose tokens
        changed since their last check (the others' answer cannot have changed)."""
        d, writes, cached = self._dense, self._writes, self._dense_out
        stale = [i for i, seq_id in enumerate(ids) if cached.get(seq_id, (-1,))[0] != writes.get(seq_id, 0)]
        if len(stale) * 2 > len(ids):  # most changed: one pass over the whole buffer, as views
            rows = np.array([d.row_of[i] for i in ids])
            query_rows = np.zeros((d.keys.shape[0], *query.shape[1:]), np.float32)
            query_rows[rows] = query.astype(np.float32)
            longest = int(d.lengths.max())  # the buffer's tail past every sequence is padding
            keys, values = d.keys[:, :, :longest], d.values[:, :, :longest]
            out = dense_attention_rows(query_rows, keys, values, d.lengths, scale).numpy()[rows]
            stale = list(range(len(ids)))
        elif stale:
            rows = np.array([d.row_of[ids[i]] for i in stale])
            longest = int(d.lengths[rows].max())
            keys, values = d.keys[rows, :, :longest], d.values[rows, :, :longest]
            out = dense_attention_rows(query[stale].astype(np.float32), keys, values, d.lengths[rows], scale).numpy()
        for k, i in enumerate(stale):
            cached[ids[i]] = (writes.get(ids[i], 0), out[k])
        return np.stack([cached[seq_id][1] for seq_id in ids])

    def _attend(self, events: list) -> AttentionReport | None:
        if not self.sequences:
            return None
        ids, query, block_tables, context_lens = self.attention_inputs()
        scale = default_scale(self.config.head_dim)
        backend = self.backend
        xp_query = backend.to_device(query)
        started = time.perf_counter()
        output = backend.paged_attention(
            xp_query, self.cache.key_cache, self.cache.value_cache, block_tables, context_lens, scale
        )
        backend.synchronize()
        kernel_seconds = time.perf_counter() - started

        started = time.perf_counter()
        dense = self._dense_attention(ids, query, scale)
        dense_seconds = time.perf_counter() - started

        report = AttentionReport(
            backend=backend.name,
            device=backend.device,
            seq_ids=ids,
            query=query,
            block_tables=block_tables,
            context_lens=context_lens,
            scale=scale,
            output=output,
            dense=dense,
            tolerance=self.config.tolerance,
            kernel_seconds=kernel_seconds,
            dense_seconds=dense_seconds,
        )
        errors = report.head_errors.tolist()
        for row, seq_id in enumerate(ids):
            n = int(context_lens[row])
            events.append(ev.LookupPerformed(seq_id, tuple(self.sequences[seq_id].block_table), n))
            head_errors = tuple(errors[row])
            events.append(
                ev.AttentionComputed(seq_id, n, max(head_errors), head_errors, report.tolerance, backend.name)
            )
        events.append(ev.KernelLaunched(backend.name, backend.device, len(ids), kernel_seconds, dense_seconds))
        return report

    # -- snapshots --------------------------------------------------------------
    def snapshot(self) -> SimulatorSnapshot:
        return SimulatorSnapshot(
            step=self.step,
            pool=self.pool.snapshot(),
            sequences=tuple(s.copy() for s in self.sequences.values()),
            block_fill=tuple(self._block_fill),
            cache=self.cache.snapshot() if self.kv_data else None,
            dense=self._dense.snapshot(),
            last_query=dict(self._last_query),
            prefix_counts=(self._prefix_lookups, self._prefix_hits),
            last_attention=self.last_attention,
            swapped=tuple(s.copy() for s in self.swapped.values()),
            cpu=None
            if self.cpu_pool is None
            else (
                self.cpu_pool.snapshot(),
                None if self._cpu_key is None else self._cpu_key.copy(),
                None if self._cpu_value is None else self._cpu_value.copy(),
            ),
            scheduler=None if self._scheduler is None else self._scheduler.snapshot(),
        )

    def restore(self, snap: SimulatorSnapshot) -> None:
        self.step = snap.step
        self.pool.restore(snap.pool)
        self.sequences = {s.seq_id: s.copy() for s in snap.sequences}
        self._block_fill = list(snap.block_fill)
        self._slots_filled = sum(f for f, r in zip(snap.block_fill, snap.pool.ref_counts, strict=True) if r)
        self._shared_blocks = sum(1 for r in snap.pool.ref_counts if r > 1)
        self._logical_tokens = sum(s.num_tokens for s in self.sequences.values())
        self._last_query = dict(snap.last_query)
        self._writes = {seq_id: 0 for seq_id in (*self.sequences, *(s.seq_id for s in snap.swapped))}
        self._dense_out = {}
        self._prefix_lookups, self._prefix_hits = snap.prefix_counts
        self._holders = {}
        for seq in self.sequences.values():
            for index, block in enumerate(seq.block_table):
                self._hold(block, seq.seq_id, index)
        self._contiguous_blocks = sum(self._contiguous_reservation(s.num_tokens) for s in self.sequences.values())
        if self.kv_data:
            self.cache.restore(snap.cache)
        self._dense.restore(snap.dense)
        self.last_attention = snap.last_attention
        self.swapped = {s.seq_id: s.copy() for s in snap.swapped}
        if snap.cpu is None:
            self.cpu_pool = self._cpu_key = self._cpu_value = None
        else:
            self._ensure_cpu_pool().restore(snap.cpu[0])
            if snap.cpu[1] is not None:
                self._cpu_key, self._cpu_value = snap.cpu[1].copy(), snap.cpu[2].copy()
        if snap.scheduler is None:
            self._scheduler = None
        else:
            self.scheduler.restore(snap.scheduler)
