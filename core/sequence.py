"""A sequence: its token ids and its block table."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sequence:
    seq_id: str
    token_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)  # logical block index -> physical block id

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def copy(self, seq_id: str | None = None) -> Sequence:
        return Sequence(seq_id or self.seq_id, list(self.token_ids), list(self.block_table))


def logical_block(position: int, block_size: int) -> int:
    return position // block_size


def block_offset(position: int, block_size: int) -> int:
    return position % block_size
