"""The physical block pool: a free queue and a reference count per block.

The free queue is an intrusive doubly linked list over block ids (as in vLLM v1's
``FreeKVCacheBlockQueue``): allocation pops the head, a freed block joins the tail,
and a block named by an explicit placement leaves from the middle, all in O(1).

Prefix caching: a full block may carry the hash of its tokens (chained with its
parent's). A freed block keeps its hash and its data, so a later prompt with the same
prefix can take it back from the middle of the queue; the head of the queue is the
least recently used block, and allocating it evicts its hash. A block is therefore
free-uncached, free-cached or referenced, and a hash maps only to a block that holds
exactly those tokens.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from pagesim.core.checks import is_int
from pagesim.core.errors import InvalidPlacementError, PoolExhaustedError
from pagesim.core.sequence import TOKEN_CODE

_NONE = -1


@dataclass(frozen=True)
class PoolSnapshot:
    ref_counts: tuple[int, ...]
    next_free: tuple[int, ...]
    prev_free: tuple[int, ...]
    head: int
    tail: int
    num_free: int
    hashes: tuple[tuple[int, int, array, int], ...] = ()  # (block, hash, token ids, first position)


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be ≥ 1; got {num_blocks}")
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._next = [*list(range(1, num_blocks)), _NONE]
        self._prev = [_NONE, *list(range(num_blocks - 1))]
        self._head = 0
        self._tail = num_blocks - 1
        self._num_free = num_blocks
        self._hash_of: dict[int, int] = {}  # block -> its registered hash
        # block -> the token ids it holds: a 64-bit array (TOKEN_CODE), never changed once stored (a tuple
        # cost 16 int objects to build and to free per block, once a block of tokens)
        self._tokens_of: dict[int, array] = {}
        self._position_of: dict[int, int] = {}  # block -> the position of its first token
        # hash -> the blocks cached under it (insertion order): as vLLM v1, every full block
        # keeps its hash, so evicting one twin leaves the prefix reachable through another.
        self._block_of: dict[int, dict[int, None]] = {}
        self._cached_free = 0  # free blocks that still hold a cached prefix
        # vLLM v1's order: a freed block without a hash goes to the head of the queue (reused
        # first), those of one release batch in the order released; hashed ones to the tail.
        self.uncached_first = False
        self._front = _NONE  # the last block this batch put at the head

    # -- queries -------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def num_used(self) -> int:
        return self.num_blocks - self._num_free

    def ref_count(self, block_id: int) -> int:
        self._check_id(block_id)
        return self._ref_counts[block_id]

    def ref_counts(self) -> list[int]:
        return list(self._ref_counts)

    def is_free(self, block_id: int) -> bool:
        return self.ref_count(block_id) == 0

    def free_blocks(self) -> list[int]:
        """Free block ids in queue order (the next allocation comes first)."""
        out, block = [], self._head
        while block != _NONE:
            out.append(block)
            block = self._next[block]
        return out

    # -- prefix cache ---------------------------------------------------------------
    def cached_block(self, block_hash: int, token_ids: array | tuple[int, ...]) -> int | None:
        """The block cached under ``block_hash`` if it holds exactly ``token_ids``."""
        if type(token_ids) is not array:
            token_ids = array(TOKEN_CODE, token_ids)
        for block in self._block_of.get(block_hash, ()):
            if self._tokens_of[block] == token_ids:  # never trust a hash alone
                return block
        return None

    def blocks_under(self, block_hash: int) -> list[int]:
        """Every block cached under ``block_hash`` (twins holding the same prefix)."""
        return list(self._block_of.get(block_hash, ()))

    def hash_of(self, block_id: int) -> int | None:
        return self._hash_of.get(block_id)

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._hash_of

    def num_cached_free(self) -> int:
        return self._cached_free

    def cached_blocks(self) -> list[int]:
        return list(self._hash_of)

    def cached_tokens(self, block_id: int) -> tuple[tuple[int, ...], int] | None:
        """A cached block's token ids and the position of the first, or None."""
        if block_id not in self._hash_of:
            return None
        return tuple(self._tokens_of[block_id]), self._position_of[block_id]

    def register(
        self, block_id: int, block_hash: int, token_ids: array | tuple[int, ...], first_position: int = 0
    ) -> bool:
        """Cache a full, referenced block under its hash (False if it is cached already).
        Another block may hold the same prefix: both stay cached."""
        if self.ref_count(block_id) == 0:
            raise ValueError(f"block {block_id} is free and cannot be cached")
        return self.register_held(block_id, block_hash, array(TOKEN_CODE, token_ids), first_position)

    def register_held(self, block_id: int, block_hash: int, token_ids: array, first_position: int) -> bool:
        """:meth:`register` of a block the caller holds (a sequence's full block): unchecked;
        ``token_ids`` (a 64-bit array) is kept, not copied."""
        if block_id in self._hash_of:
            return False
        self._block_of.setdefault(block_hash, {})[block_id] = None
        self._hash_of[block_id] = block_hash
        self._tokens_of[block_id] = token_ids
        self._position_of[block_id] = first_position
        return True

    def reuse(self, block_id: int) -> int:
        """A prefix-cache hit: take a cached block back from the free queue, or share it."""
        if block_id not in self._hash_of:
            raise ValueError(f"block {block_id} is not cached")
        refs = self._ref_counts
        if refs[block_id] == 0:
            self._take(block_id)
            return 1
        refs[block_id] += 1  # (share, its free-block check already answered)
        return refs[block_id]

    def _evict(self, block_id: int) -> bool:
        block_hash = self._hash_of.pop(block_id, None)
        if block_hash is None:
            return False
        twins = self._block_of[block_hash]
        del twins[block_id]
        if not twins:
            del self._block_of[block_hash]
        del self._tokens_of[block_id]
        del self._position_of[block_id]
        return True

    def check_placement(self, block_ids: Iterable[object]) -> list[int]:
        """Validate an explicit placement without changing anything (the ids as given may be
        anything: each is checked here, before any is used as an int)."""
        given = list(block_ids)
        for item in given:
            if not is_int(item):
                raise InvalidPlacementError(f"block id {item!r} is not an integer")
        ids = [int(item) for item in given]  # type: ignore[call-overload]  # (each is an int)
        for block_id in ids:
            if not 0 <= block_id < self.num_blocks:
                raise InvalidPlacementError(
                    f"block id {block_id} is out of range for a pool of {self.num_blocks} blocks"
                )
        if len(set(ids)) != len(ids):
            raise InvalidPlacementError(f"placement {ids} names a block more than once")
        busy = [b for b in ids if self._ref_counts[b]]
        if busy:
            raise InvalidPlacementError(
                f"block {busy[0]} is already in use" if len(busy) == 1 else f"blocks {busy} are already in use"
            )
        return ids

    # -- mutations (the engine validates before calling these) -------------------
    def allocate(self, count: int, evicted: list[int] | None = None) -> list[int]:
        """Take ``count`` blocks from the head of the free queue (least recently used
        first); cached blocks among them lose their hash and are listed in ``evicted``."""
        if count > self._num_free:
            raise PoolExhaustedError(count, self._num_free, "allocation")
        out = []
        for _ in range(count):
            block = self._take(self._head)
            if self._evict(block) and evicted is not None:
                evicted.append(block)
            out.append(block)
        return out

    def allocate_one(self) -> tuple[int, bool]:
        """:meth:`allocate` of one block: (the block, whether it was evicted from the cache)."""
        if not self._num_free:
            raise PoolExhaustedError(1, 0, "allocation")
        block = self._take(self._head)
        return block, self._evict(block)

    def allocate_specific(self, block_ids: Iterable[int], evicted: list[int] | None = None) -> list[int]:
        ids = self.check_placement(block_ids)
        for b in ids:
            self._take(b)
            if self._evict(b) and evicted is not None:
                evicted.append(b)
        return ids

    def share(self, block_id: int) -> int:
        """One more block table holds ``block_id``; returns the new ref count."""
        if self.ref_count(block_id) == 0:
            raise ValueError(f"block {block_id} is free and cannot be shared")
        self._ref_counts[block_id] += 1
        return self._ref_counts[block_id]

    def release(self, block_id: int) -> int:
        """One block table let go of ``block_id``; at zero it joins the free queue's tail."""
        refs = self._ref_counts
        if not 0 <= block_id < self.num_blocks or refs[block_id] == 0:
            self._check_id(block_id)
            raise ValueError(f"block {block_id} is already free")
        left = refs[block_id] = refs[block_id] - 1
        if left == 0:
            if self.uncached_first and block_id not in self._hash_of:
                self._insert_front(block_id)
            else:
                self._append_free(block_id)
            self._cached_free += block_id in self._hash_of
        return left

    def begin_release(self) -> None:
        """A new batch of releases (one sequence's table): with ``uncached_first``, its
        unhashed blocks go to the head ahead of the older free blocks, in the order released."""
        self._front = _NONE

    # -- snapshots -------------------------------------------------------------
    def snapshot(self) -> PoolSnapshot:
        hashes = tuple((b, h, self._tokens_of[b], self._position_of[b]) for b, h in self._hash_of.items())
        return PoolSnapshot(
            tuple(self._ref_counts),
            tuple(self._next),
            tuple(self._prev),
            self._head,
            self._tail,
            self._num_free,
            hashes,
        )

    def restore(self, snap: PoolSnapshot) -> None:
        self._ref_counts = list(snap.ref_counts)
        self._next, self._prev = list(snap.next_free), list(snap.prev_free)
        self._head, self._tail, self._num_free = snap.head, snap.tail, snap.num_free
        self._hash_of = {b: h for b, h, _, _ in snap.hashes}
        self._tokens_of = {b: t for b, _, t, _ in snap.hashes}
        self._position_of = {b: p for b, _, _, p in snap.hashes}
        self._block_of = {}
        for b, h, _, _ in snap.hashes:
            self._block_of.setdefault(h, {})[b] = None
        self._cached_free = sum(1 for b in self._hash_of if self._ref_counts[b] == 0)

    # -- internals -------------------------------------------------------------
    def _check_id(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block id {block_id} is out of range for a pool of {self.num_blocks} blocks")

    def _take(self, block_id: int) -> int:
        if block_id in self._hash_of:
            self._cached_free -= 1
        prev, nxt = self._prev[block_id], self._next[block_id]
        if prev == _NONE:
            self._head = nxt
        else:
            self._next[prev] = nxt
        if nxt == _NONE:
            self._tail = prev
        else:
            self._prev[nxt] = prev
        self._next[block_id] = self._prev[block_id] = _NONE
        self._ref_counts[block_id] = 1
        self._num_free -= 1
        return block_id

    def _insert_front(self, block_id: int) -> None:
        after = self._front
        nxt = self._head if after == _NONE else self._next[after]
        self._prev[block_id], self._next[block_id] = after, nxt
        if after == _NONE:
            self._head = block_id
        else:
            self._next[after] = block_id
        if nxt == _NONE:
            self._tail = block_id
        else:
            self._prev[nxt] = block_id
        self._front = block_id
        self._num_free += 1

    def _append_free(self, block_id: int) -> None:
        self._prev[block_id], self._next[block_id] = self._tail, _NONE
        if self._tail == _NONE:
            self._head = block_id
        else:
            self._next[self._tail] = block_id
        self._tail = block_id
        self._num_free += 1
