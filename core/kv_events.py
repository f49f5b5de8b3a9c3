"""The engine's prefix-cache events as vLLM's KV events: the ``KVEventBatch`` a vLLM server
publishes after each engine step (``BlockStored`` when full blocks enter the prefix cache,
``BlockRemoved`` when a cached block is evicted, ``AllBlocksCleared`` on a reset).

The structs reproduce ``vllm/distributed/kv_events.py`` field for field (names, order,
types, defaults, the tag and the encoder options), so that msgspec's MessagePack encoding
of a batch here is byte for byte what vLLM's publisher sends and a decoder built from
vLLM's own structs reads it. Block hashes are vLLM's chained SHA-256 hashes (below, also
those of :mod:`pagesim.core.trace`), published as their low 64 bits (vLLM's integer hashes).

:class:`KVEventConverter` turns one step's engine events into these structs, for either
scheduler; it keeps what a later removal needs (each cached block's published hash).
The network side (the ZeroMQ publisher) lives in the app: the engine never imports it.
"""

from __future__ import annotations

import hashlib
import pickle
import time
from array import array
from collections.abc import Iterable
from typing import Any

import msgspec
from pagesim.core import events as ev
from pagesim.core.engine import Simulator

# vLLM's ExternalBlockHash: the published form of a block hash (an int here, as vLLM
# publishes with integer block hashes; bytes when it publishes raw digests).
ExternalBlockHash = bytes | int
MEDIUM_GPU = "GPU"
FULL_ATTENTION = "full_attention"


# -- vLLM's block hashes ------------------------------------------------------------------
def _sha256(value) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


NONE_HASH = _sha256("0")  # what vLLM's init_none_hash makes of PYTHONHASHSEED=0


def published(block_hash: bytes) -> int:
    """A hash as vLLM's KV events publish it (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES): its low 64 bits."""
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)


class ChainHashes:
    """vLLM's chained block hashes of token prefixes, memoised by (parent, block)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._memo: dict[tuple[bytes, tuple[int, ...]], bytes] = {}

    def chain(self, tokens: list[int], blocks: int) -> list[bytes]:
        parent, out, bs = NONE_HASH, [], self.block_size
        for index in range(blocks):
            key = (parent, tuple(tokens[index * bs : (index + 1) * bs]))
            if (value := self._memo.get(key)) is None:
                value = self._memo[key] = _sha256((parent, key[1], None))
            out.append(value)
            parent = value
        return out


# -- vLLM's structs (vllm/distributed/kv_events.py) ---------------------------------------
class EventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events."""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    """The batch's payload as vLLM's publisher encodes it (msgspec MessagePack)."""
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    return _DECODER.decode(payload)


def make_batch(events: list[KVCacheEvent], ts: float | None = None, rank: int | None = None) -> KVEventBatch:
    return KVEventBatch(ts=time.time() if ts is None else ts, events=events, data_parallel_rank=rank)


# -- the engine's events → vLLM's -----------------------------------------------------------
class KVEventConverter:
    """One step's engine events → the step's vLLM KV events, in the order vLLM emits them:
    one ``BlockStored`` per run of blocks one sequence cached in a row (with the hash of the
    block before the first, if any), one ``BlockRemoved`` per evicted block.

    Call :meth:`convert` with every step's events, in order, from the engine's first step:
    a removal names the hash its block was stored under. A block cached and evicted within
    one step is announced by neither event (its tokens are gone before the step ends)."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.block_size = sim.config.block_size
        self.hashes = ChainHashes(self.block_size)
        self._held: dict[int, int] = {}  # cached block → its published hash
        # Sequences alive at the end of the last step: one freed during a step (a v0 request
        # that finished) still names its tokens.
        self._seen: dict[str, Any] = {}

    def _tokens(self, seq_id: str):
        request = getattr(self.sim.scheduler, "requests", {}).get(seq_id)
        if isinstance(getattr(request, "tokens", None), array):  # the v1 scheduler's requests keep theirs
            return request.tokens
        registry = self.sim.registry
        seq = registry.sequences.get(seq_id) or registry.swapped.get(seq_id) or self._seen.get(seq_id)
        return None if seq is None else seq.token_ids

    def _stored(self, group: list[ev.BlockCached]) -> BlockStored | None:
        cached = self.sim.blocks.pool.cached_tokens(group[0].block)
        tokens = self._tokens(group[0].seq)
        if cached is None or tokens is None:
            return None
        bs = self.block_size
        first = cached[1] // bs
        chain = self.hashes.chain(tokens, first + len(group))
        values = [published(h) for h in chain[first:]]
        self._held.update((e.block, v) for e, v in zip(group, values, strict=True))
        return BlockStored(
            block_hashes=values,
            parent_block_hash=published(chain[first - 1]) if first else None,
            token_ids=list(tokens[first * bs : (first + len(group)) * bs]),
            block_size=bs,
            lora_id=None,
            medium=MEDIUM_GPU,
            lora_name=None,
            extra_keys=[None] * len(group),
            group_idx=0,
            kv_cache_spec_kind=FULL_ATTENTION,
        )

    def convert(self, events: Iterable[ev.Event]) -> list[KVCacheEvent]:
        # Group first, convert after: a group's blocks are looked up once the step is over.
        items: list[list[ev.BlockCached] | int] = []
        for event in events:
            if isinstance(event, ev.BlockCached):
                last = items[-1] if items else None
                if isinstance(last, list) and last[-1].seq == event.seq:
                    last.append(event)
                else:
                    items.append([event])
            elif isinstance(event, ev.BlockEvicted):
                items.append(event.block)
        out: list[KVCacheEvent] = []
        for item in items:
            if isinstance(item, list):
                if (stored := self._stored(item)) is not None:
                    out.append(stored)
            elif (value := self._held.pop(item, None)) is not None:
                out.append(BlockRemoved(block_hashes=[value], medium=MEDIUM_GPU, group_idx=0))
        registry = self.sim.registry
        self._seen = {**registry.sequences, **registry.swapped}
        return out

    def clear(self) -> list[KVCacheEvent]:
        """The events of a prefix-cache reset: every cached block is forgotten at once."""
        self._held.clear()
        return [AllBlocksCleared()]
