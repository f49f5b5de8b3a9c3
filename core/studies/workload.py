"""Seeded request workloads: arrivals, prompt and output lengths, sampling patterns.

Length distributions (log-normal, clipped to the model's max length) are fitted to the
means the vLLM paper reports for its traces (Kwon et al., SOSP 2023, §6.1, Fig. 11):
ShareGPT prompts average 161.31 tokens and outputs 337.99; Alpaca 19.31 and 58.45. The
shape parameter (sigma) is ours: ShareGPT's lengths are heavy-tailed (sigma 1.0),
Alpaca's instruction lengths narrower (sigma 0.6).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from pagesim.core.checks import is_count
from pagesim.core.errors import InvalidStudyError

# name -> ((prompt mean, sigma), (output mean, sigma))
LENGTH_MODELS = {
    "sharegpt": ((161.31, 1.0), (337.99, 1.0)),
    "alpaca": ((19.31, 0.6), (58.45, 0.6)),
}
DISTRIBUTIONS = ("sharegpt", "alpaca", "uniform", "zipf")
# A million requests replay in tens of minutes on one core; more would fill memory with their
# specs before the first step (a billion took a GB in seconds, saying nothing).
MAX_REQUESTS = 1_000_000


@dataclass(frozen=True)
class RequestSpec:
    request_id: str
    arrival: float  # seconds since the start
    prompt_len: int
    output_len: int
    n: int = 1  # parallel samples sharing the prompt (forks)
    beam_width: int = 0  # > 0: beam search with this many beams (forks, pruning)
    shared_prefix: int = 0  # leading prompt tokens common to every request (a system prompt)


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


def _zipf(rng: random.Random, alpha: float, upper: int) -> int:
    """A Zipf-distributed integer in [1, upper] by inverse transform over the finite support."""
    weights = [k ** (-alpha) for k in range(1, upper + 1)]
    return rng.choices(range(1, upper + 1), weights=weights)[0]


def generate(
    distribution: str,
    count: int,
    *,
    rate: float = 1.0,
    seed: int = 0,
    max_len: int = 2048,
    n: int = 1,
    beam_width: int = 0,
    shared_prefix: int = 0,
    uniform_range: tuple[int, int] = (16, 512),
    zipf_alpha: float = 1.2,
) -> list[RequestSpec]:
    """``count`` requests with Poisson arrivals at ``rate`` per second; prompt + output ≤ max_len."""
    if not is_count(count, 0):
        raise InvalidStudyError(f"count must be a non-negative integer; got {count!r}")
    if count > MAX_REQUESTS:
        raise InvalidStudyError(f"{count:,} requests is more than a workload may hold ({MAX_REQUESTS:,})")
    if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
        raise InvalidStudyError(f"rate must be a positive, finite number of arrivals per second; got {rate!r}")
    if not is_count(max_len):
        raise InvalidStudyError(f"max_len must be a positive integer; got {max_len!r}")
    if not is_count(seed, 0):  # (random.Random takes a negative seed's absolute value: -3 would be 3)
        raise InvalidStudyError(f"the seed must be a non-negative integer; got {seed!r}")
    if distribution not in DISTRIBUTIONS:
        raise InvalidStudyError(
            f"unknown length distribution {distribution!r}; expected one of {', '.join(DISTRIBUTIONS)}"
        )
    if count < 0 or rate <= 0 or max_len < 2:
        raise InvalidStudyError("count must be ≥ 0, rate > 0 and max_len ≥ 2")
    rng = random.Random(seed)
    out, clock = [], 0.0
    zipf_upper = min(max_len // 2, 1024)
    for i in range(count):
        clock += rng.expovariate(rate)
        if distribution in LENGTH_MODELS:
            (pm, ps), (om, os_) = LENGTH_MODELS[distribution]
            prompt, output = _lognormal(rng, pm, ps), _lognormal(rng, om, os_)
        elif distribution == "uniform":
            prompt, output = rng.randint(*uniform_range), rng.randint(*uniform_range)
        else:
            prompt, output = _zipf(rng, zipf_alpha, zipf_upper), _zipf(rng, zipf_alpha, zipf_upper)
        prompt = max(1, min(int(prompt), max_len - 1)) + shared_prefix
        prompt = min(prompt, max_len - 1)
        output = max(1, min(int(output), max_len - prompt))
        out.append(RequestSpec(f"req{i}", clock, prompt, output, n, beam_width, min(shared_prefix, prompt - 1)))
    return out
