"""Scheduler cases a hostile user found: each failed before its fix."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pagesim.core import events as ev
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.errors import DuplicateSequenceError, InvalidOperationError, ScenarioError
from pagesim.core.operations import Add, Free, Schedule, Submit
from pagesim.core.scenario import parse_scenario

from tests.core.helpers import check_invariants
from tests.core.test_scheduler import check_cpu_pool


def sim_of(cpu_backend, kv_data=True, **kw):
    shape = {"num_blocks": 10, "block_size": 4, "num_heads": 2, "num_kv_heads": 1, "head_dim": 8} | kw
    return Simulator(CacheConfig(**shape), cpu_backend, kv_data=kv_data)


def schedule(sim, steps):
    events = []
    for _ in range(steps):
        events += sim.apply(Schedule(1), attend=False).events
    return events


def done(sim) -> bool:
    s = sim.scheduler
    return not (s.waiting or s.running or s.swapped)


def test_a_group_swapped_out_holding_more_than_the_watermark_allows_comes_back(cpu_backend):
    """10 blocks of 4, watermark 0.3: A (24 + 60 tokens) was swapped out holding more than
    num_blocks - watermark blocks; it used never to return, and C waited behind it forever."""
    sim = sim_of(cpu_backend, watermark=0.3, preemption="swap", num_cpu_blocks=16)
    sim.apply(Submit("B", 30, prompt_len=1))
    sim.apply(Submit("A", 60, prompt_len=24))
    schedule(sim, 200)
    sim.apply(Submit("C", 2, prompt_len=2))
    schedule(sim, 500)
    statuses = {r: s.status for r, s in sim.scheduler.requests.items()}
    assert done(sim), statuses
    assert sim.scheduler.stalled() is None
    assert sim.pool.num_free == 10 and sim.cpu_pool.num_free == 16  # nothing leaked
    assert statuses["C"] == "finished"


@pytest.mark.parametrize("fan", [{"n": 3}, {"beam_width": 3}])
def test_a_request_wider_than_max_num_seqs_is_rejected_at_submit(cpu_backend, fan):
    sim = sim_of(cpu_backend, num_blocks=24, max_num_seqs=2)
    found = sim.apply(Submit("wide", 3, prompt_len=4, **fan)).events
    rejected = [e for e in found if isinstance(e, ev.RequestRejected)]
    assert rejected and "max_num_seqs is 2" in rejected[0].reason
    assert sim.scheduler.requests["wide"].status == "rejected" and not sim.scheduler.waiting
    sim.apply(Submit("next", 3, prompt_len=4))
    schedule(sim, 10)
    assert sim.scheduler.requests["next"].status == "finished"  # not blocked behind it


def test_names_held_by_swapped_or_waiting_sequences_are_taken(cpu_backend):
    sim = sim_of(cpu_backend, num_blocks=12, preemption="swap", num_cpu_blocks=32, watermark=0.0)
    sim.apply(Submit("old", 40, prompt_len=20))
    sim.apply(Submit("young", 40, prompt_len=20))
    for _ in range(80):
        schedule(sim, 1)
        if sim.swapped:
            break
    assert sim.swapped, "the test needs a swapped-out sequence"
    name = next(iter(sim.swapped))
    used = sim.pool.num_used
    with pytest.raises(DuplicateSequenceError):
        sim.apply(Add(name, 3))
    assert sim.pool.num_used == used  # refused before any change
    sim.apply(Submit("later", 2, prompt_len=2))  # one sequence: it will be named "later"
    with pytest.raises(DuplicateSequenceError, match="request 'later' will run"):
        sim.apply(Add("later", 1))
    schedule(sim, 400)
    assert done(sim) and sim.pool.num_free == 12 and not sim.swapped


def test_a_users_name_can_never_pass_for_a_schedulers_sample(cpu_backend):
    with pytest.raises(InvalidOperationError, match="reserved for the scheduler"):
        Add("r/s1", 3)
    with pytest.raises(InvalidOperationError, match="reserved for the scheduler"):
        Submit("r/x", 2, prompt_len=3)
    with pytest.raises(ScenarioError, match=r"step 1, field 'seq'.*reserved"):
        parse_scenario('num_blocks = 8\nblock_size = 4\nnum_heads = 1\nhead_dim = 8\n[[steps]]\nop = "add"\n'
                       'seq = "q/s0"\ntokens = 2\n', "bad.toml")  # fmt: skip
    sim = sim_of(cpu_backend, num_blocks=24)
    sim.apply(Submit("q", 5, prompt_len=3, n=2))
    schedule(sim, 1)
    with pytest.raises(InvalidOperationError, match="belongs to request 'q'"):
        sim.apply(Free("q/s1"))
    schedule(sim, 10)
    assert sim.scheduler.requests["q"].status == "finished"


def test_a_request_that_can_never_be_admitted_is_reported_as_stalled(cpu_backend):
    sim = sim_of(cpu_backend, num_blocks=10, watermark=0.2)
    sim.apply(Add("mine", 24))  # the user's own sequence holds 6 blocks and never lets go
    sim.apply(Submit("r", 4, prompt_len=12))  # 3 blocks, with 2 kept as the watermark: 4 free is not enough
    schedule(sim, 5)
    reason = sim.scheduler.stalled()
    assert reason is not None and "waiting request r needs 3 blocks" in reason
    sim.apply(Free("mine"))
    assert sim.scheduler.stalled() is None  # the next step can admit it now
    schedule(sim, 10)
    assert done(sim)


STALLED = """name = "stalled"
num_blocks = 10
block_size = 4
num_heads = 2
head_dim = 8
watermark = 0.2
[[steps]]
op = "add"
seq = "mine"
tokens = 24
[[steps]]
op = "submit"
request = "r"
tokens = 12
output = 4
[[steps]]
op = "schedule"
steps = 3
"""


def test_the_cli_does_not_say_pass_for_work_that_can_never_finish(tmp_path, capsys):
    from pagesim.app.cli import main

    path = tmp_path / "stalled.toml"
    path.write_text(STALLED)
    report = tmp_path / "report.json"
    assert main(["run", str(path), "--backend", "cpu", "--quiet", "--json", str(report)]) == 3
    assert "STALLED" in capsys.readouterr().err
    data = json.loads(report.read_text())
    assert data["passed"] is False and "waiting request r" in data["stalled"]
    assert data["steps"][-1]["scheduler"] == {
        "waiting": ["r"],
        "running": [],
        "swapped": [],
        "finished": [],
        "rejected": [],
    }


@st.composite
def workloads(draw):
    config = {
        "num_blocks": draw(st.integers(4, 24)),
        "block_size": draw(st.sampled_from([1, 2, 4])),
        "watermark": draw(st.sampled_from([0.0, 0.1, 0.3])),
        "preemption": (mode := draw(st.sampled_from(["recompute", "swap"]))),
        "num_cpu_blocks": draw(st.integers(1 if mode == "swap" else 0, 32)),
        "prefix_caching": draw(st.booleans()),
        "max_num_seqs": draw(st.integers(1, 6)),
    }
    requests = []
    for i in range(draw(st.integers(1, 6))):
        fan = draw(st.sampled_from([{}, {"n": 2}, {"n": 3}, {"beam_width": 2}, {"beam_width": 3}]))
        requests.append(
            Submit(f"r{i}", draw(st.integers(1, 12)), prompt_len=draw(st.integers(1, 30)), shared_prefix=4, **fan)
        )
    return config, requests


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_every_random_workload_finishes_or_is_refused_with_nothing_leaked(cpu_backend, workload):
    """Hundreds of random scheduler workloads (n, beams, swap, recompute, watermark, prefix
    caching, small pools): each request ends finished or rejected, the pools end empty,
    and the invariants hold throughout. Memory management only, for speed."""
    config, requests = workload
    sim = sim_of(cpu_backend, kv_data=False, **config)
    for op in requests:
        sim.apply(op, attend=False)
    for _ in range(600):
        if done(sim):
            break
        sim.apply(Schedule(1), attend=False)
        assert sim.scheduler.stalled() is None
    assert done(sim), {r: s.status for r, s in sim.scheduler.requests.items()}
    assert {s.status for s in sim.scheduler.requests.values()} <= {"finished", "rejected"}
    assert sim.pool.num_free == sim.config.num_blocks and not sim.sequences and not sim.swapped
    if sim.cpu_pool is not None:
        assert sim.cpu_pool.num_free == sim.config.num_cpu_blocks


def test_random_workloads_keep_the_invariants_with_kv_data(cpu_backend):
    """A few of them with K/V stored and every invariant checked after each step."""
    sim = sim_of(cpu_backend, num_blocks=9, preemption="swap", num_cpu_blocks=12, prefix_caching=True)
    for i, fan in enumerate([{}, {"n": 2}, {"beam_width": 2}, {}]):
        sim.apply(Submit(f"r{i}", 9, prompt_len=7 + i, shared_prefix=4, **fan))
    for _ in range(300):
        if done(sim):
            break
        sim.apply(Schedule(1))
        check_invariants(sim)
        check_cpu_pool(sim)
    assert done(sim) and sim.pool.num_free == 9


@pytest.mark.timeout(20)
def test_schedule_of_two_to_the_31_steps_ends_when_nothing_can_change(cpu_backend):
    sim = sim_of(cpu_backend, kv_data=False)
    sim.apply(Schedule(2**31), attend=False)  # idle: returns at once
    sim.apply(Submit("r", 3, prompt_len=6))
    result = sim.apply(Schedule(2**31), attend=False)  # runs r to the end, then stops
    assert done(sim) and any(isinstance(e, ev.RequestFinished) for e in result.events)
    sim.apply(Add("mine", 24))
    sim.apply(Submit("s", 4, prompt_len=30))  # can never fit beside "mine": stalled
    before = sim.snapshot(with_data=False)
    sim.apply(Schedule(2**31), attend=False)
    assert sim.scheduler.stalled() is not None
    assert sim.snapshot(with_data=False).blocks == before.blocks
