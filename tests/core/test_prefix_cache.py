import pytest
from pagesim.core import events as ev
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.errors import PoolExhaustedError
from pagesim.core.operations import Add, Free, Grow

from tests.core.helpers import check_invariants, state_fingerprint
from tests.on_the_sources import on_the_sources

SYSTEM = tuple(range(100, 112))  # 12 tokens = 3 full blocks of 4


@pytest.fixture
def sim(cpu_backend):
    config = CacheConfig(num_blocks=12, block_size=4, num_heads=2, num_kv_heads=1, head_dim=8, prefix_caching=True)
    return Simulator(config, cpu_backend)


def of(result, kind):
    return [e for e in result.events if isinstance(e, kind)]


def test_a_shared_prefix_reuses_full_blocks_without_computing_them(sim):
    first = sim.apply(Add("a", prompt=(*SYSTEM, 1, 2)))
    assert [e.block for e in of(first, ev.BlockCached)] == [0, 1, 2]
    second = sim.apply(Add("b", prompt=(*SYSTEM, 7, 8, 9)))
    reused = of(second, ev.BlockReused)
    assert [(e.block, e.logical_index, e.ref_count, e.was_free) for e in reused] == [
        (0, 0, 2, False),
        (1, 1, 2, False),
        (2, 2, 2, False),
    ]
    assert [e.position for e in of(second, ev.TokenWritten)] == [12, 13, 14]  # only the suffix is computed
    assert sim.sequence("b").block_table[:3] == [0, 1, 2]
    m = second.metrics
    assert (m.prefix_lookup_blocks, m.prefix_hit_blocks, m.shared_blocks, m.used_blocks) == (6, 3, 3, 5)
    assert m.prefix_hit_rate == 0.5  # the first request missed all three
    assert second.attention.passed  # the kernel reads the shared blocks; dense recomputes them
    check_invariants(sim)


def test_the_last_prompt_token_is_always_computed(sim):
    sim.apply(Add("a", prompt=SYSTEM))
    result = sim.apply(Add("b", prompt=SYSTEM))
    assert len(of(result, ev.BlockReused)) == 2  # not the block holding the last token
    assert [e.position for e in of(result, ev.TokenWritten)] == [8, 9, 10, 11]
    check_invariants(sim)


def test_freed_blocks_stay_cached_and_come_back_from_the_free_queue(sim):
    sim.apply(Add("a", prompt=(*SYSTEM, 1)))
    freed = sim.apply(Free("a"))
    assert freed.metrics.cached_free_blocks == 3 and freed.metrics.slots_filled == 0
    result = sim.apply(Add("b", prompt=(*SYSTEM, 5)))
    assert [(e.block, e.was_free, e.ref_count) for e in of(result, ev.BlockReused)] == [
        (0, True, 1),
        (1, True, 1),
        (2, True, 1),
    ]
    assert result.metrics.cached_free_blocks == 0 and result.attention.passed
    check_invariants(sim)


def test_allocation_evicts_the_least_recently_used_cached_block(sim):
    sim.apply(Add("a", prompt=(*SYSTEM, 1)))  # blocks 0-3, 0-2 cached
    sim.apply(Free("a"))  # free queue: 4..11, then 3, 2, 1, 0 (freed in reverse)
    result = sim.apply(Add("b", 4 * 10))  # takes 4..11 then 3 and 2: block 2 is evicted
    assert [e.block for e in of(result, ev.BlockEvicted)] == [2]
    sim.apply(Free("b"))
    again = sim.apply(Add("c", prompt=(*SYSTEM, 9)))
    assert again.metrics.prefix_hit_blocks == 2  # blocks 0, 1 still cached; block 2 was lost
    check_invariants(sim)


@on_the_sources  # (it patches the compiled core)
def test_a_hash_match_alone_is_not_a_hit(sim, monkeypatch):
    from pagesim.core import prefix_cache

    monkeypatch.setattr(prefix_cache, "block_hash", lambda parent, tokens: 42)  # every hash collides
    sim.apply(Add("a", prompt=(*SYSTEM, 1)))
    result = sim.apply(Add("b", prompt=(1, 2, 3, 4, 5)))
    assert not of(result, ev.BlockReused)
    assert result.attention.passed


def test_hits_on_free_blocks_count_toward_exhaustion(sim):
    sim.apply(Add("a", prompt=(*SYSTEM, 1)))
    sim.apply(Free("a"))
    sim.apply(Add("x", 4 * 8))  # 8 of the 12 blocks; the 3 cached ones and one more stay free
    before = state_fingerprint(sim)
    with pytest.raises(PoolExhaustedError, match="needs 5 free block"):
        sim.apply(Add("b", prompt=(*SYSTEM, *range(200, 206))))  # 3 hits (free) + 2 new > 4 free
    assert state_fingerprint(sim) == before


def test_growth_caches_blocks_as_they_fill_and_forks_diverge_cleanly(sim):
    sim.apply(Add("a", prompt=(1, 2, 3)))
    result = sim.apply(Grow("a", token_ids=(4,)))
    assert [e.block for e in of(result, ev.BlockCached)] == [0]
    check_invariants(sim)


def test_prefix_caching_is_off_by_default(cpu_backend):
    sim = Simulator(CacheConfig(num_blocks=12, block_size=4, num_heads=2, head_dim=8), cpu_backend)
    sim.apply(Add("a", prompt=(*SYSTEM, 1)))
    result = sim.apply(Add("b", prompt=(*SYSTEM, 1)))
    assert not of(result, ev.BlockReused) and not of(result, ev.BlockCached)
    assert result.metrics.used_blocks == 8


def test_a_prefix_stays_reachable_when_its_first_cached_twin_is_evicted(cpu_backend):
    """4 blocks of 4: A and B hold the same 8 tokens; A is freed and its blocks evicted by C.
    B's identical blocks are cached too (as in vLLM v1 and nano-vllm), so D still gets 2 hits."""
    sim = Simulator(CacheConfig(num_blocks=4, block_size=4, num_heads=1, head_dim=8, prefix_caching=True), cpu_backend)
    prompt = tuple(range(1, 9))
    sim.apply(Add("A", prompt=prompt))
    sim.apply(Add("B", prompt=prompt))
    sim.apply(Free("A"))
    sim.apply(Add("C", prompt=tuple(range(100, 108))))
    sim.apply(Free("C"))
    result = sim.apply(Add("D", prompt=(*prompt, 9)))
    hits = [e for e in result.events if isinstance(e, ev.BlockReused)]
    assert [e.logical_index for e in hits] == [0, 1]
    assert {e.block for e in hits} == set(sim.sequence("B").block_table)


def test_block_hashes_are_cryptographic_and_seeded_per_run():
    import subprocess
    import sys

    from pagesim.core.sequence import block_hash

    tokens = (1, 2, 3, 4)
    assert block_hash(None, tokens) == block_hash(None, tokens)
    assert block_hash(None, tokens) != block_hash(None, (1, 2, 3, 5))
    assert block_hash(block_hash(None, tokens), tokens) != block_hash(None, tokens)  # the chain matters
    code = "from pagesim.core.sequence import block_hash; print(block_hash(None, (1, 2, 3, 4)))"
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout for _ in range(2)}
    assert len(runs) == 2  # another process, another root: a hash cannot be predicted


def test_a_prompt_given_as_an_array_of_any_item_type_matches_as_its_ids(sim):
    """Blocks are matched by their ids, not by an array's raw bytes: a signed array's
    prompt finds the same cached blocks as a tuple's."""
    from array import array

    sim.apply(Add("a", prompt=(*SYSTEM, 1, 2)))
    expected = sim.blocks.prefix.match(list((*SYSTEM, 7)))
    assert len(expected) == 3
    assert sim.blocks.prefix.match(array("q", (*SYSTEM, 7))) == expected
    assert sim.blocks.prefix.match(array("i", (*SYSTEM, 7))) == expected


def test_a_cached_block_is_evicted_only_once_no_free_block_without_a_prefix_is_left(sim):
    # (the free queue's head was its oldest free block, cached or not: a cached prefix was
    # thrown away while empty blocks waited behind it; vLLM v0's allocator takes a hashless
    # block first, and evicts the least recently used cached one only when none is left)
    sim.apply(Add("a", prompt=SYSTEM))  # blocks 0-2, cached
    sim.apply(Add("b", prompt=(1, 2, 3)))  # block 3, a partial block: no hash
    sim.apply(Add("c", num_tokens=32))  # blocks 4-11: the pool is full
    sim.apply(Free("a"))  # 2, 1, 0 join the free queue, cached
    sim.apply(Free("b"))  # 3 joins it after them, uncached
    taken = of(sim.apply(Add("d", prompt=(9, 9))), ev.BlockAllocated)
    assert [e.block for e in taken] == [3]
    assert {0, 1, 2} <= set(sim.pool.cached_blocks())
    evicted = sim.apply(Add("e", prompt=(8, 8)))
    assert [e.block for e in of(evicted, ev.BlockEvicted)] == [2]  # then the least recently used
    check_invariants(sim)
