"""Headless run reports: the step table, the JSON report and per-step kernel dumps."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from pagesim.app.options import json_text
from pagesim.core.engine import StepResult
from pagesim.core.events import TokenWritten
from pagesim.core.operations import Grow
from pagesim.core.timeline import Timeline
from pagesim.kernels.atomic_write import atomic_open, atomic_write
from pagesim.kernels.dtypes import dtype_name


def format_config(timeline: Timeline) -> str:
    c = timeline.scenario.config
    return (
        f"{c.num_blocks} blocks × {c.block_size} slots, {c.num_heads} heads ({c.num_kv_heads} KV) × "
        f"head dim {c.head_dim}, {c.dtype}, seed {c.seed}"
    )


# |err| and bound: the (sequence, head) nearest its bound, whose pair says how close the step came.
TABLE_HEADER = f"{'step':>4}  {'op':<28} {'used':>5} {'free':>5} {'util':>6}  {'|err|':>9} {'bound':>7}  check"


def format_step(result: StepResult) -> str:
    m = result.metrics
    att = result.attention
    if att is None:
        err, tol, check = "-", "-", "no sequences"
    elif not att.seq_ids:  # a real model's forward checked layer by layer, and then every sequence finished
        err, tol, check = "-", "-", ("ok" if att.passed else "MISMATCH") + ": its forward (no sequence left)"
    else:
        near = att.nearest_bound()
        err, tol, check = f"{near.error:9.2e}", f"{near.bound:7.1e}", "ok" if att.passed else "MISMATCH"
        if not att.attention_passed and near.exceeded:
            check += f": {near.seq_id}, head {near.head}"
    util = f"{m.utilisation:.1%}" if m.slots_allocated else "–"  # nothing allocated: nothing to be utilised
    return (
        f"{result.step:>4}  {result.op.describe():<28.28} {m.used_blocks:>5} {m.free_blocks:>5} "
        f"{util:>6}  {err:>9} {tol:>7}  {check}"
    )


def format_text(result: StepResult, tokenizer, width: int = 100) -> list[str]:
    """A real model's step in words: the text each sequence wrote (whitespace shown as it
    is, a long prompt cut in the middle)."""
    written: dict[str, list[int]] = {}
    for e in result.op_events:
        if isinstance(e, TokenWritten):
            written.setdefault(e.seq, []).append(e.token_id)
    lines = []
    for seq, ids in written.items():
        text = repr(tokenizer.decode(ids))
        if len(text) > width:
            text = text[: width // 2 - 2] + " … " + text[-(width // 2 - 2) :]
        lines.append(f"        {seq} wrote {text}")
    op = result.op
    if isinstance(op, Grow) and op.token_ids is None and len(written.get(op.seq, ())) < op.length:
        # (a real model's grow ends where its sequence does)
        lines.append(
            f"        {op.seq} stopped after {len(written.get(op.seq, ()))} of the {op.length} tokens asked: it "
            "finished (its end-of-sequence token or its max_tokens), and a later grow is refused"
        )
    return lines


def format_outputs(timeline: Timeline, tokenizer) -> list[str]:
    """A real model's text at the end of a run: each finished request's outputs (a beam
    search's best first, with its cumulative log-probability), then each live sequence's
    continuation."""
    sim = timeline.sim
    lines = []
    for request, state in sim.scheduler.requests.items():
        outputs = getattr(state, "outputs", None)
        if outputs is None and state.status == "finished":  # the v1 scheduler keeps all its tokens
            outputs = {request: tuple(state.tokens[state.prompt_len :])}
        scores = getattr(state, "beam_scores", {})
        for label, ids in (outputs or {}).items():
            score = f" (log-prob {scores[label]:.2f})" if label in scores else ""
            lines.append(f"  {label}{score}: {tokenizer.decode(ids)!r}")
    for seq in sim.sequences.values():
        if seq.num_tokens > seq.prompt_len:
            lines.append(f"  {seq.seq_id} so far: {tokenizer.decode(seq.token_ids[seq.prompt_len :])!r}")
    return ["text:", *lines, ""] if lines else []


def format_layers(result: StepResult) -> str | None:
    """A real model's per-layer check of the step, or None (the synthetic model, or no forward)."""
    layers = result.attention.layers if result.attention is not None else None
    return None if layers is None else f"        {layers.describe()}"


def format_block_tables(timeline: Timeline) -> list[str]:
    sim = timeline.sim
    lines = []
    for seq in sim.sequences.values():
        refs = ["" if sim.pool.ref_count(b) == 1 else f"×{sim.pool.ref_count(b)}" for b in seq.block_table]
        table = ", ".join(f"{b}{r}" for b, r in zip(seq.block_table, refs, strict=True))
        lines.append(f"  sequence {seq.seq_id} (len={seq.num_tokens}): physical blocks [{table}]")
    return lines


def step_report(result: StepResult) -> dict:
    att = result.attention
    out = {"step": result.step, "op": result.op.describe(), **result.metrics.as_dict()}
    if att is None:
        out.update(max_abs_error=None, passed=True, sequences={})
    else:
        attended = bool(att.seq_ids)  # (a forward checked, then every sequence finished: no attention to compare)
        out.update(
            max_abs_error=att.max_abs_error if attended else None,
            tolerance=att.tolerance if attended else None,
            passed=att.passed,
            kernel_ms=round(att.kernel_seconds * 1e3, 4),
            sequences={seq: _sequence_check(att, i) for i, seq in enumerate(att.seq_ids)},
        )
        if attended:
            near = att.nearest_bound()
            out["nearest_bound"] = {
                "sequence": near.seq_id, "head": near.head, "max_abs_error": near.error, "bound": near.bound,
            }  # fmt: skip
        if att.layers is not None:
            layers = att.layers
            out["layers"] = {
                "worst_layer": layers.worst_layer,
                "worst_error_to_bound": float(layers.ratios.max()),
                "passed": layers.attention_passed,
                "logits_max_abs_diff": layers.logits_diff,
                "same_next_tokens": layers.tokens_agree,
            }
    if result.inner_checks:  # a schedule's engine steps before its last, each checked as it ended
        out["engine_steps_before"] = [
            {"passed": passed, "max_abs_error": error} for passed, error in result.inner_checks
        ]
        out["passed"] = out["passed"] and all(passed for passed, _ in result.inner_checks)
    return out


def _sequence_check(att, row: int) -> dict:
    """A sequence's check in a JSON report: its largest error, and its head nearest its bound."""
    errors, near = att.head_errors[row], att.nearest_bound(row)
    return {
        "context_len": int(att.context_lens[row]),
        "max_abs_error": float(errors.max()),
        "passed": bool((errors <= att.tolerances[row]).all()),
        "nearest_bound": {"head": near.head, "max_abs_error": near.error, "bound": near.bound},
    }


def scheduler_queues(timeline: Timeline) -> dict[str, list[str]]:
    """The request names in each of the scheduler's queues."""
    scheduler = timeline.sim.scheduler
    finished = [r for r, state in scheduler.requests.items() if state.status == "finished"]
    rejected = [r for r, state in scheduler.requests.items() if state.status == "rejected"]
    return {
        "waiting": list(scheduler.waiting),
        "running": list(scheduler.running),
        "swapped": list(scheduler.swapped),
        "finished": finished,
        "rejected": rejected,
    }


def write_json(
    path: Path, timeline: Timeline, steps: list[dict], error: str | None, stalled: str | None = None
) -> None:
    """The JSON report of a run; ``steps`` are the :func:`step_report` of each step."""
    if steps and timeline.sim.scheduler.used:
        steps[-1]["scheduler"] = scheduler_queues(timeline)
    report = {
        "scenario": timeline.scenario.name,
        "source": timeline.scenario.source,
        "config": {k: getattr(timeline.scenario.config, k) for k in timeline.scenario.config.__dataclass_fields__},
        "backend": timeline.sim.runner.backend.name,
        "device": timeline.sim.runner.backend.device,
        "steps": steps,
        "error": error,
        "stalled": stalled,
        "passed": error is None and stalled is None and all(s["passed"] for s in steps),
    }
    text = json_text(report, default=None)  # (a value JSON cannot hold is a bug, not text)
    if str(path) == "-":
        sys.stdout.write(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text)


def _savable(array: np.ndarray) -> np.ndarray:
    # .npz has no bfloat16: store its exact bit pattern; kv_dtype says how to read it.
    return array.view(np.uint16) if array.dtype.name == "bfloat16" else array


def dump_step(folder: Path, timeline: Timeline, result: StepResult) -> Path | None:
    """Write exactly the kernel's inputs and outputs of one step, with vLLM's names."""
    att = result.attention
    if att is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    backend = timeline.sim.runner.backend
    cache = timeline.sim.runner.cache
    path = folder / f"step_{result.step:04d}.npz"
    arrays = dict(
        query=_savable(att.query),
        key_cache=_savable(backend.to_numpy(cache.key_cache)),
        value_cache=_savable(backend.to_numpy(cache.value_cache)),
        block_tables=att.block_tables,
        context_lens=att.context_lens,
        scale=np.float32(att.scale),
        output=att.output,
        dense=att.dense,
        kv_dtype=np.array(dtype_name(cache.dtype)),
        seq_ids=np.array(att.seq_ids),
    )
    with atomic_open(path, "wb") as f:
        np.savez_compressed(f, **arrays)
    return path


def event_record(step: int, event) -> dict:
    from dataclasses import asdict

    return {"step": step, "event": type(event).__name__, **asdict(event)}


def write_event_log(path: Path, results: Iterable[StepResult]) -> int:
    """Every event of the given steps as JSON lines, atomically; returns how many were written."""
    count = 0
    with atomic_open(path, "w") as f:
        for result in results:
            f.write(json.dumps({"step": result.step, "event": "Step", "op": result.op.describe()}) + "\n")
            for event in result.events:
                f.write(json.dumps(event_record(result.step, event)) + "\n")
                count += 1
    return count
