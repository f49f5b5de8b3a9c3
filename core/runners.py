"""Which runner runs a configuration's model: the synthetic token model's
:class:`~pagesim.core.model_runner.ModelRunner`."""

from __future__ import annotations

from pagesim.core.config import CacheConfig
from pagesim.core.language_model import SYNTHETIC
from pagesim.core.model_runner import ModelRunner, check_memory
from pagesim.kernels.backend import Backend


def make_runner(config: CacheConfig, backend: Backend, kv_data: bool = True) -> ModelRunner:
    if config.model == SYNTHETIC:
        check_memory(config, backend, kv_data)
        return ModelRunner(config, backend, kv_data)
    raise ValueError(f"model {config.model!r}: only the synthetic model runs in the engine so far")
