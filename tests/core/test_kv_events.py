"""The engine's KV events in vLLM's wire format: pagesim's payloads decoded with vLLM's own
structs (copied below as data definitions), byte for byte the same encoding, and the events
of both schedulers consistent as a consumer sees them (every removal names a stored hash,
every parent is stored first, every hash is the chain of its tokens)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from pagesim.core import kv_events as kv
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.operations import Schedule, Submit
from pagesim.core.scenario import load_scenario
from pagesim.core.timeline import Timeline
from pagesim.core.trace import load_workload
from pagesim.kernels.cpu_backend import CpuBackend

from tests.scenarios import token_model

TRACES = Path(__file__).resolve().parents[1] / "traces" / "vllm_v1"


# -- vLLM's structs, copied from vllm/distributed/kv_events.py (vllm-project/vllm) ---------
class VllmEventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class VllmKVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(VllmKVCacheEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(VllmKVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(VllmKVCacheEvent):
    pass


class VllmKVEventBatch(VllmEventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


VLLM_DECODER = msgspec.msgpack.Decoder(VllmKVEventBatch)
VLLM_TYPES = {kv.BlockStored: BlockStored, kv.BlockRemoved: BlockRemoved, kv.AllBlocksCleared: AllBlocksCleared}


def as_vllm(event: kv.KVCacheEvent):
    return VLLM_TYPES[type(event)](**msgspec.structs.asdict(event))


def v1_batches(name: str = "workload-1") -> list[kv.KVEventBatch]:
    """The events of a v1 run of a recorded workload, one batch per step that has any."""
    workload = load_workload(TRACES / f"{name}.json")
    config = workload.cache_config()
    sim = Simulator(config, kv_data=False)
    converter = kv.KVEventConverter(sim)
    batches, arriving = [], {}
    for request in workload.requests:
        arriving.setdefault(request.arrival_step, []).append(request)
    for step in range(2000):
        for request in arriving.get(step, []):
            sim.apply(Submit(request.id, request.max_new_tokens, prompt=request.prompt), attend=False)
            sim.scheduler.prescribe(request.id, request.output)
        events = converter.convert(sim.apply(Schedule(1), attend=False).op_events)
        if events:
            batches.append(kv.make_batch(events, ts=1000.0 + step, rank=0))
        if step > max(arriving) and not sim.scheduler.running and not sim.scheduler.waiting:
            break
    return batches


def test_vllm_structs_decode_pagesims_payload():
    batches = v1_batches()
    assert any(isinstance(e, kv.BlockRemoved) for b in batches for e in b.events)
    for batch in [*batches, kv.make_batch([kv.AllBlocksCleared()], ts=5.0)]:
        decoded = VLLM_DECODER.decode(kv.encode_batch(batch))
        assert decoded.ts == batch.ts and decoded.data_parallel_rank == batch.data_parallel_rank
        assert decoded.events == [as_vllm(e) for e in batch.events]


def test_encoding_is_vllms_byte_for_byte():
    for batch in v1_batches("workload-5"):
        theirs = VllmKVEventBatch(ts=batch.ts, events=[as_vllm(e) for e in batch.events], data_parallel_rank=0)
        assert kv.encode_batch(batch) == msgspec.msgpack.encode(theirs)
        assert kv.decode_batch(msgspec.msgpack.encode(theirs)) == batch


def test_wire_shape_tags_and_omitted_defaults():
    stored = kv.BlockStored([7], None, [1, 2], 2, None, "GPU", None)
    raw = msgspec.msgpack.decode(kv.encode_batch(kv.make_batch([stored, kv.AllBlocksCleared()], ts=1.0)))
    assert raw["ts"] == 1.0 and "data_parallel_rank" not in raw  # a default is omitted
    first, second = raw["events"]
    assert first["type"] == "BlockStored" and list(first)[1:] == [
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
    ]
    assert second == {"type": "AllBlocksCleared"}


def consumer_view(batches: list[kv.KVEventBatch], block_size: int) -> dict[int, int]:
    """What a consumer keeps, checked as it goes: each stored hash, how many blocks hold it."""
    held: dict[int, int] = {}
    hashes = kv.ChainHashes(block_size)
    tokens_of: dict[int, list[int]] = {}
    for batch in batches:
        for event in batch.events:
            if isinstance(event, kv.BlockStored):
                parent = event.parent_block_hash
                assert parent is None or parent in tokens_of, "a parent is stored before its children"
                prefix = [] if parent is None else tokens_of[parent]
                tokens = prefix + event.token_ids
                assert len(event.token_ids) == block_size * len(event.block_hashes)
                chain = hashes.chain(tokens, len(tokens) // block_size)
                assert [kv.published(h) for h in chain[len(prefix) // block_size :]] == event.block_hashes
                for i, value in enumerate(event.block_hashes):
                    tokens_of[value] = tokens[: len(prefix) + (i + 1) * block_size]
                    held[value] = held.get(value, 0) + 1
            elif isinstance(event, kv.BlockRemoved):
                for value in event.block_hashes:
                    assert held.get(value), "a removal names a stored hash"
                    held[value] -= 1
    return {h: n for h, n in held.items() if n}


def test_v1_events_are_consistent_for_a_consumer():
    batches = v1_batches("workload-7")
    assert consumer_view(batches, load_workload(TRACES / "workload-7.json").config["block_size"])


def test_v0_scheduler_events_finished_requests_included():
    config = CacheConfig(num_blocks=12, block_size=4, num_heads=1, head_dim=8, prefix_caching=True)
    sim = Simulator(config, kv_data=False)
    converter = kv.KVEventConverter(sim)
    system = list(range(100, 112))
    batches = []
    for i in range(6):
        sim.apply(Submit(f"r{i}", 5, prompt=[*system, 200 + i, 201 + i, 202 + i]), attend=False)
    for _ in range(100):
        events = converter.convert(sim.apply(Schedule(1), attend=False).op_events)
        batches.append(kv.make_batch(events, ts=0.0))
        if not sim.scheduler.running and not sim.scheduler.waiting:
            break
    stored = [e for b in batches for e in b.events if isinstance(e, kv.BlockStored)]
    removed = [e for b in batches for e in b.events if isinstance(e, kv.BlockRemoved)]
    assert stored and removed and any(e.parent_block_hash is not None for e in stored)
    live = consumer_view(batches, 4)
    assert sum(live.values()) == sim.blocks.pool.num_cached_free() + sum(
        1 for b in sim.blocks.pool.cached_blocks() if not sim.blocks.pool.is_free(b)
    )


@pytest.mark.parametrize("name", ["shared_system_prompt", "preemption_swap"])
def test_v0_scenarios_through_the_timeline(name):
    timeline = Timeline(load_scenario(token_model(name)), CpuBackend(), snapshot_data=False, history=False)
    converter = kv.KVEventConverter(timeline.sim)
    batches = []
    while not timeline.at_end:
        batches.append(kv.make_batch(converter.convert(timeline.forward().op_events), ts=0.0))
    live = consumer_view(batches, timeline.sim.config.block_size)
    assert sum(live.values()) == len(timeline.sim.blocks.pool.cached_blocks())
