import os

# Qt tests run offscreen on machines with no display (CI, these dev machines).
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest
from pagesim.kernels.cpu_backend import CpuBackend


@pytest.fixture(scope="session")
def cpu_backend():
    return CpuBackend()
