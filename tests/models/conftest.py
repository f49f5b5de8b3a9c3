import os

import pytest
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
