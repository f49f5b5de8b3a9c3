"""Headless run reports: the step table, the JSON report and per-step kernel dumps."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from pagesim.core.atomic_write import atomic_open, atomic_write
from pagesim.core.engine import StepResult
from pagesim.core.timeline import Timeline
from pagesim.kernels.dtypes import dtype_name


def format_config(timeline: Timeline) -> str:
    c = timeline.scenario.config
    return (
        f"{c.num_blocks} blocks × {c.block_size} slots, {c.num_heads} heads ({c.num_kv_heads} KV) × "
        f"head dim {c.head_dim}, {c.dtype}, seed {c.seed}"
    )


TABLE_HEADER = f"{'step':>4}  {'op':<28} {'used':>5} {'free':>5} {'util':>6}  {'max|err|':>9} {'tol':>7}  check"


def format_step(result: StepResult) -> str:
    m = result.metrics
    att = result.attention
    err, tol, check = (
        ("-", "-", "no sequences")
        if att is None
        else (
            f"{att.max_abs_error:9.2e}",
            f"{att.tolerance:7.1e}",
            "ok" if att.passed else "MISMATCH",
        )
    )
    util = f"{m.utilisation:.1%}" if m.slots_allocated else "–"  # nothing allocated: nothing to be utilised
    return (
        f"{result.step:>4}  {result.op.describe():<28.28} {m.used_blocks:>5} {m.free_blocks:>5} "
        f"{util:>6}  {err:>9} {tol:>7}  {check}"
    )


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
        out.update(
            max_abs_error=att.max_abs_error,
            tolerance=att.tolerance,
            passed=att.passed,
            kernel_ms=round(att.kernel_seconds * 1e3, 4),
            sequences={
                seq: {"context_len": int(att.context_lens[i]), "max_abs_error": float(att.head_errors[i].max())}
                for i, seq in enumerate(att.seq_ids)
            },
        )
    return out


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
    text = json.dumps(report, indent=2, allow_nan=False) + "\n"
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
