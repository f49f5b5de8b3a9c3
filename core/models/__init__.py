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
from pagesim.core.models.tokenizer import GGUFTokenizer, TokenizerError

# The model itself is torch: imported on first use (PEP 562), so that importing the package
# for its loader or its thread settings (the app's window does) does not wait for torch.
_TORCH_NAMES = ("DenseKVCache", "DenseLlamaEngine", "Generation", "Llama")


def __getattr__(name: str):
    if name in _TORCH_NAMES:
        from pagesim.core.models import llama

        return getattr(llama, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
