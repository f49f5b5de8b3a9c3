"""The physical KV cache, held by the backend, plus the dense reference copy.

``key_cache``/``value_cache`` have the seed article's layout ``(num_blocks,
block_size, num_kv_heads, head_dim)`` and live in the backend's array module (a
NumPy array on the CPU, a CuPy array on a GPU). The dense reference keeps each
sequence's K/V in token order, apart from the pool; it never reads the pool, so the
kernel-vs-dense check catches any paging bug.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from pagesim.core.config import CacheConfig
from pagesim.kernels.backend import Backend, ForwardInputs
from pagesim.kernels.dtypes import storage_dtype


@dataclass(frozen=True)
class CacheCheckpoint:
    """A point the paged cache can go back to: the undo log that started there (each
    block's K/V before its first change since) — not a copy of the pool."""

    generation: int


class PagedKVCache:
    def __init__(self, config: CacheConfig, backend: Backend) -> None:
        self.config = config
        self.backend = backend
        self.dtype = storage_dtype(config.dtype)
        self.key_cache, self.value_cache = backend.allocate_cache(
            config.num_blocks, config.block_size, config.num_kv_heads, config.head_dim, self.dtype
        )
        self._generation = 0  # the newest checkpoint's
        self._issued = 0  # (checkpoints get ids never used before, also after a restore)
        self._undo: dict[int, tuple[object, object]] | None = None  # block -> its K/V at the checkpoint
        self._live: set[int] = set()  # blocks whose K/V mattered at the checkpoint, not yet saved
        self._kept_live: set[int] = set()  # ... all of them, saved or not (what a restore there logs again)
        # The logs of older checkpoints, oldest first: (id, undo log, blocks live there), each
        # running until the next checkpoint. Restoring one undoes the newer logs in turn.
        self._older: list[tuple[int, dict, set[int]]] = []
        self.keep_checkpoints = 1  # how many checkpoints stay restorable (the newest and the ones before)

    def _before_change(self, blocks) -> None:
        if self._undo is None or not self._live:
            return
        new = [b for b in np.unique(np.asarray(blocks)).tolist() if b in self._live]
        if new:
            self._live.difference_update(new)
            ids = self.backend.xp.asarray(np.array(new, np.int64))
            keys, values = self.key_cache[ids], self.value_cache[ids]  # copies (fancy indexing)
            for i, block in enumerate(new):
                self._undo[block] = (keys[i], values[i])

    def write(self, slot_mapping: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
        self._before_slots_change(slot_mapping)
        self.backend.write_kv(self.key_cache, self.value_cache, slot_mapping, keys, values)

    def write_for(self, inputs: ForwardInputs, keys, values) -> None:
        """:meth:`write` of one layer of a model's forward (on a device, its slots are uploaded once)."""
        self._before_slots_change(inputs.slots)
        self.backend.write_kv_for(self.key_cache, self.value_cache, inputs, keys, values)

    def _before_slots_change(self, slot_mapping) -> None:
        if self._undo is not None and self._live:  # (the blocks only matter to a checkpoint)
            self._before_change(np.asarray(slot_mapping) // self.config.block_size)

    def write_blocks(self, blocks: list[int], keys: np.ndarray, values: np.ndarray) -> None:
        self._before_change(blocks)
        self.backend.write_blocks(self.key_cache, self.value_cache, blocks, keys, values)

    def copy_block(self, src: int, dst: int) -> None:
        self._before_change([dst])
        self.backend.copy_blocks(self.key_cache, self.value_cache, np.array([[src, dst]], dtype=np.int64))

    def read_sequence(self, block_table: list[int], num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """Gather one sequence's K/V to the host (for tests and inspection, never the kernel)."""
        bs = self.config.block_size
        slots = np.array([block_table[p // bs] * bs + p % bs for p in range(num_tokens)], dtype=np.int64)
        flat_shape = (-1, self.config.num_kv_heads, self.config.head_dim)
        keys = self.backend.to_numpy(self.key_cache).reshape(flat_shape)[slots]
        values = self.backend.to_numpy(self.value_cache).reshape(flat_shape)[slots]
        return keys, values

    def snapshot(self, live_blocks) -> CacheCheckpoint:
        """Start a new undo log here. Only ``live_blocks`` (held or cached) are saved before
        they change: what a free block holds is never read, so a restore need not bring it
        back. The previous checkpoint stays restorable while ``keep_checkpoints`` allows
        (a block live there and unchanged since is watched by the new log too)."""
        live = set(live_blocks)
        if self._undo is not None and self.keep_checkpoints > 1:
            self._older.append((self._generation, self._undo, self._kept_live))
            del self._older[: max(0, len(self._older) - (self.keep_checkpoints - 1))]
            live |= self._live  # (live at an older checkpoint, not yet saved: its first change is)
        else:
            self._older = []
        self._issued += 1
        self._generation = self._issued
        self._undo, self._live, self._kept_live = {}, live, set(live)
        return CacheCheckpoint(self._generation)

    def can_restore(self, checkpoint: CacheCheckpoint) -> bool:
        if self._undo is None:
            return False
        return checkpoint.generation == self._generation or any(g == checkpoint.generation for g, _, _ in self._older)

    def _apply(self, undo: dict) -> None:
        if undo:
            ids = self.backend.xp.asarray(np.array(list(undo), np.int64))
            xp = self.backend.xp
            self.key_cache[ids] = xp.stack([k for k, _ in undo.values()])
            self.value_cache[ids] = xp.stack([v for _, v in undo.values()])

    def restore(self, checkpoint: CacheCheckpoint) -> None:
        """Undo every change since ``checkpoint`` (the newest's log, then each older one's back
        to it); the log goes on from there, and the checkpoints after it are gone."""
        if not self.can_restore(checkpoint):
            raise ValueError("this cache checkpoint is no longer restorable")
        self._apply(self._undo)
        live = self._kept_live
        while self._generation != checkpoint.generation:
            self._generation, undo, live = self._older.pop()
            self._apply(undo)
        self._undo, self._live, self._kept_live = {}, set(live), live

    def forget_checkpoint(self) -> None:
        """The state moved elsewhere (a restore from another snapshot): stop logging."""
        self._issued += 1
        self._generation = self._issued
        self._undo, self._live, self._kept_live, self._older = None, set(), set(), []


class SwapSpace:
    """The host memory that swapped-out blocks' K/V wait in, indexed by CPU block id
    (the block manager's CPU pool hands the ids out). Allocated on the first swap."""

    def __init__(self, config: CacheConfig, dtype: np.dtype) -> None:
        self.shape = (config.num_cpu_blocks, config.block_size, config.num_kv_heads, config.head_dim)
        self.dtype = dtype
        self.keys: np.ndarray | None = None
        self.values: np.ndarray | None = None

    def swap_out(self, backend: Backend, cache: PagedKVCache, pairs: list[tuple[int, int]]) -> None:
        """Copy (gpu, cpu) block pairs' K/V from the cache to here."""
        if self.keys is None:
            self.keys, self.values = np.zeros(self.shape, self.dtype), np.zeros(self.shape, self.dtype)
        gpu, cpu = [g for g, _ in pairs], [c for _, c in pairs]
        keys, values = backend.read_blocks(cache.key_cache, cache.value_cache, gpu)
        self.keys[cpu], self.values[cpu] = keys, values

    def swap_in(self, backend: Backend, cache: PagedKVCache, pairs: list[tuple[int, int]]) -> None:
        """Copy (cpu, gpu) block pairs' K/V from here back into the cache."""
        cpu, gpu = [c for c, _ in pairs], [g for _, g in pairs]
        cache.write_blocks(gpu, self.keys[cpu], self.values[cpu])

    def snapshot(self) -> tuple[np.ndarray, np.ndarray] | None:
        return None if self.keys is None else (self.keys.copy(), self.values.copy())

    def rebuild(self, blocks: dict[int, tuple[np.ndarray, np.ndarray]], block_size: int) -> None:
        """Put back the K/V of these CPU blocks (block -> (keys, values) of its tokens)."""
        if not blocks:
            return
        if self.keys is None:
            self.keys, self.values = np.zeros(self.shape, self.dtype), np.zeros(self.shape, self.dtype)
        for block, (keys, values) in blocks.items():
            self.keys[block, : len(keys)] = keys
            self.values[block, : len(values)] = values

    def restore(self, snap: tuple[np.ndarray, np.ndarray] | None) -> None:
        self.keys, self.values = (None, None) if snap is None else (snap[0].copy(), snap[1].copy())


@dataclass
class _Row:
    """One sequence's K/V: full chunks and a tail, ``length`` tokens in all. ``owns_tail``:
    no fork or snapshot shares the last chunk, so appends may write into it in place."""

    keys: list[np.ndarray]
    values: list[np.ndarray]
    length: int = 0
    owns_tail: bool = True

    def share(self) -> _Row:
        """A row holding the same chunks; neither writes into the shared tail from now on."""
        self.owns_tail = False
        return _Row(list(self.keys), list(self.values), self.length, False)


class ChunkedKVReference:
    """The dense reference's K/V: each sequence's tokens in order, in the cache's storage
    dtype (so equal, bit for bit, to what the pool should hold), as a chain of fixed
    chunks of CHUNK_TOKENS rows (n, num_kv_heads, head_dim). Chunks are never written once
    another sequence or a snapshot shares them: a fork shares its parent's chunks and the
    first append to a shared tail copies it. So forked sequences and snapshots cost no
    copy, and the memory is the distinct tokens' bytes plus one partial chunk per sequence.

    It shares no code or layout with the pool (no block table, no free list, a chunk size
    unrelated to the block size): a paging bug cannot hide in both."""

    CHUNK_TOKENS = 16

    def __init__(self, num_kv_heads: int, head_dim: int, dtype: np.dtype) -> None:
        self.num_kv_heads, self.head_dim, self.dtype = num_kv_heads, head_dim, np.dtype(dtype)
        self.rows: dict[str, _Row] = {}

    def add(self, seq_id: str) -> None:
        self.rows[seq_id] = _Row([], [])

    def length(self, seq_id: str) -> int:
        return self.rows[seq_id].length

    def append(self, seq_id: str, keys: np.ndarray, values: np.ndarray) -> None:
        row, size = self.rows[seq_id], self.CHUNK_TOKENS
        done, n = 0, keys.shape[0]
        while done < n:
            offset = row.length % size
            if offset == 0:
                shape = (size, self.num_kv_heads, self.head_dim)
                row.keys.append(np.empty(shape, self.dtype))
                row.values.append(np.empty(shape, self.dtype))
            elif not row.owns_tail:  # copy-on-write of the shared tail
                row.keys[-1], row.values[-1] = row.keys[-1].copy(), row.values[-1].copy()
            row.owns_tail = True
            take = min(size - offset, n - done)
            row.keys[-1][offset : offset + take] = keys[done : done + take]
            row.values[-1][offset : offset + take] = values[done : done + take]
            row.length += take
            done += take

    def fork(self, parent: str, child: str) -> None:
        self.rows[child] = self.rows[parent].share()

    def free(self, seq_id: str) -> None:
        del self.rows[seq_id]

    def view(self, seq_id: str) -> tuple[np.ndarray, np.ndarray]:
        """(length, num_kv_heads, head_dim) copies of one sequence's K/V, contiguous."""
        row = self.rows[seq_id]
        if not row.keys:
            empty = np.empty((0, self.num_kv_heads, self.head_dim), self.dtype)
            return empty, empty.copy()
        return np.concatenate(row.keys)[: row.length], np.concatenate(row.values)[: row.length]

    def pieces(self, seq_id: str, start: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Views of one sequence's K/V from token ``start`` to its end, a chunk at a time."""
        row, size = self.rows[seq_id], self.CHUNK_TOKENS
        for index in range(start // size, -(-row.length // size)):
            first = max(start - index * size, 0)
            last = min(size, row.length - index * size)
            yield row.keys[index][first:last], row.values[index][first:last]

    def fill(self, seq_id: str, keys: np.ndarray, values: np.ndarray) -> None:
        """Write one sequence's K/V, widened to float32, into ``keys``/``values`` of shape
        (num_kv_heads, ≥ length, head_dim): the contiguous layout dense attention reads."""
        row, size = self.rows[seq_id], self.CHUNK_TOKENS
        for index, (chunk_k, chunk_v) in enumerate(zip(row.keys, row.values, strict=True)):
            start = index * size
            n = min(size, row.length - start)
            keys[:, start : start + n] = chunk_k[:n].transpose(1, 0, 2)
            values[:, start : start + n] = chunk_v[:n].transpose(1, 0, 2)

    @property
    def nbytes(self) -> int:
        distinct = {id(a): a.nbytes for row in self.rows.values() for a in (*row.keys, *row.values)}
        return sum(distinct.values())

    def snapshot(self) -> ChunkedKVReference:
        """A copy that shares every chunk (no data copied): from now on neither side writes
        into a chunk the other holds."""
        snap = ChunkedKVReference(self.num_kv_heads, self.head_dim, self.dtype)
        snap.rows = {seq_id: row.share() for seq_id, row in self.rows.items()}
        return snap

    def restore(self, snap: ChunkedKVReference) -> None:
        self.rows = snap.snapshot().rows
