"""The block manager counts a decode step's blocks without looking at ref counts until a
partly filled block is shared: the count must equal the full rule (a block at each boundary,
one per shared last block) after forks, samples, swaps and restores."""

import contextlib
import random

from pagesim.app.benchmarks import random_operations
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.errors import PagesimError
from pagesim.core.operations import Schedule, Submit


def full_rule(sim: Simulator) -> int:
    bs, refs = sim.config.block_size, sim.blocks.pool._ref_counts
    seqs = list(sim.sequences.values())
    return len([q for q in seqs if q.num_tokens % bs == 0 or refs[q.block_table[-1]] > 1])


def test_the_decode_need_matches_the_full_rule_through_forks_and_restores():
    config = CacheConfig(num_blocks=96, block_size=4, num_heads=1, head_dim=8, prefix_caching=True)
    sim = Simulator(config, kv_data=False)
    snapshots = []
    for index, op in enumerate(random_operations(1500, seed=3)):
        with contextlib.suppress(PagesimError):  # (a refused operation changes nothing)
            sim.apply(op, attend=False, record=False)
        assert sim.blocks.decode_blocks_needed(list(sim.sequences.values())) == full_rule(sim)
        if index % 97 == 0:
            snapshots.append(sim.snapshot())
        if index % 211 == 0 and snapshots:
            sim.restore(random.Random(index).choice(snapshots))
            assert sim.blocks.decode_blocks_needed(list(sim.sequences.values())) == full_rule(sim)


def test_the_decode_need_matches_the_full_rule_for_samples_swapped_in_and_out():
    config = CacheConfig(
        num_blocks=24, block_size=4, num_heads=1, head_dim=8, prefix_caching=True, num_cpu_blocks=64, max_num_seqs=16
    )
    sim = Simulator(config, kv_data=False)
    rng = random.Random(7)
    for i in range(12):
        sim.apply(Submit(f"r{i}", rng.randint(10, 30), prompt_len=rng.randint(2, 9), n=rng.choice((1, 2, 3))))
    for _ in range(300):
        sim.apply(Schedule(1), attend=False, record=False)
        assert sim.blocks.decode_blocks_needed(list(sim.sequences.values())) == full_rule(sim)
    assert sim.scheduler.stats.swapped_blocks > 0 and sim.scheduler.stats.finished == 12


def covered_by_the_full_rule(sim: Simulator, seqs: list, free: int) -> int:
    """The longest prefix of ``seqs`` whose decode needs (each one's own, exactly) fit ``free``."""
    taken = 0
    for count, seq in enumerate(seqs):
        taken += sim.blocks.append_need(seq, 1)
        if taken > free:
            return count
    return len(seqs)


def test_the_decode_cover_matches_the_exact_needs_in_any_order_and_pool():
    config = CacheConfig(num_blocks=96, block_size=4, num_heads=1, head_dim=8, prefix_caching=True)
    sim = Simulator(config, kv_data=False)
    rng = random.Random(5)
    checked = 0
    for op in random_operations(1200, seed=11):
        with contextlib.suppress(PagesimError):
            sim.apply(op, attend=False, record=False)
        seqs = list(sim.sequences.values())
        rng.shuffle(seqs)
        covered = sim.blocks.decode_covered(seqs, [q.num_tokens for q in seqs])
        assert covered == covered_by_the_full_rule(sim, seqs, sim.blocks.num_free)
        checked += covered < len(seqs)
    assert checked > 0  # the pool fell short of a whole step at least once
