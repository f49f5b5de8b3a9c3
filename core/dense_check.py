"""The dense check: an independent recompute of attention from each sequence's tokens,
to hold the paged kernel to.

It owns the contiguous reference cache (each sequence's K/V in one row, as a non-paged
engine reserves them; it never reads the pool, so any paging bug shows) and the dense
outputs already computed: a sequence whose tokens did not change since its last check
has the same dense answer, so only changed sequences are recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.kv_cache import ContiguousKVCache
from kernels.reference import dense_attention_rows


@dataclass(frozen=True)
class DenseCheckSnapshot:
    reference: ContiguousKVCache
    live: tuple[str, ...]  # every sequence with a row (live or swapped)


class DenseCheck:
    def __init__(self, num_kv_heads: int, head_dim: int) -> None:
        self.reference = ContiguousKVCache(num_kv_heads, head_dim)
        # Per sequence: how many writes it has had, and the dense output at that count.
        self._writes: dict[str, int] = {}
        self._outputs: dict[str, tuple[int, np.ndarray]] = {}

    def add(self, seq_id: str) -> None:
        self.reference.add(seq_id)

    def append(self, seq_id: str, keys: np.ndarray, values: np.ndarray) -> None:
        self.reference.append(seq_id, keys, values)
        self.touch(seq_id)

    def touch(self, seq_id: str) -> None:
        """``seq_id``'s tokens changed: its dense answer must be recomputed."""
        self._writes[seq_id] = self._writes.get(seq_id, 0) + 1

    def fork(self, parent: str, child: str) -> None:
        self.reference.fork(parent, child)
        self._writes[child] = 0

    def free(self, seq_id: str) -> None:
        self.reference.free(seq_id)
        self._writes.pop(seq_id, None)
        self._outputs.pop(seq_id, None)

    def view(self, seq_id: str) -> tuple[np.ndarray, np.ndarray]:
        return self.reference.view(seq_id)

    def outputs(self, ids: tuple[str, ...], query: np.ndarray, scale: float) -> np.ndarray:
        """Dense SDPA for sequences ``ids`` (query rows in the same order), from their
        contiguous K/V; recomputed only where the tokens changed since the last call."""
        d, writes, cached = self.reference, self._writes, self._outputs
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

    def snapshot(self) -> DenseCheckSnapshot:
        return DenseCheckSnapshot(self.reference.snapshot(), tuple(self._writes))

    def restore(self, snap: DenseCheckSnapshot) -> None:
        self.reference.restore(snap.reference)
        self._writes = {seq_id: 0 for seq_id in snap.live}
        self._outputs = {}
