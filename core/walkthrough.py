"""The kernel walk-through's content, outside Qt: which kernels it can replay, the replay of
one (sequence, head) of the current step (:func:`walk_through`, on the worker), and the
sentence that describes each of its stages."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pagesim.core.engine import Simulator
from pagesim.kernels.trace import KernelTrace, trace_cpu, trace_cuda

KERNEL_CHOICES = {
    "cpu": "CPU: tile by tile",
    "cuda-v1": "CUDA v1: warps, groups",
    "cuda-v2": "CUDA v2: partitions",
}


@dataclass(frozen=True)
class WalkThrough:
    """The kernel's work for one (sequence, head) at the current step, stage by stage."""

    seq_id: str
    head: int
    kernel: str  # a KERNEL_CHOICES key
    partition_size: int
    trace: KernelTrace
    kernel_output: np.ndarray  # the kernel's row, as it ran this step
    dense_output: np.ndarray
    bound: float  # what rounding explains for this row
    dense_error: float
    stage_token: tuple[int, ...]  # the token each stage is about (-1: a merge or the result)
    layer: int = 0  # a real model's layer whose K/V the replay read
    num_layers: int = 1

    @property
    def trace_error(self) -> float:
        return float(np.abs(self.trace.output - self.kernel_output).max())

    @property
    def rescales(self) -> int:
        """How many times a new maximum rescaled what was summed before it."""
        return sum(1 for s in self.trace.steps if s.m_before != float("-inf") and s.m_after > s.m_before)

    @property
    def num_stages(self) -> int:
        return len(self.stage_token)

    def stage_text(self, stage: int) -> str:
        """One sentence for a stage (written when shown: a long context has thousands)."""
        trace = self.trace
        if stage < len(trace.steps):
            text = _describe_step(trace.steps[stage], self.kernel, split=bool(trace.partitions))
            # (the CPU kernel's one tile; CUDA's merges rescale)
            if stage == 0 and not self.rescales and not trace.merges:
                text += " · no later max: nothing rescaled (a longer context shows it)"
            return text + _thread_block_note(trace)
        if stage - len(trace.steps) < len(trace.merges):
            return _describe_merge(trace.merges[stage - len(trace.steps)])
        return (
            f"output: replay vs kernel max |Δ| {self.trace_error:.1e}, kernel vs dense {self.dense_error:.1e} "
            f"(rounding bound {self.bound:.1e})"
        )


def _thread_block_note(trace) -> str:
    """Where a CUDA head's thread block sits when it attends several heads of a KV group."""
    geometry = trace.geometry
    if geometry is None or geometry.heads_per_block == 1:
        return ""
    block = geometry.thread_block_of(trace.head)
    first = block * geometry.heads_per_block
    return (
        f" · thread block {block} attends heads {first}–{first + geometry.heads_per_block - 1} "
        f"(KV head {trace.kv_head}): one K/V load serves all of them"
    )


def _describe_step(step, kernel: str, split: bool = False) -> str:
    text = (
        f"token {step.token}: logical block {step.logical_block} → physical block #{step.physical_block}, "
        f"slot {step.slot} · score q·k·scale = {step.score:+.3f}"
    )
    # A kernel takes the max of the tokens it handles together (a tile, a thread group's
    # batch) before any of their exps: m can be a later token's score, not this one's.
    together = "tile" if kernel == "cpu" else "batch"
    ahead = f" (the highest score in this token's {together}: the kernel finds it before taking any exp)"
    if step.m_before == float("-inf"):
        text += f" · m starts at {step.m_after:+.3f}" + (ahead if step.m_after > step.score else "")
    elif step.m_after > step.m_before:
        text += (
            f" · new max {step.m_before:+.3f} → {step.m_after:+.3f}"
            + (ahead if step.m_after > step.score else "")
            + f": rescale by exp(m_old − m_new) = ×{step.correction:.3f}"
        )
    text += f" · ℓ = {step.l_after:.3f}"
    if step.lane is None and split:
        text += f" · partition {step.partition}"
    if step.lane is not None:
        warp, group, iteration = step.lane
        text += f" · warp {warp}, thread group {group}, iteration {iteration}"
        if kernel == "cuda-v2":
            text += f", partition {step.partition}"
    return text


def _describe_merge(merge) -> str:
    if merge.stage == "group":
        return (
            f"partition {merge.partition}: thread groups {merge.into} and {merge.other} of each warp merge by a "
            f"xor shuffle (mask {merge.mask}): m = {merge.m:+.3f}, ℓ = {merge.l:.3f}"
        )
    if merge.stage == "warp":
        return (
            f"partition {merge.partition}: warp {merge.other} joins through shared memory, its ℓ weighted by "
            f"exp(m_warp − M) to {merge.l:.3f} (M = {merge.m:+.3f})"
        )
    return f"reduce: partition {merge.other} weighted by its exp-sum × exp(mᵢ − M) = {merge.l:.4f} (M = {merge.m:+.3f})"


def walk_through(
    sim: Simulator, seq_id: str, head: int, kernel: str, partition_size: int, layer: int | None = None
) -> WalkThrough | None:
    """Replay this step's kernel for ``seq_id``'s query head ``head`` (None if it did not
    attend); on a real model, in ``layer`` (None: the step's worst, as the Check panel)."""
    report = sim.last_attention
    if report is None or seq_id not in report.seq_ids or kernel not in KERNEL_CHOICES:
        return None
    row = report.index_of(seq_id)
    head = min(max(0, head), report.query.shape[1] - 1)
    runner = sim.runner
    shown = sim.shown_layer(layer)
    if shown == runner.check_layer:
        key_cache, value_cache = runner.cache_arrays()
        inputs = (report.query, key_cache, value_cache, report.block_tables, report.context_lens)
        output, dense = report.output[row, head], report.dense[row, head]
        bound, error = float(report.tolerances[row, head]), float(report.head_errors[row, head])
    else:
        detail = sim.layer_detail(seq_id, shown, int(report.context_lens[row]))
        key_cache, value_cache = runner.cache_arrays(shown)
        inputs = (detail.query[None], key_cache, value_cache, detail.block_tables, detail.context_lens)
        row = 0
        output, dense = detail.output[head], detail.dense[head]
        bound, error = float(detail.bounds[head]), float(detail.errors[head])
    if kernel == "cpu":
        trace = trace_cpu(*inputs, row, head, report.scale)
    else:
        trace = trace_cuda(*inputs, row, head, report.scale, kernel[-2:], partition_size)
    tokens = [step.token for step in trace.steps] + [-1] * (len(trace.merges) + 1)
    return WalkThrough(
        seq_id, head, kernel, partition_size, trace, output, dense, bound, error, tuple(tokens), shown,
        runner.num_layers,
    )  # fmt: skip
