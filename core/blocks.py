"""The physical block pool: a free queue and a reference count per block.

The free queue is an intrusive doubly linked list over block ids (as in vLLM v1's
``FreeKVCacheBlockQueue``): allocation pops the head, a freed block joins the tail,
and a block named by an explicit placement leaves from the middle, all in O(1).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from core.errors import InvalidPlacementError, PoolExhaustedError

_NONE = -1


@dataclass(frozen=True)
class PoolSnapshot:
    ref_counts: tuple[int, ...]
    next_free: tuple[int, ...]
    prev_free: tuple[int, ...]
    head: int
    tail: int
    num_free: int


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

    def check_placement(self, block_ids: Iterable[int]) -> list[int]:
        """Validate an explicit placement without changing anything."""
        ids = list(block_ids)
        for block_id in ids:
            if not isinstance(block_id, int) or isinstance(block_id, bool):
                raise InvalidPlacementError(f"block id {block_id!r} is not an integer")
            if not 0 <= block_id < self.num_blocks:
                raise InvalidPlacementError(
                    f"block id {block_id} is out of range for a pool of {self.num_blocks} blocks"
                )
        if len(set(ids)) != len(ids):
            raise InvalidPlacementError(f"placement {ids} names a block more than once")
        busy = [b for b in ids if self._ref_counts[b]]
        if busy:
            raise InvalidPlacementError(f"block(s) {busy} are already in use")
        return ids

    # -- mutations (the engine validates before calling these) -------------------
    def allocate(self, count: int) -> list[int]:
        if count > self._num_free:
            raise PoolExhaustedError(count, self._num_free, "allocation")
        return [self._take(self._head) for _ in range(count)]

    def allocate_specific(self, block_ids: Iterable[int]) -> list[int]:
        ids = self.check_placement(block_ids)
        return [self._take(b) for b in ids]

    def share(self, block_id: int) -> int:
        """One more block table holds ``block_id``; returns the new ref count."""
        if self.ref_count(block_id) == 0:
            raise ValueError(f"block {block_id} is free and cannot be shared")
        self._ref_counts[block_id] += 1
        return self._ref_counts[block_id]

    def release(self, block_id: int) -> int:
        """One block table let go of ``block_id``; at zero it joins the free queue's tail."""
        if self.ref_count(block_id) == 0:
            raise ValueError(f"block {block_id} is already free")
        self._ref_counts[block_id] -= 1
        if self._ref_counts[block_id] == 0:
            self._append_free(block_id)
        return self._ref_counts[block_id]

    # -- snapshots -------------------------------------------------------------
    def snapshot(self) -> PoolSnapshot:
        return PoolSnapshot(
            tuple(self._ref_counts), tuple(self._next), tuple(self._prev), self._head, self._tail, self._num_free
        )

    def restore(self, snap: PoolSnapshot) -> None:
        self._ref_counts = list(snap.ref_counts)
        self._next, self._prev = list(snap.next_free), list(snap.prev_free)
        self._head, self._tail, self._num_free = snap.head, snap.tail, snap.num_free

    # -- internals -------------------------------------------------------------
    def _check_id(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block id {block_id} is out of range for a pool of {self.num_blocks} blocks")

    def _take(self, block_id: int) -> int:
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

    def _append_free(self, block_id: int) -> None:
        self._prev[block_id], self._next[block_id] = self._tail, _NONE
        if self._tail == _NONE:
            self._head = block_id
        else:
            self._next[self._tail] = block_id
        self._tail = block_id
        self._num_free += 1
