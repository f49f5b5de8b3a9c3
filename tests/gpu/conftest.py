import pytest
from pagesim.kernels.cuda_backend import unavailable_reason


@pytest.fixture(scope="session")
def cuda_backend():
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"needs a CUDA device: {reason}")
    from pagesim.kernels.cuda_backend import CudaBackend

    return CudaBackend()
