"""Real language models: a Llama-architecture GGUF file loaded as the field loads it
(weights dequantised once to fp32 and cached, the tokenizer and chat template from the
file), the model in plain torch with attention supplied by the caller, and the dense
reference engine (contiguous K/V, torch SDPA, greedy decoding)."""

from pagesim.core.models.gguf_loader import (
    LlamaConfig,
    ModelFile,
    ModelFileError,
    UnsupportedModelError,
    bundled_model_path,
    cache_root,
    load_gguf,
)
from pagesim.core.models.llama import DenseKVCache, DenseLlamaEngine, Generation, Llama
from pagesim.core.models.tokenizer import GGUFTokenizer, TokenizerError

__all__ = [
    "DenseKVCache",
    "DenseLlamaEngine",
    "GGUFTokenizer",
    "Generation",
    "Llama",
    "LlamaConfig",
    "ModelFile",
    "ModelFileError",
    "TokenizerError",
    "UnsupportedModelError",
    "bundled_model_path",
    "cache_root",
    "load_gguf",
]
