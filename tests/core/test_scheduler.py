import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pagesim.core import events as ev
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.errors import DuplicateSequenceError, InvalidOperationError
from pagesim.core.operations import Schedule, Submit
from pagesim.core.scheduler import LATER, NEVER, OK

from tests.core.helpers import check_invariants, state_fingerprint


def make_sim(cpu_backend, num_blocks=24, **kw):
    config = CacheConfig(num_blocks=num_blocks, block_size=4, num_heads=2, num_kv_heads=1, head_dim=8, **kw)
    return Simulator(config, cpu_backend)


def run(sim, steps, attend=False):
    found = []
    for _ in range(steps):
        result = sim.apply(Schedule(1), attend=attend)
        found += result.events
        check_invariants(sim)
        check_cpu_pool(sim)
        if attend and result.attention is not None:
            assert result.attention.passed
    return found


def check_cpu_pool(sim):
    if sim.cpu_pool is None:
        return
    holders = {}
    for seq in sim.swapped.values():
        for block in seq.block_table:
            holders[block] = holders.get(block, 0) + 1
    for block in range(sim.cpu_pool.num_blocks):
        assert sim.cpu_pool.ref_count(block) == holders.get(block, 0)


def of(found, kind):
    return [e for e in found if isinstance(e, kind)]


def test_requests_are_admitted_first_come_first_served(cpu_backend):
    sim = make_sim(cpu_backend, num_blocks=12, watermark=0.0)
    for name, prompt in (("a", 20), ("b", 32), ("c", 4)):  # a: 5 blocks, b: 8, c: 1
        sim.apply(Submit(name, 2, prompt_len=prompt))
    found = run(sim, 1)
    # b does not fit next to a, so c waits behind it although c would fit.
    assert [e.request for e in of(found, ev.RequestAdmitted)] == ["a"]
    assert sim.scheduler.alloc_status(sim.scheduler.requests["b"]) == LATER
    found = run(sim, 6)
    assert [e.request for e in of(found, ev.RequestAdmitted)] == ["b", "c"]
    assert [e.request for e in of(found, ev.RequestFinished)] == ["a", "b", "c"]


def test_the_watermark_keeps_blocks_free_and_oversized_requests_are_rejected(cpu_backend):
    sim = make_sim(cpu_backend, num_blocks=20, watermark=0.2)  # keep 4 blocks free
    sim.apply(Submit("fits", 1, prompt_len=4 * 16))  # 16 blocks: 20 - 16 = 4 >= 4
    sim.apply(Submit("huge", 1, prompt_len=4 * 17))  # 17 blocks > 20 - 4 ever
    assert sim.scheduler.alloc_status(sim.scheduler.requests["fits"]) == OK
    assert sim.scheduler.alloc_status(sim.scheduler.requests["huge"]) == NEVER
    found = run(sim, 3)
    assert [e.request for e in of(found, ev.RequestRejected)] == ["huge"]
    assert "17 blocks" in of(found, ev.RequestRejected)[0].reason


def test_preemption_by_recompute_frees_the_newest_and_resumes_it_first(cpu_backend):
    sim = make_sim(cpu_backend, num_blocks=10, watermark=0.0)
    sim.apply(Submit("old", 12, prompt_len=14))  # 4 blocks, grows to 26 tokens = 7 blocks
    sim.apply(Submit("new", 12, prompt_len=14))
    found = run(sim, 10)  # both need a fifth block at token 17 and a sixth at 21: 12 > 10
    preempted = of(found, ev.RequestPreempted)
    assert preempted and preempted[0].request == "new" and preempted[0].mode == "recompute"
    assert preempted[0].tokens >= 14
    sim.apply(Submit("later", 2, prompt_len=2))
    found = run(sim, 40)
    admitted = [e.request for e in of(found, ev.RequestAdmitted)]
    assert admitted.index("new") < admitted.index("later")  # the preempted one is not starved
    assert {e.request for e in of(found, ev.RequestFinished)} >= {"old", "new", "later"}


def test_recomputed_requests_produce_the_same_tokens(cpu_backend):
    def final_tokens(num_blocks):
        sim = make_sim(cpu_backend, num_blocks=num_blocks, watermark=0.0)
        for i in range(3):
            sim.apply(Submit(f"r{i}", 10, prompt_len=9))
        tokens = {}
        for _ in range(60):
            for seq_id, seq in sim.sequences.items():
                tokens[seq_id] = list(seq.token_ids)
            sim.apply(Schedule(1), attend=False)
        return tokens, sim.scheduler.stats.preemptions

    roomy, roomy_preemptions = final_tokens(64)
    tight, tight_preemptions = final_tokens(9)
    assert roomy_preemptions == 0 and tight_preemptions > 0
    assert tight == roomy


def test_swap_moves_a_group_out_and_back_bit_for_bit(cpu_backend):
    sim = make_sim(cpu_backend, num_blocks=14, watermark=0.0, preemption="swap", num_cpu_blocks=16)
    sim.apply(Submit("first", 16, prompt_len=13))
    sim.apply(Submit("pair", 16, prompt_len=9, n=2))
    run(sim, 1)
    before = {
        s: [a.copy() for a in sim.runner.cache.read_sequence(sim.sequence(s).block_table, sim.sequence(s).num_tokens)]
        for s in sim.scheduler.requests["pair"].seqs
    }
    found = []
    while not of(found, ev.RequestPreempted):
        found += run(sim, 1, attend=True)
    (preempted,) = of(found, ev.RequestPreempted)
    assert preempted.request == "pair" and preempted.mode == "swap" and preempted.swap_seconds > 0
    assert set(preempted.seqs) == set(sim.swapped)  # the group went together
    swapped_tokens = {s: sim.swapped[s].num_tokens for s in sim.swapped}
    found = []
    while not of(found, ev.RequestSwappedIn):
        found += run(sim, 1, attend=True)
    for seq_id, (keys, values) in before.items():
        seq = sim.sequence(seq_id)
        got_k, got_v = sim.runner.cache.read_sequence(seq.block_table, swapped_tokens[seq_id])
        np.testing.assert_array_equal(got_k[: len(keys)], keys)
        np.testing.assert_array_equal(got_v[: len(values)], values)
    assert sim.cpu_pool.num_free == 16


def test_beam_search_keeps_its_width_with_forks_and_frees(cpu_backend):
    sim = make_sim(cpu_backend, num_blocks=40)
    sim.apply(Submit("beam", 6, prompt_len=6, beam_width=3))
    found = run(sim, 4, attend=True)
    assert len(sim.scheduler.requests["beam"].seqs) == 3
    assert of(found, ev.SequenceForked) and of(found, ev.SequenceFreed)
    assert of(found, ev.BlockCopied)  # a forked beam writing into the shared last block
    run(sim, 4)
    assert sim.scheduler.requests["beam"].status == "finished" and not sim.sequences


def test_bad_submissions_change_nothing(cpu_backend):
    sim = make_sim(cpu_backend)
    sim.apply(Submit("a", 2, prompt_len=3))
    with pytest.raises(DuplicateSequenceError):
        sim.apply(Submit("a", 2, prompt_len=3))
    with pytest.raises(InvalidOperationError, match="vocabulary"):
        sim.apply(Submit("b", 2, prompt=(1, 99_999)))
    assert list(sim.scheduler.requests) == ["a"]
    with pytest.raises(InvalidOperationError, match="not both"):
        Submit("c", 2, prompt_len=3, n=2, beam_width=2)


@settings(max_examples=25, deadline=None)
@given(
    num_blocks=st.integers(6, 30),
    mode=st.sampled_from(["recompute", "swap"]),
    requests=st.lists(st.tuples(st.integers(1, 20), st.integers(1, 12), st.integers(1, 3)), min_size=1, max_size=6),
    prefix=st.booleans(),
)
def test_every_request_ends_and_invariants_hold(cpu_backend, num_blocks, mode, requests, prefix):
    sim = make_sim(
        cpu_backend, num_blocks=num_blocks, watermark=0.0, preemption=mode, num_cpu_blocks=8, prefix_caching=prefix
    )
    for i, (prompt, output, n) in enumerate(requests):
        sim.apply(Submit(f"r{i}", output, prompt_len=prompt, n=n, shared_prefix=4))
    for _ in range(200):
        if not (sim.scheduler.waiting or sim.scheduler.running or sim.scheduler.swapped):
            break
        run(sim, 1)
    counts = sim.scheduler.counts()
    assert counts["finished"] + counts["rejected"] == len(requests)
    assert not sim.sequences and not sim.swapped and sim.pool.num_free == num_blocks


def test_seeking_back_restores_the_scheduler_and_the_cpu_pool(cpu_backend):
    from pagesim.core.scenario import parse_scenario
    from pagesim.core.timeline import Timeline

    steps = "".join(f'[[steps]]\nop = "submit"\nrequest = "r{i}"\ntokens = 9\noutput = 12\n' for i in range(3))
    steps += '[[steps]]\nop = "schedule"\nsteps = 1\n' * 20
    scenario = parse_scenario(
        "num_blocks = 9\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\nwatermark = 0.0\n"
        'preemption = "swap"\nnum_cpu_blocks = 12\n' + steps,
        "sched.toml",
    )
    timeline = Timeline(scenario, cpu_backend, snapshot_every=4)

    def state():
        s = timeline.sim.scheduler
        return (
            s.counts(),
            tuple(s.waiting),
            tuple(s.running),
            tuple(s.swapped),
            {k: (tuple(v.token_ids), tuple(v.block_table)) for k, v in timeline.sim.swapped.items()},
            {k: tuple(v.token_ids) for k, v in timeline.sim.sequences.items()},
        )

    seen = {}
    while not timeline.at_end:
        timeline.forward()
        seen[timeline.position] = state()
    assert timeline.sim.scheduler.stats.preemptions > 0
    for step in (17, 6, 13, 23):
        timeline.seek(step)
        assert state() == seen[step]
        check_invariants(timeline.sim)
        check_cpu_pool(timeline.sim)


def test_direct_operations_cannot_pull_sequences_from_under_the_scheduler(cpu_backend):
    from pagesim.core.operations import Add, Free, Grow

    sim = make_sim(cpu_backend)
    sim.apply(Submit("r", 4, prompt_len=5, n=2))
    with pytest.raises(InvalidOperationError, match="reserved for the scheduler"):
        Add("r/s1", 3)  # the name the request's second sample will take
    sim.apply(Submit("q", 4, prompt_len=5))
    with pytest.raises(DuplicateSequenceError, match="request 'q' will run"):
        sim.apply(Add("q", 3))
    run(sim, 1)
    with pytest.raises(InvalidOperationError, match="belongs to request 'q'"):
        sim.apply(Free("q"))
    with pytest.raises(InvalidOperationError, match="the scheduler grows and frees it"):
        sim.apply(Grow("q"))
    run(sim, 6)
    assert sim.scheduler.requests["q"].status == "finished"


@settings(max_examples=25, deadline=None)
@given(
    mode=st.sampled_from(["recompute", "swap"]),
    requests=st.lists(st.tuples(st.integers(1, 20), st.integers(1, 12), st.integers(1, 3)), min_size=1, max_size=6),
    prefix=st.booleans(),
)
def test_a_run_that_keeps_no_events_reaches_the_same_state(cpu_backend, mode, requests, prefix):
    """``record=False`` (benchmarks, big runs) takes shortcuts past the event log: block
    fills counted a block at a time, no events built. The state must not notice."""
    sims = [
        make_sim(cpu_backend, num_blocks=14, watermark=0.0, preemption=mode, num_cpu_blocks=8, prefix_caching=prefix)
        for _ in range(2)
    ]
    for sim, record in zip(sims, (True, False), strict=True):
        for i, (prompt, output, n) in enumerate(requests):
            sim.apply(Submit(f"r{i}", output, prompt_len=prompt, n=n, shared_prefix=4), record=record)
        for _ in range(60):
            sim.apply(Schedule(1), record=record)
        check_invariants(sim)
    recorded, unrecorded = sims
    assert unrecorded.block_fills() == recorded.block_fills()
    assert unrecorded.metrics() == recorded.metrics()
    assert unrecorded.scheduler.counts() == recorded.scheduler.counts()
    assert state_fingerprint(unrecorded)[1:] == state_fingerprint(recorded)[1:]
    # With no K/V either (the scheduler benchmark), decode steps list no slots: the same
    # blocks, tables, prefix cache and counts.
    bare = Simulator(dataclasses.replace(recorded.config), kv_data=False)
    for i, (prompt, output, n) in enumerate(requests):
        bare.apply(Submit(f"r{i}", output, prompt_len=prompt, n=n, shared_prefix=4), attend=False, record=False)
    for _ in range(60):
        bare.apply(Schedule(1), attend=False, record=False)
    assert bare.block_fills() == recorded.block_fills() and bare.metrics() == recorded.metrics()
    assert bare.scheduler.counts() == recorded.scheduler.counts()
    assert bare.pool.snapshot() == recorded.pool.snapshot()
    assert {
        k: (tuple(q.token_ids), tuple(q.block_table), tuple(q.block_hashes)) for k, q in bare.sequences.items()
    } == {k: (tuple(q.token_ids), tuple(q.block_table), tuple(q.block_hashes)) for k, q in recorded.sequences.items()}


def test_a_swap_on_a_real_model_moves_every_layers_k_and_v(cpu_backend):
    """The transfer time counted one layer's K/V while the caption said all 30 layers move (30× too cheap)."""
    from pagesim.core.scenario import load_scenario
    from pagesim.core.timeline import Timeline

    timeline = Timeline(load_scenario("preemption_swap"), cpu_backend, snapshot_data=False, history=False)
    swaps = []
    while not timeline.at_end and not swaps:
        swaps = [e for e in timeline.forward().events if type(e).__name__ == "RequestPreempted" and e.mode == "swap"]
    (swap,) = swaps
    config, layers = timeline.sim.config, timeline.sim.runner.num_layers
    assert layers == 30  # SmolLM2-135M
    assert swap.swap_seconds == pytest.approx(
        swap.blocks * layers * config.block_bytes / (config.swap_bandwidth_gbs * 1e9)
    )


def test_a_request_that_cannot_grow_beside_hand_added_sequences_says_so(cpu_backend):
    # (it said "grew past what the pool can hold (8 blocks)" of a request of 4 blocks: the
    # user's sequence held 5 of them, which the scheduler cannot preempt)
    from pagesim.core.operations import Add

    config = CacheConfig(num_blocks=8, block_size=4, num_heads=2, head_dim=8)
    sim = Simulator(config, cpu_backend)
    sim.apply(Add("user", num_tokens=20))
    sim.apply(Submit("r1", 2, prompt_len=12))
    result = sim.apply(Schedule(3))
    (rejected,) = [e for e in result.events if isinstance(e, ev.RequestRejected)]
    assert rejected.reason == (
        "grew past what the pool can hold beside the sequences the scheduler does not run, which hold 5 of its 8 blocks"
    )
    check_invariants(sim)
