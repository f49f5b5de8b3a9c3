"""Serving time on real sizes: a model's shape and a GPU turn each replayed iteration into
simulated seconds with a roofline model, give blocks their real bytes, and yield each
request's queue time, time to first token and time per output token.

The model (stated in README.md, "Serving time"):

- An iteration reads every weight once (all layers and the LM head) and the K/V of every
  context it attends to (once per sequence, as a paged kernel does), writes the K/V of the
  tokens it computes, and does 2 FLOPs per weight per computed token (the LM head only
  for one token per sequence: the one that samples) plus 4 · heads · head_dim FLOPs per
  layer per (query, key) pair of causal attention.
- Its time is max(bytes / HBM bandwidth, FLOPs / peak dense BF16 FLOP/s): the roofline,
  perfect overlap, no kernel-launch or scheduling overhead, one GPU, no tensor parallelism.
- Each block the kernel reads costs :data:`BLOCK_OVERHEAD_TOKENS` tokens' worth of K/V
  bytes more (per layer): a stand-in for the vLLM paper's observation (§7.2, Fig. 18b) that
  small blocks underuse the GPU's parallelism when reading the KV cache. An assumption, not
  a measurement; 0 turns it off.
- A swap moves whole blocks over PCIe at the GPU's host link bandwidth (one direction).
- The pool is what vLLM gives the KV cache: ``gpu_memory_utilization`` (0.9, vLLM's
  default) of the GPU's memory less the weights (activations not subtracted).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from pagesim.core.errors import InvalidStudyError
from pagesim.core.studies.replay import ReplayResult, Work

GIB = 2**30
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of GPU memory for weights + KV cache
BLOCK_OVERHEAD_TOKENS = 2  # each block read costs as much as this many more tokens' K/V (assumed)


MAX_SHAPE_DIM = 1 << 20  # past any published model's layers, widths and vocabulary


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape, as its published config.json gives it."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype_bytes: int = 2  # bf16/fp16 weights and K/V
    mlp_matrices: int = 3  # SwiGLU: gate, up, down (OPT's ReLU MLP: 2)
    tied_embeddings: bool = False
    source: str = ""
    weight_bytes_override: int | None = None  # a quantised file's own tensor bytes

    def __post_init__(self) -> None:
        where = self.source or self.name
        for dim in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab"):
            value = getattr(self, dim)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SHAPE_DIM:
                raise InvalidStudyError(f"{where}: {dim} must be an integer from 1 to {MAX_SHAPE_DIM:,}; got {value!r}")
        if self.heads % self.kv_heads:
            raise InvalidStudyError(
                f"{where}: {self.kv_heads} KV heads do not divide {self.heads} query heads (grouped-query attention "
                "shares each KV head among a whole number of query heads)"
            )

    @property
    def layer_params(self) -> int:
        attention = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        return self.layers * (attention + self.mlp_matrices * self.hidden * self.intermediate)

    @property
    def params(self) -> int:
        return self.layer_params + self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def weight_bytes(self) -> int:
        """The weights held in GPU memory."""
        return self.weight_bytes_override or self.params * self.dtype_bytes

    @property
    def step_weight_bytes(self) -> int:
        """The weights one iteration reads: every layer and the LM head (the embedding table
        is only gathered, a row per token)."""
        scale = self.weight_bytes / (self.params * self.dtype_bytes)
        return round((self.layer_params + self.vocab * self.hidden) * self.dtype_bytes * scale)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int  # what the driver reports as total
    bandwidth: float  # HBM bytes/s
    peak_flops: float  # dense BF16 tensor-core FLOP/s
    pcie_bandwidth: float  # host link bytes/s, one direction
    source: str = ""


# Published shapes: layers, hidden size, attention heads, KV heads, head dim, MLP size, vocabulary.
MODEL_SHAPES = {
    # meta-llama/Meta-Llama-3-8B config.json
    "llama-3-8b": ModelShape(
        "Llama-3-8B", 32, 4096, 32, 8, 128, 14336, 128256, source="meta-llama/Meta-Llama-3-8B config.json"
    ),
    # meta-llama/Meta-Llama-3-70B config.json
    "llama-3-70b": ModelShape(
        "Llama-3-70B", 80, 8192, 64, 8, 128, 28672, 128256, source="meta-llama/Meta-Llama-3-70B config.json"
    ),
    # Qwen/Qwen2.5-7B config.json (QKV biases left out: 0.01 % of the weights)
    "qwen2.5-7b": ModelShape("Qwen2.5-7B", 28, 3584, 28, 4, 128, 18944, 152064, source="Qwen/Qwen2.5-7B config.json"),
    # LLaMA-13B (Touvron et al. 2023, Table 2; meta-llama/Llama-2-13b-hf config.json has the same shape)
    "llama-13b": ModelShape(
        "LLaMA-13B", 40, 5120, 40, 40, 128, 13824, 32000, source="meta-llama/Llama-2-13b-hf config.json"
    ),
    # facebook/opt-13b config.json: ReLU MLP of 4 × hidden, embeddings tied to the LM head
    "opt-13b": ModelShape(
        "OPT-13B",
        40,
        5120,
        40,
        40,
        128,
        20480,
        50272,
        mlp_matrices=2,
        tied_embeddings=True,
        source="facebook/opt-13b config.json",
    ),
}

MIB = 2**20
# Datasheet figures: memory as nvidia-smi reports it, HBM bandwidth, dense BF16 tensor FLOP/s
# (without sparsity), and the PCIe link one way (Gen4 x16: 32 GB/s, Gen5 x16: 64 GB/s).
GPUS = {
    # NVIDIA A100 datasheet (SXM4 40GB): HBM2 1,555 GB/s, BF16 312 TFLOP/s, PCIe Gen4
    "a100-40gb": GpuSpec("A100-40GB", 40960 * MIB, 1555e9, 312e12, 32e9, "NVIDIA A100 Tensor Core GPU datasheet"),
    # NVIDIA A100 datasheet (SXM4 80GB): HBM2e 2,039 GB/s, BF16 312 TFLOP/s, PCIe Gen4
    "a100-80gb": GpuSpec("A100-80GB", 81920 * MIB, 2039e9, 312e12, 32e9, "NVIDIA A100 Tensor Core GPU datasheet"),
    # NVIDIA H100 datasheet (SXM5 80GB): HBM3 3.35 TB/s, BF16 989 TFLOP/s dense, PCIe Gen5
    "h100-sxm": GpuSpec("H100-SXM", 81559 * MIB, 3.35e12, 989e12, 64e9, "NVIDIA H100 Tensor Core GPU datasheet"),
    # NVIDIA H200 datasheet (SXM 141GB): HBM3e 4.8 TB/s, BF16 989 TFLOP/s dense, PCIe Gen5
    "h200": GpuSpec("H200", 143771 * MIB, 4.8e12, 989e12, 64e9, "NVIDIA H200 Tensor Core GPU datasheet"),
}


def _lookup(table: dict, name: str, what: str):
    key = name.strip().lower()
    if key not in table:
        raise InvalidStudyError(f"unknown {what} {name!r}; expected one of {', '.join(table)}")
    return table[key]


def model_shape(name: str) -> ModelShape:
    """A published shape by name, or the shape of a Llama-architecture ``.gguf`` file."""
    if name.lower().endswith(".gguf"):
        return shape_from_gguf(name)
    return _lookup(MODEL_SHAPES, name, "model shape")


def gpu(name: str) -> GpuSpec:
    return _lookup(GPUS, name, "GPU")


def shape_from_gguf(path: str) -> ModelShape:
    """The shape a GGUF file's metadata gives, its weights at the file's own bytes."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(path)
    except Exception as exc:  # a missing, truncated or foreign file
        raise InvalidStudyError(f"{path}: not a readable GGUF file ({exc})") from None

    def value(key: str, default=None):
        f = reader.fields.get(key)
        if f is None:
            if default is None:
                raise InvalidStudyError(f"{path}: the GGUF metadata has no {key}")
            return default
        return f.contents()

    arch = value("general.architecture")
    try:
        heads = int(value(f"{arch}.attention.head_count"))
        hidden = int(value(f"{arch}.embedding_length"))
    except (TypeError, ValueError) as exc:  # (a list where a number belongs)
        raise InvalidStudyError(f"{path}: a {arch} model whose GGUF metadata is not a shape ({exc})") from None
    if heads < 1:
        raise InvalidStudyError(f"{path}: {arch}.attention.head_count must be at least 1; got {heads}")
    tensors = {t.name: t for t in reader.tensors}
    names = set(tensors)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        vocab = len(tokens.contents())
    elif "token_embd.weight" in tensors:  # no tokenizer in the file: the embedding's rows
        vocab = int(max(tensors["token_embd.weight"].shape))
    else:
        raise InvalidStudyError(
            f"{path}: a {arch} model with neither a tokenizer nor a token embedding: its vocabulary is unknown"
        )
    return ModelShape(
        Path(path).stem,
        layers=int(value(f"{arch}.block_count")),
        hidden=hidden,
        heads=heads,
        kv_heads=int(value(f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(value(f"{arch}.attention.key_length", hidden // heads)),
        intermediate=int(value(f"{arch}.feed_forward_length")),
        vocab=vocab,
        tied_embeddings="output.weight" not in names,
        source=f"{path} (GGUF metadata)",
        weight_bytes_override=sum(int(t.n_bytes) for t in reader.tensors),
    )


def fits_on(shape: ModelShape, spec: GpuSpec, utilization: float = GPU_MEMORY_UTILIZATION) -> bool:
    """``shape``'s weights leave room for a KV cache on one ``spec``."""
    return int(spec.memory_bytes * utilization) > shape.weight_bytes


def pool_bytes(shape: ModelShape, spec: GpuSpec, utilization: float = GPU_MEMORY_UTILIZATION) -> int:
    """GPU memory left for the KV cache after the weights (vLLM's ``gpu_memory_utilization``)."""
    left = int(spec.memory_bytes * utilization) - shape.weight_bytes
    if left <= 0:
        usable = spec.memory_bytes * utilization
        raise InvalidStudyError(
            f"{shape.name}'s weights ({shape.weight_bytes / GIB:.1f} GiB) do not fit in the {usable / GIB:.1f} GiB "
            f"that vLLM uses ({utilization:.0%} of the {spec.name}'s {spec.memory_bytes / GIB:.1f} GiB): nothing is "
            "left for the KV cache (the studies model one GPU, without tensor parallelism)"
        )
    return left


def require_pool_fits(
    num_blocks: int, block_size: int, shape: ModelShape, spec: GpuSpec, what: str = "", hint: str = ""
) -> None:
    """Refuse (:class:`InvalidStudyError`) a pool of ``num_blocks`` blocks of ``block_size``
    tokens that does not fit in ``spec``'s memory after ``shape``'s weights, or weights that
    leave no room at all: timings of a pool the GPU cannot hold would mean nothing. ``what``
    names where the pool came from, ``hint`` what to do."""
    block_bytes = block_size * shape.kv_bytes_per_token
    room = pool_bytes(shape, spec)
    need = num_blocks * block_bytes
    if need > room:
        problem = (
            f"{num_blocks} blocks of {block_size} tokens take {need / GIB:.2f} GiB of KV cache; {shape.name} on "
            f"{spec.name} leaves {room / GIB:.2f} GiB after its weights: at most {room // block_bytes} such blocks"
        )
        raise InvalidStudyError((f"{what}: " if what else "") + problem + hint)


def pool_blocks(shape: ModelShape, spec: GpuSpec, block_size: int) -> int:
    """Blocks of ``block_size`` tokens the memory after the weights holds."""
    return pool_bytes(shape, spec) // (block_size * shape.kv_bytes_per_token)


@dataclass(frozen=True)
class StepCost:
    bytes: float
    flops: float
    seconds: float
    bound: str  # "memory" or "compute"


class Roofline:
    """Seconds per iteration for ``shape`` on ``spec`` with blocks of ``block_size`` tokens."""

    def __init__(
        self, shape: ModelShape, spec: GpuSpec, block_size: int, overhead_tokens: float = BLOCK_OVERHEAD_TOKENS
    ) -> None:
        self.shape, self.gpu, self.block_size, self.overhead_tokens = shape, spec, block_size, overhead_tokens

    def cost(self, work: Work) -> StepCost:
        s = self.shape
        swap = work.swapped_blocks * self.block_size * s.kv_bytes_per_token / self.gpu.pcie_bandwidth
        if not work.tokens:
            return StepCost(0.0, 0.0, swap, "memory")
        kv_tokens = work.kv_read + work.tokens + work.blocks_read * self.overhead_tokens
        nbytes = s.step_weight_bytes + kv_tokens * s.kv_bytes_per_token
        flops = (
            2 * s.layer_params * work.tokens
            + 2 * s.hidden * s.vocab * work.seqs
            + 4 * s.layers * s.heads * s.head_dim * work.attended
        )
        memory, compute = nbytes / self.gpu.bandwidth, flops / self.gpu.peak_flops
        return StepCost(nbytes, flops, max(memory, compute) + swap, "memory" if memory >= compute else "compute")

    def __call__(self, work: Work) -> float:
        return self.cost(work).seconds

    def block_bytes(self) -> int:
        return self.block_size * self.shape.kv_bytes_per_token


@dataclass(frozen=True)
class LatencySummary:
    """Per-request figures (means, medians and 99th percentiles, seconds) and the run's throughput."""

    requests: int  # finished ones: what the figures are over
    queue: dict[str, float]
    ttft: dict[str, float]
    tpot: dict[str, float]
    normalized: dict[str, float]  # (finish − arrival) / output tokens: the vLLM paper's s/token
    seconds: float  # the whole run
    output_tokens: int  # of the finished requests (each parallel sample's)
    throughput: float  # those output tokens per second of the run
    discarded_tokens: int = 0  # output tokens of requests that never finished (aborted, or cut off)

    def as_dict(self) -> dict:
        return {
            "requests": self.requests,
            "queue_s": self.queue,
            "ttft_s": self.ttft,
            "tpot_s": self.tpot,
            "normalized_latency_s_per_token": self.normalized,
            "seconds": self.seconds,
            "output_tokens": self.output_tokens,
            "throughput_tokens_per_s": self.throughput,
            "discarded_output_tokens": self.discarded_tokens,
        }


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": math.nan, "p50": math.nan, "p99": math.nan}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return {"mean": statistics.fmean(values), "p50": statistics.median(values), "p99": p99}


def latency(result: ReplayResult) -> LatencySummary:
    """Queue time (arrival to first admission), TTFT (arrival to the end of the iteration that
    produced the first output token), TPOT ((finish − first token) / (outputs − 1)) over the
    finished requests; throughput = the finished requests' output tokens (each parallel
    sample's) / the run's seconds. Tokens of a request that never finished (aborted after it
    ran, or still running when the replay stopped) are counted apart, not as throughput."""
    done = [r for r in result.requests.values() if r.finished is not None and r.first_token is not None]
    queue = [r.admitted - r.arrival for r in done if r.admitted is not None]
    ttft = [r.first_token - r.arrival for r in done]
    tpot = [(r.finished - r.first_token) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    normalized = [(r.finished - r.arrival) / r.output_tokens for r in done if r.output_tokens]
    outputs = sum(r.total_outputs for r in done)
    discarded = sum(r.total_outputs for r in result.requests.values()) - outputs
    seconds = result.clock
    return LatencySummary(
        len(done),
        _stats(queue),
        _stats(ttft),
        _stats(tpot),
        _stats(normalized),
        seconds,
        outputs,
        outputs / seconds if seconds > 0 else math.nan,
        discarded,
    )
