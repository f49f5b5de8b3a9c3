"""The golden replay: every shipped scenario's run report and event log, recorded before a
refactor and compared after it (a refactor changes no behaviour).

    python -m tests.golden.replay --record     # rewrite tests/golden/*.json.gz

Timings and block hashes are dropped; error magnitudes and their bounds are kept only as
pass/fail in the committed files (they are fp32 rounding, which may differ between CPU
families), and exactly with
``--exact`` for a comparison on one machine.
"""

from __future__ import annotations

import argparse
import gzip
import json
from dataclasses import asdict
from pathlib import Path

from pagesim.app.report import step_report
from pagesim.core.scenario import load_scenario, shipped_scenarios
from pagesim.core.timeline import Timeline
from pagesim.kernels.cpu_backend import CpuBackend

HERE = Path(__file__).resolve().parent
# Timings vary run to run; block hashes are seeded per process (hash(None) in the chain's root);
# the device's description names the kernel's thread count, which the machine sets.
TIMING = {"kernel_ms", "kernel_seconds", "dense_seconds", "block_hash", "device"}
ERRORS = {"max_abs_error", "head_errors", "tolerance", "head_tolerances"}
# A real model's per-layer check: which layer has the least margin, and by how much, is
# rounding too (its pass/fail and the tokens are kept).
ERRORS |= {"worst_layer", "worst_error_to_bound", "logits_max_abs_diff", "sentence"}
# So is which sequence and head come nearest their bounds (each sequence's pass/fail is kept).
ERRORS |= {"nearest_bound"}


def clean(record: dict, exact: bool) -> dict:
    drop = TIMING | (set() if exact else ERRORS)
    out = {}
    for key, value in record.items():
        if key in drop or value is None:  # (an optional field left unset: as if it were not there)
            continue
        if isinstance(value, dict):
            value = clean(value, exact)
        elif key == "beams" and not exact:  # beam search: (name, parent, token, log-prob) without the log-prob
            value = [list(beam[:3]) for beam in value]
        out[key] = value
    return out


def replay(name: str, exact: bool = False) -> dict:
    timeline = Timeline(load_scenario(name), CpuBackend())
    steps, events = [], []
    while not timeline.at_end:
        result = timeline.forward()
        steps.append(clean(step_report(result), exact))
        for event in result.events:
            record = {"step": result.step, "event": type(event).__name__, **asdict(event)}
            events.append(clean(record, exact))
    return json.loads(json.dumps({"scenario": name, "steps": steps, "events": events}))


def path_for(name: str) -> Path:
    return HERE / f"{name}.json.gz"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", action="store_true", help="write the committed golden files")
    parser.add_argument("--exact", type=Path, metavar="DIR", help="write exact replays (errors kept) to DIR")
    args = parser.parse_args()
    for name in sorted(shipped_scenarios()):
        if args.record:
            path_for(name).write_bytes(gzip.compress(json.dumps(replay(name)).encode(), mtime=0))
        if args.exact:
            args.exact.mkdir(parents=True, exist_ok=True)
            (args.exact / f"{name}.json").write_text(json.dumps(replay(name, exact=True), indent=0))
        print(name)


if __name__ == "__main__":
    main()
