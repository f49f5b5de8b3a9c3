"""How many threads a real model's matmuls (torch) and paged kernels (Numba) use.

On a two-core machine that other processes share, two threads per pool wait on each other
whenever the other core is busy: a decode step took several times longer than on one
thread (figures in docs/benchmarks.md), while with the machine to itself the second thread
gained little. So a machine of two cores or fewer runs one thread; a larger one leaves a
core to the rest of the machine. ``PAGESIM_THREADS`` overrides the choice."""

from __future__ import annotations

import os

from pagesim.core.errors import PagesimError

THREADS_ENV = "PAGESIM_THREADS"
MAX_THREADS_PER_CORE = 4


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads(available: int | None = None) -> int:
    available = cores() if available is None else available
    return 1 if available <= 2 else available - 1


def chosen_threads() -> tuple[int, str]:
    """The thread count and why."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise PagesimError(f"{THREADS_ENV}={value!r}: expected a positive integer")
        # More threads than cores only contend, and OpenMP fails to create thousands (100000 crashed torch).
        limit = MAX_THREADS_PER_CORE * cores()
        if int(value) > limit:
            raise PagesimError(
                f"{THREADS_ENV}={value}: at most {limit} ({MAX_THREADS_PER_CORE} per core of the {cores()} here)"
            )
        return int(value), f"{THREADS_ENV}"
    n = cores()
    return default_threads(n), f"{n} cores"


def set_threads(count: int) -> None:
    """Both pools to ``count`` threads (Numba's at most its configured maximum)."""
    import numba
    import torch

    torch.set_num_threads(count)
    numba.set_num_threads(min(count, numba.config.NUMBA_NUM_THREADS))


def apply_chosen_threads() -> str:
    """Set both pools as :func:`chosen_threads` says; what was chosen, for a header line."""
    count, why = chosen_threads()
    set_threads(count)
    return f"{count} thread{'s' if count > 1 else ''} ({why})"
