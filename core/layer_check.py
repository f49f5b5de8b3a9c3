"""A real model's check of every layer: each layer's paged attention for the newest token
of every sequence a forward computed, against dense attention over the same stored K/V
(gathered through the block table: the article's gather reference), head by head, within
the rounding bound of :func:`~pagesim.core.dense_check.error_bounds`; and the model's
logits against the dense engine's (contiguous K/V it computed itself, never the pool), the
check that no paging mistake can pass (a wrong block moves every later layer).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pagesim.core.dense_check import error_bounds
from pagesim.kernels.reference import dense_attention_rows


@dataclass(frozen=True)
class LayerCheck:
    seq_ids: tuple[str, ...]
    errors: np.ndarray  # (num_layers, num_seqs, num_heads): max |paged − dense| per head
    bounds: np.ndarray  # the same shape: what rounding explains
    logits_diff: float = 0.0  # the largest |paged − dense engine| logit of the forward
    logits_tolerance: float = float("inf")
    tokens_agree: bool = True  # both sides' logits choose the same next tokens

    @property
    def ratios(self) -> np.ndarray:
        """Each layer's worst error as a fraction of its bound (num_layers,)."""
        if not self.seq_ids:
            return np.zeros(self.errors.shape[0])
        return (self.errors / np.maximum(self.bounds, 1e-30)).max(axis=(1, 2))

    @property
    def worst_layer(self) -> int:
        return int(self.ratios.argmax())

    @property
    def attention_passed(self) -> bool:
        return bool((self.errors <= self.bounds).all())

    @property
    def passed(self) -> bool:
        return self.attention_passed and self.logits_diff <= self.logits_tolerance and self.tokens_agree

    def merged(self, later: LayerCheck) -> LayerCheck:
        """One check for an operation of several forwards (a multi-step schedule): the
        forward with the least margin, the largest logits gap, all tokens agreeing."""
        worst = self if (not self.attention_passed or self.ratios.max() >= later.ratios.max()) else later
        return LayerCheck(
            worst.seq_ids,
            worst.errors,
            worst.bounds,
            max(self.logits_diff, later.logits_diff),
            min(self.logits_tolerance, later.logits_tolerance),
            self.tokens_agree and later.tokens_agree,
        )

    def describe(self) -> str:
        layers = self.errors.shape[0]
        worst = self.worst_layer
        verdict = "within" if self.attention_passed else "BEYOND"
        text = (
            f"all {layers} layers' paged attention {verdict} their bounds "
            f"(worst: layer {worst}, {self.ratios[worst]:.2g} of its bound)"
        )
        if np.isfinite(self.logits_tolerance):
            gap = f"within {self.logits_diff:.1e}"
            if self.logits_diff > self.logits_tolerance:
                gap = f"{self.logits_diff:.1e} (BEYOND {self.logits_tolerance:.0e})"
            same = "the same next tokens" if self.tokens_agree else "DIFFERENT next tokens"
            text += f"; logits {gap} of the dense engine's, {same}"
        return text


@dataclass(frozen=True)
class LayerDetail:
    """One sequence's newest token in one layer: what the Check panel and the walk-through show."""

    layer: int
    query: np.ndarray  # (num_heads, head_dim), in the cache's dtype: what the kernel reads
    output: np.ndarray  # (num_heads, head_dim): the paged kernel's, float32
    dense: np.ndarray  # (num_heads, head_dim): over the K/V gathered through the block table
    errors: np.ndarray  # (num_heads,): max |paged − dense|
    bounds: np.ndarray  # (num_heads,): what rounding explains
    weights: np.ndarray  # (num_heads, context_len): softmax over the context
    block_tables: np.ndarray  # (1, num_blocks): the kernel's input
    context_lens: np.ndarray  # (1,)


def gather_slots(tables: list[list[int]], context_lens: list[int], block_size: int) -> list[np.ndarray]:
    """Each sequence's slot of every position, through its block table."""
    out = []
    for table, n in zip(tables, context_lens, strict=True):
        positions = np.arange(n)
        out.append(np.asarray(table, np.int64)[positions // block_size] * block_size + positions % block_size)
    return out


def check_layer(key_cache, value_cache, slots: list[np.ndarray], query: np.ndarray, paged: np.ndarray, scale: float):
    """One layer: ``query`` (num_seqs, num_heads, head_dim), the newest token's of each
    sequence, and ``paged`` its kernel output; dense attention over each sequence's K/V
    gathered from the layer's cache at ``slots``. Returns (errors, bounds), each
    (num_seqs, num_heads)."""
    dense, bounds, _ = gathered_attention(key_cache, value_cache, slots, query, scale)
    errors = np.abs(paged.astype(np.float32) - dense).max(axis=2)
    return errors, bounds


def gathered_attention(key_cache, value_cache, slots: list[np.ndarray], query: np.ndarray, scale: float):
    """Dense attention of ``query`` (num_seqs, num_heads, head_dim) over each sequence's K/V
    gathered from a layer's cache at ``slots`` (the article's gather reference). Returns
    (dense (num_seqs, num_heads, head_dim), rounding bounds (num_seqs, num_heads), the
    gathered keys (num_seqs, num_kv_heads, longest, head_dim), all float32)."""
    num_kv, head_dim = key_cache.shape[-2:]
    flat_keys, flat_values = key_cache.reshape(-1, num_kv, head_dim), value_cache.reshape(-1, num_kv, head_dim)
    lengths = np.array([len(s) for s in slots])
    longest = max(int(lengths.max(initial=0)), 1)
    keys = np.zeros((len(slots), num_kv, longest, head_dim), np.float32)
    values = np.zeros_like(keys)
    k_norm, v_abs = np.zeros((len(slots), num_kv)), np.zeros((len(slots), num_kv))
    for row, seq_slots in enumerate(slots):
        k = flat_keys[seq_slots].astype(np.float32)  # (n, kv, d)
        v = flat_values[seq_slots].astype(np.float32)
        keys[row, :, : len(seq_slots)] = k.transpose(1, 0, 2)
        values[row, :, : len(seq_slots)] = v.transpose(1, 0, 2)
        k_norm[row] = np.sqrt((k * k).sum(axis=2)).max(axis=0)
        v_abs[row] = np.abs(v).max(axis=(0, 2))
    query32 = query.astype(np.float32)
    dense = dense_attention_rows(query32, keys, values, lengths, scale).numpy()
    return dense, error_bounds(query32, scale, lengths, k_norm, v_abs), keys
