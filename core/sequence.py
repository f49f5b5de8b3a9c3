"""A sequence: its token ids and its block table."""

from __future__ import annotations

import hashlib
import os
from array import array
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


# The chain's root is random per run (vLLM's NONE_HASH): a hash cannot be predicted, so a
# crafted prompt cannot be made to collide with another's prefix (CVE-2025-25183).
_ROOT = os.urandom(16)


def block_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    """vLLM's chained block hash: SHA-256 of the parent's hash and the block's token ids,
    so a hash names a whole prefix. Hits still compare the tokens."""
    digest = hashlib.sha256(_ROOT if parent is None else parent.to_bytes(16, "little"))
    digest.update(array("q", token_ids).tobytes())
    return int.from_bytes(digest.digest()[:16], "little")
