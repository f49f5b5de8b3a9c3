"""A sequence: its token ids and its block table."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sequence:
    seq_id: str
    token_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)  # logical block index -> physical block id
    # Prefix caching: the chained hash of each full logical block (parent hash, token ids).
    block_hashes: list[int] = field(default_factory=list)
    owner: str | None = None  # the scheduler's request that runs it; None: the user's own

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def copy(self, seq_id: str | None = None) -> Sequence:
        return Sequence(
            seq_id or self.seq_id, list(self.token_ids), list(self.block_table), list(self.block_hashes), self.owner
        )


def block_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    """vLLM's chained block hash: equal only for equal prefixes (ints hash stably)."""
    return hash((parent, token_ids))
