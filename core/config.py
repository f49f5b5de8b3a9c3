"""The shape of the simulated KV cache and model."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pagesim.core.checks import is_count
from pagesim.kernels.backend import MAX_HEAD_DIM
from pagesim.kernels.dtypes import STORAGE_DTYPES, storage_dtype, tolerance

DEFAULT_MAX_MODEL_LEN = 2048
# Longer than any model's context window (the longest are ~10M tokens); past it a value is
# a typo, and positions stop fitting the kernel's 32-bit context lengths soon after.
# A step's requests or tokens: past any engine's (vLLM keeps them in 32-bit ints), and within
# what Python's slices and islice take (2^63 and over was a leaked islice error in a sweep).
MAX_BATCH_COUNT = 2**31 - 1
MAX_MODEL_LEN_LIMIT = 2**24


DEFAULT_WATERMARK = 0.01  # v0's free blocks kept back at admission, as a fraction of the pool
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # v1's token budget a step

# Settings of one engine that the other has no use for: a scenario that names one under the
# other engine is refused, whatever its value (its default too would suggest it did something).
ENGINE_FIELDS = {
    "num_cpu_blocks": ("v0", 'v0\'s swap space: scheduler = "v1" has no CPU pool (vLLM v1 has no swap)'),
    "watermark": ("v0", 'v0\'s admission rule: scheduler = "v1" admits without one, as vLLM v1 does'),
    "max_num_batched_tokens": (
        "v1",
        'v1\'s token budget: scheduler = "v0" prefills whole prompts without one (set scheduler = "v1" to use it)',
    ),
}


def other_engines_field(field: str, scheduler: str) -> str | None:
    """Why ``field`` has no place under ``scheduler``, or None when it has."""
    engine, why = ENGINE_FIELDS.get(field, (scheduler, ""))
    return None if engine == scheduler else f"{field} is {why}"


@dataclass(frozen=True)
class CacheConfig:
    num_blocks: int
    block_size: int
    num_heads: int
    head_dim: int
    num_kv_heads: int | None = None  # None: same as num_heads (multi-head attention)
    dtype: str = "float32"
    seed: int = 0
    # The length a contiguous allocator would reserve per sequence (Orca-Max style);
    # None: 2048 tokens, capped at what the whole pool holds.
    max_model_len: int | None = None
    # Reuse full blocks of identical prefixes (vLLM's automatic prefix caching).
    prefix_caching: bool = False
    # The scheduler (submit/schedule operations): preemption mode, CPU pool for swapping,
    # the free-block watermark kept for decoding, the running batch limit, and the
    # host<->device bandwidth that prices a swap in simulated time.
    preemption: str = "recompute"
    num_cpu_blocks: int = 0
    watermark: float = DEFAULT_WATERMARK
    max_num_seqs: int = 256
    swap_bandwidth_gbs: float = 25.0
    # Which scheduler runs submit/schedule: "v0" (whole prompts, vLLM v0) or "v1" (one token
    # budget a step, chunked prefill, vLLM v1); max_num_batched_tokens is v1's budget.
    scheduler: str = "v0"
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    # The model the runner runs: "synthetic" (the seeded token model), "smollm2-135m" (the
    # bundled SmolLM2-135M-Instruct) or a path to a Llama-architecture .gguf file. A real
    # model sets the heads and head dim (core.models.catalog.config_for_model fills them in).
    model: str = "synthetic"

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size", "num_heads", "num_kv_heads", "head_dim", "max_model_len"):
            value = getattr(self, name)
            if not is_count(value) and not (value is None and name in ("num_kv_heads", "max_model_len")):
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.max_model_len is None:
            object.__setattr__(self, "max_model_len", min(DEFAULT_MAX_MODEL_LEN, self.num_blocks * self.block_size))
        if self.max_model_len > MAX_MODEL_LEN_LIMIT:
            raise ValueError(
                f"max_model_len must be ≤ {MAX_MODEL_LEN_LIMIT} (2^24 tokens, past any model's context window); "
                f"got {self.max_model_len}"
            )
        if self.head_dim > MAX_HEAD_DIM:
            raise ValueError(f"head_dim must be ≤ {MAX_HEAD_DIM}; got {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})")
        if self.dtype not in STORAGE_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(STORAGE_DTYPES)}; got {self.dtype!r}")
        if not is_count(self.seed, 0):
            raise ValueError(f"seed must be a non-negative integer; got {self.seed!r}")
        if self.preemption not in ("recompute", "swap"):
            raise ValueError(f"preemption must be recompute or swap; got {self.preemption!r}")
        if not is_count(self.num_cpu_blocks, 0):
            raise ValueError(f"num_cpu_blocks must be a non-negative integer; got {self.num_cpu_blocks!r}")
        if (
            isinstance(self.watermark, bool)
            or not isinstance(self.watermark, int | float)
            or not 0 <= self.watermark < 1
        ):
            raise ValueError(f"watermark must be a fraction in [0, 1); got {self.watermark!r}")
        if not is_count(self.max_num_seqs) or self.max_num_seqs > MAX_BATCH_COUNT:
            raise ValueError(
                f"max_num_seqs must be an integer from 1 to {MAX_BATCH_COUNT:,}; got {self.max_num_seqs!r}"
            )
        bandwidth = self.swap_bandwidth_gbs
        if isinstance(bandwidth, bool) or not isinstance(bandwidth, int | float) or not 0 < bandwidth < math.inf:
            raise ValueError(f"swap_bandwidth_gbs must be a positive, finite number; got {bandwidth!r}")
        if self.preemption == "swap" and self.num_cpu_blocks < 1:
            raise ValueError("preemption = 'swap' needs num_cpu_blocks ≥ 1 (the CPU pool swapped blocks wait in)")
        if self.scheduler not in ("v0", "v1"):
            raise ValueError(f'scheduler must be "v0" or "v1"; got {self.scheduler!r}')
        if self.scheduler == "v1" and self.preemption != "recompute":
            raise ValueError('scheduler = "v1" preempts by recompute only (vLLM v1 has no swap)')
        if self.scheduler == "v1" and self.num_cpu_blocks:  # (accepted, it would change nothing)
            raise ValueError(other_engines_field("num_cpu_blocks", "v1"))
        if self.scheduler == "v1" and self.watermark != DEFAULT_WATERMARK:
            raise ValueError(other_engines_field("watermark", "v1"))
        if not is_count(self.max_num_batched_tokens) or self.max_num_batched_tokens > MAX_BATCH_COUNT:
            raise ValueError(
                f"max_num_batched_tokens must be an integer from 1 to {MAX_BATCH_COUNT:,}; "
                f"got {self.max_num_batched_tokens!r}"
            )
        if self.scheduler == "v0" and self.max_num_batched_tokens != DEFAULT_MAX_NUM_BATCHED_TOKENS:
            raise ValueError(other_engines_field("max_num_batched_tokens", "v0"))
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f'model must be "synthetic", "smollm2-135m" or a path to a .gguf file; got {self.model!r}')
        if not isinstance(self.prefix_caching, bool):
            raise ValueError(f"prefix_caching must be true or false; got {self.prefix_caching!r}")

    @property
    def tolerance(self) -> float:
        return tolerance(self.dtype)

    @property
    def block_bytes(self) -> int:
        """Bytes of K and V one block holds."""
        return 2 * self.block_size * self.num_kv_heads * self.head_dim * storage_dtype(self.dtype).itemsize

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)
