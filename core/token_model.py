"""A small deterministic model: (token id, position) -> q, k, v.

Fixed seeded projections of a token embedding, then rotary position embedding on
q and k. K/V depend only on (token id, position), so identical prefixes give
identical K/V and sharing their blocks is semantically honest.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from core.config import CacheConfig
from core.errors import InvalidOperationError

VOCAB_SIZE = 32_000
MODEL_DIM = 64
ROPE_BASE = 10_000.0
_MASK64 = (1 << 64) - 1


def _mix(*words: int) -> int:
    """splitmix64 over a few words: a cheap, stable hash for synthetic token ids."""
    z = 0x9E3779B97F4A7C15
    for word in words:
        z = (z + (word & _MASK64) + 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
    return z


_GOLDEN, _C1, _C2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix_array(seed: int, crcs: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``_mix(seed, crc, position) % VOCAB_SIZE`` for arrays (uint64 wraps like the mask)."""
    with np.errstate(over="ignore"):
        z = np.full(crcs.shape, _GOLDEN, dtype=np.uint64)
        for word in (np.uint64(seed & _MASK64), crcs, positions):
            z = z + word + _GOLDEN
            z = (z ^ (z >> np.uint64(30))) * _C1
            z = (z ^ (z >> np.uint64(27))) * _C2
            z ^= z >> np.uint64(31)
    return (z % np.uint64(VOCAB_SIZE)).astype(np.int64)


class TokenModel:
    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self._crc_of: dict[str, int] = {}
        rng = np.random.default_rng(config.seed)
        q_dim = config.num_heads * config.head_dim
        kv_dim = config.num_kv_heads * config.head_dim
        self.embedding = rng.standard_normal((VOCAB_SIZE, MODEL_DIM), dtype=np.float32)
        scale = np.float32(1.0 / np.sqrt(MODEL_DIM))
        self.w_q = rng.standard_normal((MODEL_DIM, q_dim), dtype=np.float32) * scale
        self.w_k = rng.standard_normal((MODEL_DIM, kv_dim), dtype=np.float32) * scale
        self.w_v = rng.standard_normal((MODEL_DIM, kv_dim), dtype=np.float32) * scale
        self._w_qkv = np.ascontiguousarray(np.concatenate([self.w_q, self.w_k, self.w_v], axis=1))
        half = config.head_dim // 2
        self._inv_freq = [ROPE_BASE ** (-2 * i / config.head_dim) for i in range(half)]
        self._cos = np.empty((0, half), np.float32)
        self._sin = np.empty((0, half), np.float32)

    # -- synthetic token ids -----------------------------------------------------
    def _crc(self, seq_id: str) -> int:
        crc = self._crc_of[seq_id] = zlib.crc32(seq_id.encode())
        return crc

    def token_id(self, seq_id: str, position: int) -> int:
        """The token a sequence holds (or samples) at ``position``; stable across runs."""
        return _mix(self.config.seed, zlib.crc32(seq_id.encode()), position) % VOCAB_SIZE

    def token_ids(self, seq_id: str, start: int, count: int) -> list[int]:
        if count <= 8:
            return [self.token_id(seq_id, p) for p in range(start, start + count)]
        crc = np.full(count, zlib.crc32(seq_id.encode()), dtype=np.uint64)
        return _mix_array(self.config.seed, crc, np.arange(start, start + count, dtype=np.uint64)).tolist()

    def next_token_ids(self, seq_ids: list[str], positions: list[int]) -> list[int]:
        """One token per sequence (a decode step), computed together."""
        crc_of = self._crc_of
        crcs = np.array([crc_of.get(s) or self._crc(s) for s in seq_ids], dtype=np.uint64)
        return _mix_array(self.config.seed, crcs, np.asarray(positions, dtype=np.uint64)).tolist()

    # -- projections -------------------------------------------------------------
    # Bit-exact determinism matters: a token's K/V must not depend on what else was in
    # the batch, or identical prefixes would differ in the last bit. So projections are
    # one fixed-shape product per token, and the rotary table is built with libm per
    # position rather than with vectorised ufuncs whose tails may round differently.
    def _rotary_table(self, upto: int) -> tuple[np.ndarray, np.ndarray]:
        have = self._cos.shape[0]
        if upto > have:
            grow = max(upto, 2 * have) - have
            angles = [[p * f for f in self._inv_freq] for p in range(have, have + grow)]
            cos = np.array([[math.cos(a) for a in row] for row in angles], np.float32).reshape(grow, -1)
            sin = np.array([[math.sin(a) for a in row] for row in angles], np.float32).reshape(grow, -1)
            self._cos = np.concatenate([self._cos, cos])
            self._sin = np.concatenate([self._sin, sin])
        return self._cos, self._sin

    def _rotate(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        half = len(self._inv_freq)
        if half == 0 or x.shape[0] == 0:
            return x
        cos_table, sin_table = self._rotary_table(int(positions.max()) + 1)
        cos, sin = cos_table[positions][:, None, :], sin_table[positions][:, None, :]
        x1, x2 = x[..., :half], x[..., half : 2 * half]
        out = x.copy()
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half : 2 * half] = x2 * cos + x1 * sin
        return out

    def qkv(self, token_ids, positions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """float32 q (n, num_heads, head_dim), k and v (n, num_kv_heads, head_dim)."""
        token_ids = np.asarray(token_ids, dtype=np.int64)
        positions = np.asarray(positions, dtype=np.int64)
        if token_ids.size and (token_ids.min() < 0 or token_ids.max() >= VOCAB_SIZE):
            raise ValueError(f"token ids must be in [0, {VOCAB_SIZE})")
        c = self.config
        q_dim, kv_dim = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        rows = np.empty((token_ids.shape[0], self._w_qkv.shape[1]), np.float32)
        for i, token in enumerate(token_ids.tolist()):
            np.dot(self.embedding[token], self._w_qkv, out=rows[i])
        q = rows[:, :q_dim].reshape(-1, c.num_heads, c.head_dim)
        k = rows[:, q_dim : q_dim + kv_dim].reshape(-1, c.num_kv_heads, c.head_dim)
        v = rows[:, q_dim + kv_dim :].reshape(-1, c.num_kv_heads, c.head_dim)
        return self._rotate(q, positions), self._rotate(k, positions), v.copy()


def check_vocab(token_ids, field: str) -> None:
    """Refuse token ids outside the vocabulary, naming the field."""
    if not token_ids or (min(token_ids) >= 0 and max(token_ids) < VOCAB_SIZE):
        return
    bad = next(t for t in token_ids if not 0 <= t < VOCAB_SIZE)
    raise InvalidOperationError(f"{field}: token id {bad} is outside the vocabulary [0, {VOCAB_SIZE})")
