"""Which runner runs a configuration's model: the synthetic token model's
:class:`~pagesim.core.model_runner.ModelRunner`, or, for a real model
(``config.model`` is ``"smollm2-135m"`` or a ``.gguf`` path), the
:class:`~pagesim.core.llama_runner.LlamaRunner`: the model's weights, one paged cache per
layer with one block table for all, and the dense engine it is checked against."""

from __future__ import annotations

from pagesim.core.config import CacheConfig
from pagesim.core.language_model import SYNTHETIC
from pagesim.core.model_runner import ModelRunner, check_memory
from pagesim.kernels.backend import Backend


def make_runner(config: CacheConfig, backend: Backend, kv_data: bool = True) -> ModelRunner:
    if config.model == SYNTHETIC:
        check_memory(config, backend, kv_data)
        return ModelRunner(config, backend, kv_data)
    # Lazy on purpose: torch and the model file load only when a scenario names a real model.
    from pagesim.core.llama_runner import LlamaRunner

    return LlamaRunner.for_config(config, backend, kv_data)
