"""Plain data for views: what a picture of the engine at one step needs, and nothing else.

A :class:`Frame` is built on the worker that owns the simulator and handed to the GUI
thread whole, so views draw from immutable data and never touch the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pagesim.core import events as ev
from pagesim.core.beam_tree import BeamTree, timeline_beam_trees
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator, StepResult
from pagesim.core.metrics import Metrics
from pagesim.core.model_runner import AttentionReport
from pagesim.core.operations import Schedule, Submit
from pagesim.core.step_work import StepWork, step_work
from pagesim.core.timeline import Timeline
from pagesim.core.token_budget import TokenBudget, prefill_progress, step_budget
from pagesim.core.token_text import PieceOf, piece_function, pieces_of, tokenizer_of


@dataclass(frozen=True)
class SequenceState:
    seq_id: str
    num_tokens: int
    block_table: tuple[int, ...]
    # A real model's: each token's text and how many tokens the prompt had (None: synthetic ids).
    pieces: tuple[str, ...] | None = None
    prompt_len: int = 0


def sequence_state(seq, piece: PieceOf | None) -> SequenceState:
    pieces = None if piece is None else pieces_of(piece, seq.token_ids)
    return SequenceState(seq.seq_id, seq.num_tokens, tuple(seq.block_table), pieces, seq.prompt_len)


@dataclass(frozen=True)
class AttentionSummary:
    """The step's attention check over every live sequence, as the views draw it: per
    sequence (in ``seq_ids``' order) its context, the blocks the kernel read, the max abs
    error of each head against dense attention and what rounding explains; the verdict."""

    backend: str
    device: str
    seq_ids: tuple[str, ...]
    context_lens: np.ndarray  # (num_seqs,)
    block_tables: np.ndarray  # (num_seqs, max_blocks): the block-table tensor the kernel read
    block_size: int
    head_errors: np.ndarray  # (num_seqs, num_heads)
    tolerances: np.ndarray  # (num_seqs, num_heads)
    passed: bool  # every head of every sequence within its rounding bound
    max_abs_error: float
    tolerance: float  # the loosest row's bound
    kernel_seconds: float
    dense_seconds: float

    @classmethod
    def of(cls, report: AttentionReport) -> AttentionSummary:
        return cls(
            report.backend, report.device, report.seq_ids, report.context_lens, report.block_tables,
            report.block_size, report.head_errors, report.tolerances, report.passed, report.max_abs_error,
            report.tolerance, report.kernel_seconds, report.dense_seconds,
        )  # fmt: skip

    def lookup_of(self, seq_id: str | None) -> tuple[int, ...] | None:
        """The physical blocks the kernel read for ``seq_id``, in logical order (None: not attended)."""
        if seq_id not in self.seq_ids:
            return None
        row = self.seq_ids.index(seq_id)
        used = -(-int(self.context_lens[row]) // self.block_size)
        return tuple(self.block_tables[row, :used].tolist())


@dataclass(frozen=True)
class FocusDetail:
    """The selected sequence's decode step in detail (all heads)."""

    seq_id: str
    context_len: int
    output: np.ndarray  # (num_heads, head_dim): the paged kernel's
    dense: np.ndarray  # (num_heads, head_dim): dense SDPA's
    head_errors: np.ndarray  # (num_heads,)
    head_tolerances: np.ndarray  # (num_heads,): what rounding explains, per head
    head_passed: np.ndarray  # (num_heads,) bool: the error within its bound
    kv_mismatch: str | None  # None: the K/V read through the table are bit for bit what was written
    weights: np.ndarray  # (num_heads, context_len): softmax over the context
    token_blocks: np.ndarray  # (context_len,): physical block read for each token
    # A real model's: the layer shown, how many there are, the step's worst (None: no forward ran).
    layer: int = 0
    num_layers: int = 1
    worst_layer: int | None = None
    # The dense side: the dense engine's own K/V (the report's layer), or the K/V gathered
    # through the block table from the layer's cache (any other layer).
    gathered: bool = False


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
    attention: AttentionSummary | None  # the current step's attention check
    focus: FocusDetail | None
    backend: str
    device: str
    # The operation events of the step that produced this frame, to animate; None: the frame
    # did not come from a step (a seek, an undo, a new focus), and nothing animates.
    events: tuple[ev.Event, ...] | None = None
    status_notes: tuple[str, ...] = ()  # what that step's scheduling decisions cost, for the status bar
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
    script_length: int = 0  # the scenario's own steps (a branch past them sets none aside)
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
    # The v1 scheduler: what this step computed per request against its token budget (None:
    # not a v1 schedule step), and the running requests still prefilling: (computed, to compute).
    token_budget: TokenBudget | None = None
    prefilling: dict[str, tuple[int, int]] | None = None
    # Whether the tokens have text (a real model's tokenizer; each sequence's pieces), not only ids.
    has_text: bool = False
    # Any step: what it computed per sequence, prefill or decode, and the prefix hits it skipped.
    step_work: StepWork | None = None
    # A schedule of several engine steps: how many of the checks before its last failed
    # (``attention`` is the last one's).
    engine_steps_failed: int = 0
    beam_trees: tuple[BeamTree, ...] = ()  # a real model's beam searches, up to this step
    # Layers with a paged cache each (a real model's; the synthetic model attends once) and
    # the one with the least margin in this step's check of every layer (None: no forward ran).
    num_layers: int = 1
    worst_layer: int | None = None

    @property
    def metrics(self) -> Metrics | None:
        return self.history[-1] if self.history else None

    def sequence(self, seq_id: str) -> SequenceState | None:
        return next((s for s in self.sequences if s.seq_id == seq_id), None)

    def slot_texts(self, block: int) -> tuple[str, ...] | None:
        """The text in each filled slot of ``block``, read through its first holder's table
        (None: the block has no holder, or the model no text)."""
        held = self.holders.get(block) if self.has_text else None
        state = self.sequence(held[0][0]) if held else None
        if state is None or state.pieces is None:
            return None
        start = held[0][1] * self.config.block_size
        return state.pieces[start : start + int(self.block_fill[block])]

    def step_lookup(self, seq_id: str | None) -> tuple[int, ...] | None:
        """The blocks the kernel read for ``seq_id`` in the step that produced this frame, in
        logical order (None: no such step, or it did not attend ``seq_id``)."""
        if self.events is None or self.attention is None:
            return None
        return self.attention.lookup_of(seq_id)


def _cpu_holders(sim: Simulator) -> tuple[tuple[int, tuple[str, ...]], ...]:
    holders: dict[int, list[str]] = {}
    for seq in sim.swapped.values():
        for block in seq.block_table:
            holders.setdefault(block, []).append(seq.seq_id)
    return tuple(sorted((block, tuple(seqs)) for block, seqs in holders.items()))


def focus_detail(
    sim: Simulator, seq_id: str | None, unchanged: FocusDetail | None = None, layer: int | None = None
) -> FocusDetail | None:
    """``unchanged``: the previous step's detail of the same sequence, which that step did not
    touch: its softmax weights still hold (the kernel's output and the checks are new).
    ``layer``: a real model's layer to show (None: the step's worst, else the report's)."""
    report = sim.last_attention
    if seq_id is None or report is None or seq_id not in report.seq_ids or seq_id not in sim.sequences:
        return None
    row = report.index_of(seq_id)
    context_len = int(report.context_lens[row])
    runner = sim.runner
    num_layers = runner.num_layers
    worst = sim.worst_layer()
    shown = sim.shown_layer(layer)
    if shown != runner.check_layer:
        detail = sim.layer_detail(seq_id, shown, context_len)
        block_size = sim.config.block_size
        table = detail.block_tables[0]
        return FocusDetail(
            seq_id=seq_id,
            context_len=context_len,
            output=detail.output,
            dense=detail.dense,
            head_errors=detail.errors,
            head_tolerances=detail.bounds,
            head_passed=detail.errors <= detail.bounds,
            kv_mismatch=sim.verify_kv(seq_id),
            weights=detail.weights,
            token_blocks=np.repeat(table, block_size)[:context_len],
            layer=shown,
            num_layers=num_layers,
            worst_layer=worst,
            gathered=True,
        )
    same = unchanged is not None and unchanged.seq_id == seq_id and unchanged.layer == shown
    if same and unchanged.context_len == context_len:
        weights, token_blocks = unchanged.weights, unchanged.token_blocks
    else:
        weights, token_blocks = sim.attention_weights(seq_id)
    return FocusDetail(
        seq_id=seq_id,
        context_len=context_len,
        output=report.output[row],
        dense=report.dense[row],
        head_errors=report.head_errors[row],
        head_tolerances=report.tolerances[row],
        head_passed=report.head_errors[row] <= report.tolerances[row],
        kv_mismatch=sim.verify_kv(seq_id),
        weights=weights,
        token_blocks=token_blocks,
        layer=shown,
        num_layers=num_layers,
        worst_layer=worst,
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


def _uses_scheduler(timeline: Timeline) -> bool:
    """The scheduler has run, or a step of the timeline will submit to it (its lanes show,
    empty, before the first request arrives)."""
    return timeline.sim.scheduler.used or any(isinstance(op, Submit | Schedule) for op in timeline.operations)


def build_frame(
    timeline: Timeline,
    focus_seq: str | None,
    result: StepResult | None = None,
    previous: Frame | None = None,
    focus_layer: int | None = None,
) -> Frame:
    """The picture after the timeline's current step. With the ``previous`` frame of the
    step just before (and this step's ``result``), only what the step touched is rebuilt."""
    sim = timeline.sim
    scheduled = _uses_scheduler(timeline)  # (a scan of the operations: once a frame)
    piece = piece_function(tokenizer_of(sim.runner.model))
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
            else sequence_state(seq, piece)
            for seq_id, seq in sim.sequences.items()
        )
    else:
        holders = sim.holders_map()
        ref_counts = np.array(sim.pool.ref_counts(), dtype=np.int32)
        block_fill = np.array(sim.block_fills(), dtype=np.int32)
        history = tuple(r.metrics for k in range(1, timeline.position + 1) if (r := timeline.result(k)) is not None)
        sequences = tuple(sequence_state(s, piece) for s in sim.sequences.values())
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
        attention=None if sim.last_attention is None else AttentionSummary.of(sim.last_attention),
        focus=focus_detail(sim, focus_seq, kept_focus, focus_layer),
        backend=sim.runner.backend_name,
        device=sim.runner.device,
        events=None if result is None else result.op_events,
        status_notes=() if result is None else tuple(n for e in result.op_events if (n := e.status_note())),
        operations=tuple(timeline.operations),
        touched_blocks=touched_blocks,
        touched_sequences=touched_sequences,
        cached_blocks=frozenset(sim.pool.cached_blocks()),
        queues=None
        if not scheduled
        else {
            "waiting": tuple(sim.scheduler.waiting),
            "running": tuple(sim.scheduler.running),
            "swapped": tuple(sim.scheduler.swapped),
            "finished": tuple(r for r, state in sim.scheduler.requests.items() if state.status == "finished"),
        },
        scheduler_counts=sim.scheduler.counts() if scheduled else None,
        branch_step=timeline.branch_step,
        script_length=len(timeline.scenario.operations),
        can_undo=timeline.can_undo,
        can_redo=timeline.can_redo,
        num_cpu_blocks=sim.config.num_cpu_blocks,
        cpu_holders=_cpu_holders(sim),
        cpu_moved=frozenset(
            e.cpu_block
            for e in (current.op_events if current is not None else ())
            if isinstance(e, ev.BlockSwappedOut | ev.BlockSwappedIn)
        ),
        token_budget=step_budget(sim.scheduler, current.op if current is not None else None),
        prefilling=prefill_progress(sim.scheduler),
        has_text=piece is not None,
        step_work=None
        if current is None
        else step_work(
            current.op_events,
            sim.config.block_size,
            max((s.num_tokens for s in sequences), default=0),
            current.forwards if hasattr(sim.runner, "paged_seconds") else None,
        ),
        engine_steps_failed=0 if current is None else sum(not passed for passed, _ in current.inner_checks),
        beam_trees=timeline_beam_trees(timeline),
        num_layers=sim.runner.num_layers,
        worst_layer=sim.worst_layer(),
        caption=timeline.caption(timeline.position),
        note=timeline.note(timeline.position),
        captions=timeline.captions(),
    )
