"""Finding out whether CUDA is usable asks the driver first: on a machine without a GPU
the app never imports CuPy (a second of its start-up, most of it ml_dtypes)."""

import subprocess
import sys

import pytest
from pagesim.kernels import cuda_backend


class _FakeDriver:
    def __init__(self, init_status: int, count: int) -> None:
        self.init_status, self.count = init_status, count

    def cuInit(self, flags):  # the driver API's names
        return self.init_status

    def cuDeviceGetCount(self, pointer):
        pointer._obj.value = self.count
        return 0


def _with_driver(monkeypatch, driver):
    monkeypatch.setattr(cuda_backend, "_open_driver", lambda: driver)


def test_no_driver_library_means_no_cuda_and_says_so(monkeypatch):
    _with_driver(monkeypatch, None)
    assert cuda_backend.driver_device_count() is None
    assert "no CUDA driver" in cuda_backend.unavailable_reason()


@pytest.mark.parametrize("init_status, count", [(100, 0), (0, 0)])  # CUDA_ERROR_NO_DEVICE, or zero devices
def test_a_driver_without_devices_means_no_cuda(monkeypatch, init_status, count):
    _with_driver(monkeypatch, _FakeDriver(init_status, count))
    assert cuda_backend.driver_device_count() == 0
    assert cuda_backend.unavailable_reason() == "the CUDA driver sees no device"


def test_a_driver_with_devices_hands_over_to_cupy(monkeypatch):
    _with_driver(monkeypatch, _FakeDriver(0, 2))
    assert cuda_backend.driver_device_count() == 2
    reason = cuda_backend.unavailable_reason()  # CuPy has the last word (no real device here)
    assert reason is None or "CuPy" in reason or "CUDA" in reason


def test_choosing_a_backend_on_a_cpu_machine_imports_neither_cupy_nor_ml_dtypes():
    probe = (
        "import sys; from pagesim.kernels.selection import select_backend, available_backends; "
        "backend = select_backend('auto'); reasons = available_backends(); "
        "print(backend.name, 'cupy' in sys.modules, 'ml_dtypes' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    if out[0] == "cuda":
        pytest.skip("this machine has a CUDA device: CuPy is rightly imported")
    assert out == ["cpu", "False", "False"]
