"""What-if replays: the same scenario or workload once per point of a grid of engine
settings, memory management only (``kv_data=False``), side by side with the original.

Knobs (:data:`KNOBS`): ``block_size``, ``num_blocks`` (the pool), ``prefix_caching``,
``preemption``, ``watermark``, ``max_num_seqs``, ``max_num_batched_tokens``, ``scheduler``
(``engine`` is another name for it: v0 or v1) and ``num_cpu_blocks``. A variant that changes
the block size but not the pool keeps the pool's memory: its block count is the original's
token slots over the new size (or, with a model shape and a GPU, what the memory after the
weights holds). A variant that swaps on a scenario without a CPU pool gets one as large as
the GPU pool. A variant the engine refuses (a placement past a smaller pool, v1 with swap),
or whose pool does not fit in the GPU's memory after the weights (with a model shape and a
GPU), is reported as one that cannot run, with the reason; the others still run.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from pagesim.core.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_WATERMARK, CacheConfig
from pagesim.core.errors import InvalidStudyError, PagesimError
from pagesim.core.scenario import Scenario
from pagesim.core.studies.replay import ReplayResult, replay_scenario, replay_workload
from pagesim.core.studies.serving_time import (
    GpuSpec,
    LatencySummary,
    ModelShape,
    Roofline,
    latency,
    pool_blocks,
    require_pool_fits,
)
from pagesim.core.studies.workload import RequestSpec

MAX_VARIANTS = 256
_BOOLS = {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False, "1": True, "0": False}


def _count(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            kind = "a positive integer" if minimum == 1 else f"an integer ≥ {minimum}"
            raise ValueError(f"expected {kind}")
        return value

    return parse


def _bool(text: str) -> bool:
    if text.lower() not in _BOOLS:
        raise ValueError("expected true or false")
    return _BOOLS[text.lower()]


def _choice(*options: str):
    def parse(text: str) -> str:
        if text.lower() not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return text.lower()

    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise ValueError("expected a fraction in [0, 1)")
    return value


# knob -> (CacheConfig field, parser of one value)
KNOBS: dict[str, tuple[str, Callable[[str], object]]] = {
    "block_size": ("block_size", _count(1)),
    "num_blocks": ("num_blocks", _count(1)),
    "prefix_caching": ("prefix_caching", _bool),
    "preemption": ("preemption", _choice("recompute", "swap")),
    "watermark": ("watermark", _fraction),
    "max_num_seqs": ("max_num_seqs", _count(1)),
    "max_num_batched_tokens": ("max_num_batched_tokens", _count(1)),
    "scheduler": ("scheduler", _choice("v0", "v1")),
    "engine": ("scheduler", _choice("v0", "v1")),
    "num_cpu_blocks": ("num_cpu_blocks", _count(0)),
}


def parse_setting(text: str) -> tuple[str, tuple]:
    """``"block_size=8,16,32"`` -> ``("block_size", (8, 16, 32))``; an unknown knob or a bad
    value is an :class:`InvalidStudyError` naming it."""
    name, sep, values = text.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or not name:
        raise InvalidStudyError(f"--set {text!r}: expected KNOB=VALUE[,VALUE…], e.g. block_size=8,16,32")
    if name not in KNOBS:
        raise InvalidStudyError(f"unknown knob {name!r}; the knobs are {', '.join(KNOBS)}")
    parse = KNOBS[name][1]
    parsed = []
    for raw in values.split(","):
        raw = raw.strip()
        try:
            parsed.append(parse(raw))
        except ValueError as exc:
            raise InvalidStudyError(f"{name}: bad value {raw!r} ({exc})") from None
    if len(set(parsed)) != len(parsed):
        raise InvalidStudyError(f"{name}: a value is listed twice ({values})")
    return KNOBS[name][0], tuple(parsed)


def expand(settings: Sequence[tuple[str, tuple]]) -> list[dict[str, object]]:
    """Every combination of the settings' values, in order (the last knob varies fastest)."""
    fields = [f for f, _ in settings]
    if len(set(fields)) != len(fields):
        twice = next(f for f in fields if fields.count(f) > 1)
        raise InvalidStudyError(f"{twice} is set twice: give all its values in one --set")
    count = 1
    for _, values in settings:
        count *= len(values)
    if count > MAX_VARIANTS:
        raise InvalidStudyError(f"the grid has {count} variants; at most {MAX_VARIANTS}")
    return [dict(zip(fields, combo, strict=True)) for combo in itertools.product(*(v for _, v in settings))]


def label(changes: dict[str, object]) -> str:
    if not changes:
        return "original"
    return " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in changes.items())


@dataclass(frozen=True)
class Hardware:
    """A model shape on a GPU: iterations take roofline time, and (for a workload) the pool
    is the memory after the weights."""

    shape: ModelShape
    gpu: GpuSpec

    def roofline(self, block_size: int) -> Roofline:
        return Roofline(self.shape, self.gpu, block_size)


@dataclass(frozen=True)
class Source:
    """What a sweep replays: a scenario, or a workload of timed requests on ``config``."""

    name: str
    config: CacheConfig
    scenario: Scenario | None = None
    workload: tuple[RequestSpec, ...] = ()
    pool_from_hardware: bool = False  # a workload whose pool the preset sized


@dataclass
class VariantResult:
    label: str
    changes: dict[str, object]
    status: str  # "ok", "rejected" (some requests), "stalled", "unfinished" or "cannot run"
    reason: str = ""
    config: CacheConfig | None = None
    steps: int = 0
    peak_blocks: int = 0
    mean_blocks: float = 0.0
    used_blocks: list[int] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    preemptions: int = 0
    recomputed_tokens: int = 0
    swapped_blocks: int = 0
    prefix_hit_rate: float = 0.0
    finished: int = 0
    rejected: int = 0  # refused, as submitted or after running (``aborted`` of them)
    aborted: int = 0  # v0: admitted, then refused as it outgrew the pool (its tokens thrown away)
    latency: LatencySummary | None = None
    pool_gib: float | None = None
    wall_seconds: float = 0.0

    @property
    def ran(self) -> bool:
        return self.status != "cannot run"

    def row(self) -> dict[str, object]:
        """One flat row (CSV)."""
        c = self.config
        out: dict[str, object] = {
            "variant": self.label,
            "status": self.status,
            "reason": self.reason,
            "block_size": c.block_size if c else "",
            "num_blocks": c.num_blocks if c else "",
            "scheduler": c.scheduler if c else "",
            "steps": self.steps,
            "peak_blocks": self.peak_blocks,
            "mean_blocks": round(self.mean_blocks, 3),
            "preemptions": self.preemptions,
            "recomputed_tokens": self.recomputed_tokens,
            "swapped_blocks": self.swapped_blocks,
            "prefix_hit_rate": round(self.prefix_hit_rate, 6),
            "finished": self.finished,
            "rejected": self.rejected,
            "aborted": self.aborted,
        }
        if self.latency is not None:
            lat = self.latency
            out |= {
                "pool_gib": round(self.pool_gib or 0.0, 3),
                "queue_mean_s": lat.queue["mean"],
                "ttft_mean_s": lat.ttft["mean"],
                "ttft_p99_s": lat.ttft["p99"],
                "tpot_mean_s": lat.tpot["mean"],
                "tpot_p99_s": lat.tpot["p99"],
                "normalized_latency_s_per_token": lat.normalized["mean"],
                "throughput_tokens_per_s": lat.throughput,
                "discarded_output_tokens": lat.discarded_tokens,
                "seconds": lat.seconds,
            }
        return out

    def as_dict(self) -> dict:
        out = self.row() | {"changes": self.changes, "used_blocks": self.used_blocks}
        if self.latency is not None:
            out["latency"] = self.latency.as_dict()
            out["iteration_ends_s"] = self.ends
        return out


def refusals(records: list) -> str:
    """The refused requests in words: those rejected as submitted, then those aborted after
    they ran, each with its reason where they share one."""

    def why(group: list) -> str:
        reasons = {r.rejection for r in group}
        return reasons.pop() if len(reasons) == 1 and None not in reasons else ""

    said = []
    at_submit = [r for r in records if r.rejected and not r.aborted]
    after = [r for r in records if r.aborted]
    if at_submit:
        said.append(f"{len(at_submit)} of {len(records)} requests rejected: {why(at_submit) or 'they can never fit'}")
    if after:
        reason = why(after)
        said.append(f"{len(after)} aborted after running" + (f": {reason}" if reason else ""))
    return "; ".join(said)


def variant_config(source: Source, changes: dict[str, object], hardware: Hardware | None) -> CacheConfig:
    """The source's configuration with ``changes``; a ValueError says why it cannot be."""
    base = source.config
    fields = dict(changes)
    block_size = fields.get("block_size", base.block_size)
    if "num_blocks" not in fields and block_size != base.block_size:
        if source.pool_from_hardware and hardware is not None:
            fields["num_blocks"] = pool_blocks(hardware.shape, hardware.gpu, block_size)
        else:  # the same memory in blocks of another size
            if block_size > base.num_slots:  # (one such block would hold more than the whole pool)
                raise ValueError(
                    f"blocks of {block_size} tokens are larger than the whole pool ({base.num_slots} token slots); "
                    f"give num_blocks too to change the pool"
                )
            fields["num_blocks"] = base.num_slots // block_size
    if fields.get("scheduler") == "v0" and base.scheduler == "v1":  # v1's budget does not carry over to v0
        fields.setdefault("max_num_batched_tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS)
    if fields.get("scheduler") == "v1" and base.scheduler == "v0":
        # v0's own settings do not carry over to v1 (which refuses them) unless the variant sets them
        fields.setdefault("watermark", DEFAULT_WATERMARK)
        if fields.get("preemption", base.preemption) == "recompute":
            fields.setdefault("num_cpu_blocks", 0)
    if (
        fields.get("preemption", base.preemption) == "swap"
        and "num_cpu_blocks" not in changes  # (one the variant sets is its own, 0 too: refused)
        and not base.num_cpu_blocks
    ):
        fields["num_cpu_blocks"] = fields.get("num_blocks", base.num_blocks)
    if base.max_model_len == min(2048, base.num_slots):  # the default: follow the new pool
        fields.setdefault("max_model_len", None)
    config = replace(base, **fields)
    if hardware is not None:
        require_pool_fits(config.num_blocks, config.block_size, hardware.shape, hardware.gpu)
    return config


def _replay(source: Source, config: CacheConfig, hardware: Hardware | None) -> ReplayResult:
    if hardware is not None:
        seconds = hardware.roofline(config.block_size)
        if source.scenario is not None:
            return replay_scenario(source.scenario, config, seconds)
        return replay_workload(config, source.workload, seconds)
    if source.scenario is not None:
        return replay_scenario(source.scenario, config)
    return replay_workload(config, source.workload)


def run_variant(source: Source, changes: dict[str, object], hardware: Hardware | None = None) -> VariantResult:
    out = VariantResult(label(changes), dict(changes), "ok")
    began = time.perf_counter()
    try:
        config = out.config = variant_config(source, changes, hardware)
        result = _replay(source, config, hardware)
    except (PagesimError, ValueError) as exc:
        out.status, out.reason = "cannot run", str(exc)
        out.wall_seconds = time.perf_counter() - began
        return out
    out.wall_seconds = time.perf_counter() - began
    out.steps = result.iterations
    out.used_blocks = result.used_blocks
    out.ends = result.ends
    out.peak_blocks = max(result.used_blocks, default=0)
    out.mean_blocks = sum(result.used_blocks) / len(result.used_blocks) if result.used_blocks else 0.0
    out.preemptions, out.recomputed_tokens = result.preemptions, result.recomputed_tokens
    out.swapped_blocks, out.prefix_hit_rate = result.swapped_blocks, result.prefix_hit_rate
    records = result.requests.values()
    out.finished = sum(1 for r in records if r.finished is not None)
    out.rejected = sum(1 for r in records if r.rejected)
    out.aborted = sum(1 for r in records if r.aborted)
    if result.stalled:
        out.status, out.reason = "stalled", result.stalled
    elif result.unfinished:
        arrivals = f", {result.never_submitted} of them not yet arrived" if result.never_submitted else ""
        out.status, out.reason = (
            "unfinished",
            f"{result.unfinished} requests not done after {result.iterations} steps{arrivals}",
        )
    elif out.rejected:  # (what ran is right, but not all of the workload ran)
        out.status, out.reason = "rejected", refusals(list(records))
    if hardware is not None:
        out.latency = latency(result)
        out.pool_gib = config.num_blocks * hardware.roofline(config.block_size).block_bytes() / 2**30
    return out


@dataclass
class SweepResult:
    source: str
    hardware: Hardware | None
    settings: list[tuple[str, tuple]]
    variants: list[VariantResult]  # the original first

    @property
    def original(self) -> VariantResult:
        return self.variants[0]


def sweep(
    source: Source,
    settings: Sequence[tuple[str, tuple]],
    hardware: Hardware | None = None,
    progress: Callable[[int, int, VariantResult], None] | None = None,
) -> SweepResult:
    """The original and every point of the grid, each replayed; ``progress(i, n, result)``
    after each. With ``hardware``, an original whose pool the GPU cannot hold (or whose
    weights leave no room) is refused before anything runs: an InvalidStudyError."""
    if hardware is not None:
        config = source.config
        require_pool_fits(config.num_blocks, config.block_size, hardware.shape, hardware.gpu, f"{source.name}'s pool")
    grid = [{}] + [c for c in expand(settings) if c]
    variants = []
    for index, changes in enumerate(grid, start=1):
        result = run_variant(source, changes, hardware)
        variants.append(result)
        if progress is not None:
            progress(index, len(grid), result)
    return SweepResult(source.name, hardware, list(settings), variants)
