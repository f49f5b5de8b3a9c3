"""vLLM v0's preemption of forked groups (parallel samples, beams): swapped when a CPU pool
exists (v0 recomputes only single-sequence groups), otherwise prefilled once and forked
again, never once per sample; a swapped group returns in the step its blocks free up. (That a
shipped run ends when its requests do is checked in the one walk of each, in test_scenario.)"""

import dataclasses

from hypothesis import given
from hypothesis import strategies as st
from pagesim.core import events as ev
from pagesim.core.block_manager import distinct_blocks
from pagesim.core.engine import Simulator
from pagesim.core.operations import Schedule, Submit
from pagesim.core.scenario import load_scenario
from pagesim.core.scheduler import shared_prefix_len
from pagesim.core.timeline import Timeline

from tests.core.helpers import check_invariants
from tests.core.test_scheduler import check_cpu_pool, make_sim, of
from tests.scenarios import token_model


def three_requests(sim: Simulator) -> None:
    """The preemption scenarios' requests: r3 (two samples of a 10-token prompt) is the
    one preempted when the 24-block pool runs out."""
    sim.apply(Submit("r1", 20, prompt_len=18))
    sim.apply(Submit("r2", 20, prompt_len=14))
    sim.apply(Submit("r3", 16, prompt_len=10, n=2))


def step_until(sim: Simulator, kind, limit=60):
    for _ in range(limit):
        result = sim.apply(Schedule(1), attend=False)
        check_invariants(sim)
        check_cpu_pool(sim)
        if found := of(result.events, kind):
            return found, result
    raise AssertionError(f"no {kind.__name__} in {limit} steps")


def group_blocks(sim: Simulator, request: str) -> list[int]:
    return distinct_blocks(sim.sequence(s) for s in sim.scheduler.requests[request].seqs)


def test_a_forked_group_is_swapped_when_a_cpu_pool_exists_although_recompute_is_configured(cpu_backend):
    sim = make_sim(cpu_backend, num_blocks=24, watermark=0.0, preemption="recompute", num_cpu_blocks=32)
    three_requests(sim)
    (preempted,), _ = step_until(sim, ev.RequestPreempted)
    assert preempted.request == "r3" and preempted.mode == "swap" and preempted.tokens == 0
    assert sim.scheduler.stats.recomputed_tokens == 0
    shared_before = preempted.blocks  # the group's distinct blocks (the prompt's shared once)
    step_until(sim, ev.RequestSwappedIn)
    s0, s1 = (sim.sequence(s) for s in ("r3/s0", "r3/s1"))
    assert len(group_blocks(sim, "r3")) == shared_before < 2 * sim.config.blocks_for(s0.num_tokens)
    assert s0.block_table[:2] == s1.block_table[:2]  # the prompt's full blocks still shared


def test_a_single_sequence_is_still_recomputed_as_configured_with_a_cpu_pool(cpu_backend):
    sim = make_sim(cpu_backend, num_blocks=10, watermark=0.0, preemption="recompute", num_cpu_blocks=16)
    sim.apply(Submit("old", 12, prompt_len=14))
    sim.apply(Submit("new", 12, prompt_len=14))
    (preempted,), _ = step_until(sim, ev.RequestPreempted)
    assert preempted.request == "new" and preempted.mode == "recompute"


def test_without_a_cpu_pool_a_forked_group_is_prefilled_once_and_forked_again(cpu_backend):
    sim = make_sim(cpu_backend, num_blocks=24, watermark=0.0)
    three_requests(sim)
    tokens = {}
    for _ in range(60):
        tokens = {s: list(sim.sequence(s).token_ids) for s in ("r3/s0", "r3/s1") if s in sim.sequences}
        result = sim.apply(Schedule(1), attend=False)
        if preempted := of(result.events, ev.RequestPreempted):
            break
    (preempted,) = preempted
    assert preempted.mode == "recompute" and preempted.request == "r3"
    lengths = {s: len(sim.scheduler.requests["r3"].resume_tokens[s]) for s in ("r3/s0", "r3/s1")}
    assert lengths == {"r3/s0": 20, "r3/s1": 20}
    assert preempted.tokens == 10 + 10 + 10  # the shared prompt once, then each sample's own
    used_before = sim.pool.num_used
    (admitted,), _ = step_until(sim, ev.RequestAdmitted)
    assert admitted.request == "r3" and admitted.resumed
    s0, s1 = sim.sequence("r3/s0"), sim.sequence("r3/s1")
    # 10 shared tokens: 2 full blocks and a partial one; each 10-token tail: a copy of the
    # partial block (the last writer keeps it) and 2 more blocks of its own. 8, not 2 × 5.
    assert len(group_blocks(sim, "r3")) == 8
    assert s0.block_table[:2] == s1.block_table[:2]
    planned = dataclasses.replace(sim.scheduler.requests["r3"], resume_tokens={k: tuple(v) for k, v in tokens.items()})
    assert sim.pool.num_used - used_before == 8 == sim.scheduler.admission_blocks(planned)  # as admission planned
    # the same tokens as before the preemption (a decode ran in the preempting step for r1, r2 only)
    assert {s: list(sim.sequence(s).token_ids) for s in ("r3/s0", "r3/s1")} == tokens
    assert [sim.pool.ref_count(b) for b in s0.block_table[:2]] == [2, 2]


def test_a_swapped_group_returns_in_the_step_its_blocks_free_up(cpu_backend):
    config = load_scenario(token_model("preemption_swap")).config
    sim = Simulator(config, cpu_backend)
    three_requests(sim)
    step_until(sim, ev.RequestPreempted)
    finished, result = step_until(sim, ev.RequestFinished)
    assert {e.request for e in finished} == {"r1", "r2"}
    assert [e.request for e in of(result.events, ev.RequestSwappedIn)] == ["r3"]  # in that same step
    assert sim.scheduler.running == ["r3"] and not sim.scheduler.swapped


def test_the_swap_scenario_never_idles_while_a_swapped_group_could_fit(cpu_backend):
    timeline = Timeline(load_scenario(token_model("preemption_swap")), cpu_backend)
    swapped_at = []
    while not timeline.at_end:
        timeline.forward()
        sim, sched = timeline.sim, timeline.sim.scheduler
        if sched.swapped:
            swapped_at.append(timeline.sim.step)
            need = len(distinct_blocks(sim.swapped[s] for s in sched.requests[sched.swapped[0]].seqs))
            assert sched.running or need > sim.pool.num_free, f"step {sim.step}: nothing runs, r3 could return"
    assert swapped_at  # the scenario does swap


@given(st.lists(st.lists(st.integers(0, 2), max_size=6).map(tuple), min_size=1, max_size=4))
def test_shared_prefix_len_is_the_longest_prefix_all_share(lists):
    longest = 0
    while all(len(t) > longest for t in lists) and len({t[longest] for t in lists}) == 1:
        longest += 1
    assert shared_prefix_len(lists) == longest
