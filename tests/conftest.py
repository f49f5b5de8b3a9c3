import errno
import os

# Qt tests run offscreen on machines with no display (CI, these dev machines).
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest
from pagesim.core import atomic_write
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
