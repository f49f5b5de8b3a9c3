"""Which model a name means, loaded once per process: ``"smollm2-135m"`` (the bundled
SmolLM2-135M-Instruct) or a path to a Llama-architecture ``.gguf`` file, its weights in the
dtype ``PAGESIM_DTYPE`` chooses (fp32 unless asked: core.models.precision), and the first
load in a process sets torch's and Numba's thread counts (core.models.threads: one each on a
machine of two cores or fewer); and the cache configuration's shape fields a model sets
(heads, KV heads, head dim), which a scenario header may repeat but not contradict."""

from __future__ import annotations

import functools
import os
import stat
import threading
from pathlib import Path

from pagesim.core.config import CacheConfig
from pagesim.core.errors import PagesimError
from pagesim.core.language_model import BUNDLED_MODEL as BUNDLED_NAME
from pagesim.core.models.gguf_loader import LlamaConfig, ModelFile, ModelFileError, bundled_model_path, load_gguf
from pagesim.core.models.precision import resolve_dtype
from pagesim.core.models.threads import apply_chosen_threads

SHAPE_FIELDS = ("num_heads", "num_kv_heads", "head_dim")


class ModelMismatchError(ModelFileError):
    """A configuration field that contradicts the model (``field`` names it)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def model_path(name: str) -> Path:
    if name == BUNDLED_NAME:
        return bundled_model_path()
    if name.lower().endswith(".gguf"):
        return Path(name).expanduser()
    if name == "synthetic":  # (a scenario's model may be it; a model file to load may not)
        raise ModelFileError(
            f'the synthetic token model has no weights or tokenizer to load: give "{BUNDLED_NAME}" or a .gguf file'
        )
    raise ModelFileError(f'model must be "synthetic", "{BUNDLED_NAME}" or a path to a .gguf file; got {name!r}')


LOADED_KEPT = 2  # models held in memory at once (the newest loads)
_loaded: dict[tuple, ModelFile] = {}
# One load at a time: a second thread asking for the model a first is loading (the app's
# early load at start-up, then its parse) waits for that load instead of doing it again.
_loading = threading.Lock()


def _load(path: str, cache_dir: str | None, stamp: tuple[int, int], dtype: str) -> ModelFile:
    key = (path, cache_dir, stamp, dtype)
    with _loading:
        model = _loaded.pop(key, None)
        if model is None:
            model = load_gguf(path, dtype=dtype)
        _loaded[key] = model  # the newest last
        while len(_loaded) > LOADED_KEPT:
            del _loaded[next(iter(_loaded))]
    return model


def _key(name: str, dtype: str | None) -> tuple:
    path = model_path(name)
    try:
        st = path.stat()
    except OSError as e:
        raise ModelFileError(f"{path}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):  # (it read as "No such file or directory" once opened)
        raise ModelFileError(f"{path} is a folder, not a .gguf model file")
    dtype = dtype or resolve_dtype()[0]
    return str(path.resolve()), os.environ.get("PAGESIM_CACHE_DIR"), (st.st_mtime_ns, st.st_size), dtype


def is_loaded(name: str, dtype: str | None = None) -> bool:
    """Whether :func:`load_model` would answer at once (no file to read: the app loads a
    model that is not in a thread of its own, with a progress bar). A model that cannot be
    found is "loaded": its load fails at once, with the reason."""
    try:
        return _key(name, dtype) in _loaded
    except (ModelFileError, PagesimError):
        return True


@functools.cache
def _choose_threads_once() -> None:
    """The first real model of a process (the CLI, the app, a scenario) sets both thread
    pools; a later change by the caller stands."""
    apply_chosen_threads()


def load_model(name: str, dtype: str | None = None) -> ModelFile:
    """The model ``name`` means, loaded (and cached in this process: a scenario's parse and
    its runner share one load; a file changed on disk is loaded again), its weights in
    ``dtype`` ("float32" or "bfloat16"; None: as ``PAGESIM_DTYPE`` chooses)."""
    key = _key(name, dtype)
    model = _load(*key)
    _choose_threads_once()  # after: it imports torch, which the load does not need
    return model


def model_shapes(config: LlamaConfig) -> dict[str, int]:
    return {"num_heads": config.num_heads, "num_kv_heads": config.num_kv_heads, "head_dim": config.head_dim}


def check_shapes(given: dict, config: LlamaConfig, name: str) -> None:
    """Refuse a shape field in ``given`` that contradicts the model, naming it."""
    for field, value in model_shapes(config).items():
        if given.get(field) is not None and given[field] != value:
            raise ModelMismatchError(
                f"{field} = {given[field]!r} contradicts the model {name!r}, which has {field} = {value} "
                "(leave it out: the model sets it)",
                field,
            )


def config_for_model(name: str, num_blocks: int, block_size: int, **fields) -> CacheConfig:
    """A cache configuration for model ``name``: its heads and head dim from the model."""
    model = load_model(name)
    check_shapes(fields, model.config, name)
    return CacheConfig(num_blocks, block_size, model=name, **(fields | model_shapes(model.config)))
