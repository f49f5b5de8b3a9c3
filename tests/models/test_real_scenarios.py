"""The shipped real-model scenarios: stepping back then forward (from a snapshot with K/V,
and from one without, whose K/V the dense engine rebuilds) reproduces the uninterrupted
text; the preemption scenarios write the same text whether the group is swapped, recomputed
or preempted by vLLM v1."""

import pytest
from pagesim.core.scenario import load_scenario
from pagesim.core.timeline import Timeline
from pagesim.kernels.cpu_backend import CpuBackend

pytestmark = [pytest.mark.timeout(900), pytest.mark.usefixtures("one_kernel_thread", "model_cache")]


def texts(timeline):
    """Every live sequence's tokens and every request's outputs, as they stand."""
    sim = timeline.sim
    live = {s: tuple(seq.token_ids) for s, seq in sim.sequences.items()}
    requests = {}
    for name, state in sim.scheduler.requests.items():
        requests[name] = dict(getattr(state, "outputs", {})) or tuple(getattr(state, "tokens", ()))
    return live, requests


@pytest.mark.parametrize("snapshot_data", [True, False])
def test_stepping_back_then_forward_reproduces_the_text(snapshot_data):
    timeline = Timeline(load_scenario("parallel_sampling"), CpuBackend(), snapshot_every=4, snapshot_data=snapshot_data)
    seen = {}
    while not timeline.at_end:
        result = timeline.forward()
        assert result.attention is None or result.attention.passed
        seen[timeline.position] = texts(timeline)
    end = timeline.position
    for target in (6, 3):
        timeline.seek(target)
        assert texts(timeline) == seen[target]
        while timeline.position < end:
            result = timeline.forward()
            assert result.attention is None or result.attention.passed
            assert texts(timeline) == seen[timeline.position], f"step {timeline.position} after a seek to {target}"


def outputs_of(name):
    timeline = Timeline(load_scenario(name), CpuBackend(), snapshot_data=False, history=False)
    preemptions = 0
    while not timeline.at_end:
        result = timeline.forward()
        assert result.attention is None or result.attention.passed
        preemptions += sum(type(e).__name__ == "RequestPreempted" for e in result.events)
    requests = timeline.sim.scheduler.requests
    out = {}
    for name, state in requests.items():
        if hasattr(state, "outputs"):
            out.update(state.outputs)
        else:
            out[name] = tuple(state.tokens[state.prompt_len :])
    return out, preemptions


def test_every_preemption_writes_the_uninterrupted_text():
    swap, swaps = outputs_of("preemption_swap")
    recompute, recomputes = outputs_of("preemption_recompute")
    v1, v1_preemptions = outputs_of("preemption_v1")
    assert swaps and recomputes and v1_preemptions
    assert swap == recompute == v1
    assert len(swap) == 4 and all(swap.values())
