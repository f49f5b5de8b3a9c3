"""Sampling parameters per sequence, and the next-token choice from a sequence's logits.

:class:`SamplingParams` is small and frozen; a sequence keeps its own (a fork inherits
them with its own sequence index, so parallel samples draw differently). A real model's
next token is :func:`choose_token` of the sequence's last logits: temperature 0 (or below
1e-5, as vLLM has it) is greedy (the argmax); otherwise the logits are divided by the temperature, cut to the ``top_k``
largest and to the nucleus of ``top_p`` (vLLM's rule: sorted, the smallest set of the most
probable tokens whose mass reaches ``top_p``), and one token is drawn with a generator
seeded from (request seed, sequence index, position) alone. The same logits and the same
three numbers give the same token: a replay, a step back then forward, and a branch
reproduce the same text. The synthetic token model ignores all of it.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace

from pagesim.core.checks import is_count
from pagesim.core.errors import InvalidOperationError


def _is_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


# Below this a temperature is greedy, as vLLM's _SAMPLING_EPS makes it: logits divided by
# 1e-40 overflow float32 to inf, and a softmax of infs is NaN (every draw came out token 0).
GREEDY_BELOW = 1e-5


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # below GREEDY_BELOW (0 included): greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = 0  # the request's
    max_tokens: int | None = None  # tokens to generate at most (None: no limit)
    stop_at_eos: bool = True  # the end-of-sequence token finishes the sequence
    index: int = 0  # the sequence's index in its request (parallel samples: 0 … n-1)
    length_penalty: float = 1.0  # beam search: a finished beam's score is logprob / length ** this

    def __post_init__(self) -> None:
        if not _is_number(self.temperature) or self.temperature < 0:
            raise InvalidOperationError(f"temperature must be a number ≥ 0; got {self.temperature!r}", "temperature")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidOperationError(f"top_p must be a number in (0, 1]; got {self.top_p!r}", "top_p")
        if not is_count(self.top_k, 0):
            raise InvalidOperationError(f"top_k must be an integer ≥ 0 (0: off); got {self.top_k!r}", "top_k")
        if not is_count(self.seed, 0) or self.seed >= 2**63:
            raise InvalidOperationError(f"seed must be an integer in [0, 2^63); got {self.seed!r}", "seed")
        if self.max_tokens is not None and not is_count(self.max_tokens):
            raise InvalidOperationError(f"max_tokens must be a positive integer; got {self.max_tokens!r}", "max_tokens")
        if not isinstance(self.stop_at_eos, bool):
            raise InvalidOperationError(f"stop_at_eos must be true or false; got {self.stop_at_eos!r}", "stop_at_eos")
        if not _is_number(self.length_penalty):
            got = f"length_penalty must be a number; got {self.length_penalty!r}"
            raise InvalidOperationError(got, "length_penalty")
        if not is_count(self.index, 0):
            raise InvalidOperationError(f"index must be an integer ≥ 0; got {self.index!r}", "index")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    def for_index(self, index: int) -> SamplingParams:
        """The same parameters for the request's sequence ``index`` (its own draws)."""
        return replace(self, index=index)

    def for_fork(self, child: str) -> SamplingParams:
        """A user's fork named ``child``: an index from the name, stable across runs."""
        return replace(self, index=zlib.crc32(child.encode()))

    def draw_seed(self, position: int) -> int:
        """The generator's seed for the token at ``position``: (seed, index, position) only."""
        data = f"{self.seed}:{self.index}:{position}".encode()
        return zlib.crc32(data) | (zlib.adler32(data) << 32)

    def finished(self, generated: int, last_token: int, eos_id: int | None) -> str | None:
        """Why a sequence that has generated ``generated`` tokens, the last ``last_token``,
        is done ("eos", "length"), or None."""
        if generated and self.stop_at_eos and eos_id is not None and last_token == eos_id:
            return "eos"
        if self.max_tokens is not None and generated >= self.max_tokens:
            return "length"
        return None


GREEDY = SamplingParams()


def masked_logits(logits, params: SamplingParams):
    """The logits (float32, 1-D torch) divided by the temperature, with tokens outside the
    top-k and the top-p nucleus at -inf (vLLM's ``_apply_top_k_top_p``)."""
    import torch

    scaled = logits.to(torch.float32) / params.temperature
    sorted_logits, order = scaled.sort(descending=False)
    vocab = sorted_logits.numel()
    if 0 < params.top_k < vocab:
        threshold = sorted_logits[vocab - params.top_k]
        sorted_logits = sorted_logits.masked_fill(sorted_logits < threshold, -math.inf)
    if params.top_p < 1:
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        cut = cumulative <= 1 - params.top_p  # the least probable tokens whose mass is ≤ 1 - p
        cut[-1] = False  # at least one token stays
        sorted_logits = sorted_logits.masked_fill(cut, -math.inf)
    return torch.full_like(scaled, -math.inf).scatter(0, order, sorted_logits)


def choose_token(logits, params: SamplingParams | None, position: int) -> int:
    """The next token from a sequence's last logits (see the module's docstring)."""
    if params is None or params.greedy:
        return int(logits.argmax())
    import torch

    probs = masked_logits(logits, params).softmax(-1)
    generator = torch.Generator().manual_seed(params.draw_seed(position))
    # vLLM's draw: probs / Exp(1) noise, the argmax (a categorical draw from ``probs``).
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return int((probs / noise).argmax())


def token_logprob(logits, token: int) -> float:
    """The log-probability of ``token`` under ``logits`` (log-softmax, float64)."""
    import torch

    return float(torch.log_softmax(logits.to(torch.float64), -1)[token])
