"""The prefix cache's side of the block manager: chained hashes of full blocks (vLLM's and
nano-vllm's scheme: a block's hash covers its tokens and its parent's hash), the lookup of
a prompt's cached prefix, and the hit counters. The blocks themselves, cached or not, stay
in the :class:`~pagesim.core.blocks.BlockPool`, which maps hashes to blocks."""

from __future__ import annotations

from array import array
from collections.abc import Iterator

from pagesim.core import events as ev
from pagesim.core.blocks import BlockPool
from pagesim.core.config import CacheConfig
from pagesim.core.events import EventLog
from pagesim.core.sequence import TOKEN_CODE, Sequence, TokenIds, block_hash


def _hash_once(parent: int | None, token_ids: array, index: int, known: list[int] | None) -> int:
    """Block ``index``'s chained hash: taken from ``known`` (the hashes of the same tokens'
    first blocks, found before) when it has it, else computed and, as the next, kept there."""
    if known is not None and index < len(known):
        return known[index]
    h = block_hash(parent, token_ids)
    if known is not None and index == len(known):
        known.append(h)
    return h


class PrefixCache:
    def __init__(self, config: CacheConfig, pool: BlockPool, events: EventLog) -> None:
        self.block_size = config.block_size
        self.pool = pool
        self.events = events
        self.lookups = 0  # full prompt blocks looked up
        self.hits = 0  # ... and found cached

    def _chunks(self, token_ids, start: int, stop: int) -> Iterator[tuple[int, array]]:
        """(index, token ids as an array of 64-bit items) of full logical blocks ``start`` … ``stop - 1``."""
        bs = self.block_size
        # (a slice of an array of token ids is one already)
        as_array = type(token_ids) is not array or token_ids.typecode != TOKEN_CODE
        for index in range(start, stop):
            chunk = token_ids[index * bs : (index + 1) * bs]
            yield index, array(TOKEN_CODE, chunk) if as_array else chunk

    def match(self, token_ids: TokenIds, known: list[int] | None = None) -> list[tuple[int, int]]:
        """(block, hash) of the cached full blocks this prompt starts with. The block of the
        last prompt token is never reused: its query must be computed. ``known``: the hashes
        of these tokens' first blocks found before, taken as they are and extended here."""
        hits: list[tuple[int, int]] = []
        parent = None
        for index, chunk in self._chunks(token_ids, 0, (len(token_ids) - 1) // self.block_size):
            h = _hash_once(parent, chunk, index, known)
            block = self.pool.cached_block(h, chunk)
            if block is None:
                break
            hits.append((block, h))
            parent = h
        return hits

    def note_lookup(self, num_tokens: int, hits: int) -> None:
        self.lookups += (num_tokens - 1) // self.block_size
        self.hits += hits

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Hash ``seq``'s blocks that filled up since its last hash and register them."""
        bs, ids, hashes, table = self.block_size, seq.token_ids, seq.block_hashes, seq.block_table
        register, events, known = self.pool.register_held, self.events, seq.known_hashes
        h = hashes[-1] if hashes else None
        for index in range(len(hashes), len(ids) // bs):
            first = index * bs
            raw = ids[first : first + bs]  # (an array slice: a copy the pool keeps)
            h = _hash_once(h, raw, index, known)
            hashes.append(h)
            if register(table[index], h, raw, first) and events.enabled:
                events.emit(ev.BlockCached(table[index], seq.seq_id, h))

    def recache(self, seq: Sequence) -> None:
        """Register ``seq``'s hashed blocks again under their new ids (after a swap in)."""
        chunks = self._chunks(seq.token_ids, 0, len(seq.block_hashes))
        for (index, chunk), h in zip(chunks, seq.block_hashes, strict=True):
            if self.pool.register(seq.block_table[index], h, chunk, index * self.block_size):
                self.events.add(ev.BlockCached, seq.block_table[index], seq.seq_id, h)
