"""Memory metrics of one step: what the paged pool holds vs a contiguous reservation."""

from __future__ import annotations

from typing import NamedTuple


class Metrics(NamedTuple):
    """Every step of every run makes one: a named tuple is built in half the time of a frozen
    dataclass, which sets each field through ``object.__setattr__``."""

    step: int
    num_sequences: int
    used_blocks: int
    free_blocks: int
    shared_blocks: int  # blocks held by more than one block table
    logical_tokens: int  # sum of sequence lengths (shared prefixes counted per sequence)
    slots_allocated: int  # the sequences' blocks × block_size (not the v1 engine's null block, used by none)
    slots_filled: int  # physical slots holding a token
    contiguous_blocks: int  # what per-sequence max-length reservations would hold
    prefix_lookup_blocks: int = 0  # full prompt blocks looked up in the prefix cache, so far
    prefix_hit_blocks: int = 0  # ... found there: blocks neither allocated nor computed
    cached_free_blocks: int = 0  # free blocks still holding a cached prefix

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_blocks / self.prefix_lookup_blocks if self.prefix_lookup_blocks else 0.0

    @property
    def utilisation(self) -> float | None:
        """Slots holding tokens / slots allocated; None while nothing is allocated (no slot
        to be used or wasted: neither 0 % nor 100 %)."""
        return self.slots_filled / self.slots_allocated if self.slots_allocated else None

    @property
    def internal_fragmentation(self) -> int:
        """Allocated slots that hold no token: the unused tail of each last block."""
        return self.slots_allocated - self.slots_filled

    @property
    def total_blocks(self) -> int:
        return self.used_blocks + self.free_blocks

    def as_dict(self) -> dict[str, float | int]:
        out = self._asdict()
        out["utilisation"] = None if self.utilisation is None else round(self.utilisation, 6)
        out["internal_fragmentation"] = self.internal_fragmentation
        out["prefix_hit_rate"] = round(self.prefix_hit_rate, 6)
        return out
