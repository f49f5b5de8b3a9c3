"""The backend interface: where the KV cache lives and which kernel reads it."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
from pagesim.kernels.dtypes import dtype_name

MAX_HEAD_DIM = 256


class BackendUnavailableError(RuntimeError):
    """A backend was asked for by name but cannot run on this machine."""


class KernelInputError(ValueError):
    """Kernel inputs that would make the kernel read out of bounds or compute garbage."""


class ForwardInputs:
    """One model forward's slots, block tables and context lengths (and a prefill's query
    starts): the same for every layer. A backend with a device uploads them at the first
    layer and keeps the uploads in ``uploads`` for the others."""

    def __init__(self, slots: np.ndarray, tables: np.ndarray, context_lens: np.ndarray, query_starts=None) -> None:
        self.slots, self.tables, self.context_lens, self.query_starts = slots, tables, context_lens, query_starts
        self.uploads: dict[str, Any] = {}


class Backend(ABC):
    """A paged-attention backend.

    The backend owns the physical KV cache arrays (``key_cache``/``value_cache`` of shape
    ``(num_blocks, block_size, num_kv_heads, head_dim)``) in its own array module, writes
    new tokens into slots, copies blocks for copy-on-write, and runs the decode kernel.
    """

    name: str
    xp: Any
    cache_on_host = True  # the KV cache lives in host memory (a GPU backend's lives on the device)

    @property
    @abstractmethod
    def device(self) -> str:
        """Human-readable device, e.g. ``"CPU kernel · no CUDA device"``."""

    def allocate_cache(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: np.dtype
    ) -> tuple[Any, Any]:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # Zero-filled so an unwritten slot never holds NaNs that a bad mask could leak.
        return self.xp.zeros(shape, dtype=dtype), self.xp.zeros(shape, dtype=dtype)

    @abstractmethod
    def write_kv(
        self, key_cache: Any, value_cache: Any, slot_mapping: np.ndarray, keys: np.ndarray, values: np.ndarray
    ) -> None:
        """Write ``keys``/``values`` of shape (n, num_kv_heads, head_dim) to flat slots
        ``block * block_size + offset`` (vLLM's ``reshape_and_cache``)."""

    def write_kv_for(self, key_cache: Any, value_cache: Any, inputs: ForwardInputs, keys, values) -> None:
        """:meth:`write_kv` of one layer of a forward (a device backend uploads its slots once)."""
        self.write_kv(key_cache, value_cache, inputs.slots, keys, values)

    def read_blocks(self, key_cache: Any, value_cache: Any, block_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Whole blocks' K/V to the host (swap out)."""
        ids = self.xp.asarray(np.asarray(block_ids, dtype=np.int64))
        return self.to_numpy(key_cache[ids]), self.to_numpy(value_cache[ids])

    def write_blocks(self, key_cache: Any, value_cache: Any, block_ids: list[int], keys, values) -> None:
        """Whole blocks' K/V from the host (swap in)."""
        ids = self.xp.asarray(np.asarray(block_ids, dtype=np.int64))
        key_cache[ids] = self.to_device(keys)
        value_cache[ids] = self.to_device(values)

    @abstractmethod
    def copy_blocks(self, key_cache: Any, value_cache: Any, block_mapping: np.ndarray) -> None:
        """Copy whole blocks, ``block_mapping`` is (n, 2) of (src, dst) pairs."""

    @abstractmethod
    def _paged_attention(
        self,
        query: np.ndarray,
        key_cache: Any,
        value_cache: Any,
        block_tables: np.ndarray,
        context_lens: np.ndarray,
        scale: float,
    ) -> np.ndarray: ...

    def _paged_prefill(
        self,
        query: np.ndarray,
        key_cache: Any,
        value_cache: Any,
        query_starts: np.ndarray,
        block_tables: np.ndarray,
        context_lens: np.ndarray,
        scale: float,
    ) -> np.ndarray:
        raise NotImplementedError(f"the {self.name} backend has no paged prefill kernel")

    def paged_prefill(
        self,
        query: np.ndarray,
        key_cache: Any,
        value_cache: Any,
        query_starts: np.ndarray,
        block_tables: np.ndarray,
        context_lens: np.ndarray,
        scale: float,
    ) -> np.ndarray:
        """Causal attention for the new tokens of every sequence, read through the block table.

        ``query`` (total_query_tokens, num_heads, head_dim) in the cache dtype: the new tokens
        of every sequence, packed; sequence i's are ``query[query_starts[i]:query_starts[i + 1]]``
        (``query_starts`` (num_seqs + 1,) int32, vLLM's cu_seqlens_q). ``context_lens``
        (num_seqs,) int32 counts the tokens in the cache *including* the new ones (already
        written), so query row j of sequence i sits at position
        ``context_lens[i] - q_len_i + j`` and attends to positions 0..that one. A sequence
        with one new token is a decode. Returns (total_query_tokens, num_heads, head_dim)
        float32 on the host.
        """
        block_tables = int32_indices(block_tables, "block_tables")
        context_lens = int32_indices(context_lens, "context_lens")
        query_starts = int32_indices(query_starts, "query_starts")
        validate_prefill_inputs(
            query, key_cache, value_cache, query_starts, block_tables, context_lens, self.kv_dtype_name
        )
        return self._paged_prefill(
            query, key_cache, value_cache, query_starts, block_tables, context_lens, float(scale)
        )

    def paged_attention(
        self,
        query: np.ndarray,
        key_cache: Any,
        value_cache: Any,
        block_tables: np.ndarray,
        context_lens: np.ndarray,
        scale: float,
    ) -> np.ndarray:
        """Decode attention for one query token per sequence, read through the block table.

        ``query`` (num_seqs, num_heads, head_dim) in the cache dtype; ``block_tables``
        (num_seqs, max_blocks) int32; ``context_lens`` (num_seqs,) int32. Returns the
        output (num_seqs, num_heads, head_dim) as float32 on the host.
        """
        block_tables = int32_indices(block_tables, "block_tables")
        context_lens = int32_indices(context_lens, "context_lens")
        validate_kernel_inputs(query, key_cache, value_cache, block_tables, context_lens, self.kv_dtype_name)
        return self._paged_attention(query, key_cache, value_cache, block_tables, context_lens, float(scale))

    def to_numpy(self, array: Any) -> np.ndarray:
        return np.asarray(array)

    def to_device(self, array: np.ndarray) -> Any:
        """A host array in this backend's array module."""
        return self.xp.asarray(array)

    def kv_dtype_name(self, dtype) -> str:
        """The storage dtype's name (``float32``, ``float16``, ``bfloat16``) for an array dtype."""
        return dtype_name(dtype)

    def synchronize(self) -> None:  # noqa: B027 - a default no-op, overridden on devices
        """Wait for queued device work; a no-op on the CPU."""

    def memory_available(self) -> int | None:
        """Bytes free where this backend keeps the KV cache (None: unknown)."""
        return host_memory_available()


def host_memory_available() -> int | None:
    """The kernel's estimate of memory available to a new allocation (MemAvailable), in bytes."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def int32_indices(values: Any, name: str) -> np.ndarray:
    """``values`` (block ids, lengths, query starts) as a contiguous int32 array, refused
    rather than wrapped or truncated: a cast first would read block 2**32 + 5 as block 5 and
    a length of 6.9 as 6, and the bounds checks after it would pass."""
    array = np.asarray(values)
    if array.dtype == np.int32 or array.size == 0:
        return np.ascontiguousarray(array, dtype=np.int32)
    if array.dtype.kind == "f" and np.isfinite(array).all() and (array == np.trunc(array)).all():
        pass  # (whole numbers in a float array: nothing is lost)
    elif array.dtype.kind not in "iu":
        raise KernelInputError(f"{name} must hold integers; got dtype {array.dtype}")
    low, high = int(array.min()), int(array.max())  # (exact: comparing in float32 rounds 2**31 - 1 up)
    if low < np.iinfo(np.int32).min or high > np.iinfo(np.int32).max:
        bad = low if low < np.iinfo(np.int32).min else high
        raise KernelInputError(f"{name} holds {bad}, outside the kernels' 32-bit indices")
    return np.ascontiguousarray(array, dtype=np.int32)


def validate_kernel_inputs(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_tables: np.ndarray,
    context_lens: np.ndarray,
    kv_dtype_name=dtype_name,
) -> None:
    """Check shapes, dtypes and every block id a kernel would dereference, on the host."""
    _validate_cache_and_query(query, key_cache, value_cache, kv_dtype_name, rows="num_seqs")
    _validate_tables(block_tables, context_lens, query.shape[0], key_cache.shape)


def validate_prefill_inputs(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    query_starts: np.ndarray,
    block_tables: np.ndarray,
    context_lens: np.ndarray,
    kv_dtype_name=dtype_name,
) -> None:
    """:func:`validate_kernel_inputs` for a prefill launch: the packed query, and
    ``query_starts`` splitting it into every sequence's 1..context_len newest tokens."""
    _validate_cache_and_query(query, key_cache, value_cache, kv_dtype_name, rows="total_query_tokens")
    if block_tables.ndim != 2:
        raise KernelInputError(f"block_tables must be (num_seqs, max_blocks); got {block_tables.shape}")
    num_seqs = block_tables.shape[0]
    if query_starts.ndim != 1 or query_starts.shape[0] != num_seqs + 1:
        raise KernelInputError(
            f"query_starts must be (num_seqs + 1,) = ({num_seqs + 1},) for {num_seqs} block-table rows; "
            f"got {query_starts.shape}"
        )
    if query_starts[0] != 0 or query_starts[-1] != query.shape[0]:
        raise KernelInputError(
            f"query_starts must run from 0 to the {query.shape[0]} query tokens; "
            f"got {query_starts[0]} .. {query_starts[-1]}"
        )
    q_lens = np.diff(query_starts.astype(np.int64))
    if q_lens.size and q_lens.min() < 1:
        bad = int(np.argmin(q_lens))
        raise KernelInputError(
            f"query_starts must increase: sequence {bad} has {q_lens[bad]} query tokens "
            f"(query_starts[{bad}] = {query_starts[bad]}, query_starts[{bad + 1}] = {query_starts[bad + 1]})"
        )
    _validate_tables(block_tables, context_lens, num_seqs, key_cache.shape)
    if q_lens.size and (q_lens > context_lens).any():
        bad = int(np.argmax(q_lens > context_lens))
        raise KernelInputError(
            f"sequence {bad}: {q_lens[bad]} query tokens but a context of {context_lens[bad]}; "
            "the context counts the new tokens, so it is at least as long"
        )


def _validate_cache_and_query(query: Any, key_cache: Any, value_cache: Any, kv_dtype_name, rows: str) -> None:
    if key_cache.ndim != 4 or key_cache.shape != value_cache.shape:
        raise KernelInputError(
            "key_cache and value_cache must both be (num_blocks, block_size, num_kv_heads, head_dim); "
            f"got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
        )
    if key_cache.dtype != value_cache.dtype or query.dtype != key_cache.dtype:
        raise KernelInputError(
            f"query, key_cache and value_cache must share one dtype; got {query.dtype}, "
            f"{key_cache.dtype}, {value_cache.dtype}"
        )
    kv_dtype_name(key_cache.dtype)
    for name, array in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        if not array.flags.c_contiguous:
            raise KernelInputError(f"{name} must be C-contiguous (the kernels index it by its shape)")
    _, _, num_kv_heads, head_dim = key_cache.shape
    if query.ndim != 3 or query.shape[2] != head_dim:
        raise KernelInputError(f"query must be ({rows}, num_heads, {head_dim}); got {tuple(query.shape)}")
    num_heads = query.shape[1]
    if head_dim < 1 or head_dim > MAX_HEAD_DIM:
        raise KernelInputError(f"head_dim must be in 1..{MAX_HEAD_DIM}; got {head_dim}")
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise KernelInputError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})")


def _validate_tables(block_tables: np.ndarray, context_lens: np.ndarray, num_seqs: int, cache_shape) -> None:
    num_blocks, block_size = cache_shape[0], cache_shape[1]
    if block_tables.ndim != 2 or block_tables.shape[0] != num_seqs:
        raise KernelInputError(f"block_tables must be ({num_seqs}, max_blocks); got {block_tables.shape}")
    if context_lens.shape != (num_seqs,):
        raise KernelInputError(f"context_lens must be ({num_seqs},); got {context_lens.shape}")
    from pagesim.kernels.table_check import tables_in_range  # (Numba's import: not for every command)

    if num_seqs == 0 or tables_in_range(block_tables, context_lens, block_size, num_blocks):
        return  # (else the checks below find what is wrong and say so)
    if context_lens.min() < 1:
        bad = int(np.argmin(context_lens))
        raise KernelInputError(f"context_lens[{bad}] = {context_lens[bad]}: every sequence needs ≥ 1 token")
    max_blocks = block_tables.shape[1]
    blocks_needed = (context_lens + block_size - 1) // block_size
    if blocks_needed.max() > max_blocks:
        bad = int(np.argmax(blocks_needed))
        raise KernelInputError(
            f"sequence {bad}: context length {context_lens[bad]} needs {blocks_needed[bad]} blocks "
            f"but block_tables has {max_blocks} columns"
        )
    used = np.arange(max_blocks)[None, :] < blocks_needed[:, None]
    ids = block_tables[used]
    if ids.size and (ids.min() < 0 or ids.max() >= num_blocks):
        rows, cols = np.nonzero(used & ((block_tables < 0) | (block_tables >= num_blocks)))
        raise KernelInputError(
            f"block_tables[{rows[0]}, {cols[0]}] = {block_tables[rows[0], cols[0]]} is out of range "
            f"for a pool of {num_blocks} blocks"
        )


def query_tiles(query_starts: np.ndarray, query_tile: int) -> tuple[np.ndarray, np.ndarray]:
    """A prefill launch's work items: (sequence, first query row) of every tile of
    ``query_tile`` consecutive query rows of one sequence (each sequence's last may be short)."""
    starts = np.asarray(query_starts, dtype=np.int64)
    tiles = -(-np.diff(starts) // query_tile)
    seqs = np.repeat(np.arange(tiles.size, dtype=np.int64), tiles)
    first_tile = np.cumsum(tiles) - tiles
    rows = starts[seqs] + query_tile * (np.arange(seqs.size) - first_tile[seqs])
    return seqs.astype(np.int32), rows.astype(np.int32)


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
