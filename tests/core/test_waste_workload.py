import itertools
import statistics

import pytest
from pagesim.core.studies.waste import ALLOCATORS, CATEGORIES, FirstFit, compare, next_pow2, reservation, simulate
from pagesim.core.studies.workload import LENGTH_MODELS, RequestSpec, generate


def test_workloads_are_seeded_and_match_their_stated_means():
    a = generate("sharegpt", 4000, rate=10, seed=3)
    assert a == generate("sharegpt", 4000, rate=10, seed=3) and a != generate("sharegpt", 4000, rate=10, seed=4)
    (prompt_mean, _), (output_mean, _) = LENGTH_MODELS["sharegpt"]
    # Clipping to max_len trims the tail a little; the means stay within 10 %.
    assert statistics.mean(r.prompt_len for r in a) == pytest.approx(prompt_mean, rel=0.1)
    assert statistics.mean(r.output_len for r in a) == pytest.approx(output_mean, rel=0.1)
    assert all(r.prompt_len + r.output_len <= 2048 for r in a)
    gaps = [b.arrival - a_.arrival for a_, b in itertools.pairwise(a)]
    assert statistics.mean(gaps) == pytest.approx(1 / 10, rel=0.1)  # Poisson at 10 per second


@pytest.mark.parametrize("kind", ["alpaca", "uniform", "zipf"])
def test_every_length_distribution_stays_in_bounds(kind):
    reqs = generate(kind, 500, seed=1, max_len=512, n=2, shared_prefix=8)
    assert all(r.output_len >= 1 and r.prompt_len + r.output_len <= 512 and r.n == 2 for r in reqs)
    with pytest.raises(ValueError, match="unknown length distribution"):
        generate("gaussian", 1)


def test_first_fit_places_in_the_first_hole_and_merges_frees():
    space = FirstFit(100)
    a, b, c = space.allocate(30), space.allocate(30), space.allocate(30)
    assert (a, b, c) == (0, 30, 60) and space.allocate(20) is None
    space.free(a, 30)
    space.free(c, 30)
    assert space.largest_hole == 40 and space.allocate(35) == 60  # the 10-slot tail merged with c's range
    space.free(b, 30)
    assert space.allocate(60) == 0


def test_reservation_rules():
    spec = RequestSpec("r", 0.0, prompt_len=100, output_len=25)
    assert next_pow2(25) == 32 and next_pow2(32) == 32 and next_pow2(1) == 1
    assert reservation("orca-max", spec, 2048) == 2048
    assert reservation("orca-pow2", spec, 2048) == 132
    assert reservation("orca-oracle", spec, 2048) == 125


def test_the_split_sums_to_the_pool_and_each_allocator_wastes_its_own_way():
    workload = generate("sharegpt", 300, rate=1000, seed=2)
    reports = {r.allocator: r for r in compare(workload, 8192, keep_steps=True)}
    assert set(reports) == set(ALLOCATORS)
    for r in reports.values():
        assert r.finished == 300 and r.loaded_steps > 0
        assert all(sum(step[c] for c in CATEGORIES) == 8192 for step in r.per_step)
        assert all(v >= 0 for step in r.per_step for v in step.values())
        assert sum(r.shares.values()) == pytest.approx(1.0)
    paged, oracle, pow2, worst = (reports[a].shares for a in ("paged", "orca-oracle", "orca-pow2", "orca-max"))
    assert paged["reservation"] == paged["external_fragmentation"] == 0
    assert oracle["internal_fragmentation"] == 0 and worst["external_fragmentation"] == 0
    # The paper's ordering of token-state shares: paged ≫ Oracle > Pow2 > Max.
    assert paged["token_states"] > 0.9 > oracle["token_states"] > pow2["token_states"] > worst["token_states"]
    assert reports["paged"].peak_batch > reports["orca-oracle"].peak_batch > reports["orca-max"].peak_batch


def test_unknown_allocator_is_refused():
    with pytest.raises(ValueError, match="unknown allocator"):
        simulate("buddy", [], 16)


def test_a_full_batch_is_not_external_fragmentation():
    # Short requests, many at once: the batch cap of 4 binds long before the pool does, so
    # the free memory is free, not cut into holes the head of the queue could not use.
    workload = [RequestSpec(f"r{i}", 0.0, prompt_len=8, output_len=8) for i in range(40)]
    for allocator in ("orca-oracle", "orca-pow2"):
        report = simulate(allocator, workload, 4096, max_len=64, max_batch=4, keep_steps=True)
        assert report.loaded_steps > 0 and report.peak_batch == 4
        assert all(step["external_fragmentation"] == 0 for step in report.per_step)
        assert report.shares["free"] > 0.9


def test_holes_too_small_for_the_head_are_external_fragmentation():
    # r0 and r2 (short) hold the pool's two ends around r1; once they finish, 40 slots are
    # free in two holes of 20 while the 30-slot head waits.
    workload = [
        RequestSpec("r0", 0.0, prompt_len=19, output_len=1),
        RequestSpec("r1", 0.0, prompt_len=30, output_len=30),
        RequestSpec("r2", 0.0, prompt_len=19, output_len=1),
        RequestSpec("r3", 0.0, prompt_len=29, output_len=1),
    ]
    report = simulate("orca-oracle", workload, 100, max_len=60, block_size=4, keep_steps=True)
    assert report.per_step[1]["external_fragmentation"] == 40 and report.per_step[1]["free"] == 0
