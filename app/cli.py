"""The ``pagesim`` command line: the same engine as the app, without a window."""

from __future__ import annotations

import argparse
import codecs
import contextlib
import errno
import importlib.util
import math
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, TypeVar

from pagesim.app.kv_attach import add_parser as add_attach_parser
from pagesim.app.kv_attach import cmd_attach
from pagesim.app.kv_publisher import add_run_options as add_kv_event_options
from pagesim.app.kv_publisher import check_publisher_options, open_step_publisher
from pagesim.app.options import (
    add_backend_option,
    add_bench_options,
    add_dtype_option,
    json_text,
    output_file_arg,
    path_arg,
    say_unused_cuda_kernel,
    shortened,
    writable_problem,
)
from pagesim.app.report import (
    TABLE_HEADER,
    dump_step,
    format_block_tables,
    format_config,
    format_layers,
    format_outputs,
    format_step,
    format_text,
    step_report,
    write_json,
)
from pagesim.app.serving_cli import DEFAULT_WASTE_SLOTS, add_waste_pool_options, cmd_latency, cmd_sweep, waste_pool
from pagesim.app.serving_cli import add_parsers as add_serving_parsers
from pagesim.core.errors import PagesimError
from pagesim.core.events import RequestRejected
from pagesim.core.language_model import BUNDLED_MODEL
from pagesim.core.scenario import DEFAULT_SCENARIO, examples, load_scenario, scenario_file, scenario_model
from pagesim.core.studies.waste import CATEGORIES, CATEGORY_LABELS, ReplayTooLongError, check_bounded, compare
from pagesim.core.studies.workload import DISTRIBUTIONS, generate
from pagesim.core.timeline import Timeline
from pagesim.core.trace import load_workload, trace_records, write_trace
from pagesim.kernels.atomic_write import atomic_open, atomic_write
from pagesim.kernels.backend import BackendUnavailableError
from pagesim.kernels.selection import available_backends, select_backend


def _int_from(text: str, least: int, kind: str) -> int:
    """``text`` as an integer of at least ``least`` (``kind`` names it in the error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {kind}; got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {kind}; got {value}")
    return value


def _positive_int(text: str) -> int:
    return _int_from(text, 1, "a positive integer")


def _count(text: str) -> int:
    return _int_from(text, 0, "a whole number ≥ 0")


def _positive_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number; got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive, finite number; got {text}")
    return value


def _max_len(text: str) -> int:
    value = _positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"expected at least 2 (a prompt token and an output token); got {value}")
    return value


def _size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, e.g. 1400x860; got {text!r}") from None
    if not (1 <= width <= 16384 and 1 <= height <= 16384):
        raise argparse.ArgumentTypeError(f"expected a width and a height from 1 to 16384 pixels; got {text!r}")
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
    run.add_argument(
        "--json", type=output_file_arg, metavar="REPORT", help="write a JSON report here ('-': standard output)"
    )
    run.add_argument("--dump", type=path_arg, metavar="DIR", help="write each step's kernel inputs/outputs as .npz")
    run.add_argument("--quiet", action="store_true", help="print only the summary line")
    add_kv_event_options(run)  # --kv-events ENDPOINT: publish as a vLLM server does

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
    waste.add_argument(
        "--slots", type=_positive_int, help=f"KV-cache pool size in token slots (default {DEFAULT_WASTE_SLOTS})"
    )
    waste.add_argument("--block-size", type=_positive_int, default=16)
    waste.add_argument("--max-len", type=_max_len, default=2048, help="the model's max length (Orca-Max reserves it)")
    waste.add_argument(
        "--json", type=output_file_arg, metavar="PATH", help="write the breakdown here ('-': standard output)"
    )
    waste.add_argument("--per-step", action="store_true", help="with --json: every step's split too")
    add_waste_pool_options(waste)  # --model-shape with --gpu, or --blocks

    trace = sub.add_parser(
        "trace", help="run a workload of the vLLM v1 traces through the v1 scheduler; write its trace (JSON lines)"
    )
    trace.add_argument("workload", type=path_arg, help="a workload-N.json (config, requests with their output tokens)")
    trace.add_argument(
        "-o", "--output", type=output_file_arg, required=True, metavar="OUT", help="the trace ('-': stdout)"
    )
    add_serving_parsers(sub)  # latency, sweep

    gen = sub.add_parser("generate", help="generate text with a real model inside the paged engine, checked vs dense")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template (a user turn)")
    gen.add_argument("--max-tokens", type=_positive_int, default=64, metavar="N", help="tokens to generate at most")
    gen.add_argument("--model", default=BUNDLED_MODEL, metavar="M", help=f'"{BUNDLED_MODEL}" or a .gguf path')
    gen.add_argument("--block-size", type=_positive_int, default=16, metavar="B", help="token slots per KV block")
    gen.add_argument(
        "--json", type=output_file_arg, metavar="OUT", help="write tokens, text and verdicts here ('-': stdout)"
    )
    gen.add_argument(
        "--temperature", type=float, default=0.0, metavar="T", help="0 (the default), or below 1e-5 as in vLLM: greedy"
    )
    gen.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus: the smallest set of mass ≥ P")
    gen.add_argument("--top-k", type=int, default=0, metavar="K", help="the K most likely tokens only (0: off)")
    gen.add_argument("--seed", type=int, default=0, metavar="S", help="the draws' seed (the same seed, the same text)")
    add_dtype_option(gen, None)  # fp32 unless asked: the paged and dense engines agree token for token
    add_backend_option(gen)

    add_attach_parser(sub)  # pagesim attach ENDPOINT: a vLLM server's prefix cache, live
    sub.add_parser("scenarios", help="list the shipped scenarios")
    sub.add_parser("backends", help="list the backends and whether each can run here")

    gui = sub.add_parser("gui", help="open the desktop app")
    gui.add_argument("scenario", nargs="?", default=DEFAULT_SCENARIO)
    add_backend_option(gui)
    gui.add_argument("--steps", type=_count, default=0, help="run this many steps first")
    gui.add_argument("--screenshot", type=output_file_arg, help="save a PNG of the window after --steps, then exit")
    gui.add_argument("--size", type=_size, metavar="WxH", help="window size, e.g. 1400x860")
    gui.add_argument("--theme", choices=["dark", "light"], help="colour theme (default: the last one used)")
    gui.add_argument(
        "--panel",
        choices=["memory", "waste", "scheduler", "steplog", "whatif", "latency"],
        help="bring this bottom panel to the front; with --screenshot, a whatif, latency or waste panel runs "
        "its default study first",
    )
    return parser


class CannotWrite(Exception):
    """An output file could not be written (the run's work is done; its old file, if any, is whole)."""

    def __init__(self, path: Path, what: str, exc: OSError) -> None:
        super().__init__(f"could not write {what} {path}: {exc.strerror or exc}")


def write_output(path: Path, text: str | bytes, option: str) -> None:
    """``text`` to ``path`` ('-': standard output), atomically; a failure is a CannotWrite naming ``option``."""
    if str(path) == "-":
        sys.stdout.write(text)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text)
    except OSError as exc:
        raise CannotWrite(path, option, exc) from None


T = TypeVar("T")


def stream_output(path: Path, write: Callable[[IO[str]], T], option: str) -> T:
    """:func:`write_output` of text that ``write`` writes to a stream as it makes it: to
    ``path`` ('-': standard output), atomically. Returns what ``write`` returns."""
    if str(path) == "-":
        return write(sys.stdout)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(path, "w") as out:
            return write(out)
    except OSError as exc:
        raise CannotWrite(path, option, exc) from None


def _same_path(a: Path, b: Path) -> bool:
    return os.path.abspath(a) == os.path.abspath(b) or (a.exists() and b.exists() and os.path.samefile(a, b))


def _mismatch_at(step: int, att) -> str:
    """``" (first at step 2: chat, head 0, |err| 1.0e-04 > bound 1.5e-05)"``, or "" when no head
    of this step left its bound (a real model's layers did)."""
    near = att.nearest_bound()
    if not near.exceeded:
        return ""
    return f" (first at step {step}: {near.seq_id}, head {near.head}, |err| {near.error:.1e} > bound {near.bound:.1e})"


def cmd_run(args: argparse.Namespace) -> int:
    for path, what, folder in ((args.json, "--json", False), (args.dump, "--dump", True)):
        if path is not None and (reason := writable_problem(path, what, folder)):
            print(f"error: {reason}", file=sys.stderr)
            return 2
    if args.dump is not None and args.dump.is_dir() and (old := sorted(args.dump.glob("step_*.npz"))):
        # (a second run's files beside the first's would read as one run; none of them is replaced)
        print(
            f"error: --dump {args.dump} already holds {len(old)} step file(s) of an earlier run ({old[0].name} …): "
            "give an empty or new folder",
            file=sys.stderr,
        )
        return 2
    if args.json is not None and args.dump is not None and _same_path(args.json, args.dump):
        print(
            f"error: --json {args.json} and --dump {args.dump} name the same path: the report is a file, the "
            "dumps go in a folder",
            file=sys.stderr,
        )
        return 2
    if (
        args.json is not None
        and args.dump is not None
        and Path(os.path.abspath(args.dump)) in Path(os.path.abspath(args.json)).parents
    ):
        print(
            f"error: --json {args.json} is inside the --dump folder {args.dump}: the report would sit among the "
            "step files, or replace one; write it elsewhere",
            file=sys.stderr,
        )
        return 2
    check_publisher_options(args)
    backend = select_backend(args.backend, args.cuda_kernel)
    say_unused_cuda_kernel(args, backend)
    # A run never steps back: no snapshot keeps K/V arrays, no step but the current one is
    # kept, and each step's report only for --json.
    timeline = Timeline(load_scenario(args.scenario), backend, snapshot_data=False, history=False)
    out = sys.stderr if str(args.json) == "-" else sys.stdout  # the report owns stdout then
    say = (lambda *_: None) if args.quiet else (lambda *a: print(*a, file=out))
    say(f"pagesim run · {timeline.scenario.name} ({timeline.scenario.source})")
    say(f"backend: {backend.name} · {backend.device}")
    say(f"cache: {format_config(timeline)}")
    kv_events = open_step_publisher(args, timeline.sim, say)
    tokenizer = getattr(timeline.sim.runner.model, "tokenizer", None)  # a real model's: text per step
    say(TABLE_HEADER)
    reports, steps, failed, worst, error, checked, rejected = [], 0, [], 0.0, None, 0, []
    logits_failed: list[int] = []  # of ``failed``, the steps whose attention held and whose logits did not
    engine_checked = 0  # of the checks, those at a schedule's engine steps before its last
    undumped = 0  # of those, the ones --dump could not write (only a schedule's last step keeps its inputs)
    layer_steps, logits_gap = 0, 0.0  # a real model's: steps whose every layer was checked
    first_mismatch = ""  # where the kernel first left its bound: step, sequence, head
    try:
        while not timeline.at_end:
            try:
                result = timeline.forward()
            except PagesimError as exc:
                error = str(exc)
                break
            steps += 1
            rejected += [e.status_note() for e in result.events if isinstance(e, RequestRejected)]
            if kv_events is not None:
                kv_events.step(result)
            if args.json:
                reports.append(step_report(result))
            for passed, inner_error in result.inner_checks:  # a schedule's engine steps before its last
                checked += 1
                engine_checked += 1
                worst = max(worst, inner_error)
                if not passed and result.step not in failed:
                    failed.append(result.step)
            if result.attention is not None:
                checked += 1
                worst = max(worst, result.attention.max_abs_error)
                if not result.attention.passed and result.step not in failed:
                    failed.append(result.step)
                    if result.attention.attention_passed:  # (only the logits, or the tokens, left the bound)
                        logits_failed.append(result.step)
                if not result.attention.attention_passed and not first_mismatch and result.attention.seq_ids:
                    first_mismatch = _mismatch_at(result.step, result.attention)  # (maybe after its inner checks)
                if result.attention.layers is not None:
                    layer_steps += 1
                    logits_gap = max(logits_gap, result.attention.layers.logits_diff)
            say(format_step(result))
            if tokenizer is not None:
                for line in [*format_text(result, tokenizer), format_layers(result)]:
                    if line:
                        say(line)
            if args.dump:
                undumped += len(result.inner_checks)  # (an engine step inside a schedule keeps no kernel inputs)
                try:
                    dump_step(args.dump, timeline, result)
                except OSError as exc:
                    raise CannotWrite(args.dump, "--dump", exc) from None
    except BaseException as exc:
        if kv_events is not None:  # (any way out: its thread stops, its sockets close, an ipc socket's file goes)
            kv_events.publisher.close()
        if not isinstance(exc, KeyboardInterrupt):
            raise
        # Ctrl-C: say what a partial run left behind
        if args.dump is not None and (written := sorted(args.dump.glob("step_*.npz"))):
            print(
                f"\ninterrupted at step {steps}: --dump {args.dump} holds the step files of this unfinished run "
                f"({written[0].name} … {written[-1].name}); no --json report was written",
                file=sys.stderr,
            )
            return INTERRUPTED_EXIT
        raise
    if kv_events is not None:
        kv_events.finish()
    say("")
    if tokenizer is not None:
        for line in format_outputs(timeline, tokenizer):
            say(line)
    say(f"block tables after step {timeline.position}:")
    for line in format_block_tables(timeline):
        say(line)
    last = timeline.sim.last_attention
    if last is not None and last.seq_ids:
        c = timeline.scenario.config
        say(
            f"kernel output shape {(len(last.seq_ids), c.num_heads, 1, c.head_dim)} "
            "(num_seqs, num_heads, 1, head_dim) as in the seed article"
        )
    scheduler = timeline.sim.scheduler
    stalled = scheduler.stalled() if scheduler.used and error is None else None
    corrupt = [m for seq in timeline.sim.sequences if (m := timeline.sim.verify_kv(seq))]
    if args.json:
        try:
            write_json(args.json, timeline, reports, error, stalled)
        except OSError as exc:
            raise CannotWrite(args.json, "--json", exc) from None
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if undumped:  # (before the verdict: a failed run is when dumps are looked for)
        print(
            f"note: --dump {args.dump}: {undumped} checks ran at engine steps inside schedules, which keep no kernel "
            "inputs (only a schedule's last step does): nothing was dumped for them; schedules of one step each "
            "would dump every step",
            file=sys.stderr,
        )
    if failed:
        kernel_failed = [step for step in failed if step not in logits_failed]
        if kernel_failed:
            print(
                f"FAIL: kernel and dense attention differ beyond rounding at steps {kernel_failed}{first_mismatch}",
                file=sys.stderr,
            )
        if logits_failed:
            print(
                f"FAIL: every layer's paged attention held its bound, but the logits (or the next tokens) differ from "
                f"the dense engine's beyond theirs at steps {logits_failed}",
                file=sys.stderr,
            )
        return 1
    if corrupt:
        print(
            f"FAIL: the K/V read through the block tables differ from what was written: {corrupt[0]}", file=sys.stderr
        )
        return 1
    if stalled:
        print(f"STALLED: the scheduler can never finish its requests: {stalled}", file=sys.stderr)
        return 3
    for note in rejected:  # vLLM's answer to a request that can never fit: said, not hidden
        print(f"REJECTED: {note}", file=out)
    if not checked:
        what = "the scenario has no steps" if steps == 0 else "no sequence was live when a step ended"
        print(f"NOTHING CHECKED: {steps} steps, {what}: the kernel was never compared with dense attention", file=out)
        return 0
    inside = f", {checked} checks ({engine_checked} at engine steps inside schedules):" if engine_checked else ","
    print(f"PASS: {steps} steps{inside} kernel matches dense attention (max |err| {worst:.2e})", file=out)
    if layer_steps:
        print(
            f"PASS: {layer_steps} steps ran the model: every layer's paged attention within its bound, logits "
            f"within {logits_gap:.1e} of the dense engine's and the same tokens",
            file=out,
        )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.repeats > 1 and (args.gui or args.model or args.backend == "cuda"):
        print("error: --repeats is for the engine and scheduler benchmarks (pagesim bench on the CPU)", file=sys.stderr)
        return 2
    if args.gui:
        return cmd_gui_bench(args)
    # Lazy on purpose: the benchmarks import torch (over a second), which no other command needs.
    from pagesim.app.benchmarks import run_benchmarks

    return run_benchmarks(args)


def cmd_waste(args: argparse.Namespace) -> int:
    pool = waste_pool(args)
    args.slots = pool.slots
    given = f"{pool.slots} slots from {pool.source}"  # (what the user typed: --slots, --blocks or a preset)
    if args.per_step and args.json is None:
        print("error: --per-step adds every step's split to the --json file: give --json too", file=sys.stderr)
        return 2
    if args.slots < args.max_len:
        print(
            f"error: the pool ({given}) is smaller than --max-len {args.max_len}: a contiguous allocator that "
            "reserves the max length could never place a request",
            file=sys.stderr,
        )
        return 2
    if args.block_size > args.slots:
        print(
            f"error: --block-size {args.block_size} is larger than the pool ({given}): not one block fits",
            file=sys.stderr,
        )
        return 2
    if -(-args.max_len // args.block_size) > args.slots // args.block_size:
        print(
            f"error: --max-len {args.max_len} needs {-(-args.max_len // args.block_size)} blocks of "
            f"{args.block_size} slots; the pool ({given}) has {args.slots // args.block_size}: a "
            "long request could never be placed",
            file=sys.stderr,
        )
        return 2
    if args.json is not None and (reason := writable_problem(args.json, "--json")):
        print(f"error: {reason}", file=sys.stderr)
        return 2
    workload = generate(args.workload, args.requests, rate=args.rate, seed=args.seed, max_len=args.max_len)
    try:
        check_bounded(workload)
    except ReplayTooLongError as exc:
        option = f"--rate {args.rate:g}" if exc.cause == "arrivals" else f"--requests {args.requests}"
        print(f"error: {option}: {exc}", file=sys.stderr)
        return 2
    reports = compare(workload, args.slots, block_size=args.block_size, max_len=args.max_len, keep_steps=args.per_step)
    to_stdout = args.json is not None and str(args.json) == "-"
    out = sys.stderr if to_stdout else sys.stdout  # the breakdown owns stdout then
    mean_in = sum(r.prompt_len for r in workload) / max(1, len(workload))
    mean_out = sum(r.output_len for r in workload) / max(1, len(workload))
    print(
        f"pagesim waste · {args.requests} {args.workload}-like requests (mean prompt {mean_in:.0f}, output "
        f"{mean_out:.0f} tokens) · pool {args.slots} slots · block size {args.block_size} · max length {args.max_len}",
        file=out,
    )
    print(f"pool: {pool.describe()}", file=out)
    print("shares of the KV pool, averaged over the steps with a request waiting:", file=out)
    labels = CATEGORY_LABELS
    header = f"{'allocator':<12}" + "".join(f"{labels[c]:>15}" for c in CATEGORIES) + f"{'steps':>8}{'batch':>7}"
    print(header, file=out)
    for r in reports:
        shares = r.shares
        # No step with a request waiting: the pool was never the limit, and there is no average to show.
        cells = [f"{shares[c]:>15.1%}" if r.loaded_steps else f"{'—':>15}" for c in CATEGORIES]
        print(f"{r.allocator:<12}" + "".join(cells) + f"{r.steps:>8}{r.peak_batch:>7}", file=out)
    idle = [r.allocator for r in reports if not r.loaded_steps]
    if idle:
        print(
            f"—: no request ever waited for memory under {', '.join(idle)}: the pool was never full; "
            "try more --requests or fewer --slots",
            file=out,
        )
    if args.json:
        allocators = [r.as_dict() | ({"per_step": r.per_step} if args.per_step else {}) for r in reports]
        report = {"workload": vars(args) | {"json": str(args.json)}, "pool": pool.describe(), "allocators": allocators}
        write_output(args.json, json_text(report), "--json")
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    if reason := writable_problem(args.output, "--output"):
        print(f"error: {reason}", file=sys.stderr)
        return 2
    workload = load_workload(args.workload)
    # (each step's record written as it ends: a long trace is never held whole)
    summary = stream_output(args.output, lambda out: write_trace(trace_records(workload), out), "--output")
    rejected = summary.get("rejected", {})
    for request, reason in list(rejected.items())[:5]:
        print(f"note: request {request} rejected: {reason}", file=sys.stderr)
    if len(rejected) > 5:
        print(f"note: … and {len(rejected) - 5} more rejected (see the trace's summary)", file=sys.stderr)
    if unfinished := summary["unfinished"]:
        names = ", ".join(unfinished[:5]) + (f" … (+{len(unfinished) - 5})" if len(unfinished) > 5 else "")
        print(
            f"note: {len(unfinished)} of {len(workload.requests)} requests did not finish within "
            f"{summary['steps']} steps (max_steps {workload.max_steps}): {names}",
            file=sys.stderr,
        )
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    # Lazy on purpose: generating loads torch and the model, which no other headless command needs.
    from pagesim.app.generate import cmd_generate as run_generate

    return run_generate(args, write_output)


def cmd_scenarios(_: argparse.Namespace) -> int:
    """The shipped scenarios in a learner's order (the app's welcome lists them so), one line
    each as wide as the terminal, read from their headers (no model is loaded to list them)."""
    listed = examples()
    width = max(len(e.name) for e in listed)
    columns = shutil.get_terminal_size((100, 24)).columns
    for example in listed:
        line = f"{example.name:<{width}} {example.steps:>4} steps  {example.model:<12}  {example.title}"
        line += f" — {example.summary(len(example.description))}" if example.description.strip() else ""
        cut = max(columns, len(line.split(" — ")[0]) + 20)  # never into the title
        print(line if len(line) <= cut else line[: cut - 1].rstrip() + "…")
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
    # Lazy on purpose: only the GUI commands may load Qt (the headless ones never do).
    from pagesim.app.gui.main import main as gui_main

    return gui_main(args)


def cmd_gui_bench(args: argparse.Namespace) -> int:
    if reason := _qt_missing():
        print(f"error: {reason}", file=sys.stderr)
        return 2
    # Lazy on purpose, as in cmd_gui: Qt loads only for the GUI benchmark.
    from pagesim.app.gui.bench import main as gui_bench_main

    return gui_bench_main(args)


# What the output says in characters an ASCII-only terminal (LANG=C, PYTHONIOENCODING=ascii)
# can show; anything else becomes "?".
ASCII_SPELLINGS = {
    "·": "-", "×": "x", "≤": "<=", "≥": ">=", "→": "->", "←": "<-", "…": "...", "—": "--", "–": "-",
    "✓": "ok", "✗": "X", "≠": "!=", "±": "+/-", "⌊": "floor(", "⌋": ")",
}  # fmt: skip


def _ascii_spelling(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    text = exc.object[exc.start : exc.end]
    return "".join(ASCII_SPELLINGS.get(ch, "?") for ch in text), exc.end


codecs.register_error("pagesim-ascii", _ascii_spelling)


def _tolerant_streams() -> None:
    """Standard output and error never fail on a character their encoding lacks."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", "strict") in ("strict", None):
            # A closed or detached stream: nothing to print on anyway.
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="pagesim-ascii")


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so that the interpreter's final flush
    says nothing either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


class StdoutError(Exception):
    """Writing to standard output failed (a closed pipe, a full disk)."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(cause.strerror or str(cause))
        self.errno = cause.errno


class _ClosedStream:
    """Standard output when the shell closed it (``>&-``): Python has None there, and every
    write fails as a write to a closed descriptor does."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "it is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError(errno.EBADF, "it is closed")


class _GuardedStdout:
    """Standard output, whose write failures are told apart from an output file's."""

    def __init__(self, stream) -> None:
        self._stream = stream if stream is not None else _ClosedStream()

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise StdoutError(exc) from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise StdoutError(exc) from exc

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


SIGPIPE_EXIT = 128 + 13  # what a shell reports for a tool that a closed pipe ended


def main(argv: list[str] | None = None) -> int:
    _tolerant_streams()
    real_stdout = sys.stdout
    sys.stdout = _GuardedStdout(real_stdout)
    try:
        code = _main(argv)
        sys.stdout.flush()  # a full stdout (> /dev/full) fails here, not at exit
        return code
    except KeyboardInterrupt:  # Ctrl-C: a line, not a traceback (every output is written atomically)
        print("\ninterrupted: nothing more was written", file=sys.stderr)
        return INTERRUPTED_EXIT
    except StdoutError as exc:
        # Whatever was not written is dropped: the interpreter's final flush must not fail again.
        _quiet_stdout()
        if exc.errno == errno.EPIPE:  # the reader left (| head): end quietly, as Unix tools do
            return SIGPIPE_EXIT
        print(f"error: could not write to standard output: {exc}", file=sys.stderr)
        return 1
    finally:
        sys.stdout = real_stdout


INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped

# The options that name a file a command writes.
OUTPUT_OPTIONS = (("json", "--json"), ("csv", "--csv"), ("plot", "--plot"), ("output", "--output"),
                  ("screenshot", "--screenshot"))  # fmt: skip


def files_read(args: argparse.Namespace) -> list[tuple[Path, str]]:
    """The files a command reads, each with what it is: its scenario (a shipped one's own
    file), workload, and model files (``--model``, ``--model-shape``, a scenario's header)."""
    found: list[tuple[Path, str]] = []
    scenario = getattr(args, "scenario", None)
    if isinstance(scenario, str | Path):
        found.append((scenario_file(scenario), "the scenario being read"))
        if (model := scenario_model(scenario)) is not None:
            found.append((_model_file(model), "the model file the scenario loads"))
    workload = getattr(args, "workload", None)
    if isinstance(workload, str | Path):
        found.append((Path(workload), "the workload being read"))
    for attr, option in (("model", "--model"), ("model_shape", "--model-shape"), ("tokenizer", "--tokenizer")):
        value = getattr(args, attr, None)
        if isinstance(value, str | Path):
            found.append((_model_file(str(value)), f"the {option} file being read"))
    return [(path, what) for path, what in found if path.is_file()]


def _model_file(name: str) -> Path:
    """The file a model name stands for: the bundled model's own (inside the installed
    package), else the name as a path."""
    if name == BUNDLED_MODEL:
        from pagesim.core.models.gguf_loader import bundled_model_path  # (the loader only when asked)

        with contextlib.suppress(PagesimError, OSError):
            return bundled_model_path()
    return Path(name)


def overwrites_input(args: argparse.Namespace) -> str | None:
    """Why an output would replace a file the command reads, or another output of the same
    run, or None (the report would be written over its own scenario, workload or model, and
    the user's file would be gone; or one output over the other)."""
    inputs = files_read(args)
    outputs: list[tuple[Path, str]] = []
    for attr, option in OUTPUT_OPTIONS:
        out = getattr(args, attr, None)
        if out is None or str(out) == "-":
            continue
        for source, what in inputs:
            if _same_path(Path(out), source):
                return f"{option} {out} is {what}: it would be overwritten; give another path"
        for other, other_option in outputs:  # (the second write would replace the first)
            if _same_path(Path(out), other):
                return f"{other_option} {other} and {option} {out} name the same file: give each its own path"
        outputs.append((Path(out), option))
    return None


def _main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command
    if command is None:
        # The app when it can be shown; otherwise the same default scenario, headless.
        command = "run" if _qt_missing() else "gui"
        args = parser.parse_args([command])
    try:
        return _dispatch(args, command)
    except OSError as exc:  # a path the system refuses (too long, a folder not to be entered)
        if exc.filename is None or exc.errno not in PATH_ERRNOS:
            raise
        print(f"error: {shortened(str(exc.filename))}: {exc.strerror or exc}", file=sys.stderr)
        return 2


# What the system says of a path a user gave (not of a failing disk or a bug): one line each.
PATH_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.ELOOP})


def _dispatch(args: argparse.Namespace, command: str) -> int:
    if reason := overwrites_input(args):
        print(f"error: {reason}", file=sys.stderr)
        return 2
    handlers = {
        "run": cmd_run,
        "bench": cmd_bench,
        "scenarios": cmd_scenarios,
        "waste": cmd_waste,
        "trace": cmd_trace,
        "latency": lambda a: cmd_latency(a, write_output),
        "sweep": lambda a: cmd_sweep(a, write_output),
        "generate": cmd_generate,
        "backends": cmd_backends,
        "attach": cmd_attach,
        "gui": cmd_gui,
    }
    try:
        return handlers[command](args)
    except (PagesimError, BackendUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except CannotWrite as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
