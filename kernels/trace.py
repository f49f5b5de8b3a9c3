"""A step-by-step replay of the paged-attention kernels for one (sequence, query head):
what the kernel walk-through shows, in plain NumPy, outside Qt.

The replay follows each kernel's own order of work, so its stages are the kernel's:
- the CPU kernel (``kernels/cpu_backend.py``) folds one tile of whole blocks at a time
  (≥ 4 blocks, ≥ 32 tokens): the block-table lookups, the tile's scores, its max, the rescale of the
  running sum and accumulator by exp(m_old − m_new), then the tile's exp-weighted values; a
  few long sequences are split into partitions, reduced at the end as v2's are (inside a
  tile the kernel reads token t of each block in turn; the replay lists the tokens in
  order, which changes only the order of the value sums, not the running max or ℓ);
- the CUDA kernel (``kernels/paged_attention.cu``) attends up to 4 query heads of one KV
  group in a thread block (each K/V load serves all of them; a head's walk is the same
  whichever block it shares), and gives each of its 4 warps thread groups
  of ``GROUP`` lanes; per iteration group g of warp w takes a batch of TOKENS_PER_ITER
  tokens first + g + j·TOKENS_PER_WARP for first = begin + w·span (span = TOKENS_PER_WARP ·
  TOKENS_PER_ITER), stepping by 4·span, and keeps its own online softmax, rescaled once per
  batch; the groups of a warp then merge by xor shuffles (masks GROUP, 2·GROUP, … 16), the warps through
  shared memory; v2 does that per 512-token partition and a reduce rescales each
  partition by exp(m_i − M) weighted by its exp-sum.
The states are computed per lane in float64 with NumPy (fast enough for a long context on
the GUI's worker); the trace's output equals the kernel's within the kernel's rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from pagesim.kernels.cuda_build import PARTITION_SIZE
from pagesim.kernels.geometry import NUM_WARPS, WARP, CudaGeometry


class TokenStep(NamedTuple):
    """One token folded into an online-softmax state (a named tuple: thousands per trace,
    and a frozen dataclass costs several times more to build)."""

    token: int
    logical_block: int
    physical_block: int
    slot: int
    score: float  # (q·scale)·k
    m_before: float
    m_after: float
    correction: float  # exp(m_before − m_after): how the old state was rescaled
    l_after: float
    lane: tuple[int, int, int] | None = None  # CUDA: (warp, group, iteration)
    partition: int = 0


@dataclass(frozen=True)
class Merge:
    """Two online-softmax states combined: ``stage`` is "group" (a xor shuffle within a warp,
    ``mask``), "warp" (through shared memory) or "reduce" (v2's partitions)."""

    stage: str
    partition: int
    into: int
    other: int
    mask: int
    m: float
    l: float  # noqa: E741 - the name the kernels and the literature use
    warp: int = 0  # "group": the warp whose thread groups merge


@dataclass(frozen=True)
class PartitionResult:
    index: int
    begin: int
    end: int
    max_logit: float
    exp_sum: float
    output: np.ndarray  # normalised partial output (head_dim,)


@dataclass
class KernelTrace:
    kernel: str  # "cpu", "cuda-v1" or "cuda-v2"
    seq_row: int
    head: int
    kv_head: int
    context_len: int
    partition_size: int
    lookups: list[tuple[int, int]] = field(default_factory=list)  # (logical, physical), in the kernel's order
    scores: np.ndarray | None = None  # (context_len,)
    steps: list[TokenStep] = field(default_factory=list)
    block_folds: list[dict] = field(default_factory=list)  # CPU: per tile (blocks, max, new max, correction, sum)
    merges: list[Merge] = field(default_factory=list)
    partitions: list[PartitionResult] = field(default_factory=list)
    geometry: CudaGeometry | None = None
    output: np.ndarray | None = None


def _inputs(query, key_cache, value_cache, block_tables, context_lens, row: int, head: int, scale: float):
    num_heads = query.shape[1]
    kv_head = head // (num_heads // key_cache.shape[2])
    q = query[row, head].astype(np.float32) * np.float32(scale)
    n = int(context_lens[row])
    bs = key_cache.shape[1]
    positions = np.arange(n)
    blocks = np.asarray(block_tables[row])[positions // bs]
    keys = key_cache[blocks, positions % bs, kv_head].astype(np.float32)
    values = value_cache[blocks, positions % bs, kv_head].astype(np.float32)
    scores = (keys @ q).astype(np.float32)
    return kv_head, n, bs, blocks, values, scores


def trace_cpu(query, key_cache, value_cache, block_tables, context_lens, row: int, head: int, scale: float):
    """The CPU kernel's walk: its work split (:func:`kernels.cpu_backend.work_split`), tile
    by tile of whole blocks with one rescale per tile, partition by partition, and for a
    split sequence the partitions reduced as v2's are."""
    from pagesim.kernels.cpu_backend import work_split  # (Numba loads when a trace is asked for)

    kv_head, n, bs, blocks, values, scores = _inputs(
        query, key_cache, value_cache, block_tables, context_lens, row, head, scale
    )
    tile_blocks, part_blocks, parts = work_split(query.shape[0], np.asarray(block_tables).shape[1], bs)
    trace = KernelTrace("cpu", row, head, kv_head, n, part_blocks * bs if parts > 1 else n, scores=scores)
    seq_blocks = -(-n // bs)
    for part in range(parts):
        first, last = part * part_blocks, min(seq_blocks, (part + 1) * part_blocks)
        if first >= last:
            continue  # past this sequence's end: the kernel's state stays empty
        m, l = -np.inf, 0.0  # noqa: E741
        acc = np.zeros(values.shape[1], np.float64)
        for tile_first in range(first, last, tile_blocks):
            tile_last = min(last, tile_first + tile_blocks)
            trace.lookups.extend((logical, int(blocks[logical * bs])) for logical in range(tile_first, tile_last))
            lo, hi = tile_first * bs, min(n, tile_last * bs)
            tile = scores[lo:hi].astype(np.float64)
            new_max = max(m, float(tile.max()))
            correction = float(np.exp(m - new_max)) if m != -np.inf else 0.0
            p = np.exp(tile - new_max)
            running = l * correction + np.cumsum(p)
            acc = acc * correction + p @ values[lo:hi]
            columns = (range(lo, hi), blocks[lo:hi].tolist(), scores[lo:hi].tolist(), running.tolist())
            for token, physical, score, total in zip(*columns, strict=True):
                first_token = token == lo  # the tile's rescale happened before its first token
                trace.steps.append(
                    TokenStep(token, token // bs, physical, token % bs, score, m if first_token else new_max,
                              new_max, correction if first_token else 1.0, total, None, part)
                )  # fmt: skip
            l = float(running[-1])  # noqa: E741
            trace.block_folds.append(
                {"logical": tile_first, "logical_end": tile_last, "block_max": float(tile.max()), "m": new_max,
                 "correction": correction, "l": l, "partition": part}
            )  # fmt: skip
            m = new_max
        output = (acc / l).astype(np.float32) if l > 0 else np.zeros(values.shape[1], np.float32)
        trace.partitions.append(PartitionResult(part, first * bs, min(n, last * bs), m, l, output))
    if len(trace.partitions) <= 1:
        trace.output = trace.partitions[0].output if trace.partitions else np.zeros(values.shape[1], np.float32)
        trace.partitions = []  # one partition: nothing to reduce
        return trace
    _reduce(trace)
    return trace


def _merge(a, b):
    (m1, l1, acc1), (m2, l2, acc2) = a, b
    m = max(m1, m2)
    if m == -np.inf:
        return a
    wa, wb = np.exp(m1 - m), np.exp(m2 - m)
    return m, l1 * wa + l2 * wb, acc1 * wa + acc2 * wb


def _batched_running(scores: np.ndarray, batch: int):
    """The online softmax over ``scores`` in order, rescaled once per ``batch`` tokens (the
    batch's max taken before any of its exps): m before and after each token, the rescale
    factor (at a batch's first token; 1 after), and ℓ after each — as lists, in NumPy (a
    long context has thousands of tokens per thread group)."""
    s = scores.astype(np.float64)
    n = len(s)
    padded = np.full(-(-n // batch) * batch, -np.inf)
    padded[:n] = s
    m_batch = np.maximum.accumulate(padded.reshape(-1, batch).max(axis=1))  # m after each batch
    m_prev = np.concatenate([[-np.inf], m_batch[:-1]])
    with np.errstate(invalid="ignore"):
        factor = np.where(np.isneginf(m_prev), 0.0, np.exp(m_prev - m_batch))
    of_batch = np.arange(n) // batch
    first = np.arange(n) % batch == 0
    m_after = m_batch[of_batch]
    m_before = np.where(first, m_prev[of_batch], m_after)
    correction = np.where(first, factor[of_batch], 1.0)
    # ℓ_t = Σ_{i ≤ t} exp(s_i − m_after_t), summed against the final max to stay in range.
    top = m_batch[-1]
    running = np.cumsum(np.exp(s - top)) * np.exp(top - m_after)
    return m_before.tolist(), m_after.tolist(), correction.tolist(), running.tolist()


def _attend_range(trace: KernelTrace, geometry, scores, values, blocks, bs, begin, end, partition):
    """One thread block's work over tokens [begin, end): groups, then warps."""
    d = values.shape[1]
    states = {}
    steps = []
    span, per_round = geometry.warp_span, NUM_WARPS * geometry.warp_span
    for w in range(NUM_WARPS):
        for g in range(geometry.tokens_per_warp):
            # Group g of warp w, iteration after iteration: its batch of tokens a group apart.
            firsts = np.arange(begin + w * span + g, end, per_round)
            tokens = (firsts[:, None] + np.arange(geometry.batch)[None, :] * geometry.tokens_per_warp).ravel()
            tokens = tokens[tokens < end]
            if tokens.size == 0:
                states[(w, g)] = (-np.inf, 0.0, np.zeros(d))
                continue
            m_before, m, correction, l = _batched_running(scores[tokens], geometry.batch)  # noqa: E741
            weights = np.exp(scores[tokens].astype(np.float64) - m[-1])
            states[(w, g)] = (float(m[-1]), float(l[-1]), weights @ values[tokens])
            iterations = ((tokens - begin) // per_round).tolist()
            columns = (tokens.tolist(), blocks[tokens].tolist(), scores[tokens].tolist(), m_before, m, correction, l,
                       iterations)  # fmt: skip
            for t, block, score, before, after, factor, total, i in zip(*columns, strict=True):
                steps.append(
                    TokenStep(t, t // bs, block, t % bs, score, before, after, factor, total, (w, g, i), partition)
                )
    steps.sort(key=lambda step: step.token)  # the kernel's order: round after round, lanes side by side
    trace.steps.extend(steps)
    # Groups of a warp: xor shuffles; every group ends with the warp's state.
    mask = geometry.group
    while mask < WARP:
        step = mask // geometry.group
        for w in range(NUM_WARPS):
            merged = {}
            for g in range(geometry.tokens_per_warp):
                merged[g] = _merge(states[(w, g)], states[(w, g ^ step)])
                if g < (g ^ step):
                    m, l, _ = merged[g]  # noqa: E741
                    trace.merges.append(Merge("group", partition, g, g ^ step, mask, float(m), float(l), w))
            for g, state in merged.items():
                states[(w, g)] = state
        mask *= 2
    # Warps through shared memory.
    warps = [states[(w, 0)] for w in range(NUM_WARPS)]
    global_max = max(m for m, _, _ in warps)
    weights = [0.0 if m == -np.inf else float(np.exp(m - global_max)) for m, _, _ in warps]
    total = sum(exp_sum * w for (_, exp_sum, _), w in zip(warps, weights, strict=True))
    for w, ((_, exp_sum, _), weight) in enumerate(zip(warps, weights, strict=True)):
        trace.merges.append(Merge("warp", partition, 0, w, 0, float(global_max), float(exp_sum * weight)))
    acc = sum((a * weight for (_, _, a), weight in zip(warps, weights, strict=True)), np.zeros(d))
    out = acc / total if total > 0 else np.zeros(d)
    return global_max, total, out.astype(np.float32)


def trace_cuda(
    query, key_cache, value_cache, block_tables, context_lens, row: int, head: int, scale: float,
    variant: str = "v1", partition_size: int = PARTITION_SIZE,
):  # fmt: skip
    """The CUDA kernel's walk. ``partition_size`` other than the kernel's 512 is a teaching
    value (small scenarios can show v2's partitions); the default is the real one."""
    kv_head, n, bs, blocks, values, scores = _inputs(
        query, key_cache, value_cache, block_tables, context_lens, row, head, scale
    )
    geometry = CudaGeometry.of(key_cache.dtype, key_cache.shape[3], query.shape[1], key_cache.shape[2])
    size = n if variant == "v1" else partition_size
    trace = KernelTrace(f"cuda-{variant}", row, head, kv_head, n, size, scores=scores, geometry=geometry)
    for logical in range(-(-n // bs)):
        trace.lookups.append((logical, int(blocks[logical * bs])))
    if n == 0:
        trace.output = np.zeros(values.shape[1], np.float32)
        return trace
    if variant == "v1":
        _, _, trace.output = _attend_range(trace, geometry, scores, values, blocks, bs, 0, n, 0)
        return trace
    for index, begin in enumerate(range(0, n, size)):
        end = min(begin + size, n)
        m, total, out = _attend_range(trace, geometry, scores, values, blocks, bs, begin, end, index)
        trace.partitions.append(PartitionResult(index, begin, end, float(m), float(total), out))
    _reduce(trace)
    return trace


def _reduce(trace: KernelTrace) -> None:
    """Partitions' normalised outputs rescaled by exp(mᵢ − M) and weighted by their exp-sums."""
    big_m = max(p.max_logit for p in trace.partitions)
    weights = [p.exp_sum * float(np.exp(p.max_logit - big_m)) for p in trace.partitions]
    total = sum(weights)
    for p, w in zip(trace.partitions, weights, strict=True):
        trace.merges.append(Merge("reduce", p.index, 0, p.index, 0, float(big_m), float(w)))
    acc = sum(
        (p.output * w for p, w in zip(trace.partitions, weights, strict=True)),
        np.zeros_like(trace.partitions[0].output),
    )
    trace.output = (acc / total).astype(np.float32)
