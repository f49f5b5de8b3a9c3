"""A small deterministic model: (token id, position) -> q, k, v.

Fixed seeded projections of a token embedding, then rotary position embedding on
q and k. K/V depend only on (token id, position), so identical prefixes give
identical K/V and sharing their blocks is semantically honest.
"""

from __future__ import annotations

import functools
import math
import zlib
from array import array
from typing import ClassVar

import numpy as np
from pagesim.core.config import CacheConfig
from pagesim.core.language_model import SYNTHETIC
from pagesim.core.language_model import check_vocab as _check_vocab
from pagesim.core.sequence import TOKEN_CODE

MEMORY_ONLY_VOCAB = 2**31  # a memory-only run's ids: any model's (vLLM's token ids are int32)
VOCAB_SIZE = 32_000
MODEL_DIM = 64
ROPE_BASE = 10_000.0
_MASK64 = (1 << 64) - 1


_SEED64 = 0x9E3779B97F4A7C15


def _mix_from(z: int, *words: int) -> int:
    """splitmix64 rounds over a few words from state ``z`` (a hash of the words before)."""
    for word in words:
        z = (z + (word & _MASK64) + _SEED64) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
    return z


def _mix(*words: int) -> int:
    """splitmix64 over a few words: a cheap, stable hash for synthetic token ids."""
    return _mix_from(_SEED64, *words)


_GOLDEN, _C1, _C2 = np.uint64(_SEED64), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _VOCAB64 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(VOCAB_SIZE)


def _mix_array_from(z: np.ndarray, *words) -> np.ndarray:
    """:func:`_mix_from` for arrays, reduced to token ids (the compiled mixer's reference in
    the tests); ``z`` (the caller's own, fresh) is worked on in place. uint64 array
    arithmetic wraps like the mask, silently."""
    for word in words:
        z += word
        z += _GOLDEN
        z ^= z >> _S30
        z *= _C1
        z ^= z >> _S27
        z *= _C2
        z ^= z >> _S31
    z %= _VOCAB64
    return z.astype(np.int64)


def _mix_positions(states: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = _mix_from(states[i], positions[i]) % VOCAB_SIZE``, compiled (see
    :func:`_position_mixer`): one splitmix round per token, no temporaries."""
    for i in range(states.shape[0]):
        z = states[i] + positions[i] + _GOLDEN
        z ^= z >> _S30
        z *= _C1
        z ^= z >> _S27
        z *= _C2
        z ^= z >> _S31
        out[i] = z % _VOCAB64


@functools.cache
def _position_mixer():
    """:func:`_mix_positions` compiled on first use (Numba loads with the first step or
    generated prompt, not with the window): a decode step's ids, or a prompt's, cost one
    call instead of a dozen array passes."""
    import numba

    # Typed up front: int64 positions would mix uint64 with int64, which Numba does in float64.
    return numba.njit("void(uint64[::1], uint64[::1], int64[::1])", cache=True, boundscheck=False)(_mix_positions)


def _rotate_rows(x: np.ndarray, factors: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
    """Rotary embedding of ``x`` (n, heads, dim) into ``out``: each head's halves x1, x2
    become x1 cos - x2 sin and x2 cos + x1 sin (``factors[p]``: cos, -sin, sin at position
    ``p``); an odd dim's last element is copied. Compiled (see :func:`_rotator`): a grow's
    one token costs one call, not a dozen array passes. Each element is two float32
    products and their sum, rounded as NumPy rounds them, so the bits do not depend on the
    batch (no fused multiply-add: Numba contracts nothing without fastmath)."""
    half = factors.shape[2]
    for i in range(x.shape[0]):
        f = factors[positions[i]]
        for h in range(x.shape[1]):
            for j in range(half):
                x1, x2 = x[i, h, j], x[i, h, half + j]
                out[i, h, j] = x1 * f[0, j] + x2 * f[1, j]
                out[i, h, half + j] = x2 * f[0, j] + x1 * f[2, j]
            for j in range(2 * half, x.shape[2]):
                out[i, h, j] = x[i, h, j]


@functools.cache
def _rotator():
    """:func:`_rotate_rows` compiled on first use (Numba loads with the first write, not
    with the window)."""
    import numba

    return numba.njit(cache=True, boundscheck=False)(_rotate_rows)


@functools.lru_cache(maxsize=4)
def _weights(seed: int, num_heads: int, num_kv_heads: int, head_dim: int) -> tuple[np.ndarray, ...]:
    """The model's fixed weights, shared (read-only) by every model with the same seed and
    shape: the embedding alone is 8 MB, and the app builds a new model per scenario load
    and per branch."""
    rng = np.random.default_rng(seed)
    embedding = rng.standard_normal((VOCAB_SIZE, MODEL_DIM), dtype=np.float32)
    scale = np.float32(1.0 / np.sqrt(MODEL_DIM))
    w_q = rng.standard_normal((MODEL_DIM, num_heads * head_dim), dtype=np.float32) * scale
    w_k = rng.standard_normal((MODEL_DIM, num_kv_heads * head_dim), dtype=np.float32) * scale
    w_v = rng.standard_normal((MODEL_DIM, num_kv_heads * head_dim), dtype=np.float32) * scale
    w_qkv = np.ascontiguousarray(np.concatenate([w_q, w_k, w_v], axis=1))
    for weights in (embedding, w_q, w_k, w_v, w_qkv):
        weights.flags.writeable = False
    return embedding, w_q, w_k, w_v, w_qkv


class _RotaryTable:
    """cos and sin of every position's rotary angles, shared by every model of one head dim.
    Built with libm per position, in fixed pieces of PIECE positions: a position's value
    never depends on how far the table had grown (vectorised ufuncs may round their tails
    differently), and building it never holds more than one piece of Python floats.

    Filled on demand, up to the furthest position a run has reached (vLLM precomputes its
    cos/sin cache for the model's maximum position; here a large ``max_model_len`` would
    cost seconds to minutes of pure-Python libm calls before the first step, for positions
    a run may never reach). Since a position's value never depends on the fill order, the
    lazy table holds exactly what an eager one would. Growing fills the arrays in place, in
    doubling capacity (repeated concatenation left the old tables as holes in the heap)."""

    PIECE = 256
    _by_head_dim: ClassVar[dict[int, _RotaryTable]] = {}

    def __init__(self, head_dim: int) -> None:
        self.half = head_dim // 2
        self.inv_freq = [ROPE_BASE ** (-2 * i / head_dim) for i in range(self.half)]
        self.filled = 0  # positions [0, filled) hold their values
        # Per position: cos, -sin and sin (what a rotation multiplies by; -sin is exact).
        self.factors = np.empty((0, 3, self.half), np.float32)

    @property
    def cos(self) -> np.ndarray:
        return self.factors[:, 0]

    @property
    def sin(self) -> np.ndarray:
        return self.factors[:, 2]

    @classmethod
    def for_head_dim(cls, head_dim: int) -> _RotaryTable:
        if head_dim not in cls._by_head_dim:
            cls._by_head_dim[head_dim] = cls(head_dim)
        return cls._by_head_dim[head_dim]

    def reserve(self, positions: int) -> None:
        """Room for ``positions`` positions (rounded up to whole pieces); nothing is computed."""
        if positions <= self.factors.shape[0]:
            return
        capacity = -(-max(positions, 2 * self.factors.shape[0]) // self.PIECE) * self.PIECE
        factors = np.empty((capacity, 3, self.half), np.float32)
        factors[: self.filled] = self.factors[: self.filled]
        self.factors = factors

    def fill(self, upto: int) -> None:
        """Compute positions [0, upto) (in whole pieces) if not yet done."""
        if upto > self.filled:
            self.reserve(upto)
            for start in range(self.filled, upto, self.PIECE):
                angles = [p * f for p in range(start, start + self.PIECE) for f in self.inv_freq]
                piece = self.factors[start : start + self.PIECE]
                piece[:, 0] = np.array([math.cos(a) for a in angles], np.float32).reshape(self.PIECE, -1)
                piece[:, 2] = np.array([math.sin(a) for a in angles], np.float32).reshape(self.PIECE, -1)
                np.negative(piece[:, 2], out=piece[:, 1])
                self.filled = start + self.PIECE

    def at(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(n, half) float32 cos and sin at ``positions``."""
        rows = self.factors_at(positions)
        return rows[:, 0], rows[:, 2]

    def factors_at(self, positions: np.ndarray) -> np.ndarray:
        """(n, 3, half) float32 cos, -sin and sin at ``positions``."""
        self.fill(int(positions[0] if len(positions) == 1 else positions.max()) + 1)
        return self.factors[positions]


class _StreamStates(dict):
    """Each sequence's (seed, name) rounds of the token hash, as signed 64-bit ints (what
    an int64 array holds), computed the first time a name is asked for: a dict lookup in C
    for the rest, with no scan of the batch for names not seen before."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed

    def __missing__(self, seq_id: str) -> int:
        state = _mix(self.seed, zlib.crc32(seq_id.encode()))
        self[seq_id] = state = state - (1 << 64) if state >> 63 else state
        return state


class TokenModel:
    """The synthetic model (a :class:`~pagesim.core.language_model.LanguageModel`)."""

    name = SYNTHETIC
    vocab_size = VOCAB_SIZE
    samples_from_logits = False
    context_window = None  # (hashed ids and rotary positions: any length runs)
    eos_id = None  # hashed ids: no token ends a sequence

    def __init__(self, config: CacheConfig, vocab_size: int = VOCAB_SIZE) -> None:
        self.config = config
        # A sequence's hash state after (seed, crc), as the int64 with its bits: NumPy reads
        # an int in int64's range about twice as fast as one past it.
        self._stream_of = _StreamStates(config.seed)
        self._last_batch: tuple[list[str], np.ndarray] = ([], np.empty(0, np.uint64))  # names, states
        weights = _weights(config.seed, config.num_heads, config.num_kv_heads, config.head_dim)
        self.embedding, self.w_q, self.w_k, self.w_v, self._w_qkv = weights
        self._rotary = _RotaryTable.for_head_dim(config.head_dim)  # filled as positions are reached
        # The ids it takes: its own vocabulary, whose embedding rows it has, or for a
        # memory-only run (no K/V: ids are only hashed) any model's, MEMORY_ONLY_VOCAB.
        self.vocab_size = vocab_size

    # -- synthetic token ids -----------------------------------------------------
    def token_id(self, seq_id: str, position: int) -> int:
        """The token a sequence holds (or samples) at ``position``; stable across runs."""
        return _mix(self.config.seed, zlib.crc32(seq_id.encode()), position) % VOCAB_SIZE

    def token_ids(self, seq_id: str, start: int, count: int) -> list[int]:
        # The (seed, name) rounds once: only the position's round runs per token.
        stream = self._stream_of[seq_id] & _MASK64
        if count <= 8:
            return [_mix_from(stream, p) % VOCAB_SIZE for p in range(start, start + count)]
        out = np.empty(count, np.int64)
        _position_mixer()(np.full(count, stream, np.uint64), np.arange(start, start + count, dtype=np.uint64), out)
        return out.tolist()

    def next_token_ids(self, seq_ids: list[str], positions: list[int], sampling=None) -> list[int]:
        """One token per sequence (a decode step), computed together: each sequence's
        (seed, name) rounds are hashed once, only the position's round runs per step.
        ``sampling`` is ignored: the ids are a hash."""
        names, states = self._last_batch
        if seq_ids != names:  # (a decode batch often runs again as it was: its states are kept)
            states = self._stream_states(seq_ids)
            self._last_batch = (list(seq_ids), states)
        n = len(seq_ids)
        out = np.empty(n, np.int64)
        if len(positions) != n:
            raise ValueError(f"{n} sequences but {len(positions)} positions")
        # (an unsigned array's buffer: half the time of np.fromiter on a list of ints)
        _position_mixer()(states, np.frombuffer(array(TOKEN_CODE, positions), np.uint64), out)
        return out.tolist()

    def _stream_states(self, seq_ids: list[str]) -> np.ndarray:
        # (fromiter: a third of np.array's time on a list of Python ints)
        return np.fromiter(map(self._stream_of.__getitem__, seq_ids), np.int64, len(seq_ids)).view(np.uint64)

    def check_vocab(self, token_ids, field: str) -> None:
        _check_vocab(token_ids, field, self.vocab_size)

    # -- projections -------------------------------------------------------------
    # Bit-exact determinism matters: a token's K/V must not depend on what else was in
    # the batch, or identical prefixes would differ in the last bit. So projections are
    # one fixed-shape product per token, and the rotary table is built with libm per
    # position rather than with vectorised ufuncs whose tails may round differently.
    def _rotate(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        half = self._rotary.half
        if half == 0 or x.shape[0] == 0:
            return x
        if len(positions) != x.shape[0]:
            raise ValueError(f"{x.shape[0]} tokens but {len(positions)} positions")
        if x.shape[2] not in (2 * half, 2 * half + 1):  # (the compiled loop indexes unchecked)
            raise ValueError(
                f"rows of {x.shape[2]} elements for a rotary table of head dim {2 * half} or {2 * half + 1}"
            )
        first, last = (int(positions[0]),) * 2 if len(positions) == 1 else (int(positions.min()), int(positions.max()))
        if first < 0:
            raise ValueError(f"positions must be non-negative, got {first}")
        self._rotary.fill(last + 1)  # (the compiled loop reads the table unchecked)
        out = np.empty(x.shape, np.float32)
        _rotator()(x, self._rotary.factors, np.ascontiguousarray(positions, np.int64), out)
        return out

    def qkv(self, token_ids, positions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """float32 q (n, num_heads, head_dim), k and v (n, num_kv_heads, head_dim)."""
        ids = np.asarray(token_ids, dtype=np.int64).tolist()  # a decode step's few: Python is quicker
        positions = np.asarray(positions, dtype=np.int64)
        if ids and (min(ids) < 0 or max(ids) >= VOCAB_SIZE):
            raise ValueError(f"token ids must be in [0, {VOCAB_SIZE})")
        c = self.config
        q_dim, kv_dim = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        rows = np.empty((len(ids), self._w_qkv.shape[1]), np.float32)
        for i, token in enumerate(ids):
            np.dot(self.embedding[token], self._w_qkv, out=rows[i])
        # q and k sit side by side in a row and take the same rotation: one pass for both.
        qk = self._rotate(rows[:, : q_dim + kv_dim].reshape(len(ids), -1, c.head_dim), positions)
        q, k = qk[:, : c.num_heads], qk[:, c.num_heads :]
        v = rows[:, q_dim + kv_dim :].reshape(-1, c.num_kv_heads, c.head_dim)
        return q, k, v.copy()


def check_vocab(token_ids, field: str) -> None:
    """Refuse token ids outside the synthetic vocabulary, naming the field."""
    _check_vocab(token_ids, field, VOCAB_SIZE)
