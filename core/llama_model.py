"""A real language model behind the engine's model interface, and the dense engine the
paged runner is checked against.

:class:`LlamaModel` is what the registry and the schedulers ask for tokens: a decode
step's next token of each sequence comes from that sequence's last logits (greedy, or drawn
under its sampling parameters: :func:`~pagesim.core.sampling.choose_token`), which the
:class:`~pagesim.core.llama_runner.LlamaRunner` leaves here after each forward.
:class:`DenseReference` runs the same model beside it with each sequence's K/V in one
contiguous row per layer and torch's SDPA (the model's :class:`DenseLlamaEngine`), fed
the same tokens; :class:`LogitsCheck` is one sequence's paged logits against dense's, and
the token each side's logits give under the sequence's sampling parameters.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
from pagesim.core.errors import InvalidOperationError
from pagesim.core.language_model import check_vocab
from pagesim.core.models import DenseKVCache, DenseLlamaEngine, Llama, ModelFile
from pagesim.core.sampling import SamplingParams, choose_token
from pagesim.core.token_model import _mix

# Paged and dense logits both come from fp32 arithmetic in different orders, through 30
# layers: SmolLM2's differ by ~5e-5 at most (logits of magnitude ~20). A wrong block, a stale slot
# or a missed copy-on-write moves them by far more than this (one stale slot in one layer: 0.03-0.17).
LOGITS_TOLERANCE = 1e-3
# With bf16 weights (core.models.precision) every matmul rounds to 8 significant bits; the two
# engines round some values differently (their attention differs in the last fp32 bits) and
# from then on drift apart by bf16's rounding. SmolLM2's logits (|logit| < 32, where a bf16
# step is 0.125) then differ by 2 steps typically and 5.5 at most (0.69, over 365 steps of 10
# chat prompts); the bound is 8 steps. It no longer sees one stale slot (0.03-0.17, under the
# drift): the per-layer attention check, on the same stored K/V, still does. The greedy token
# still differs where the top two logits are that close (6 of those 365 steps): a failed check.
LOGITS_TOLERANCE_BF16 = 1.0
LOGITS_TOLERANCES = {"float32": LOGITS_TOLERANCE, "bfloat16": LOGITS_TOLERANCE_BF16}
# A paged cache's dtype -> what the dense rows round q, K and V to (None: fp32, nothing to round).
STORED_TORCH_DTYPES = {"float32": None, "float16": torch.float16, "bfloat16": torch.bfloat16}
# A half-precision KV cache (fp32 weights): both engines round q, K and V to the cache's dtype,
# but their attention differs in the last fp32 bits, so now and then a value rounds to the
# other neighbour, and the two drift apart by the cache's rounding. Over SmolLM2's shipped
# scenarios (about 200 checks each) the logits differed by up to 0.22 with a bf16 cache and
# 0.026 with an fp16 one: 512 units of the cache's roundoff (1.0 and 0.125) bound them 4.5x
# over. As with bf16 weights, the per-layer attention check, on the same stored K/V, is the
# one that still sees a stale slot there (docs/bench/kv-dtype-logits-drift-2026-12-04-amd.txt).
KV_LOGITS_TOLERANCES = {"float32": 0.0, "float16": 512 * 2.0**-12, "bfloat16": 512 * 2.0**-9}


class LlamaModel:
    """A real model as the engine sees it (a :class:`~pagesim.core.language_model.LanguageModel`)."""

    samples_from_logits = True

    def __init__(self, file: ModelFile, seed: int = 0) -> None:
        self.file = file
        self.name = file.config.name or file.path.name
        self.vocab_size = file.config.vocab_size
        self.eos_id = file.config.eos_id
        self.context_window = file.config.context_length
        self.tokenizer = file.tokenizer
        self.llama = Llama(file.config, file.weights)
        self.seed = seed
        self.logits: dict[str, torch.Tensor] = {}  # each sequence's last logits, the paged path's

    def token_ids(self, seq_id: str, start: int, count: int) -> list[int]:
        """Filler ids for a prompt given as a count (a hash, as the synthetic model's)."""
        crc = zlib.crc32(seq_id.encode())
        return [_mix(self.seed, crc, p) % self.vocab_size for p in range(start, start + count)]

    def next_token_ids(
        self, seq_ids: list[str], positions: list[int], sampling: list[SamplingParams | None] | None = None
    ) -> list[int]:
        """Each sequence's next token from its last logits: the argmax (no ``sampling``, or
        temperature 0), else drawn under its parameters for the token's position."""
        out = []
        params = sampling or [None] * len(seq_ids)
        for seq_id, position, param in zip(seq_ids, positions, params, strict=True):
            logits = self.logits.get(seq_id)
            if logits is None:
                raise InvalidOperationError(f"sequence {seq_id!r} has no logits yet: none of its tokens was computed")
            out.append(choose_token(logits, param, position))
        return out

    def check_vocab(self, token_ids, field: str) -> None:
        check_vocab(token_ids, field, self.vocab_size)


@dataclass(frozen=True)
class LogitsCheck:
    """One sequence's logits after a forward: the paged path's against the dense engine's."""

    seq_id: str
    position: int  # the position of the token whose logits these are
    max_abs_diff: float
    tolerance: float
    paged_token: int  # each side's choice of the next token (greedy, or drawn with the same seed)
    dense_token: int

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.tolerance and self.paged_token == self.dense_token


def clone_cache(cache: DenseKVCache, extra: int = 16) -> DenseKVCache:
    """A copy of ``cache``'s rows (room for ``extra`` more tokens before it grows)."""
    copy = DenseKVCache(cache.config, capacity=cache.length + extra, stored_dtype=cache.stored_dtype)
    n = cache.length
    copy.keys[:, :, :n] = cache.keys[:, :, :n]
    copy.values[:, :, :n] = cache.values[:, :, :n]
    copy.length = n
    return copy


class DenseReference:
    """The dense engine beside the paged one: every sequence's K/V in its own contiguous
    :class:`DenseKVCache` (never the pool), its newest logits."""

    def __init__(self, llama: Llama, kv_dtype: str = "float32") -> None:
        """``kv_dtype``: the paged cache's; the dense rows round q, K and V to it as the paged
        engine does, so both attend over the same values (an fp32 row beside a bf16 pool would
        differ by the cache's rounding, not by the paging), and the logits are held to what
        that rounding explains."""
        self.engine = DenseLlamaEngine(llama)
        self.tolerance = max(LOGITS_TOLERANCES[llama.dtype_name], KV_LOGITS_TOLERANCES[kv_dtype])
        self.stored_dtype = STORED_TORCH_DTYPES[kv_dtype]
        self.caches: dict[str, DenseKVCache] = {}
        self.logits: dict[str, torch.Tensor] = {}

    def add(self, seq_id: str) -> None:
        self.caches[seq_id] = DenseKVCache(self.engine.model.config, capacity=64, stored_dtype=self.stored_dtype)

    def fork(self, parent: str, child: str) -> None:
        self.caches[child] = clone_cache(self.caches[parent])
        if parent in self.logits:
            self.logits[child] = self.logits[parent]

    def free(self, seq_id: str) -> None:
        self.caches.pop(seq_id, None)
        self.logits.pop(seq_id, None)

    def feed(self, seq_id: str, token_ids: list[int]) -> torch.Tensor:
        """``token_ids`` after what the sequence holds; its new last logits."""
        logits = self.engine.step(self.caches[seq_id], token_ids)
        self.logits[seq_id] = logits
        return logits

    def feed_all(self, rows: list[tuple[str, list[int]]]) -> None:
        """Several sequences' new tokens. A decode step (one token each) runs as one forward,
        its matmuls batched as the paged engine's are, each sequence still attending over its
        own contiguous K/V (a forward per sequence made the check several times the step)."""
        if len(rows) < 2 or any(len(ids) != 1 for _, ids in rows):
            for seq_id, ids in rows:
                self.feed(seq_id, ids)
            return
        caches = [self.caches[seq_id] for seq_id, _ in rows]
        ids = torch.tensor([ids[0] for _, ids in rows], dtype=torch.long)
        positions = torch.tensor([cache.length for cache in caches])

        def attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            rows_out = [cache(layer, q[i : i + 1], k[i : i + 1], v[i : i + 1]) for i, cache in enumerate(caches)]
            return torch.cat(rows_out)

        model = self.engine.model
        logits = model.logits(model.forward(ids, positions, attention))
        for (seq_id, _), row in zip(rows, logits, strict=True):
            self.logits[seq_id] = row

    def snapshot(self) -> tuple[dict[str, DenseKVCache], dict[str, torch.Tensor]]:
        return {s: clone_cache(c, 0) for s, c in self.caches.items()}, dict(self.logits)

    def restore(self, snap: tuple[dict[str, DenseKVCache], dict[str, torch.Tensor]] | None) -> None:
        if snap is None:
            self.caches, self.logits = {}, {}
        else:
            self.caches, self.logits = {s: clone_cache(c) for s, c in snap[0].items()}, dict(snap[1])

    def compare(
        self, seq_id: str, position: int, paged: torch.Tensor, sampling: SamplingParams | None = None
    ) -> LogitsCheck:
        """``paged`` logits (those of the token at ``position``) against the dense ones, and
        the next token each gives under ``sampling``."""
        dense = self.logits[seq_id]
        diff = float((paged - dense).abs().max())
        nxt = position + 1
        paged_token, dense_token = choose_token(paged, sampling, nxt), choose_token(dense, sampling, nxt)
        return LogitsCheck(seq_id, position, diff, self.tolerance, paged_token, dense_token)
