import errno
import os

# Qt tests run offscreen on machines with no display (CI, these dev machines).
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest
from pagesim.kernels import atomic_write
from pagesim.kernels.cpu_backend import CpuBackend


@pytest.fixture(scope="session")
def cpu_backend():
    return CpuBackend()


@pytest.fixture
def full_disk(monkeypatch):
    """Every atomic write fails as on a full disk (at the fsync before the rename)."""

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic_write.os, "fsync", full)


def pytest_addoption(parser):
    group = parser.getgroup("monkey", "the GUI monkey (tests/app/test_monkey.py)")
    group.addoption(
        "--monkey-actions",
        type=int,
        default=None,
        help="random actions per seed (default 150); from 600 on, the run also asserts that memory stays flat",
    )
    group.addoption("--monkey-seeds", default=None, help="comma-separated seeds to run (default 0,1)")
