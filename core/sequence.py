"""A sequence: its token ids and its block table."""

from __future__ import annotations

import hashlib
import os
from array import array
from collections import abc
from dataclasses import dataclass, field
from typing import NamedTuple

from pagesim.core.sampling import SamplingParams

# Token ids as unsigned 64-bit items (never negative): the array module converts a Python
# int to an unsigned item directly, to a signed one through its argument parser, at about
# twice the cost of an append. An id's bytes, and so its block's hash, are the same in both.
TOKEN_CODE = "Q"
# Token ids as they come: a list, a tuple or an array of TOKEN_CODE items.
TokenIds = abc.Sequence[int]


def family_of(seq_id: str) -> str:
    """The request a sequence belongs to: its samples and beams are ``request/s0``,
    ``request/b1`` … (vLLM's sequence group)."""
    return seq_id.split("/", 1)[0]


@dataclass(slots=True)
class Sequence:
    seq_id: str
    # 8 bytes a token (a list of ints held 40): a run holds every token of every sequence.
    token_ids: array = field(default_factory=lambda: array(TOKEN_CODE))
    block_table: list[int] = field(default_factory=list)  # logical block index -> physical block id
    # Prefix caching: the chained hash of each full logical block (parent hash, token ids).
    block_hashes: list[int] = field(default_factory=list)
    owner: str | None = None  # the scheduler's request that runs it; None: the user's own
    # How a real model picks its next tokens (None: greedy, no limit; the synthetic model
    # ignores it) and how many of its tokens are the prompt (what it generated follows).
    sampling: SamplingParams | None = None
    prompt_len: int = 0
    # Block hashes of these very tokens found before, in order (a v1 request's, kept across
    # its preemptions as vLLM's Request.block_hashes): taken instead of hashed again, and
    # extended as blocks fill. Never copied to a fork or a snapshot (their tokens part).
    known_hashes: list[int] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.token_ids, array) or self.token_ids.typecode != TOKEN_CODE:
            self.token_ids = array(TOKEN_CODE, self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def snapshot(self) -> SequenceSnapshot:
        # Token ids are only ever appended to: the snapshot shares the live array and keeps
        # its length, instead of copying every token of every sequence at every snapshot.
        return SequenceSnapshot(
            self.seq_id,
            self.token_ids,
            len(self.token_ids),
            tuple(self.block_table),
            tuple(self.block_hashes),
            self.owner,
            self.sampling,
            self.prompt_len,
        )

    @property
    def generated(self) -> int:
        return len(self.token_ids) - self.prompt_len

    def copy(self, seq_id: str | None = None) -> Sequence:
        return Sequence(
            seq_id or self.seq_id,
            array(TOKEN_CODE, self.token_ids),
            list(self.block_table),
            list(self.block_hashes),
            self.owner,
            self.sampling,
            self.prompt_len,
        )


class SequenceSnapshot(NamedTuple):
    seq_id: str
    token_ids: array  # shared with the live sequence, which only appends: read up to num_tokens
    num_tokens: int
    block_table: tuple[int, ...]
    block_hashes: tuple[int, ...]
    owner: str | None
    sampling: SamplingParams | None = None
    prompt_len: int = 0

    def restore(self) -> Sequence:
        return Sequence(
            self.seq_id,
            self.token_ids[: self.num_tokens],
            list(self.block_table),
            list(self.block_hashes),
            self.owner,
            self.sampling,
            self.prompt_len,
        )


# The chain's root is random per run (vLLM's NONE_HASH): a hash cannot be predicted, so a
# crafted prompt cannot be made to collide with another's prefix (CVE-2025-25183).
_ROOT = os.urandom(16)


def block_hash(parent: int | None, token_ids: tuple[int, ...] | array) -> int:
    """vLLM's chained block hash: SHA-256 of the parent's hash and the block's token ids,
    so a hash names a whole prefix. Hits still compare the tokens."""
    digest = hashlib.sha256(_ROOT if parent is None else parent.to_bytes(16, "little"))
    digest.update(token_ids if isinstance(token_ids, array) else array(TOKEN_CODE, token_ids))
    return int.from_bytes(digest.digest()[:16], "little")
