"""The ``pagesim`` command line: the same engine as the app, without a window."""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from pathlib import Path

from pagesim.app.options import add_backend_option, add_bench_options, writable_problem
from pagesim.app.report import (
    TABLE_HEADER,
    dump_step,
    format_block_tables,
    format_config,
    format_step,
    step_report,
    write_json,
)
from pagesim.core.errors import PagesimError
from pagesim.core.scenario import DEFAULT_SCENARIO, load_scenario, shipped_scenarios
from pagesim.core.studies.workload import DISTRIBUTIONS
from pagesim.core.timeline import Timeline
from pagesim.kernels.backend import BackendUnavailableError
from pagesim.kernels.selection import available_backends, select_backend


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {value}")
    return value


def _positive_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number; got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive, finite number; got {text}")
    return value


def _size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, e.g. 1400x860; got {text!r}") from None
    return width, height


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pagesim",
        description="PagedAttention simulator. With no command, opens the app on the default scenario.",
    )
    sub = parser.add_subparsers(dest="command")

    run = sub.add_parser("run", help="run a scenario headless and check the kernel against dense attention")
    run.add_argument("scenario", nargs="?", default=DEFAULT_SCENARIO, help="a .toml file or a shipped name")
    add_backend_option(run)
    run.add_argument("--json", type=Path, metavar="REPORT", help="write a JSON report here ('-': standard output)")
    run.add_argument("--dump", type=Path, metavar="DIR", help="write each step's kernel inputs/outputs as .npz")
    run.add_argument("--quiet", action="store_true", help="print only the summary line")

    bench = sub.add_parser("bench", help="benchmark the kernels and the engine; medians, side by side")
    add_bench_options(bench)
    bench.add_argument("--gui", action="store_true", help="benchmark the app's step + redraw instead")

    waste = sub.add_parser(
        "waste", help="where KV memory goes: paging against contiguous reservations (the vLLM paper's Fig. 2)"
    )
    waste.add_argument("--workload", choices=DISTRIBUTIONS, default="sharegpt")
    waste.add_argument("--requests", type=_positive_int, default=1000)
    waste.add_argument(
        "--rate", type=_positive_rate, default=2000.0, help="Poisson arrivals per second (high: under load)"
    )
    waste.add_argument("--seed", type=int, default=0)
    waste.add_argument("--slots", type=_positive_int, default=32768, help="KV-cache pool size in token slots")
    waste.add_argument("--block-size", type=_positive_int, default=16)
    waste.add_argument(
        "--max-len", type=_positive_int, default=2048, help="the model's max length (Orca-Max reserves it)"
    )
    waste.add_argument("--json", type=Path, metavar="PATH", help="write the breakdown here")
    waste.add_argument("--per-step", action="store_true", help="with --json: every step's split too")

    sub.add_parser("scenarios", help="list the shipped scenarios")
    sub.add_parser("backends", help="list the backends and whether each can run here")

    gui = sub.add_parser("gui", help="open the desktop app")
    gui.add_argument("scenario", nargs="?", default=DEFAULT_SCENARIO)
    add_backend_option(gui)
    gui.add_argument("--steps", type=int, default=0, help="run this many steps first")
    gui.add_argument("--screenshot", type=Path, help="save a PNG of the window after --steps, then exit")
    gui.add_argument("--size", type=_size, metavar="WxH", help="window size, e.g. 1400x860")
    gui.add_argument("--theme", choices=["dark", "light"], help="colour theme (default: the last one used)")
    return parser


def cmd_run(args: argparse.Namespace) -> int:
    for path, what, folder in ((args.json, "--json", False), (args.dump, "--dump", True)):
        if path is not None and (reason := writable_problem(path, what, folder)):
            print(f"error: {reason}", file=sys.stderr)
            return 2
    backend = select_backend(args.backend, args.cuda_kernel)
    # A run never steps back: no snapshot keeps K/V arrays, no step but the current one is
    # kept, and each step's report only for --json.
    timeline = Timeline(load_scenario(args.scenario), backend, snapshot_data=False, history=False)
    out = sys.stderr if str(args.json) == "-" else sys.stdout  # the report owns stdout then
    say = (lambda *_: None) if args.quiet else (lambda *a: print(*a, file=out))
    say(f"pagesim run · {timeline.scenario.name} ({timeline.scenario.source})")
    say(f"backend: {backend.name} · {backend.device}")
    say(f"cache: {format_config(timeline)}")
    say(TABLE_HEADER)
    reports, steps, failed, worst, error = [], 0, [], 0.0, None
    while not timeline.at_end:
        try:
            result = timeline.forward()
        except PagesimError as exc:
            error = str(exc)
            break
        steps += 1
        if args.json:
            reports.append(step_report(result))
        if result.attention is not None:
            worst = max(worst, result.attention.max_abs_error)
            if not result.attention.passed:
                failed.append(result.step)
        say(format_step(result))
        if args.dump:
            dump_step(args.dump, timeline, result)
    say("")
    say(f"block tables after step {timeline.position}:")
    for line in format_block_tables(timeline):
        say(line)
    last = timeline.sim.last_attention
    if last is not None:
        c = timeline.scenario.config
        say(
            f"kernel output shape {(len(last.seq_ids), c.num_heads, 1, c.head_dim)} "
            "(num_seqs, num_heads, 1, head_dim) as in the seed article"
        )
    scheduler = timeline.sim.scheduler
    stalled = scheduler.stalled() if scheduler.used and error is None else None
    corrupt = [m for seq in timeline.sim.sequences if (m := timeline.sim.verify_kv(seq))]
    if args.json:
        write_json(args.json, timeline, reports, error, stalled)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if failed:
        print(f"FAIL: kernel and dense attention differ beyond rounding at steps {failed}", file=sys.stderr)
        return 1
    if corrupt:
        print(
            f"FAIL: the K/V read through the block tables differ from what was written: {corrupt[0]}", file=sys.stderr
        )
        return 1
    if stalled:
        print(f"STALLED: the scheduler can never finish its requests: {stalled}", file=sys.stderr)
        return 3
    print(f"PASS: {steps} steps, kernel matches dense attention (max |err| {worst:.2e})", file=out)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.gui:
        return cmd_gui_bench(args)
    from pagesim.app.benchmarks import run_benchmarks

    return run_benchmarks(args)


def cmd_waste(args: argparse.Namespace) -> int:
    import json

    from pagesim.core.studies.waste import CATEGORIES, CATEGORY_LABELS, compare
    from pagesim.core.studies.workload import generate

    if args.slots < args.max_len:
        print(
            f"error: --slots {args.slots} is smaller than --max-len {args.max_len}: a contiguous allocator that "
            "reserves the max length could never place a request",
            file=sys.stderr,
        )
        return 2
    if args.json is not None and (reason := writable_problem(args.json, "--json")):
        print(f"error: {reason}", file=sys.stderr)
        return 2
    workload = generate(args.workload, args.requests, rate=args.rate, seed=args.seed, max_len=args.max_len)
    reports = compare(workload, args.slots, block_size=args.block_size, max_len=args.max_len, keep_steps=args.per_step)
    mean_in = sum(r.prompt_len for r in workload) / max(1, len(workload))
    mean_out = sum(r.output_len for r in workload) / max(1, len(workload))
    print(
        f"pagesim waste · {args.requests} {args.workload}-like requests (mean prompt {mean_in:.0f}, output "
        f"{mean_out:.0f} tokens) · pool {args.slots} slots · block size {args.block_size} · max length {args.max_len}"
    )
    print("shares of the KV pool, averaged over the steps with a request waiting:")
    labels = CATEGORY_LABELS
    print(f"{'allocator':<12}" + "".join(f"{labels[c]:>15}" for c in CATEGORIES) + f"{'steps':>8}{'batch':>7}")
    for r in reports:
        shares = r.shares
        print(
            f"{r.allocator:<12}" + "".join(f"{shares[c]:>15.1%}" for c in CATEGORIES) + f"{r.steps:>8}{r.peak_batch:>7}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        allocators = [r.as_dict() | ({"per_step": r.per_step} if args.per_step else {}) for r in reports]
        report = {"workload": vars(args) | {"json": str(args.json)}, "allocators": allocators}
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


def cmd_scenarios(_: argparse.Namespace) -> int:
    for name in sorted(shipped_scenarios()):
        scenario = load_scenario(name)
        summary = " ".join(scenario.description.split())[:90]
        print(f"{name:<14} {len(scenario.operations):>4} steps  {scenario.name}: {summary}")
    return 0


def cmd_backends(_: argparse.Namespace) -> int:
    for name, status in available_backends().items():
        print(f"{name:<5} {status}")
    print(f"auto  → {select_backend('auto').device}")
    return 0


def _qt_missing() -> str | None:
    """Why the desktop app cannot start here, or None (a probe: nothing is imported)."""
    missing = [name for name in ("PySide6", "pyqtgraph") if importlib.util.find_spec(name) is None]
    if missing:
        return f"the desktop app needs {' and '.join(missing)}: pip install 'pagesim[gui]'"
    return None


def cmd_gui(args: argparse.Namespace) -> int:
    # The CLI is the composition root: the GUI commands are the only way it reaches Qt.
    if reason := _qt_missing():
        print(f"error: {reason}", file=sys.stderr)
        return 2
    from pagesim.app.gui.main import main as gui_main

    return gui_main(args)


def cmd_gui_bench(args: argparse.Namespace) -> int:
    if reason := _qt_missing():
        print(f"error: {reason}", file=sys.stderr)
        return 2
    from pagesim.app.gui.bench import main as gui_bench_main

    return gui_bench_main(args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command
    if command is None:
        # The app when it can be shown; otherwise the same default scenario, headless.
        command = "run" if _qt_missing() else "gui"
        args = parser.parse_args([command])
    handlers = {
        "run": cmd_run,
        "bench": cmd_bench,
        "scenarios": cmd_scenarios,
        "waste": cmd_waste,
        "backends": cmd_backends,
        "gui": cmd_gui,
    }
    try:
        return handlers[command](args)
    except (PagesimError, BackendUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
