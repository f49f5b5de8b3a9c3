"""The serving-study commands: ``pagesim latency`` (serving time of one replay on a model
shape and a GPU) and ``pagesim sweep`` (what-if replays over a grid of engine settings).
Their parsers and handlers; ``app.cli`` registers them."""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from collections.abc import Callable
from pathlib import Path

from pagesim.app.options import json_text, output_file_arg, writable_problem
from pagesim.app.sweep_plot import render_png
from pagesim.core.config import CacheConfig
from pagesim.core.errors import InvalidStudyError
from pagesim.core.operations import Submit
from pagesim.core.scenario import load_scenario
from pagesim.core.studies.replay import MAX_ITERATIONS, replay_scenario, replay_workload
from pagesim.core.studies.serving_time import (
    GIB,
    GPUS,
    MODEL_SHAPES,
    fits_on,
    gpu,
    latency,
    model_shape,
    pool_blocks,
    require_pool_fits,
)
from pagesim.core.studies.stand_in import memory_only
from pagesim.core.studies.sweep import KNOBS, Hardware, Source, SweepResult, parse_setting, sweep
from pagesim.core.studies.waste import WastePool, pool_from_preset, pool_of_blocks
from pagesim.core.studies.workload import DISTRIBUTIONS, generate

# The CLI's write_output: text or bytes to a path ('-': standard output), atomically; a
# failure is its CannotWrite naming the option.
Writer = Callable[[Path, str | bytes, str], None]
DEFAULT_WORKLOAD_BLOCKS = 2048  # a workload's pool without a model shape and a GPU (or --blocks)
DEFAULT_WASTE_SLOTS = 32768  # pagesim waste's pool without --slots, --blocks or a model shape and a GPU


def _add_hardware(parser: argparse.ArgumentParser, required: bool = False) -> None:
    """--model-shape and --gpu (``required``: said in their help; the command checks it, with
    an example, rather than argparse's bare list)."""
    need = " (required)" if required else ""
    too_large = [
        name for name, shape in MODEL_SHAPES.items() if not any(fits_on(shape, spec) for spec in GPUS.values())
    ]
    beyond = (
        f"; {', '.join(too_large)}: more than one GPU's memory, which the studies do not model" if too_large else ""
    )
    parser.add_argument(
        "--model-shape",
        metavar="SHAPE",
        help=f"a published model shape ({', '.join(MODEL_SHAPES)}) or a .gguf file's own{beyond}{need}",
    )
    parser.add_argument("--gpu", metavar="GPU", help=f"a GPU preset ({', '.join(GPUS)}){need}")


WORKLOAD_DEFAULTS = {"requests": 200, "rate": 4.0, "seed": 0, "block_size": 16}


def _add_source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", nargs="?", help="a .toml file or a shipped name (or --workload)")
    parser.add_argument("--workload", choices=DISTRIBUTIONS, help="a seeded workload instead of a scenario")
    # (no default here: given with a scenario, they would be ignored, so that is refused; see _source)
    parser.add_argument(
        "--requests", type=int, help=f"with --workload: how many requests (default {WORKLOAD_DEFAULTS['requests']})"
    )
    parser.add_argument(
        "--rate",
        type=float,
        help=f"with --workload: Poisson arrivals per second (default {WORKLOAD_DEFAULTS['rate']:g})",
    )
    parser.add_argument("--seed", type=int, help=f"with --workload: the seed (default {WORKLOAD_DEFAULTS['seed']})")
    parser.add_argument(
        "--block-size", type=int, help=f"with --workload: tokens per block (default {WORKLOAD_DEFAULTS['block_size']})"
    )
    parser.add_argument(
        "--blocks",
        type=int,
        metavar="N",
        help="the pool in blocks (default: the scenario's; for a workload the memory after the weights with "
        f"--model-shape and --gpu, else {DEFAULT_WORKLOAD_BLOCKS})",
    )


def add_parsers(sub) -> None:
    lat = sub.add_parser(
        "latency", help="serving time of a scenario or workload on a model shape and a GPU (roofline): TTFT, TPOT"
    )
    _add_source(lat)
    _add_hardware(lat, required=True)
    lat.add_argument(
        "--json", type=output_file_arg, metavar="PATH", help="write the figures here ('-': standard output)"
    )

    sw = sub.add_parser("sweep", help="what-if replays of a scenario or workload over a grid of engine settings")
    _add_source(sw)
    _add_hardware(sw)
    sw.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=V1,V2",
        dest="settings",
        help=f"values of one knob ({', '.join(KNOBS)}); repeat for a grid",
    )
    sw.add_argument(
        "--json", type=output_file_arg, metavar="PATH", help="write every variant here ('-': standard output)"
    )
    sw.add_argument("--csv", type=output_file_arg, metavar="PATH", help="one row a variant ('-': standard output)")
    sw.add_argument(
        "--plot", type=output_file_arg, metavar="PNG", help="blocks over time and the figures, side by side"
    )


def _hardware(args) -> Hardware | None:
    if (args.model_shape is None) != (args.gpu is None):
        raise InvalidStudyError("--model-shape and --gpu go together (a model's shape on a GPU)")
    if args.model_shape is None:
        return None
    return Hardware(model_shape(args.model_shape), gpu(args.gpu))


def _check_fits(blocks: int, block_size: int, hardware: Hardware | None, what: str, hint: str = "") -> None:
    if hardware is not None:
        require_pool_fits(blocks, block_size, hardware.shape, hardware.gpu, what, hint)


def _source(args, hardware: Hardware | None) -> Source:
    if args.blocks is not None and args.blocks < 1:
        raise InvalidStudyError(f"--blocks must be a positive integer; got {args.blocks}")
    given = [name for name in WORKLOAD_DEFAULTS if getattr(args, name) is not None]
    if args.workload is None and given:  # (the scenario says these itself)
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        verb = "shapes" if len(given) == 1 else "shape"
        change = "edit it, or use --set" if hasattr(args, "settings") else "edit it"  # (only sweep has --set)
        raise InvalidStudyError(f"{flags} {verb} a --workload; a scenario has its own ({change})")
    for name, default in WORKLOAD_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.workload is None:
        # Memory only (no K/V): a real model's scenario runs on the synthetic model, as in the app.
        # (None: no scenario given, the default; "" is a name the user typed, refused by the loader)
        scenario, note = memory_only(load_scenario("default" if args.scenario is None else args.scenario))
        if note:
            print(f"note: {note}", file=sys.stderr)
        if not any(isinstance(op, Submit) for op in scenario.operations):
            print(
                f"note: {scenario.name} submits no requests (its sequences are added by hand): no request is timed, "
                "and the scheduler's settings (scheduler, max_num_seqs, max_num_batched_tokens) do not reach them",
                file=sys.stderr,
            )
        config = scenario.config
        if args.blocks is not None:
            _check_fits(args.blocks, config.block_size, hardware, "--blocks")
            config = CacheConfig(**{**config.__dict__, "num_blocks": args.blocks, "max_model_len": None})
        else:
            _check_fits(
                config.num_blocks, config.block_size, hardware, f"{scenario.name}'s pool", " (--blocks sets another)"
            )
        return Source(scenario.name, config, scenario)
    if args.scenario is not None:
        raise InvalidStudyError("give a scenario or --workload, not both")
    for option, value in (("--requests", args.requests), ("--block-size", args.block_size)):
        if value < 1:
            raise InvalidStudyError(f"{option} must be a positive integer; got {value}")
    if not (math.isfinite(args.rate) and args.rate > 0):
        raise InvalidStudyError(f"--rate must be a positive number (requests a second); got {args.rate}")
    specs = tuple(generate(args.workload, args.requests, rate=args.rate, seed=args.seed))
    from_hardware = args.blocks is None and hardware is not None
    if from_hardware:
        blocks = pool_blocks(hardware.shape, hardware.gpu, args.block_size)
        if blocks < 1:
            raise InvalidStudyError(
                f"one block of {args.block_size} tokens is larger than what {hardware.gpu.name} leaves after "
                f"{hardware.shape.name}'s weights: give a smaller --block-size"
            )
    else:
        blocks = args.blocks or DEFAULT_WORKLOAD_BLOCKS
        _check_fits(blocks, args.block_size, hardware, "--blocks")
    try:
        config = CacheConfig(num_blocks=blocks, block_size=args.block_size, num_heads=1, head_dim=8)
    except ValueError as exc:
        raise InvalidStudyError(str(exc)) from None
    name = f"{args.requests} {args.workload}-like requests at {args.rate:g}/s"
    return Source(name, config, workload=specs, pool_from_hardware=from_hardware)


def _check_outputs(*pairs) -> str | None:
    for path, option in pairs:
        if path is not None and (reason := writable_problem(path, option)):
            return reason
    return None


def _pool_line(config: CacheConfig, hardware: Hardware | None) -> str:
    line = f"pool {config.num_blocks} blocks of {config.block_size} tokens"
    if hardware is not None:
        block = hardware.roofline(config.block_size).block_bytes()
        line += f" · {block / 1024:g} KiB a block · {config.num_blocks * block / GIB:.2f} GiB"
    return line


def _ms(value: float) -> str:
    return "—" if math.isnan(value) else f"{value * 1e3:.2f}"


def cmd_latency(args: argparse.Namespace, write_output: Writer) -> int:
    if reason := _check_outputs((args.json, "--json")):
        print(f"error: {reason}", file=sys.stderr)
        return 2
    hardware = _hardware(args)
    if hardware is None:
        raise InvalidStudyError("latency needs --model-shape and --gpu (e.g. --model-shape llama-3-8b --gpu h200)")
    source = _source(args, hardware)
    seconds = hardware.roofline(source.config.block_size)
    if source.scenario is not None:
        result = replay_scenario(source.scenario, source.config, seconds)
    else:
        result = replay_workload(source.config, source.workload, seconds)
    summary = latency(result)
    out = sys.stderr if args.json is not None and str(args.json) == "-" else sys.stdout
    shape, spec = hardware.shape, hardware.gpu
    print(f"pagesim latency · {source.name} · {shape.name} on {spec.name} (roofline)", file=out)
    print(
        f"weights {shape.weight_bytes / GIB:.1f} GiB · K/V {shape.kv_bytes_per_token / 1024:g} KiB a token · "
        f"{_pool_line(source.config, hardware)}",
        file=out,
    )
    print(f"{'request':<14}{'queue ms':>10}{'TTFT ms':>10}{'TPOT ms':>10}{'outputs':>9}", file=out)
    records = list(result.requests.values())
    for r in records[:40]:
        queue = math.nan if r.admitted is None else r.admitted - r.arrival
        ttft = math.nan if r.first_token is None else r.first_token - r.arrival
        tpot = (
            (r.finished - r.first_token) / (r.output_tokens - 1)
            if r.finished is not None and r.first_token is not None and r.output_tokens > 1
            else math.nan
        )
        state = f"  {r.state}" if r.rejected else ""
        # (n samples each write this many: the throughput counts them all)
        outputs = f"{r.output_tokens} × {r.samples}" if r.samples > 1 else f"{r.output_tokens}"
        print(f"{r.request:<14}{_ms(queue):>10}{_ms(ttft):>10}{_ms(tpot):>10}{outputs:>9}{state}", file=out)
    if len(records) > 40:
        print(f"… and {len(records) - 40} more requests", file=out)
    rejected = sum(r.rejected and not r.aborted for r in records)
    aborted = sum(r.aborted for r in records)
    not_done = f" · {rejected} rejected (never fit the pool or max_model_len)" if rejected else ""
    if aborted:
        outgrew = all((r.rejection or "").startswith("grew past") for r in records if r.aborted)
        not_done += f" · {aborted} aborted after running" + (" (outgrew the pool)" if outgrew else "")
    if result.unfinished:
        not_done += f" · {result.unfinished} unfinished"
    print(
        f"{summary.requests} finished{not_done} in {result.iterations} steps, {summary.seconds:.3f} s · mean queue "
        f"{_ms(summary.queue['mean'])} ms · TTFT {_ms(summary.ttft['mean'])} ms (p99 {_ms(summary.ttft['p99'])}) · "
        f"TPOT {_ms(summary.tpot['mean'])} ms (p99 {_ms(summary.tpot['p99'])}) · "
        f"{'—' if math.isnan(summary.throughput) else f'{summary.throughput:.0f}'} tokens/s of finished requests",
        file=out,
    )
    if result.capped:
        arrivals = f", {result.never_submitted:,} of them not yet arrived" if result.never_submitted else ""
        # (a higher rate packs the same requests into fewer, fuller steps)
        advice = ": send fewer requests, or raise --rate" if source.scenario is None else ""
        print(
            f"note: a replay stops after {MAX_ITERATIONS:,} steps; this one left {result.unfinished:,} requests "
            f"unfinished{arrivals}{advice}",
            file=out,
        )
    if summary.discarded_tokens:
        print(
            f"not counted: {summary.discarded_tokens} output tokens of requests that never finished",
            file=out,
        )
    if result.swapped_blocks:
        # (the roofline's host link, not the scenario's swap_bandwidth_gbs: that one times the engine's own events)
        print(
            f"swaps: {result.swapped_blocks} blocks moved over the {spec.name}'s host link "
            f"({spec.pcie_bandwidth / 1e9:g} GB/s a direction)",
            file=out,
        )
    if result.stalled:
        print(f"STALLED: {result.stalled}", file=out)
    if args.json is not None:
        doc = {
            "source": source.name,
            "model_shape": shape.__dict__,
            "gpu": spec.__dict__,
            "pool_blocks": source.config.num_blocks,
            "block_size": source.config.block_size,
            "summary": summary.as_dict(),
            "steps": result.iterations,
            "unfinished": result.unfinished,
            "not_yet_arrived": result.never_submitted,  # (of the unfinished: the replay stopped first)
            "stopped_at_step_cap": result.capped,
            "requests": [{**r.__dict__, "state": r.state} for r in records],
        }
        write_output(args.json, json_text(doc), "--json")
    return 0


def format_table(result: SweepResult) -> list[str]:
    timed = result.hardware is not None
    # The variant column is as wide as its longest label: a cut one could hide the very
    # value that tells two rows apart.
    width = max([len("variant"), *(len(v.label) for v in result.variants)]) + 2
    head = f"{'variant':<{width}}{'status':>11}{'steps':>7}{'peak':>6}{'preempt':>8}{'prefix hit':>11}{'done':>6}"
    if timed:
        head += f"{'TTFT ms':>9}{'TPOT ms':>9}{'s/token':>9}{'tok/s':>8}"
    lines = [head]
    base = result.original
    for v in result.variants:
        name = v.label
        if not v.ran:
            lines.append(f"{name:<{width}}{'cannot run':>11}  {v.reason}")
            continue
        line = f"{name:<{width}}{v.status:>11}{v.steps:>7}{v.peak_blocks:>6}{v.preemptions:>8}"
        line += f"{v.prefix_hit_rate:>11.1%}{v.finished:>6}"
        if timed and v.latency is not None:
            lat = v.latency
            line += f"{_ms(lat.ttft['mean']):>9}{_ms(lat.tpot['mean']):>9}"
            normalized, throughput = lat.normalized["mean"], lat.throughput
            line += f"{'—' if math.isnan(normalized) else f'{normalized:.4f}':>9}"
            line += f"{'—' if math.isnan(throughput) else f'{throughput:.0f}':>8}"
        if v is not base and base.ran and base.steps:
            line += f"  steps {v.steps / base.steps - 1:+.0%}"
        if v.status in ("stalled", "unfinished", "rejected"):
            line += f"  ({v.reason})"
        lines.append(line)
    return lines


def to_csv(result: SweepResult) -> str:
    rows = [v.row() for v in result.variants]
    names = list(dict.fromkeys(k for row in rows for k in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    # (a figure with nothing to average, NaN in the JSON's null, is an empty cell: "nan" is no number)
    writer.writerows({k: "" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()} for row in rows)
    return buffer.getvalue()


def to_json(result: SweepResult) -> str:
    hardware = result.hardware
    doc = {
        "source": result.source,
        "settings": {name: list(values) for name, values in result.settings},
        "model_shape": None if hardware is None else hardware.shape.name,
        "gpu": None if hardware is None else hardware.gpu.name,
        "variants": [v.as_dict() for v in result.variants],
    }
    return json_text(doc, indent=1)


def cmd_sweep(args: argparse.Namespace, write_output: Writer) -> int:
    if reason := _check_outputs((args.json, "--json"), (args.csv, "--csv"), (args.plot, "--plot")):
        print(f"error: {reason}", file=sys.stderr)
        return 2
    if str(args.plot) == "-":
        print("error: --plot writes a PNG file, not standard output", file=sys.stderr)
        return 2
    if args.plot is not None and args.plot.suffix.lower() != ".png":  # (a .pdf name on PNG bytes misleads)
        print(f"error: --plot {args.plot}: the plot is a PNG image; name it ….png", file=sys.stderr)
        return 2
    if sum(str(p) == "-" for p in (args.json, args.csv) if p is not None) > 1:
        print("error: only one of --json and --csv can go to standard output", file=sys.stderr)
        return 2
    settings = [parse_setting(text) for text in args.settings]
    given = [text.partition("=")[0].strip() for text in args.settings]
    for field in {f for f, _ in settings}:
        names = [name for name, (f, _) in zip(given, settings, strict=True) if f == field]
        if len(names) > 1:
            twice = names[0] if len(set(names)) == 1 else f"{field} (as {' and '.join(dict.fromkeys(names))})"
            raise InvalidStudyError(f"{twice} is set twice: give all its values in one --set")
    if not settings:
        raise InvalidStudyError("nothing to sweep: give at least one --set KNOB=V1,V2 (e.g. block_size=8,16,32)")
    hardware = _hardware(args)
    source = _source(args, hardware)
    to_stdout = any(p is not None and str(p) == "-" for p in (args.json, args.csv))
    out = sys.stderr if to_stdout else sys.stdout

    def progress(index: int, count: int, variant) -> None:
        print(f"[{index}/{count}] {variant.label}: {variant.status} ({variant.wall_seconds:.2f} s)", file=sys.stderr)

    where = f"{hardware.shape.name} on {hardware.gpu.name} (roofline)" if hardware else "no model shape: steps only"
    print(f"pagesim sweep · {source.name} · {_pool_line(source.config, hardware)} · {where}", file=out)
    result = sweep(source, settings, hardware, progress)
    for line in format_table(result):
        print(line, file=out)
    ran = any(v.ran for v in result.variants)
    # Every output made before any is written: a plot that cannot be drawn leaves no file half the set.
    png = render_png(result) if args.plot is not None and ran else None
    if args.json is not None:
        write_output(args.json, to_json(result), "--json")
    if args.csv is not None:
        write_output(args.csv, to_csv(result), "--csv")
    if not ran:  # (the table and the files say why; a plot would be empty)
        print("error: no variant could run, the original included: see the reasons above", file=sys.stderr)
        return 2
    if png is not None:
        write_output(args.plot, png, "--plot")
        print(f"plot: {args.plot}", file=out)
    return 0


def add_waste_pool_options(parser: argparse.ArgumentParser) -> None:
    """``pagesim waste``'s pool: from a preset (memory after the weights) or a block count."""
    _add_hardware(parser)
    parser.add_argument("--blocks", type=int, metavar="N", help="the pool in blocks of --block-size (not --slots)")


def waste_pool(args: argparse.Namespace) -> WastePool:
    """The pool ``pagesim waste`` replays on: a preset's, --blocks, or --slots (the default)."""
    hardware = _hardware(args)
    choices = {"--slots": args.slots, "--blocks": args.blocks, "--model-shape with --gpu": hardware}
    given = [option for option, value in choices.items() if value is not None]
    if len(given) > 1:
        raise InvalidStudyError(f"give one pool size: {' or '.join(given)}, not {'both' if len(given) == 2 else 'all'}")
    if hardware is not None:
        return pool_from_preset(hardware.shape, hardware.gpu, args.block_size)
    if args.blocks is not None:
        if args.blocks < 1:
            raise InvalidStudyError(f"--blocks must be a positive integer; got {args.blocks}")
        return pool_of_blocks(args.blocks, args.block_size, f"--blocks {args.blocks}")
    if args.slots is None:
        return WastePool(DEFAULT_WASTE_SLOTS, args.block_size, "the default")
    return WastePool(args.slots, args.block_size, f"--slots {args.slots}")
