import pytest
from hypothesis import given
from hypothesis import strategies as st
from pagesim.core.blocks import BlockPool
from pagesim.core.errors import InvalidPlacementError, PoolExhaustedError


def test_allocation_takes_the_queue_head_and_frees_join_the_tail():
    pool = BlockPool(4)
    assert pool.allocate(2) == [0, 1]
    pool.release(0)
    assert pool.free_blocks() == [2, 3, 0]
    assert pool.allocate(3) == [2, 3, 0]
    assert pool.num_free == 0 and pool.num_used == 4


def test_explicit_placement_removes_blocks_from_the_middle_of_the_queue():
    pool = BlockPool(8)
    assert pool.allocate_specific([0, 3, 5]) == [0, 3, 5]
    assert pool.free_blocks() == [1, 2, 4, 6, 7]
    assert pool.allocate(1) == [1]


@pytest.mark.parametrize(
    "placement, message",
    [([9], "out of range"), ([-1], "out of range"), ([2, 2], "more than once"), ([1], "already in use")],
)
def test_bad_placements_are_refused_and_change_nothing(placement, message):
    pool = BlockPool(8)
    pool.allocate_specific([1])
    before = pool.snapshot()
    with pytest.raises(InvalidPlacementError, match=message):
        pool.allocate_specific(placement)
    assert pool.snapshot() == before


def test_exhaustion_is_refused_whole():
    pool = BlockPool(3)
    pool.allocate(2)
    before = pool.snapshot()
    with pytest.raises(PoolExhaustedError, match="needs 2 free blocks, "):
        pool.allocate(2)
    assert pool.snapshot() == before


def test_sharing_counts_references_and_the_last_release_frees():
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    assert pool.share(block) == 2
    assert pool.release(block) == 1 and not pool.is_free(block)
    assert pool.release(block) == 0 and pool.is_free(block)
    with pytest.raises(ValueError, match="already free"):
        pool.release(block)
    with pytest.raises(ValueError, match="cannot be shared"):
        pool.share(block)


@given(st.lists(st.tuples(st.sampled_from(["alloc", "share", "release"]), st.integers(0, 15)), max_size=200))
def test_pool_invariants_hold_under_any_sequence_of_calls(calls):
    pool = BlockPool(16)
    refs = [0] * 16
    for action, arg in calls:
        if action == "alloc" and pool.num_free:
            for b in pool.allocate(1 + arg % pool.num_free):
                refs[b] = 1
        elif action == "share" and refs[arg]:
            pool.share(arg)
            refs[arg] += 1
        elif action == "release" and refs[arg]:
            pool.release(arg)
            refs[arg] -= 1
        free = pool.free_blocks()
        assert sorted(free) == [b for b in range(16) if refs[b] == 0]  # free xor referenced, once each
        assert [pool.ref_count(b) for b in range(16)] == refs
        assert pool.num_free + pool.num_used == 16 == len(free) + sum(1 for r in refs if r)
