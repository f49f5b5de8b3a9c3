"""Serving time of one scenario, request by request, on a model shape and a GPU: what the
app's Latency panel shows. The scenario replays to its end on its own pool (every request
finished, rejected or stalled), iterations timed by the roofline of :mod:`serving_time`; a
real model's scenario on the synthetic model (:mod:`stand_in`), which the result notes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pagesim.core.config import CacheConfig
from pagesim.core.scenario import Scenario
from pagesim.core.studies.replay import ReplayResult, replay_scenario
from pagesim.core.studies.serving_time import (
    GIB,
    LatencySummary,
    Roofline,
    gpu,
    latency,
    model_shape,
    require_pool_fits,
)
from pagesim.core.studies.stand_in import memory_only

DEFAULT_MODEL_SHAPE = "llama-3-8b"
DEFAULT_GPU = "h200"


@dataclass(frozen=True)
class RequestLatency:
    """One request's figures in seconds; NaN where it never got that far."""

    request: str
    queue: float  # arrival to first admission
    ttft: float  # arrival to the end of the iteration that produced its first output token
    tpot: float  # (finish − first token) / (outputs − 1)
    output_tokens: int  # per sample
    preemptions: int
    state: str  # "finished", "rejected" (at submission), "aborted" (after it ran) or "unfinished"
    samples: int = 1  # n parallel samples, each writing output_tokens


def request_latencies(result: ReplayResult) -> tuple[RequestLatency, ...]:
    rows = []
    for r in result.requests.values():
        queue = math.nan if r.admitted is None else r.admitted - r.arrival
        ttft = math.nan if r.first_token is None else r.first_token - r.arrival
        timed = r.finished is not None and r.first_token is not None and r.output_tokens > 1
        tpot = (r.finished - r.first_token) / (r.output_tokens - 1) if timed else math.nan
        rows.append(RequestLatency(r.request, queue, ttft, tpot, r.output_tokens, r.preemptions, r.state, r.samples))
    return tuple(rows)


def pool_description(config: CacheConfig, roofline: Roofline) -> str:
    """The pool in blocks and in the model's bytes, e.g. "24 blocks of 4 tokens · 512 KiB a block · 0.01 GiB"."""
    block = roofline.block_bytes()
    return (
        f"{config.num_blocks} blocks of {config.block_size} tokens · {block / 1024:g} KiB a block · "
        f"{config.num_blocks * block / GIB:.2f} GiB"
    )


@dataclass(frozen=True)
class ScenarioLatency:
    source: str
    model_shape: str  # the shape's own name, e.g. "Llama-3-8B"
    gpu: str
    pool: str  # the scenario's pool, in words (pool_description)
    steps: int
    summary: LatencySummary
    requests: tuple[RequestLatency, ...]
    stalled: str | None  # why the scheduler could not finish, if it could not
    note: str = ""  # what was replayed instead, if not the scenario itself


def scenario_latency(
    scenario: Scenario, shape_name: str = DEFAULT_MODEL_SHAPE, gpu_name: str = DEFAULT_GPU
) -> ScenarioLatency:
    """Replay ``scenario`` to its end with ``shape_name``'s iterations on ``gpu_name`` (preset
    names); an unknown preset or an operation the engine refuses is an InvalidStudyError."""
    shape, spec = model_shape(shape_name), gpu(gpu_name)
    scenario, note = memory_only(scenario)
    roofline = Roofline(shape, spec, scenario.config.block_size)
    require_pool_fits(scenario.config.num_blocks, scenario.config.block_size, shape, spec, f"{scenario.name}'s pool")
    result = replay_scenario(scenario, scenario.config, roofline)
    return ScenarioLatency(
        scenario.name,
        shape.name,
        spec.name,
        pool_description(scenario.config, roofline),
        result.iterations,
        latency(result),
        request_latencies(result),
        result.stalled,
        note,
    )
