import numpy as np
import pytest
from pagesim.core import events as ev
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.errors import (
    DuplicateSequenceError,
    InvalidOperationError,
    InvalidPlacementError,
    PoolExhaustedError,
    UnknownSequenceError,
)
from pagesim.core.operations import Add, Fork, Free, Grow

from tests.core.helpers import check_invariants, state_fingerprint
from tests.scenarios import token_model


@pytest.fixture
def sim(cpu_backend):
    return Simulator(CacheConfig(num_blocks=8, block_size=4, num_heads=2, head_dim=8, seed=42), cpu_backend)


def kinds(result):
    return [type(e).__name__ for e in result.events]


def test_add_allocates_blocks_for_the_prompt_and_writes_every_token(sim):
    result = sim.apply(Add("a", 10))
    assert sim.sequence("a").block_table == [0, 1, 2]
    allocated = [e for e in result.events if isinstance(e, ev.BlockAllocated)]
    assert [(e.block, e.logical_index) for e in allocated] == [(0, 0), (1, 1), (2, 2)]
    written = [e for e in result.events if isinstance(e, ev.TokenWritten)]
    assert [(e.position, e.block, e.slot) for e in written][-3:] == [(7, 1, 3), (8, 2, 0), (9, 2, 1)]
    assert result.metrics.used_blocks == 3 and result.metrics.internal_fragmentation == 2
    assert result.attention.passed
    check_invariants(sim)


def test_explicit_placement_reproduces_the_seed_article_tables(sim):
    sim.apply(Add("0", 10, blocks=(0, 3, 5)))
    result = sim.apply(Add("1", 7, blocks=(1, 7)))
    assert result.attention.block_tables.tolist() == [[0, 3, 5], [1, 7, 0]]
    assert result.attention.context_lens.tolist() == [10, 7]
    assert result.attention.output.shape == (2, 2, 8)
    lookups = [(e.seq, e.blocks, e.context_len) for e in result.events if isinstance(e, ev.LookupPerformed)]
    assert lookups == [("0", (0, 3, 5), 10), ("1", (1, 7), 7)]
    check_invariants(sim)


def test_grow_allocates_only_when_crossing_a_block_boundary(sim):
    sim.apply(Add("a", 3))
    assert "BlockAllocated" not in kinds(sim.apply(Grow("a")))  # fills slot 3 of block 0
    result = sim.apply(Grow("a"))
    assert [e.block for e in result.events if isinstance(e, ev.BlockAllocated)] == [1]
    assert sim.sequence("a").num_tokens == 5


def test_fork_shares_every_block_and_copy_on_write_keeps_both_histories(sim):
    sim.apply(Add("a", 6))
    fork = sim.apply(Fork("a", "b"))
    assert [(e.block, e.ref_count) for e in fork.events if isinstance(e, ev.BlockShared)] == [(0, 2), (1, 2)]
    assert fork.metrics.shared_blocks == 2 and fork.metrics.used_blocks == 2
    parent_kv = [a.copy() for a in sim.runner.cache.read_sequence([0, 1], 6)]

    grow = sim.apply(Grow("b"))
    copies = [e for e in grow.events if isinstance(e, ev.BlockCopied)]
    assert [(e.src, e.dst, e.seq) for e in copies] == [(1, 2, "b")]
    assert sim.sequence("b").block_table == [0, 2] and sim.sequence("a").block_table == [0, 1]
    assert sim.pool.ref_count(0) == 2 and sim.pool.ref_count(1) == 1
    # The parent's data is untouched by the fork's write, and the copy holds the shared prefix.
    for before, after in zip(parent_kv, sim.runner.cache.read_sequence([0, 1], 6), strict=True):
        np.testing.assert_array_equal(before, after)
    assert grow.attention.passed
    check_invariants(sim)

    # The parent now owns its last block alone: no second copy.
    assert "BlockCopied" not in kinds(sim.apply(Grow("a")))
    check_invariants(sim)


def test_fork_of_a_full_last_block_needs_no_copy(sim):
    sim.apply(Add("a", 8))
    sim.apply(Fork("a", "b"))
    result = sim.apply(Grow("b"))
    assert "BlockCopied" not in kinds(result)
    assert sim.sequence("b").block_table == [0, 1, 2]
    check_invariants(sim)


def test_free_releases_in_reverse_and_keeps_blocks_others_hold(sim):
    sim.apply(Add("a", 6))
    sim.apply(Fork("a", "b"))
    result = sim.apply(Free("a"))
    assert [(type(e).__name__, e.block) for e in result.events if isinstance(e, ev.BlockReleased | ev.BlockFreed)] == [
        ("BlockReleased", 1),
        ("BlockReleased", 0),
    ]
    result = sim.apply(Free("b"))
    assert [e.block for e in result.events if isinstance(e, ev.BlockFreed)] == [1, 0]
    assert result.attention is None and result.metrics.free_blocks == 8
    check_invariants(sim)


def test_forked_sequences_diverge_after_the_fork(sim):
    sim.apply(Add("a", 4))
    sim.apply(Fork("a", "b"))
    sim.apply(Grow("a", 2))
    sim.apply(Grow("b", 2))
    a, b = sim.sequence("a").token_ids, sim.sequence("b").token_ids
    assert a[:4] == b[:4] and a[4:] != b[4:]


@pytest.mark.parametrize(
    "op, error, message",
    [
        (Grow("ghost"), UnknownSequenceError, "unknown sequence 'ghost'"),
        (Free("ghost"), UnknownSequenceError, "live sequences: a, b"),
        (Fork("ghost", "c"), UnknownSequenceError, "ghost"),
        (Fork("a", "b"), DuplicateSequenceError, "'b' already exists"),
        (Add("a", 1), DuplicateSequenceError, "'a' already exists"),
        (Add("c", 25), PoolExhaustedError, "needs 7 free block"),
        (Grow("b", 30), PoolExhaustedError, "needs 8 free block"),
        (Add("c", 4, blocks=(0,)), InvalidPlacementError, "already in use"),
        (Add("c", 4, blocks=(99,)), InvalidPlacementError, "out of range"),
        # (checked before any is used as an int: compiled, the pool takes only ints)
        (Add("c", 4, blocks=("7",)), InvalidPlacementError, "block id '7' is not an integer"),
        (Add("c", 4, blocks=(7.0,)), InvalidPlacementError, "block id 7.0 is not an integer"),
        (Add("c", 4, blocks=(True,)), InvalidPlacementError, "block id True is not an integer"),
        (Add("c", 5, blocks=(6,)), InvalidPlacementError, "need exactly 2"),
        (Add("c", prompt=(1, 40_000)), InvalidOperationError, "outside the vocabulary"),
    ],
)
def test_refused_operations_change_nothing(sim, op, error, message):
    sim.apply(Add("a", 6))
    sim.apply(Fork("a", "b"))  # b's last block is shared: a grow would need a copy too
    before = state_fingerprint(sim)
    with pytest.raises(error, match=message):
        sim.apply(op)
    assert state_fingerprint(sim) == before
    check_invariants(sim)


def test_copy_on_write_counts_toward_exhaustion(sim):
    sim.apply(Add("a", 6))
    sim.apply(Fork("a", "b"))
    sim.apply(Add("c", 4 * 6))  # all 8 blocks used
    before = state_fingerprint(sim)
    with pytest.raises(PoolExhaustedError, match="needs 1 free block, "):
        sim.apply(Grow("b"))  # room in the last block, but it is shared
    assert state_fingerprint(sim) == before


def test_metrics_compare_with_a_contiguous_reservation(cpu_backend):
    config = CacheConfig(num_blocks=64, block_size=16, num_heads=1, head_dim=8, max_model_len=256)
    sim = Simulator(config, cpu_backend)
    sim.apply(Add("a", 17))
    m = sim.apply(Add("b", 40)).metrics
    assert (m.used_blocks, m.slots_allocated, m.slots_filled) == (5, 80, 57)
    assert m.internal_fragmentation == 23 and m.utilisation == pytest.approx(57 / 80)
    assert m.contiguous_blocks == 2 * 16


def test_attention_checks_every_live_sequence_with_its_newest_token(sim):
    sim.apply(Add("a", 5))
    sim.apply(Add("b", 2))
    result = sim.apply(Grow("a"))
    computed = {e.seq: e for e in result.events if isinstance(e, ev.AttentionComputed)}
    assert set(computed) == {"a", "b"}
    assert computed["a"].context_len == 6 and computed["b"].context_len == 2
    assert all(e.passed and len(e.head_errors) == 2 for e in computed.values())


def test_the_check_catches_a_corrupted_cache(sim):
    sim.apply(Add("a", 6))
    sim.runner.cache.key_cache[1, 0] += 1.0  # a paging bug: data under a live slot changed
    result = sim.apply(Grow("a"))
    assert not result.attention.passed


def test_dense_reference_is_recomputed_only_for_sequences_that_changed(sim, monkeypatch):
    from pagesim.core import dense_check

    sim.apply(Add("a", 5))
    sim.apply(Add("b", 6))
    calls = []
    real = dense_check.dense_attention_rows
    monkeypatch.setattr(dense_check, "dense_attention_rows", lambda q, *a: calls.append(q.shape[0]) or real(q, *a))
    result = sim.apply(Grow("a"))
    assert calls == [1]  # only a's tokens changed
    assert result.attention.passed and result.attention.dense.shape[0] == 2
    # The check still bites: corrupt b's cached-over data and its kernel output diverges.
    sim.runner.cache.key_cache[sim.sequence("b").block_table[0], 0] += 1.0
    assert not sim.apply(Grow("a")).attention.passed


@pytest.mark.parametrize("name", ["default", "parallel_sampling", "preemption_swap", "beam_search", "long_context"])
def test_decode_block_tables_kept_between_steps_equal_a_fresh_build(cpu_backend, name):
    """attention_inputs rewrites only the tables that changed since the last step: every step of
    a scenario (forks, copy-on-write, frees, swaps, beams) must give the fresh build's array,
    width included (the CPU kernel's work split reads it)."""
    from pagesim.core.scenario import load_scenario
    from pagesim.core.timeline import Timeline

    timeline = Timeline(load_scenario(token_model(name)), cpu_backend)
    while not timeline.at_end:
        timeline.forward()  # its attention updated the tables kept from the step before
        sim = timeline.sim
        if not sim.sequences:
            continue
        sim.runner._last_tables = None  # the next call builds from scratch
        fresh = sim.runner.attention_inputs(list(sim.sequences.values()))[2]
        tables = timeline.current.attention.block_tables
        assert tables.shape == fresh.shape and (tables == fresh).all(), timeline.position


def test_decode_block_tables_narrow_when_the_longest_table_shrinks(cpu_backend):
    """The same sequences with a shorter longest table (a step back restores one): the padded
    width follows, as a fresh build's would."""
    sim = Simulator(CacheConfig(num_blocks=32, block_size=4, num_heads=2, head_dim=8, seed=1), cpu_backend)
    for op in (Add("long", 28), Add("a", 3), Add("b", 5), Add("c", 2)):
        sim.apply(op)
    before = sim.snapshot()
    sim.apply(Grow("long", 1))  # an 8th block: one table of four changed, the others kept
    assert sim.last_attention.block_tables.shape == (4, 8)
    sim.restore(before)
    tables = sim.runner.attention_inputs(list(sim.sequences.values()))[2]
    assert tables.shape == (4, 7)
    assert tables.tolist() == [s.block_table + [0] * (7 - len(s.block_table)) for s in sim.sequences.values()]


def _scheduled_sim(cpu_backend):
    from pagesim.core.operations import Submit

    sim = Simulator(CacheConfig(num_blocks=16, block_size=4, num_heads=2, head_dim=8), cpu_backend)
    sim.apply(Submit("r1", 5, prompt_len=10))
    return sim


def test_a_schedule_of_many_steps_keeps_one_whole_report_and_each_earlier_check_as_two_numbers(cpu_backend):
    from pagesim.core.model_runner import AttentionReport
    from pagesim.core.operations import Schedule

    sim = _scheduled_sim(cpu_backend)
    reports = []
    attend = sim.runner.attend
    sim.runner.attend = lambda seqs: reports.append(attend(seqs)) or reports[-1]
    result = sim.apply(Schedule(20))
    live = [r for r in reports if r is not None]
    # An attend per engine step, none more after the op: five with r1 live, then the step
    # that finished it, with nothing left to check (the op's own report).
    assert len(reports) == 6 and len(live) == 5 and reports[-1] is None and result.attention is None
    assert result.inner_checks == tuple((r.passed, r.max_abs_error) for r in live)
    assert all(isinstance(c, tuple) and not isinstance(c[1], AttentionReport) for c in result.inner_checks)


def test_a_check_that_fails_to_run_inside_a_schedule_is_raised_with_the_op_counted(cpu_backend):
    from pagesim.core.operations import Schedule

    sim = _scheduled_sim(cpu_backend)
    calls = []

    def broken(seqs):
        calls.append(len(seqs))
        raise RuntimeError("the device went away")

    sim.runner.attend = broken
    before = sim.step
    with pytest.raises(RuntimeError, match="the device went away"):
        sim.apply(Schedule(20))
    assert sim.step == before + 1 and len(calls) == 1  # (the op ran whole; its step counted once)
    assert sim.scheduler.after_step is None
