"""A memory-only run without events (the scheduler benchmarks' path, where the block
manager skips every event) leaves the pool exactly as a recorded one does, and a v1
request hashes each block of its tokens once, however often it is preempted and admitted
again."""

import pytest
from pagesim.core import prefix_cache
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.operations import Schedule, Submit
from pagesim.core.studies.workload import generate

from tests.on_the_sources import on_the_sources


def _config(scheduler: str, block_size: int = 8) -> CacheConfig:
    v1_budget = {"max_num_batched_tokens": 96} if scheduler == "v1" else {}
    return CacheConfig(
        num_blocks=160, block_size=block_size, num_heads=1, head_dim=8, prefix_caching=True, max_num_seqs=24,
        scheduler=scheduler, **v1_budget,
    )  # fmt: skip


def _states(scheduler: str, record: bool, count: int = 50, block_size: int = 8) -> tuple[list, Simulator]:
    """The block manager's whole state after every step of a workload that preempts, and
    the simulator at its end."""
    sim = Simulator(_config(scheduler, block_size), kv_data=False)
    specs = generate("sharegpt", count, rate=20.0, seed=3, shared_prefix=16, max_len=300)
    states, index, clock = [], 0, 0.0
    scheduler_ = sim.scheduler
    while index < len(specs) or scheduler_.waiting or scheduler_.running or scheduler_.swapped:
        while index < len(specs) and specs[index].arrival <= clock:
            s = specs[index]
            sim.apply(Submit(s.request_id, s.output_len, prompt_len=s.prompt_len, shared_prefix=16), False, record)
            index += 1
        sim.apply(Schedule(1), attend=False, record=record)
        snap = sim.blocks.snapshot()
        tables = {name: (list(seq.token_ids), seq.block_table, seq.block_hashes) for name, seq in sim.sequences.items()}
        states.append((snap.pool, snap.block_fill, snap.usage, tables))
        clock += 0.05
    return states, sim


@pytest.mark.parametrize("scheduler", ["v0", "v1"])
@pytest.mark.parametrize("block_size", [8, 1])
def test_a_memory_only_step_leaves_the_pool_as_a_recorded_one_does(scheduler, block_size):
    """Events on or off, the same blocks taken, freed, cached and evicted, in the same
    order; with one-token blocks, every token fills a block and the next takes one."""
    recorded, sim = _states(scheduler, record=True, block_size=block_size)
    assert sim.scheduler.stats.preemptions > 0  # (the pool is small enough to preempt, and free and reuse blocks)
    assert _states(scheduler, record=False, block_size=block_size)[0] == recorded


@on_the_sources  # (it patches the compiled core)
def test_a_v1_request_hashes_each_block_of_its_tokens_once(monkeypatch):
    """vLLM's Request.block_hashes: a request preempted and admitted again (and one whose
    admission waits for blocks, step after step) looks its prompt up by the hashes it has."""
    hashed = []
    real_hash = prefix_cache.block_hash
    monkeypatch.setattr(prefix_cache, "block_hash", lambda *args: hashed.append(args) or real_hash(*args))
    _, sim = _states("v1", record=False)
    requests = sim.scheduler.requests.values()
    assert sim.scheduler.stats.preemptions >= 10 and max(r.preemptions for r in requests) >= 2
    # At most once per full block of each request's tokens (its last sample is never cached).
    assert 0 < len(hashed) <= sum((len(r.tokens) - 1) // 8 for r in requests)
