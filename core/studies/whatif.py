"""The knobs the app's what-if panel offers (names :func:`sweep.parse_setting` accepts),
and for each a first guess at values worth trying on a scenario: values that differ from
the scenario's own setting, small enough to matter on a teaching-sized pool."""

from __future__ import annotations

from pagesim.core.config import CacheConfig

PANEL_KNOBS = (
    "block_size",
    "num_blocks",
    "prefix_caching",
    "preemption",
    "watermark",
    "max_num_seqs",
    "max_num_batched_tokens",
    "scheduler",
)


def _others(current, candidates, count: int = 2) -> str:
    return ",".join(str(v) for v in [c for c in candidates if c != current][:count])


def suggested_values(knob: str, config: CacheConfig) -> str:
    """Values for ``knob`` as the panel's text field takes them, e.g. ``"2,8"`` for a block size of 4."""
    if knob == "block_size":
        size = config.block_size
        return f"{size // 2},{size * 2}" if size > 1 else "2,4"
    if knob == "num_blocks":
        return f"{max(1, config.num_blocks // 2)},{config.num_blocks * 2}"
    if knob == "prefix_caching":
        return "false" if config.prefix_caching else "true"
    if knob == "preemption":
        return "recompute" if config.preemption == "swap" else "swap"
    if knob == "watermark":
        return _others(config.watermark, (0.0, 0.05, 0.2))
    if knob == "max_num_seqs":
        return _others(config.max_num_seqs, (1, 2, 4))
    if knob == "max_num_batched_tokens":
        size = config.block_size
        return _others(config.max_num_batched_tokens, (2 * size, 8 * size, 32 * size))
    if knob == "scheduler":
        return "v0" if config.scheduler == "v1" else "v1"
    raise ValueError(f"unknown knob {knob!r}; the panel's knobs are {', '.join(PANEL_KNOBS)}")
