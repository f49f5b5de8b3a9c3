"""The CUDA backend: CuPy launches the kernels in ``paged_attention.cu``; the KV cache
lives on the device and changes there (writes and copy-on-write copies included)."""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import json
import math
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
from pagesim.kernels.atomic_write import atomic_write
from pagesim.kernels.backend import (
    Backend,
    ForwardInputs,
    KernelInputError,
    int32_indices,
    query_tiles,
    validate_kernel_inputs,
    validate_prefill_inputs,
)
from pagesim.kernels.cuda_build import (
    HEADS_PER_BLOCK,
    NUM_THREADS,
    OPTIONS,
    PARTITION_SIZE,
    CompileError,
    Instantiation,
    check_head_dim,
    heads_per_block,
    instantiation_for,
    kernel_source,
    nvrtc_cubin,
    nvrtc_ptx,
    prefill_query_tile,
)
from pagesim.kernels.dtypes import bfloat16, dtype_name, is_bfloat16
from pagesim.kernels.occupancy import DeviceLimits, KernelResources, LaunchPlan, plan_launch
from pagesim.kernels.user_cache import cache_root

# vLLM's rule: v1 when the longest context fits one pass (≤ 8192) and either it is a
# single partition or there are enough (sequence, head) pairs to fill the GPU.
V1_MAX_CONTEXT = 8192
V1_MIN_WORK = 512
MAX_GRID_Y = 65535  # sequences ride on the grid's y dimension


def choose_variant(max_context_len: int, num_seqs: int, num_heads: int) -> str:
    partitions = math.ceil(max_context_len / PARTITION_SIZE)
    if max_context_len <= V1_MAX_CONTEXT and (partitions == 1 or num_seqs * num_heads > V1_MIN_WORK):
        return "v1"
    return "v2"


_DRIVER_LIBRARIES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")


def driver_device_count() -> int | None:
    """CUDA devices the driver reports, asked of the driver library directly; None where
    there is no driver library. Importing CuPy to ask is slow (it imports ml_dtypes), and
    every CPU-only start of the app asked, before its first frame."""
    driver = _open_driver()
    if driver is None:
        return None
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0  # e.g. CUDA_ERROR_NO_DEVICE: a driver, and nothing it can run on
    return count.value


def _open_driver():
    for name in _DRIVER_LIBRARIES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def unavailable_reason() -> str | None:
    devices = driver_device_count()
    if devices is None:
        return "no CUDA driver on this machine (libcuda not found)"
    if devices == 0:
        return "the CUDA driver sees no device"
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'pagesim[cuda]')"
    try:
        if not cupy.cuda.is_available():
            return "CuPy sees no CUDA device"
    except Exception as exc:  # the driver can fail in many ways; say how
        return f"CUDA runtime error: {exc}"
    return None


# Compiled modules, one per (dtype, head_dim) with every block-size variant, per target and process.
_MODULES: dict[tuple[tuple[int, int], str], Any] = {}
_MODULES_LOCK = threading.Lock()


class CompiledModule:
    """A loaded module whose kernels are asked for by their template names
    (``pagesim::paged_attention_v1<...>``), as a CuPy ``RawModule`` compiled with
    ``name_expressions`` is."""

    def __init__(self, raw_module, lowered: dict[str, str]) -> None:
        self._raw = raw_module
        self._lowered = lowered

    def get_function(self, name: str):
        return self._raw.get_function(self._lowered[name])


def module_cache_key(inst: Instantiation, target: str) -> str:
    """What a compiled module depends on: the source, the options, the target, the kernels
    named, the compiler (NVRTC's major.minor version: all that it reports)."""
    from cupy.cuda import nvrtc

    digest = hashlib.sha256()
    parts = (kernel_source(), " ".join(OPTIONS), target, "\n".join(inst.module_names()), str(nvrtc.getVersion()))
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def device_target(compute_capability: str | int) -> str:
    """What NVRTC compiles for a device of this compute capability ("90"): its machine code
    (``sm_90``) where NVRTC knows the architecture, else PTX for the newest one it knows
    (``compute_90``), which the driver compiles for the device when it loads it (as CuPy
    does for a GPU newer than its NVRTC)."""
    from cupy.cuda import nvrtc

    capability = int(compute_capability)
    known = sorted(nvrtc.getSupportedArchs())
    if capability in known:
        return f"sm_{capability}"
    older = [arch for arch in known if arch < capability]
    if not older:
        major, minor = divmod(capability, 10)
        raise CompileError(
            f"this NVRTC ({'.'.join(map(str, nvrtc.getVersion()))}) compiles for compute capability "
            f"{known[0] // 10}.{known[0] % 10} and newer; the GPU is {major}.{minor}"
        )
    return f"compute_{older[-1]}"


def cached_module_file(inst: Instantiation, target: str, folder: Path | None = None) -> tuple[Path, dict[str, str]]:
    """``inst``'s module compiled for ``target`` (a cubin for ``sm_XY``, PTX for
    ``compute_XY``) and its kernels' lowered names, compiled once per machine: kept in
    pagesim's cache folder, checked by its hash and its names. (CuPy's own cache recompiles
    in every process when templates are named, and a (dtype, head_dim) module takes seconds
    to compile.) Where the folder cannot be written, the file goes to a temporary one."""
    names = inst.module_names()
    key = module_cache_key(inst, target)
    suffix = ".cubin" if target.startswith("sm_") else ".ptx"
    try:
        folder = cache_root() / "cuda" if folder is None else folder
    except RuntimeError:  # no home folder to find the cache in
        folder = _temporary_folder()
    module_path, entry_path = folder / f"{key}{suffix}", folder / f"{key}.json"
    try:
        entry = json.loads(entry_path.read_text(encoding="utf-8"))
        lowered = dict(entry["lowered"])
        if entry["sha256"] == hashlib.sha256(module_path.read_bytes()).hexdigest() and set(lowered) == set(names):
            return module_path, lowered
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent, partial or stale: compiled again below
    if suffix == ".cubin":
        data, lowered = nvrtc_cubin(names, target)
    else:
        ptx, lowered = nvrtc_ptx(names, target)
        data = ptx.encode()
    entry_text = json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "lowered": lowered})
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(module_path, data)  # the module first: an entry never names a file not yet there
        atomic_write(entry_path, entry_text)
    except OSError:
        module_path = _temporary_folder() / module_path.name
        module_path.write_bytes(data)
    return module_path, lowered


def _temporary_folder() -> Path:
    """A folder of this process's own, removed when it exits."""
    folder = Path(tempfile.mkdtemp(prefix="pagesim-cuda-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _load_module(path: Path, lowered: dict[str, str]) -> CompiledModule:
    """The module at ``path``, loaded now (CuPy loads on first use)."""
    import cupy

    raw = cupy.RawModule(path=str(path))
    raw.get_function(next(iter(lowered.values())))
    return CompiledModule(raw, lowered)


def compiled_module(inst: Instantiation, target: str) -> CompiledModule:
    with _MODULES_LOCK:
        module = _MODULES.get((inst.module_key, target))
        if module is None:
            path, lowered = cached_module_file(inst, target)
            try:
                module = _load_module(path, lowered)
            except Exception:  # the cached file changed or went since it was checked: compile afresh
                path, lowered = cached_module_file(inst, target, _temporary_folder())
                module = _load_module(path, lowered)
            _MODULES[(inst.module_key, target)] = module
        return module


class CudaBackend(Backend):
    name = "cuda"
    cache_on_host = False

    def __init__(self, device_id: int = 0, variant: str = "auto") -> None:
        import cupy

        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        if variant not in ("auto", "vllm", "v1", "v2"):
            raise ValueError(f"variant must be auto, vllm, v1 or v2; got {variant!r}")
        self.xp = cupy
        self.variant = variant
        self.device_id = device_id
        self._device = cupy.cuda.Device(device_id)
        self.target = device_target(self._device.compute_capability)  # what its modules are compiled for
        props = cupy.cuda.runtime.getDeviceProperties(device_id)
        self._device_name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        self._limits: DeviceLimits | None = None

    def device_limits(self) -> DeviceLimits:
        """The occupancy model's limits, from the device's own attributes."""
        if self._limits is None:
            a = self._device.attributes
            self._limits = DeviceLimits(
                self._device_name,
                sm_count=a["MultiProcessorCount"],
                max_threads_per_sm=a.get("MaxThreadsPerMultiProcessor", 2048),
                max_blocks_per_sm=a.get("MaxBlocksPerMultiprocessor", 32),
                registers_per_sm=a.get("MaxRegistersPerMultiprocessor", 65536),
                shared_per_sm=a.get("MaxSharedMemoryPerMultiprocessor", 228 * 1024),
                reserved_shared_per_block=a.get("ReservedSharedMemoryPerBlock", 1024),
            )
        return self._limits

    def launch_plan(self, key_cache, num_seqs: int, num_heads: int, max_context: int, heads=None) -> LaunchPlan:
        """v1 or v2 from the occupancy model, with the compiled kernels' registers and shared
        memory (of the kernels attending ``heads`` query heads a thread block: by default,
        :func:`heads_per_block`'s choice)."""
        heads = heads_per_block(num_heads, key_cache.shape[2]) if heads is None else heads
        inst, module = self._module_for(key_cache, heads)

        def resources(name: str) -> KernelResources:
            function = module.get_function(inst.names[name])
            return KernelResources(NUM_THREADS, function.num_regs, function.shared_size_bytes)

        return plan_launch(
            num_seqs,
            num_heads,
            max_context,
            resources("v1"),
            resources("v2"),
            self.device_limits(),
            PARTITION_SIZE,
            heads_per_block=heads,
        )

    @property
    def device(self) -> str:
        return f"CUDA · {self._device_name}"

    # -- dtypes: CuPy has no bfloat16, so bf16 caches live as uint16 bit patterns --------
    def array_dtype(self, dtype: np.dtype) -> np.dtype:
        return np.dtype(np.uint16) if is_bfloat16(dtype) else np.dtype(dtype)

    def kv_dtype_name(self, dtype) -> str:
        return "bfloat16" if np.dtype(dtype) == np.uint16 else dtype_name(dtype)

    def allocate_cache(self, num_blocks, block_size, num_kv_heads, head_dim, dtype):
        check_head_dim(head_dim)
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        with self._device:
            zeros = self.xp.zeros(shape, dtype=self.array_dtype(dtype))
            return zeros, zeros.copy()

    def to_device(self, array):
        if isinstance(array, self.xp.ndarray):  # already on the device
            with self._device:
                return self.xp.ascontiguousarray(array)
        host = np.ascontiguousarray(array)
        if is_bfloat16(host.dtype):
            host = host.view(np.uint16)
        with self._device:
            return self.xp.asarray(host)

    def to_numpy(self, array) -> np.ndarray:
        if isinstance(array, np.ndarray):
            return array
        host = self.xp.asnumpy(array)
        return host.view(bfloat16()) if host.dtype == np.uint16 else host

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()

    def memory_available(self) -> int | None:
        with self._device:
            free, _ = self.xp.cuda.runtime.memGetInfo()
        return int(free)

    def _module_for(self, cache, heads: int = 1) -> tuple[Instantiation, Any]:
        _, block_size, _, head_dim = cache.shape
        inst = instantiation_for(self.kv_dtype_name(cache.dtype), head_dim, block_size, heads)
        return inst, self.compile_module(inst)

    def compile_module(self, inst: Instantiation):
        """The module holding ``inst``'s kernels (NVRTC, cached per machine and per process)."""
        return compiled_module(inst, self.target)

    # -- cache writes ------------------------------------------------------------------
    def _check_cache_pair(self, key_cache, value_cache) -> None:
        if key_cache.ndim != 4 or value_cache.shape != key_cache.shape or value_cache.dtype != key_cache.dtype:
            raise KernelInputError(
                "key_cache and value_cache must both be (num_blocks, block_size, num_kv_heads, head_dim) in one "
                f"dtype; got {tuple(key_cache.shape)} {key_cache.dtype} and {tuple(value_cache.shape)} "
                f"{value_cache.dtype}"
            )

    def write_kv(self, key_cache, value_cache, slot_mapping, keys, values) -> None:
        slots = self._checked_slots(key_cache, value_cache, slot_mapping)
        if slots.size:
            with self._device:
                self._launch_write(key_cache, value_cache, self.xp.asarray(slots), keys, values)

    def _checked_slots(self, key_cache, value_cache, slot_mapping) -> np.ndarray:
        """The slots as a host int64 array, each in the pool (or -1: a token skipped)."""
        self._check_cache_pair(key_cache, value_cache)
        slots = np.asarray(slot_mapping, dtype=np.int64)
        num_slots = key_cache.shape[0] * key_cache.shape[1]
        if slots.size and (slots.max() >= num_slots or slots.min() < -1):
            bad = int(slots.max()) if slots.max() >= num_slots else int(slots.min())
            raise KernelInputError(f"slot {bad} is out of range for a pool of {num_slots} slots (-1 skips a token)")
        return slots

    def _launch_write(self, key_cache, value_cache, device_slots, keys, values) -> None:
        """``reshape_and_cache`` on checked slots already on the device."""
        inst, module = self._module_for(key_cache)
        token_size = key_cache.shape[2] * key_cache.shape[3]
        k, v = self.to_device(keys), self.to_device(values)
        for name, array in (("keys", k), ("values", v)):
            if array.shape != (device_slots.size, *key_cache.shape[2:]) or array.dtype != key_cache.dtype:
                raise KernelInputError(
                    f"{name} must be ({device_slots.size}, {key_cache.shape[2]}, {key_cache.shape[3]}) in the cache "
                    f"dtype {key_cache.dtype}; got {tuple(array.shape)} {array.dtype}"
                )
        module.get_function(inst.names["write"])(
            (device_slots.size,),
            (min(token_size, 256),),
            (k, v, key_cache, value_cache, device_slots, np.int32(token_size)),
        )

    def copy_blocks(self, key_cache, value_cache, block_mapping) -> None:
        self._check_cache_pair(key_cache, value_cache)
        mapping = np.asarray(block_mapping, dtype=np.int64).reshape(-1, 2)
        if mapping.size == 0:
            return
        if mapping.min() < 0 or mapping.max() >= key_cache.shape[0]:
            raise KernelInputError(f"block mapping {mapping.tolist()} is out of range for {key_cache.shape[0]} blocks")
        inst, module = self._module_for(key_cache)
        block_elems = key_cache.shape[1] * key_cache.shape[2] * key_cache.shape[3]
        kernel = module.get_function(inst.names["copy"])
        with self._device:
            kernel(
                (mapping.shape[0],),
                (256,),
                (key_cache, value_cache, self.xp.asarray(mapping.reshape(-1)), np.int64(block_elems)),
            )

    # -- attention ---------------------------------------------------------------------
    def _paged_attention(self, query, key_cache, value_cache, block_tables, context_lens, scale):
        return self.to_numpy(
            self.paged_attention_device(query, key_cache, value_cache, block_tables, context_lens, scale)
        )

    def device_pointer(self, array) -> int:
        return int(array.data.ptr)

    def paged_attention_device(self, query, key_cache, value_cache, block_tables, context_lens, scale, variant=None):
        """Validate on the host (as :meth:`paged_attention` does, plus what only the device
        launch needs), upload the tables and launch. Returns the (num_seqs, num_heads,
        head_dim) float32 output on the device."""
        query = query if not isinstance(query, np.ndarray) else self.to_device(query)
        tables, lens = self._checked_decode_inputs(query, key_cache, value_cache, block_tables, context_lens)
        max_context = int(lens.max()) if lens.size else 0
        with self._device:
            tables, lens = self.xp.asarray(tables), self.xp.asarray(lens)
            return self.launch_paged_attention(query, key_cache, value_cache, tables, lens, max_context, scale, variant)

    def _checked_decode_inputs(self, query, key_cache, value_cache, block_tables, context_lens):
        """The tables and lengths as host int32 arrays, checked against the query and the cache."""
        tables = int32_indices(block_tables, "block_tables")
        lens = int32_indices(context_lens, "context_lens")
        validate_kernel_inputs(query, key_cache, value_cache, tables, lens, self.kv_dtype_name)
        num_seqs, num_heads, _ = query.shape
        if num_heads < 1:
            raise KernelInputError("query must have at least one head")
        if num_seqs > MAX_GRID_Y:
            raise KernelInputError(
                f"{num_seqs} sequences in one launch; the grid's y dimension holds at most {MAX_GRID_Y}"
            )
        self._check_alignment(query, key_cache, value_cache)
        return tables, lens

    # -- a model's forward: its tables uploaded once, for every layer -----------------------------
    # The first layer checks the forward's slots and tables on the host and uploads them; every
    # layer, the first included, launches on those uploads (a synchronous host-to-device copy a
    # layer drained the device's queue). A later layer's cache and query must have the first's
    # shapes and dtype: what was checked once holds for it.
    def write_kv_for(self, key_cache, value_cache, inputs: ForwardInputs, keys, values) -> None:
        """:meth:`write_kv` of one layer of a model's forward."""
        uploaded = inputs.uploads
        if "slots" not in uploaded:
            slots = self._checked_slots(key_cache, value_cache, inputs.slots)
            with self._device:
                uploaded["slots"] = self.xp.asarray(slots)
            uploaded["write_cache"] = (tuple(key_cache.shape), key_cache.dtype)
        elif uploaded["write_cache"] != (tuple(key_cache.shape), key_cache.dtype):
            raise KernelInputError("every layer of a forward must have the first layer's cache shape and dtype")
        else:
            self._check_cache_pair(key_cache, value_cache)
        if uploaded["slots"].size:
            with self._device:
                self._launch_write(key_cache, value_cache, uploaded["slots"], keys, values)

    def attention_device_for(self, query, key_cache, value_cache, inputs: ForwardInputs, scale):
        """A forward's layer of attention on the device (decode, or prefill where ``inputs``
        has query starts); returns its float32 output there."""
        uploaded, xp = inputs.uploads, self.xp
        shapes = (tuple(query.shape), tuple(key_cache.shape), key_cache.dtype)
        if "tables" not in uploaded:
            if inputs.query_starts is None:
                tables, lens = self._checked_decode_inputs(
                    query, key_cache, value_cache, inputs.tables, inputs.context_lens
                )
            else:
                _, tables, lens = self._checked_prefill_inputs(
                    query, key_cache, value_cache, inputs.query_starts, inputs.tables, inputs.context_lens
                )
            with self._device:
                uploaded["tables"], uploaded["lens"] = xp.asarray(tables), xp.asarray(lens)
            uploaded["shapes"] = shapes
            uploaded["max_context"] = int(lens.max()) if lens.size else 0
        elif uploaded["shapes"] != shapes:
            raise KernelInputError("every layer of a forward must have the first layer's query and cache shapes")
        else:
            self._check_cache_pair(key_cache, value_cache)
            self._check_alignment(query, key_cache, value_cache)
        if inputs.query_starts is not None:
            return self.launch_paged_prefill(
                query, key_cache, value_cache, inputs.query_starts, uploaded["tables"], uploaded["lens"], scale,
                uploaded,
            )  # fmt: skip
        if "variant" not in uploaded:
            num_seqs, num_heads, _ = query.shape
            heads = heads_per_block(num_heads, key_cache.shape[2])
            uploaded["variant"] = self.variant_for(key_cache, num_seqs, num_heads, uploaded["max_context"], heads)
        with self._device:
            return self.launch_paged_attention(
                query, key_cache, value_cache, uploaded["tables"], uploaded["lens"], uploaded["max_context"], scale,
                uploaded["variant"],
            )  # fmt: skip

    def _check_alignment(self, query, key_cache, value_cache) -> None:
        for name, array in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
            if self.device_pointer(array) % 16:
                raise KernelInputError(f"{name} must start on a 16-byte boundary (the kernels load 16 bytes at once)")

    def _paged_prefill(self, query, key_cache, value_cache, query_starts, block_tables, context_lens, scale):
        return self.to_numpy(
            self.paged_prefill_device(query, key_cache, value_cache, query_starts, block_tables, context_lens, scale)
        )

    def paged_prefill_device(self, query, key_cache, value_cache, query_starts, block_tables, context_lens, scale):
        """Validate on the host (as :meth:`paged_prefill` does, plus what only the device launch
        needs), upload the tables and launch. Returns the (total_query_tokens, num_heads,
        head_dim) float32 output on the device."""
        query = query if not isinstance(query, np.ndarray) else self.to_device(query)
        starts, tables, lens = self._checked_prefill_inputs(
            query, key_cache, value_cache, query_starts, block_tables, context_lens
        )
        return self.launch_paged_prefill(query, key_cache, value_cache, starts, tables, lens, scale)

    def _checked_prefill_inputs(self, query, key_cache, value_cache, query_starts, block_tables, context_lens):
        """The query starts, tables and lengths as host int32 arrays, checked against the query and the cache."""
        starts = int32_indices(query_starts, "query_starts")
        tables = int32_indices(block_tables, "block_tables")
        lens = int32_indices(context_lens, "context_lens")
        validate_prefill_inputs(query, key_cache, value_cache, starts, tables, lens, self.kv_dtype_name)
        num_heads = query.shape[1]
        if num_heads < 1:
            raise KernelInputError("query must have at least one head")
        heads = heads_per_block(num_heads, key_cache.shape[2])
        if num_heads // heads > MAX_GRID_Y:
            raise KernelInputError(f"{num_heads} query heads: the grid's y dimension holds at most {MAX_GRID_Y} blocks")
        self._check_alignment(query, key_cache, value_cache)
        return starts, tables, lens

    def launch_paged_prefill(
        self, query, key_cache, value_cache, query_starts, block_tables, context_lens, scale, uploads=None
    ):
        """The prefill launch on validated inputs: ``query_starts`` on the host (the tiles are
        cut there), the tables on the host or the device. ``uploads``: a forward's, where the
        starts and tiles of its first layer are kept for the others."""
        xp = self.xp
        total, num_heads, head_dim = query.shape
        _, block_size, num_kv_heads, _ = key_cache.shape
        heads = heads_per_block(num_heads, num_kv_heads)
        inst, module = self._module_for(key_cache, heads)
        uploads = {} if uploads is None else uploads
        with self._device:
            if "tiles" not in uploads:
                tile_seqs, tile_rows = query_tiles(query_starts, prefill_query_tile(head_dim, heads))
                starts = xp.asarray(np.ascontiguousarray(query_starts, dtype=np.int32))
                uploads["tiles"] = (tile_seqs.size, starts, xp.asarray(tile_seqs), xp.asarray(tile_rows))
            num_tiles, starts, tile_seqs, tile_rows = uploads["tiles"]
            if num_tiles == 0:
                return xp.zeros((total, num_heads, head_dim), dtype=xp.float32)  # no zero-sized grid
            out = xp.empty((total, num_heads, head_dim), dtype=xp.float32)
            module.get_function(inst.names["prefill"])(
                (num_tiles, num_heads // heads),
                (NUM_THREADS,),
                (
                    out,
                    xp.ascontiguousarray(query),
                    key_cache,
                    value_cache,
                    starts,
                    tile_seqs,
                    tile_rows,
                    xp.asarray(block_tables),
                    xp.asarray(context_lens),
                    np.float32(scale),
                    np.int32(num_heads),
                    np.int32(num_kv_heads),
                    np.int32(block_size),
                    np.int32(block_tables.shape[1]),
                ),
            )
            return out

    def variant_for(self, key_cache, num_seqs: int, num_heads: int, max_context: int, heads: int) -> str:
        """v1 or v2 for a launch: the backend's fixed choice, vLLM's rule, or the occupancy model's."""
        if self.variant in ("v1", "v2"):
            return self.variant
        if self.variant == "vllm":
            return choose_variant(max_context, num_seqs, num_heads)
        return self.launch_plan(key_cache, num_seqs, num_heads, max_context, heads).variant

    def launch_paged_attention(
        self, query, key_cache, value_cache, tables, lens, max_context: int, scale: float, variant=None, heads=None
    ):
        """The launch alone, on validated device arrays (the benchmark times this). ``heads``:
        query heads a thread block attends (default: :func:`heads_per_block`'s choice)."""
        xp = self.xp
        num_seqs, num_heads, head_dim = query.shape
        _, block_size, num_kv_heads, _ = key_cache.shape
        if heads is None:
            heads = heads_per_block(num_heads, num_kv_heads)
        elif heads not in HEADS_PER_BLOCK or (num_heads // num_kv_heads) % heads:
            raise KernelInputError(
                f"a thread block attends 1, 2 or 4 heads of one KV group of {num_heads // num_kv_heads}; got {heads}"
            )
        inst, module = self._module_for(key_cache, heads)
        if variant is None:
            variant = self.variant_for(key_cache, num_seqs, num_heads, max_context, heads)
        with self._device:
            q = xp.ascontiguousarray(query)
            if num_seqs == 0 or max_context == 0:
                return xp.zeros((num_seqs, num_heads, head_dim), dtype=xp.float32)  # no zero-sized grid
            out = xp.empty((num_seqs, num_heads, head_dim), dtype=xp.float32)
            common = (np.float32(scale), np.int32(num_heads), np.int32(num_kv_heads), np.int32(block_size))
            max_blocks = np.int32(tables.shape[1])
            if variant == "v1":
                module.get_function(inst.names["v1"])(
                    (num_heads // heads, num_seqs),
                    (NUM_THREADS,),
                    (out, q, key_cache, value_cache, tables, lens, *common, max_blocks),
                )
                return out
            partitions = math.ceil(max_context / PARTITION_SIZE)
            partial = xp.empty((num_seqs, num_heads, partitions, head_dim), dtype=xp.float32)
            maxes = xp.empty((num_seqs, num_heads, partitions), dtype=xp.float32)
            sums = xp.empty_like(maxes)
            module.get_function(inst.names["v2"])(
                (num_heads // heads, num_seqs, partitions),
                (NUM_THREADS,),
                (
                    partial,
                    maxes,
                    sums,
                    q,
                    key_cache,
                    value_cache,
                    tables,
                    lens,
                    *common,
                    max_blocks,
                    np.int32(partitions),
                ),
            )
            module.get_function(inst.names["reduce"])(
                (num_heads, num_seqs),
                (NUM_THREADS,),
                (out, partial, maxes, sums, lens, np.int32(num_heads), np.int32(partitions)),
            )
            return out
