"""Inputs for the emulated kernels (decode and prefill), a float64 dense reference and the
error model that sets the tolerance."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pagesim.kernels.dtypes import storage_dtype

U32 = 2.0**-24  # unit roundoff of fp32, the kernels' arithmetic
LAMBDA = 4.0  # probabilistic rounding-error model (Higham & Mary 2019): P(exceed) ≲ 2·exp(-λ²/2) ≈ 7e-4 per sum
BOUNDARY_LENGTHS = (511, 512, 513, 1100)


@dataclass
class Case:
    query: np.ndarray  # (num_seqs, num_heads, head_dim), storage dtype
    key_cache: np.ndarray  # (num_blocks, block_size, num_kv_heads, head_dim)
    value_cache: np.ndarray
    block_tables: np.ndarray  # (num_seqs, max_blocks) int32, padded with a NaN block's id
    context_lens: np.ndarray  # (num_seqs,) int32
    scale: float

    @property
    def args(self):
        return self.query, self.key_cache, self.value_cache, self.block_tables, self.context_lens


def lengths_for(block_size: int) -> list[int]:
    """One token, a block, one over a block, and both sides of the 512-token partition edge."""
    return sorted({1, block_size, block_size + 1, *BOUNDARY_LENGTHS})


def make_case(rng, *, context_lens, block_size, num_heads, num_kv_heads, head_dim, dtype, spare=2) -> Case:
    """Each sequence's blocks scattered over the pool. Every slot no kernel may read (the
    tail of each last block, spare blocks, and the tables' padding, which points at a spare
    block) holds NaN, so any read past the mask shows in the output."""
    dt = storage_dtype(dtype)
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(blocks_per_seq) + spare
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = rng.standard_normal(shape, dtype=np.float32).astype(dt)
    value_cache = rng.standard_normal(shape, dtype=np.float32).astype(dt)
    perm = rng.permutation(num_blocks)
    nan_block = int(perm[-1])
    tables = np.full((len(context_lens), max(1, *blocks_per_seq)), nan_block, dtype=np.int32)
    start = 0
    for s, (n, nb) in enumerate(zip(context_lens, blocks_per_seq, strict=True)):
        tables[s, :nb] = perm[start : start + nb]
        if nb:
            tail = n - (nb - 1) * block_size
            key_cache[perm[start + nb - 1], tail:] = np.nan
            value_cache[perm[start + nb - 1], tail:] = np.nan
        start += nb
    key_cache[perm[start:]] = np.nan
    value_cache[perm[start:]] = np.nan
    query = rng.standard_normal((len(context_lens), num_heads, head_dim), dtype=np.float32).astype(dt)
    return Case(query, key_cache, value_cache, tables, np.asarray(context_lens, np.int32), 1.0 / math.sqrt(head_dim))


def gathered(case: Case, seq: int) -> tuple[np.ndarray, np.ndarray]:
    """Sequence ``seq``'s K and V in float64, (tokens, num_kv_heads, head_dim)."""
    block_size = case.key_cache.shape[1]
    positions = np.arange(int(case.context_lens[seq]))
    blocks = case.block_tables[seq, positions // block_size]
    keys = case.key_cache[blocks, positions % block_size].astype(np.float64)
    values = case.value_cache[blocks, positions % block_size].astype(np.float64)
    return keys, values


def dense_reference(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """float64 dense attention on the same stored values, and the error bound per row.

    The kernel widens every stored value exactly (fp16 by cvt, bf16 by a shift) and
    computes in fp32, so the gap to this reference is fp32 rounding alone, whatever the
    storage dtype; the dtype only sets the inputs, which both sides read identically. The
    bound (absolute, per (sequence, head)) follows the softmax's rounding-error model:
    - scores s = (q·scale)·k: a d-term dot product, error ≲ λ√d·u·Σ|q·scale·k|;
    - p = __expf(s − m): the product (s − m)·log2 e rounded, |s − m|·u relative, plus
      ex2.approx's 2 ulp; a relative error ε in every p moves the weighted average o by at
      most 2·ε·max|v|;
    - ℓ and the accumulator: sums of up to L terms, ≲ λ√L·u relative each.
    So tol = max|v| · u · (2·(λ√d·S + R + 2) + 2λ√L + 8), with S = max Σ|q·scale·k| and
    R = max(s) − min(s) over the context. λ = 4 is the model's confidence factor.
    """
    num_seqs, num_heads, head_dim = case.query.shape
    num_kv_heads = case.key_cache.shape[2]
    group = num_heads // num_kv_heads
    out = np.zeros((num_seqs, num_heads, head_dim))
    tol = np.zeros((num_seqs, num_heads))
    q_all = case.query.astype(np.float32) * np.float32(case.scale)  # as the kernel scales q in fp32
    for s in range(num_seqs):
        n = int(case.context_lens[s])
        if n == 0:
            continue
        keys, values = gathered(case, s)
        for h in range(num_heads):
            kv = h // group
            out[s, h], tol[s, h] = _attend(q_all[s, h].astype(np.float64), keys[:, kv], values[:, kv])
    return out, tol


def _attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, float]:
    """One query head over (L, head_dim) float64 K/V: the output and its rounding bound."""
    head_dim, n = q.shape[0], keys.shape[0]
    scores = keys @ q
    weights = np.exp(scores - scores.max())
    out = weights @ values / weights.sum()
    score_mass = np.abs(keys * q).sum(axis=1).max()
    spread = scores.max() - scores.min()
    v_max = np.abs(values).max()
    rounding = 2 * (LAMBDA * math.sqrt(head_dim) * score_mass + spread + 2) + 2 * LAMBDA * math.sqrt(n) + 8
    return out, v_max * U32 * rounding


def mismatches(got: np.ndarray, case: Case, label: str) -> list[str]:
    """Rows that are not finite or outside the bound, described; empty when all match."""
    expected, tol = dense_reference(case)
    problems = []
    if not np.isfinite(got).all():
        rows = sorted({(int(s), int(h)) for s, h, _ in np.argwhere(~np.isfinite(got))})
        lens = [int(case.context_lens[s]) for s, _ in rows[:4]]
        problems.append(f"{label}: non-finite output in (seq, head) {rows[:4]} (context lengths {lens})")
        return problems
    err = np.abs(got - expected).max(axis=2)
    bad = np.argwhere(err > tol)
    if bad.size:
        s, h = (int(v) for v in bad[0])
        problems.append(
            f"{label}: {len(bad)} rows off, e.g. seq {s} (context {int(case.context_lens[s])}) head {h}: "
            f"error {err[s, h]:.3g} > tolerance {tol[s, h]:.3g}"
        )
    return problems


def error_ratio(got: np.ndarray, case: Case) -> float:
    """max(error / tolerance) over the rows, for the verification record."""
    expected, tol = dense_reference(case)
    live = tol > 0
    err = np.abs(got - expected).max(axis=2)
    return float((err[live] / tol[live]).max()) if live.any() else 0.0


# -- prefill -------------------------------------------------------------------------------
@dataclass
class PrefillCase:
    query: np.ndarray  # (total_query_tokens, num_heads, head_dim), storage dtype
    key_cache: np.ndarray
    value_cache: np.ndarray
    query_starts: np.ndarray  # (num_seqs + 1,) int32
    block_tables: np.ndarray
    context_lens: np.ndarray  # counting the new tokens
    scale: float

    @property
    def args(self):
        return self.query, self.key_cache, self.value_cache, self.query_starts, self.block_tables, self.context_lens

    def positions(self) -> np.ndarray:
        """Every query row's position in its sequence, and its sequence: (2, total) int."""
        q_lens = np.diff(self.query_starts)
        seqs = np.repeat(np.arange(q_lens.size), q_lens)
        rows = np.arange(self.query.shape[0])
        return np.stack([self.context_lens[seqs] - q_lens[seqs] + rows - self.query_starts[seqs], seqs])


def make_prefill_case(rng, *, seqs, block_size, num_heads, num_kv_heads, head_dim, dtype, spare=2) -> PrefillCase:
    """``seqs``: (context_len, q_len) per sequence, the q_len newest tokens being the queries.
    The cache as :func:`make_case` lays it out (every slot no kernel may read is NaN)."""
    base = make_case(
        rng, context_lens=[c for c, _ in seqs], block_size=block_size, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, spare=spare,
    )  # fmt: skip
    starts = np.concatenate([[0], np.cumsum([q for _, q in seqs])]).astype(np.int32)
    query = rng.standard_normal((int(starts[-1]), num_heads, head_dim), dtype=np.float32).astype(base.query.dtype)
    return PrefillCase(
        query, base.key_cache, base.value_cache, starts, base.block_tables, base.context_lens, base.scale
    )


def prefill_reference(case: PrefillCase) -> tuple[np.ndarray, np.ndarray]:
    """float64 causal attention of every query row over positions 0..its own, and the
    bound of :func:`dense_reference` per (row, head) with L the row's position + 1."""
    total, num_heads, head_dim = case.query.shape
    group = num_heads // case.key_cache.shape[2]
    out = np.zeros((total, num_heads, head_dim))
    tol = np.zeros((total, num_heads))
    q_all = case.query.astype(np.float32) * np.float32(case.scale)
    as_decode = Case(case.query, case.key_cache, case.value_cache, case.block_tables, case.context_lens, case.scale)
    positions, seqs = case.positions()
    gathered_seqs = {}
    for r in range(total):
        s = int(seqs[r])
        if s not in gathered_seqs:
            gathered_seqs[s] = gathered(as_decode, s)
        keys, values = gathered_seqs[s]
        seen = int(positions[r]) + 1
        for h in range(num_heads):
            kv = h // group
            out[r, h], tol[r, h] = _attend(q_all[r, h].astype(np.float64), keys[:seen, kv], values[:seen, kv])
    return out, tol


def prefill_mismatches(got: np.ndarray, case: PrefillCase, label: str) -> list[str]:
    """:func:`mismatches` for a prefill launch: rows not finite or outside the bound, described."""
    expected, tol = prefill_reference(case)
    positions, seqs = case.positions()
    if not np.isfinite(got).all():
        rows = sorted({(int(r), int(h)) for r, h, _ in np.argwhere(~np.isfinite(got))})
        where = [(int(seqs[r]), int(positions[r])) for r, _ in rows[:4]]
        return [f"{label}: non-finite output in (row, head) {rows[:4]} ((sequence, position) {where})"]
    err = np.abs(got - expected).max(axis=2)
    bad = np.argwhere(err > tol)
    if not bad.size:
        return []
    r, h = (int(v) for v in bad[0])
    s = int(seqs[r])
    return [
        f"{label}: {len(bad)} rows off, e.g. row {r} (seq {s}, position {int(positions[r])} of a context of "
        f"{int(case.context_lens[s])}) head {h}: error {err[r, h]:.3g} > tolerance {tol[r, h]:.3g}"
    ]
