"""Plain data for views: what a picture of the engine at one step needs, and nothing else.

A :class:`Frame` is built on the worker that owns the simulator and handed to the GUI
thread whole, so views draw from immutable data and never touch the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pagesim.core import events as ev
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator, StepResult
from pagesim.core.metrics import Metrics
from pagesim.core.model_runner import AttentionReport
from pagesim.core.timeline import Timeline


@dataclass(frozen=True)
class SequenceState:
    seq_id: str
    num_tokens: int
    block_table: tuple[int, ...]


@dataclass(frozen=True)
class FocusDetail:
    """The selected sequence's decode step in detail (all heads)."""

    seq_id: str
    context_len: int
    output: np.ndarray  # (num_heads, head_dim): the paged kernel's
    dense: np.ndarray  # (num_heads, head_dim): dense SDPA's
    head_errors: np.ndarray  # (num_heads,)
    head_tolerances: np.ndarray  # (num_heads,): what rounding explains, per head
    kv_mismatch: str | None  # None: the K/V read through the table are bit for bit what was written
    weights: np.ndarray  # (num_heads, context_len): softmax over the context
    token_blocks: np.ndarray  # (context_len,): physical block read for each token


@dataclass(frozen=True)
class Frame:
    position: int  # steps applied (0 = start)
    length: int  # steps in the timeline
    config: CacheConfig
    scenario_name: str
    scenario_description: str
    label: str  # the last step's operation, or "start"
    ref_counts: np.ndarray  # (num_blocks,)
    block_fill: np.ndarray  # (num_blocks,) tokens held
    holders: dict[int, tuple[tuple[str, int], ...]]  # block -> (seq, logical index) pairs
    free_queue: tuple[int, ...]  # free blocks, next allocation first
    sequences: tuple[SequenceState, ...]
    history: tuple[Metrics, ...]  # metrics of steps 1..position
    result: StepResult | None  # the step that produced this frame (its events)
    attention: AttentionReport | None
    focus: FocusDetail | None
    backend: str
    device: str
    operations: tuple = ()  # the timeline's operations (scenario + the user's own)
    # What this frame's step changed, so views can redraw only that; None: anything.
    touched_blocks: frozenset[int] | None = None
    touched_sequences: frozenset[str] | None = None
    cached_blocks: frozenset[int] = frozenset()  # blocks holding a reusable prefix (free or not)
    # The scheduler's queues (request ids, in order) and counters; None without one.
    queues: dict[str, tuple[str, ...]] | None = None
    scheduler_counts: dict[str, int] | None = None
    # Branching: the step after which the user's actions left the script, and what undo/redo can do.
    branch_step: int | None = None
    can_undo: bool = False
    can_redo: bool = False
    # What this step did in one sentence, the scenario's own narration of it, and a line per step.
    caption: str = ""
    note: str = ""
    captions: tuple[str, ...] = ()
    # The CPU swap pool: its size and, per CPU block in use, the swapped sequences holding it.
    num_cpu_blocks: int = 0
    cpu_holders: tuple[tuple[int, tuple[str, ...]], ...] = ()
    cpu_moved: frozenset[int] = frozenset()  # CPU blocks the current step swapped out or in

    @property
    def metrics(self) -> Metrics | None:
        return self.history[-1] if self.history else None

    def sequence(self, seq_id: str) -> SequenceState | None:
        return next((s for s in self.sequences if s.seq_id == seq_id), None)


def _cpu_holders(sim: Simulator) -> tuple[tuple[int, tuple[str, ...]], ...]:
    holders: dict[int, list[str]] = {}
    for seq in sim.swapped.values():
        for block in seq.block_table:
            holders.setdefault(block, []).append(seq.seq_id)
    return tuple(sorted((block, tuple(seqs)) for block, seqs in holders.items()))


def attention_weights(sim: Simulator, seq_id: str) -> tuple[np.ndarray, np.ndarray]:
    """Softmax weights (num_heads, context_len) of ``seq_id``'s newest token, from its
    dense K/V, and the physical block each context token was read from."""
    seq = sim.sequence(seq_id)
    c = sim.config
    keys, _ = sim.dense_kv(seq_id)
    query, _, _ = sim.runner.model.qkv([seq.token_ids[-1]], [seq.num_tokens - 1])
    q = query[0].astype(sim.runner.cache.dtype).astype(np.float32)  # (H, D)
    k = keys.astype(np.float32)  # (T, Hkv, D)
    kv_of_head = np.arange(c.num_heads) // (c.num_heads // c.num_kv_heads)
    scores = np.einsum("hd,thd->ht", q, k[:, kv_of_head, :]) / np.sqrt(c.head_dim)
    scores -= scores.max(axis=1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=1, keepdims=True)
    token_blocks = np.repeat(np.array(seq.block_table), c.block_size)[: seq.num_tokens]
    return weights.astype(np.float32), token_blocks


def focus_detail(sim: Simulator, seq_id: str | None, unchanged: FocusDetail | None = None) -> FocusDetail | None:
    """``unchanged``: the previous step's detail of the same sequence, which that step did not
    touch: its softmax weights still hold (the kernel's output and the checks are new)."""
    report = sim.last_attention
    if seq_id is None or report is None or seq_id not in report.seq_ids or seq_id not in sim.sequences:
        return None
    row = report.index_of(seq_id)
    if unchanged is not None and unchanged.seq_id == seq_id and unchanged.context_len == report.context_lens[row]:
        weights, token_blocks = unchanged.weights, unchanged.token_blocks
    else:
        weights, token_blocks = attention_weights(sim, seq_id)
    return FocusDetail(
        seq_id=seq_id,
        context_len=int(report.context_lens[row]),
        output=report.output[row],
        dense=report.dense[row],
        head_errors=report.head_errors[row],
        head_tolerances=report.tolerances[row],
        kv_mismatch=sim.verify_kv(seq_id),
        weights=weights,
        token_blocks=token_blocks,
    )


def touched_by(result: StepResult, sim: Simulator) -> tuple[frozenset, frozenset]:
    """Blocks and sequences whose picture one step changed (from its events)."""
    blocks: set[int] = set()
    seqs: set[str] = set()
    for event in result.op_events:  # (attention events change no block's picture)
        if event.changes_pool:
            blocks.update(event.touched_blocks)
            seqs.update(event.touched_seqs)
    # A ref count change shows in every table that holds the block.
    for block in blocks:
        seqs.update(seq for seq, _ in sim.holders(block))
    return frozenset(blocks), frozenset(seqs)


def build_frame(
    timeline: Timeline, focus_seq: str | None, result: StepResult | None = None, previous: Frame | None = None
) -> Frame:
    """The picture after the timeline's current step. With the ``previous`` frame of the
    step just before (and this step's ``result``), only what the step touched is rebuilt."""
    sim = timeline.sim
    if focus_seq not in sim.sequences:
        focus_seq = next(iter(sim.sequences), None)
    incremental = result is not None and previous is not None and previous.position == timeline.position - 1
    touched_blocks, touched_sequences = touched_by(result, sim) if result is not None else (None, None)
    if incremental:
        holders = dict(previous.holders)
        ref_counts, block_fill = previous.ref_counts.copy(), previous.block_fill.copy()
        for block in touched_blocks:
            held = sim.holders(block)
            if held:
                holders[block] = tuple(held)
            else:
                holders.pop(block, None)
            ref_counts[block] = sim.pool.ref_count(block)
            block_fill[block] = sim.block_fill(block)
        history = (*previous.history, result.metrics)
        # A sequence the step did not touch keeps its picture (most of 256, every step).
        before = {s.seq_id: s for s in previous.sequences}
        sequences = tuple(
            kept
            if (kept := before.get(seq_id)) is not None
            and seq_id not in touched_sequences
            and kept.num_tokens == seq.num_tokens
            and len(kept.block_table) == len(seq.block_table)
            else SequenceState(seq_id, seq.num_tokens, tuple(seq.block_table))
            for seq_id, seq in sim.sequences.items()
        )
    else:
        holders = sim.holders_map()
        ref_counts = np.array(sim.pool.ref_counts(), dtype=np.int32)
        block_fill = np.array(sim.block_fills(), dtype=np.int32)
        history = tuple(r.metrics for k in range(1, timeline.position + 1) if (r := timeline.result(k)) is not None)
        sequences = tuple(SequenceState(s.seq_id, s.num_tokens, tuple(s.block_table)) for s in sim.sequences.values())
    # The focused sequence's weights, if the step left it alone (most steps of a big batch).
    kept_focus = previous.focus if incremental and focus_seq not in touched_sequences else None
    current = timeline.current
    return Frame(
        position=timeline.position,
        length=timeline.length,
        config=sim.config,
        scenario_name=timeline.scenario.name,
        scenario_description=timeline.scenario.description,
        label=current.op.describe() if current is not None else "start",
        ref_counts=ref_counts,
        block_fill=block_fill,
        holders=holders,
        free_queue=tuple(sim.pool.free_blocks()),
        sequences=sequences,
        history=history,
        result=result,
        attention=sim.last_attention,
        focus=focus_detail(sim, focus_seq, kept_focus),
        backend=sim.runner.backend.name,
        device=sim.runner.backend.device,
        operations=tuple(timeline.operations),
        touched_blocks=touched_blocks,
        touched_sequences=touched_sequences,
        cached_blocks=frozenset(sim.pool.cached_blocks()),
        queues=None
        if not sim.scheduler.used
        else {
            "waiting": tuple(sim.scheduler.waiting),
            "running": tuple(sim.scheduler.running),
            "swapped": tuple(sim.scheduler.swapped),
            "finished": tuple(r for r, state in sim.scheduler.requests.items() if state.status == "finished"),
        },
        scheduler_counts=None if not sim.scheduler.used else sim.scheduler.counts(),
        branch_step=timeline.branch_step,
        can_undo=timeline.can_undo,
        can_redo=timeline.can_redo,
        num_cpu_blocks=sim.config.num_cpu_blocks,
        cpu_holders=_cpu_holders(sim),
        cpu_moved=frozenset(
            e.cpu_block
            for e in (current.op_events if current is not None else ())
            if isinstance(e, ev.BlockSwappedOut | ev.BlockSwappedIn)
        ),
        caption=timeline.caption(timeline.position),
        note=timeline.note(timeline.position),
        captions=timeline.captions(),
    )


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
    trace: object  # kernels.trace.KernelTrace
    kernel_output: np.ndarray  # the kernel's row, as it ran this step
    dense_output: np.ndarray
    bound: float  # what rounding explains for this row
    dense_error: float
    stage_token: tuple[int, ...]  # the token each stage is about (-1: a merge or the result)

    @property
    def trace_error(self) -> float:
        return float(np.abs(self.trace.output - self.kernel_output).max())

    @property
    def num_stages(self) -> int:
        return len(self.stage_token)

    def stage_text(self, stage: int) -> str:
        """One sentence for a stage (written when shown: a long context has thousands)."""
        trace = self.trace
        if stage < len(trace.steps):
            text = _describe_step(trace.steps[stage], self.kernel, split=bool(trace.partitions))
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
    if step.m_before == float("-inf"):
        text += f" · first token here: m = {step.m_after:+.3f}"
    elif step.m_after > step.m_before:
        text += (
            f" · new max {step.m_before:+.3f} → {step.m_after:+.3f}: "
            f"rescale by exp(m_old − m_new) = ×{step.correction:.3f}"
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


def walk_through(sim: Simulator, seq_id: str, head: int, kernel: str, partition_size: int) -> WalkThrough | None:
    """Replay this step's kernel for ``seq_id``'s query head ``head`` (None if it did not attend)."""
    from pagesim.kernels.trace import trace_cpu, trace_cuda

    report = sim.last_attention
    if report is None or seq_id not in report.seq_ids or kernel not in KERNEL_CHOICES:
        return None
    row = report.index_of(seq_id)
    head = min(max(0, head), report.query.shape[1] - 1)
    backend = sim.runner.backend
    inputs = (
        report.query,
        backend.to_numpy(sim.runner.cache.key_cache),
        backend.to_numpy(sim.runner.cache.value_cache),
        report.block_tables,
        report.context_lens,
    )
    if kernel == "cpu":
        trace = trace_cpu(*inputs, row, head, report.scale)
    else:
        trace = trace_cuda(*inputs, row, head, report.scale, kernel[-2:], partition_size)
    tokens = [step.token for step in trace.steps] + [-1] * (len(trace.merges) + 1)
    return WalkThrough(
        seq_id, head, kernel, partition_size, trace, report.output[row, head], report.dense[row, head],
        float(report.tolerances[row, head]), float(report.head_errors[row, head]), tuple(tokens),
    )  # fmt: skip
