import os

import pytest
import torch
from pagesim.core.models import DenseLlamaEngine, Llama, ModelFileError, bundled_model_path, load_gguf
from pagesim.core.models.gguf_loader import CACHE_ENV


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    """Every load in these tests caches into a fresh folder, never the user's."""
    folder = tmp_path_factory.mktemp("model-cache")
    old = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(folder)
    yield folder
    if old is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = old


@pytest.fixture(scope="session")
def smollm_path():
    try:
        return bundled_model_path()
    except ModelFileError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def smollm(model_cache, smollm_path):
    """SmolLM2-135M-Instruct, loaded once (the first, uncached load: ~10 s)."""
    return load_gguf(smollm_path)


@pytest.fixture(scope="session")
def llama(smollm):
    return Llama(smollm.config, smollm.weights)


@pytest.fixture(scope="session")
def engine(llama):
    return DenseLlamaEngine(llama)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The model's matmuls on one thread. On a two-core machine that other processes share,
    two OpenMP threads wait on each other and a decode step took ~5x longer (0.3 s, against
    0.06 s on one thread); with the cores to itself it gains little from the second."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_kernel_thread():
    """The paged kernels on one thread too: a decode launch over a few short sequences is
    microseconds of work, and waking Numba's threads on a shared two-core machine cost
    ~8 ms a launch (60 launches a step)."""
    import numba

    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(threads)
