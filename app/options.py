"""Command-line options shared by ``pagesim`` and ``python -m pagesim.app.benchmarks``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

BACKEND_CHOICES = ["auto", "cpu", "cuda"]
DEFAULT_BENCH_JSON = Path("bench-results/bench.json")
DEFAULT_GUI_BENCH_JSON = Path("bench-results/gui-bench.json")


def add_backend_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=BACKEND_CHOICES,
        default="auto",
        help="kernel backend: auto picks CUDA when CuPy sees a device, else the compiled CPU kernel",
    )
    parser.add_argument(
        "--cuda-kernel",
        choices=["auto", "vllm", "v1", "v2"],
        default="auto",
        help="CUDA only: force v1 or split-K v2; auto: from the occupancy model (v1 when it fills at least 4 "
        "waves of the device or the context fits one 512-token partition, else v2 if that gives more waves); "
        "vllm: vLLM's rule (v1 when the longest context is ≤ 8192 and either it fits one partition or there are "
        "more than 512 (sequence, head) pairs)",
    )


def add_bench_options(parser: argparse.ArgumentParser) -> None:
    add_backend_option(parser)
    parser.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help=f"write the results here (default: {DEFAULT_BENCH_JSON}, or {DEFAULT_GUI_BENCH_JSON} with --gui)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (a smoke run)")


def bench_json(args: argparse.Namespace, gui: bool = False) -> Path:
    """Where a benchmark writes its results: ``--json`` as given, else the default."""
    if getattr(args, "json", None) is not None:
        return args.json
    return DEFAULT_GUI_BENCH_JSON if gui else DEFAULT_BENCH_JSON


def writable_problem(path: Path, what: str, folder: bool = False) -> str | None:
    """Why ``path`` cannot be written (as a file, or a folder to write into), or None.
    Checked before a run, so that a long run does not end in a traceback."""
    if str(path) == "-" and not folder:
        return None
    if path.exists():
        if folder != path.is_dir():
            return f"{what} {path} is {'a file' if folder else 'a folder'}, not {'a folder' if folder else 'a file'}"
        target = path if folder else path.parent
    else:
        target = path.parent
    while not target.exists():
        target = target.parent
    if not target.is_dir():
        return f"{what} {path} is under {target}, which is a file"
    if not os.access(target, os.W_OK | os.X_OK):
        return f"{what} {path}: {target} is not writable"
    return None
