"""The dense check: an independent recompute of attention from each sequence's tokens,
to hold the paged kernel to.

It owns the reference copy of every sequence's K/V (in token order, apart from the pool:
it never reads the pool, so any paging bug shows) and the dense outputs already computed:
a sequence whose tokens did not change since its last check has the same dense answer,
so only changed sequences are recomputed. Dense attention reads each sequence's K/V as
one contiguous float32 row, built for the call and dropped after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pagesim.core.kv_cache import ChunkedKVReference
from pagesim.kernels.reference import dense_attention_rows

U32 = 2.0**-24  # unit roundoff of fp32, the arithmetic of both the kernel and dense


def stack_rows(rows: list[np.ndarray]) -> np.ndarray:
    """``np.stack(rows)`` for many equal-shaped rows (one per sequence, every step): one
    concatenate, without stack's per-row shape checks and reshapes."""
    return np.concatenate(rows).reshape(len(rows), *rows[0].shape)


class RowStack:
    """:func:`stack_rows` for rows that mostly stay the same between calls (a step changes
    one sequence of 256): rows are told apart by identity, and only the new ones are copied
    into a copy of the last stack. So a row must never change in place (replace it), and
    the stacks handed out are read-only: the next call starts from them."""

    def __init__(self) -> None:
        self._rows: list[np.ndarray] = []
        self._stack: np.ndarray | None = None

    def __call__(self, rows: list[np.ndarray]) -> np.ndarray:
        last, kept = self._stack, self._rows
        changed = None
        if last is not None and len(rows) == len(kept) and rows and rows[0].shape == last.shape[1:]:
            changed = [i for i, (row, old) in enumerate(zip(rows, kept, strict=True)) if row is not old]
        if changed is None or 2 * len(changed) > len(rows) or any(rows[i].dtype != last.dtype for i in changed):
            stack = stack_rows(rows)
        else:
            stack = last.copy()
            for i in changed:
                stack[i] = rows[i]
        stack.flags.writeable = False
        self._rows, self._stack = list(rows), stack
        return stack


def error_bounds(
    query: np.ndarray, scale: float, context_lens: np.ndarray, k_norm_max: np.ndarray, v_abs_max: np.ndarray
) -> np.ndarray:
    """Largest |kernel − dense| that rounding explains, per (sequence, head).

    Both sides read the same stored K/V and compute in fp32 in different orders, so
    their gap is rounding alone (the storage dtype only sets the inputs). With
    S = ‖q‖·max‖k‖·scale, which bounds every score:
    - a score, a head_dim-term dot product, is off by ≲ √d·S·u (rounding errors of
      random sign add up like a random walk);
    - p = exp(s − m): the product (s − m)·log2 e is rounded, and |s − m| ≤ 2S; the GPU's
      ``__expf`` adds 2 ulp: a relative error ≲ (2S + 2)·u in every p;
    - ℓ and the weighted sum gather L terms: ≲ √L·u relative;
    and the output, a weighted average of values, moves by at most max|v| times those.
    Kernel and dense each round: tol = 2·u·max|v|·(√d·S + 2S + √L + 4). It is tight enough
    to catch a wrong block at every context length and one zeroed slot up to a few
    thousand tokens (a slot weighs ~1/L). Past that a lost slot hides under it; the kernel
    tests prove every slot is read (:meth:`Simulator.verify_kv` proves the pool and tables
    the kernel reads through, on the host, not the kernel's loads).

    ``query`` (num_seqs, num_heads, head_dim) float; ``k_norm_max``/``v_abs_max``
    (num_seqs, num_kv_heads)."""
    num_seqs, num_heads, head_dim = query.shape
    group = num_heads // k_norm_max.shape[1] if num_seqs else 1
    q_norm = np.linalg.norm(query.astype(np.float64), axis=2)  # (S, H)
    kv_of_head = np.arange(num_heads) // group
    s = q_norm * k_norm_max[:, kv_of_head] * scale
    lengths = np.sqrt(np.asarray(context_lens, np.float64))[:, None]
    return 2 * U32 * v_abs_max[:, kv_of_head] * (np.sqrt(head_dim) * s + 2 * s + lengths + 4)


@dataclass(frozen=True)
class DenseCheckSnapshot:
    reference: ChunkedKVReference | None  # None: rebuilt from the tokens on restore
    live: tuple[str, ...]  # every sequence with a row (live or swapped)
    magnitudes: tuple = ()  # (seq, max ‖k‖ per KV head, max |v| per KV head, tokens they cover)

    def without_data(self) -> DenseCheckSnapshot:
        return DenseCheckSnapshot(None, self.live, self.magnitudes)


MIN_ROW_TOKENS = 64  # rows of one SDPA call are padded to a power of two ≥ this


class DenseCheck:
    def __init__(self, num_kv_heads: int, head_dim: int, dtype: np.dtype, batch_bytes: int = 1 << 24) -> None:
        """``batch_bytes``: the most float32 K/V one SDPA call builds (one sequence at least),
        so the check's working memory stays a fraction of the cache's."""
        self.reference = ChunkedKVReference(num_kv_heads, head_dim, dtype)
        self.num_kv_heads, self.head_dim, self.batch_bytes = num_kv_heads, head_dim, batch_bytes
        # Per sequence: how many writes it has had, and the dense output at that count.
        self._writes: dict[str, int] = {}
        self._outputs: dict[str, tuple[int, np.ndarray]] = {}
        self._bounds: dict[str, tuple[int, np.ndarray]] = {}  # the same, for the error bounds
        # Per sequence and KV head: the largest ‖k‖ and |v| of its first ``_folded`` tokens,
        # for the error bound. Brought up to date only when a bound is asked for: a run
        # without attention (the engine's, a scheduler's) never pays for them.
        self._k_norm: dict[str, np.ndarray] = {}
        self._v_abs: dict[str, np.ndarray] = {}
        self._folded: dict[str, int] = {}
        self._stacks = {"bounds": RowStack(), "outputs": RowStack()}

    def add(self, seq_id: str) -> None:
        self.reference.add(seq_id)
        self._k_norm[seq_id] = np.zeros(self.num_kv_heads)
        self._v_abs[seq_id] = np.zeros(self.num_kv_heads)
        self._folded[seq_id] = 0

    def append(self, seq_id: str, keys: np.ndarray, values: np.ndarray) -> None:
        self.reference.append(seq_id, keys, values)
        self.touch(seq_id)

    def _fold(self, seq_id: str) -> None:
        """Bring ``seq_id``'s largest ‖k‖ and |v| up to its last token (a maximum is exact:
        folded a chunk at a time or a write at a time, the bits are the same)."""
        start = self._folded[seq_id]
        if start == self.reference.length(seq_id):
            return
        k_norm, v_abs = self._k_norm[seq_id], self._v_abs[seq_id]
        for keys, values in self.reference.pieces(seq_id, start):
            k32, v32 = keys.astype(np.float32, copy=False), values.astype(np.float32, copy=False)
            # ‖k‖ as np.linalg.norm computes it (the same bits), without its dispatch
            np.maximum(k_norm, np.sqrt(np.add.reduce(k32 * k32, axis=2)).max(axis=0), out=k_norm)
            np.maximum(v_abs, np.maximum.reduce(np.abs(v32), axis=(0, 2)), out=v_abs)
        self._folded[seq_id] = self.reference.length(seq_id)

    def bounds(self, ids: tuple[str, ...], query: np.ndarray, scale: float, context_lens: np.ndarray) -> np.ndarray:
        """:func:`error_bounds` for these sequences, from the magnitudes seen so far. A row
        depends only on its sequence's tokens (its query, magnitudes and length), so, as
        with :meth:`outputs`, only the rows of sequences written since the last call are
        computed (row by row the same arithmetic as all at once)."""
        if not ids:
            return np.zeros((0, query.shape[1]))
        cached, writes = self._bounds, self._writes
        stale = self._stale(ids, cached)
        if stale:
            for i in stale:
                self._fold(ids[i])
            k_norm = stack_rows([self._k_norm[ids[i]] for i in stale])
            v_abs = stack_rows([self._v_abs[ids[i]] for i in stale])
            rows = error_bounds(query[stale].astype(np.float32), scale, context_lens[stale], k_norm, v_abs)
            for row, i in zip(rows, stale, strict=True):
                cached[ids[i]] = (writes.get(ids[i], 0), row)  # rows of a fresh array: nothing else holds it
        return self._stacks["bounds"]([cached[seq_id][1] for seq_id in ids])

    def _stale(self, ids: tuple[str, ...], cached: dict[str, tuple[int, np.ndarray]]) -> list[int]:
        """Positions of the sequences written since their cached row was computed."""
        writes = self._writes
        return [i for i, seq_id in enumerate(ids) if cached.get(seq_id, (-1,))[0] != writes.get(seq_id, 0)]

    def touch(self, seq_id: str) -> None:
        """``seq_id``'s tokens changed: its dense answer must be recomputed."""
        self._writes[seq_id] = self._writes.get(seq_id, 0) + 1

    def fork(self, parent: str, child: str) -> None:
        self.reference.fork(parent, child)
        self._writes[child] = 0
        self._k_norm[child] = self._k_norm[parent].copy()
        self._v_abs[child] = self._v_abs[parent].copy()
        self._folded[child] = self._folded[parent]  # (the rows past it are the parent's too)

    def free(self, seq_id: str) -> None:
        self.reference.free(seq_id)
        self._writes.pop(seq_id, None)
        self._outputs.pop(seq_id, None)
        self._bounds.pop(seq_id, None)
        self._k_norm.pop(seq_id, None)
        self._v_abs.pop(seq_id, None)
        self._folded.pop(seq_id, None)

    def rebuild_row(self, seq_id: str, keys: np.ndarray | None, values: np.ndarray | None) -> None:
        """Refill ``seq_id``'s row (after a restore without data) with its tokens' K/V."""
        if keys is not None:
            self.reference.append(seq_id, keys, values)

    def view(self, seq_id: str) -> tuple[np.ndarray, np.ndarray]:
        return self.reference.view(seq_id)

    def outputs(self, ids: tuple[str, ...], query: np.ndarray, scale: float) -> np.ndarray:
        """Dense SDPA for sequences ``ids`` (query rows in the same order); recomputed only
        where the tokens changed since the last call. Changed sequences are grouped by
        length (the next power of two ≥ MIN_ROW_TOKENS) into calls of at most
        ``batch_bytes`` of float32 K/V, each padded to its longest row. (SDPA's rounding
        depends on the batch's shape: a recomputed answer may differ in the last bits.)"""
        ref, writes, cached = self.reference, self._writes, self._outputs
        stale = self._stale(ids, cached)
        by_width: dict[int, list[int]] = {}
        for i in stale:
            width = MIN_ROW_TOKENS
            while width < ref.length(ids[i]):
                width *= 2
            by_width.setdefault(width, []).append(i)
        row_bytes_per_token = 2 * self.num_kv_heads * self.head_dim * 4
        for width, members in by_width.items():
            per_call = max(1, self.batch_bytes // (width * row_bytes_per_token))
            for first in range(0, len(members), per_call):
                batch = members[first : first + per_call]
                lengths = np.array([ref.length(ids[i]) for i in batch])
                longest = max(int(lengths.max()), 1)  # the tail past every row would be padding
                shape = (len(batch), self.num_kv_heads, longest, self.head_dim)
                keys, values = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
                for row, i in enumerate(batch):
                    ref.fill(ids[i], keys[row], values[row])
                out = dense_attention_rows(query[batch].astype(np.float32), keys, values, lengths, scale).numpy()
                for row, i in enumerate(batch):
                    cached[ids[i]] = (writes.get(ids[i], 0), out[row].copy())  # no view keeps the batch alive
        return self._stacks["outputs"]([cached[seq_id][1] for seq_id in ids])

    def snapshot(self, with_data: bool = True) -> DenseCheckSnapshot:
        return DenseCheckSnapshot(
            self.reference.snapshot() if with_data else None,
            tuple(self._writes),
            tuple((i, self._k_norm[i].copy(), self._v_abs[i].copy(), self._folded[i]) for i in self._k_norm),
        )

    def restore(self, snap: DenseCheckSnapshot) -> None:
        if snap.reference is None:  # the engine rebuilds each row (rebuild_row)
            self.reference = ChunkedKVReference(self.num_kv_heads, self.head_dim, self.reference.dtype)
            for seq_id in snap.live:
                self.reference.add(seq_id)
        else:
            self.reference.restore(snap.reference)
        self._writes = {seq_id: 0 for seq_id in snap.live}
        self._outputs = {}
        self._bounds = {}
        self._k_norm = {i: k.copy() for i, k, _, _ in snap.magnitudes}
        self._v_abs = {i: v.copy() for i, _, v, _ in snap.magnitudes}
        self._folded = {i: folded for i, _, _, folded in snap.magnitudes}
