"""Which dtype a real model's weights and matmuls use: fp32, or bf16 where the CPU has bf16
matmul instructions (AMX or AVX512-BF16, which oneDNN uses for torch's bf16 matmuls).

bf16 is faster and halves the weights' memory (figures in docs/benchmarks.md), but it is not
the default: a bf16 matmul rounds its inputs and outputs to 8 significant bits, and the paged
and dense engines, whose attention outputs differ in the last fp32 bits, round some of them
differently; from there the two drift apart by bf16's rounding, not fp32's. Their logits
then differ by ~0.25, and the greedy token differs wherever the top two are that close: in
6 of 365 steps of 10 chat prompts, where fp32 agrees within 1e-4 and on every token.
``auto`` picks bf16 where the CPU has the instructions; ``PAGESIM_DTYPE`` sets the choice
for a whole process."""

from __future__ import annotations

import os

from pagesim.core.errors import PagesimError

DTYPE_ENV = "PAGESIM_DTYPE"
DTYPE_CHOICES = ("auto", "fp32", "bf16")
DEFAULT_CHOICE = "fp32"  # the paged and dense engines agree token for token (above)
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo's names
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16"}
SHORT_NAMES = {v: k for k, v in DTYPE_NAMES.items()}


class DtypeChoiceError(PagesimError, ValueError):
    """A dtype choice that is none of auto, fp32, bf16 (the option's or the environment's)."""


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return set(next(line.split(":", 1)[1].split() for line in f if line.startswith("flags")))
    except (OSError, StopIteration):
        return set()


def bf16_matmul_flags() -> list[str]:
    """The CPU's bf16 matmul instructions (empty: bf16 would be emulated, slower than fp32)."""
    flags = cpu_flags()
    return [flag for flag in BF16_FLAGS if flag in flags]


def choice_from_env() -> str:
    choice = os.environ.get(DTYPE_ENV, "").strip().lower() or DEFAULT_CHOICE
    if choice not in DTYPE_CHOICES:
        raise DtypeChoiceError(f"{DTYPE_ENV}={choice!r}: expected one of {', '.join(DTYPE_CHOICES)}")
    return choice


def resolve_dtype(choice: str | None = None) -> tuple[str, str]:
    """The weights' dtype (``"float32"`` or ``"bfloat16"``) for ``choice`` (None: the
    environment's, else fp32), and why, in a few words."""
    explicit = choice is not None or bool(os.environ.get(DTYPE_ENV, "").strip())
    choice = choice_from_env() if choice is None else choice
    if choice not in DTYPE_CHOICES:
        raise DtypeChoiceError(f"dtype {choice!r}: expected one of {', '.join(DTYPE_CHOICES)}")
    flags = bf16_matmul_flags()
    if choice == "auto":
        if flags:
            return "bfloat16", f"auto: the CPU has {' and '.join(flags)}"
        return "float32", "auto: the CPU has no bf16 matmul instructions"
    if choice == "bf16":
        return "bfloat16", "asked for" + ("" if flags else " (no bf16 matmul instructions: emulated, slow)")
    return "float32", "asked for" if explicit else "the default"


def describe_dtype(dtype: str) -> str:
    """How a header line names the weights' dtype: ``bf16 weights`` or ``fp32 weights``."""
    return f"{SHORT_NAMES.get(dtype, dtype)} weights"
