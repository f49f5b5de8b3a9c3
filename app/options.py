"""Command-line options shared by ``pagesim`` and ``python -m pagesim.app.benchmarks``."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from pagesim.core.language_model import BUNDLED_MODEL

BACKEND_CHOICES = ["auto", "cpu", "cuda"]
DEFAULT_BENCH_JSON = Path("bench-results/bench.json")
DEFAULT_GUI_BENCH_JSON = Path("bench-results/gui-bench.json")
DEFAULT_MODEL_BENCH_JSON = Path("bench-results/model-bench.json")
# core.models.precision's choices (importing that package would load torch, which most commands never need)
DTYPE_CHOICES = ["auto", "fp32", "bf16"]


def finite(value):
    """``value`` with each NaN or infinity as None: JSON has no NaN, and a strict reader
    rejects the whole file (a mean over no finished request is NaN; the JSON says null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def json_text(doc, indent: int | None = 2, default=str) -> str:
    """A report as strict JSON: each NaN or infinity as null (see :func:`finite`), and what
    else JSON cannot name as its text (``default=None``: a TypeError instead)."""
    return json.dumps(finite(doc), indent=indent, allow_nan=False, default=default) + "\n"


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


def add_dtype_option(parser: argparse.ArgumentParser, default: str | None) -> None:
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default=default,
        help="a real model's weights and matmuls: fp32, bf16, or auto (bf16 where the CPU has AMX or AVX512-BF16); "
        f"default: {default or 'PAGESIM_DTYPE, else fp32'}",
    )


def _repeat_count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= 50:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 50, got {text!r}")
    return count


def say_unused_cuda_kernel(args: argparse.Namespace, backend) -> None:
    """A note when ``--cuda-kernel`` was chosen for a run that is not on the CUDA backend."""
    choice = getattr(args, "cuda_kernel", "auto")
    if choice != "auto" and backend.name != "cuda":
        print(f"note: --cuda-kernel {choice} is for the CUDA backend; this run uses {backend.name}", file=sys.stderr)


def path_arg(text: str) -> Path:
    """A file or folder option's path; an empty one is refused (``Path("")`` is the current
    folder: ``--dump ""`` wrote its files there, ``--json ""`` named "." in its error)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty name: give a path")
    return Path(text)


def output_file_arg(text: str) -> Path:
    """:func:`path_arg` of a file to write: one ending in a slash names a folder, and
    ``Path`` would drop the slash (``--json out/new/`` wrote a file called ``new``)."""
    path = path_arg(text)
    if text != "-" and text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(
            f"{shortened(text)!r} ends in {text[-1]!r}, so it names a folder: give a file's name"
        )
    return path


def add_bench_options(parser: argparse.ArgumentParser) -> None:
    add_backend_option(parser)
    parser.add_argument(
        "--json",
        type=output_file_arg,
        metavar="PATH",
        help=f"write the results here (default: {DEFAULT_BENCH_JSON}, {DEFAULT_GUI_BENCH_JSON} with --gui, "
        f"{DEFAULT_MODEL_BENCH_JSON} with --model)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (a smoke run)")
    parser.add_argument(
        "--repeats",
        type=_repeat_count,
        default=1,
        metavar="N",
        help="run the engine and scheduler benchmarks N times each, in turn, each in a fresh process, and "
        "report their medians (default 1: once, in this process)",
    )
    parser.add_argument(
        "--model",
        nargs="?",
        const=BUNDLED_MODEL,
        metavar="M",
        help="benchmark a real model instead (default smollm2-135m, or a .gguf path): loads, peak memory, threads, "
        "decode steps and a prefill, the paged engine against the dense one; CPU only",
    )
    add_dtype_option(parser, "auto")


def bench_json(args: argparse.Namespace, gui: bool = False) -> Path:
    """Where a benchmark writes its results: ``--json`` as given, else the default."""
    if getattr(args, "json", None) is not None:
        return args.json
    if getattr(args, "model", None):
        return DEFAULT_MODEL_BENCH_JSON
    return DEFAULT_GUI_BENCH_JSON if gui else DEFAULT_BENCH_JSON


def shortened(text: str, limit: int = 120) -> str:
    """``text``, its middle cut to "…" past ``limit`` characters (a path too long for the system)."""
    return text if len(text) <= limit else f"{text[: limit // 2]}…{text[-limit // 2 :]}"


def writable_problem(path: Path, what: str, folder: bool = False) -> str | None:
    """Why ``path`` cannot be written (as a file, or a folder to write into), or None.
    Checked before a run, so that a long run does not end in a traceback."""
    if str(path) == "-" and not folder:
        return None
    try:
        return _writable_problem(path, what, folder)
    except OSError as exc:  # (too long a name, a folder not to be entered: Path.exists raises)
        return f"{what} {shortened(str(path))}: {exc.strerror or exc}"


def _writable_problem(path: Path, what: str, folder: bool) -> str | None:
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
