"""For tests that patch a function inside the compiled core's modules (to plant a bug, or to
count calls): compiled code calls the functions of its group directly, so a patch reaches
the sources only. Under the compiled core such a test runs again, whole, in a child pytest
on the sources (``PAGESIM_PURE_PYTHON=1``); without it, it runs here as written."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

from pagesim.core import compiled_core

ROOT = Path(__file__).resolve().parent.parent


def pytest_on_the_sources(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """A child pytest of ``args`` with ``PAGESIM_PURE_PYTHON=1``, from the checkout's root."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        env={**os.environ, compiled_core.PURE_PYTHON_ENV: "1"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def on_the_sources(test):
    @functools.wraps(test)
    def run(*args, **kwargs):
        if not compiled_core.status.active:
            return test(*args, **kwargs)
        node = os.environ["PYTEST_CURRENT_TEST"].rsplit(" ", 1)[0]  # "path::name[id] (call)"
        child = pytest_on_the_sources([node], timeout=240)
        assert child.returncode == 0 and " passed" in child.stdout, child.stdout[-4000:] + child.stderr[-2000:]

    return run
