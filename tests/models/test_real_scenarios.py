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


@pytest.mark.parametrize(("dtype", "tolerance"), [("bfloat16", 1.0), ("float16", 0.125)])
def test_a_half_precision_cache_passes_its_checks_against_a_dense_engine_that_rounds_alike(dtype, tolerance):
    """A real model over a bf16 or fp16 KV cache: the dense engine rounds q, K and V to the
    cache's dtype as the paged one does, and the logits are held to what that rounding
    explains (they failed every step against fp32 rows and the fp32 bound)."""
    import re

    import torch
    from pagesim.core.scenario import parse_scenario, shipped_folder

    text = (shipped_folder() / "default.toml").read_text(encoding="utf-8")
    text, count = re.subn(r'^dtype = "[^"]*"$', f'dtype = "{dtype}"', text, flags=re.M)
    assert count == 1
    timeline = Timeline(parse_scenario(text, "default"), CpuBackend(), snapshot_data=False, history=False)
    checks = []
    while not timeline.at_end:
        report = timeline.forward().attention
        assert report is None or report.passed, f"step {timeline.position}: {report.layers}"
        if report is not None and report.layers is not None:
            checks.append(report.layers)
    assert checks and all(c.logits_tolerance == tolerance and c.tokens_agree for c in checks)
    assert max(c.logits_diff for c in checks) > 0  # (the engines do differ: the check is not vacuous)
    reference = timeline.sim.runner.reference
    rows = next(iter(reference.caches.values()))
    stored = getattr(torch, dtype)
    assert rows.stored_dtype == stored
    held = rows.keys[:, :, : rows.length]
    assert torch.equal(held, held.to(stored).float())  # every K the dense rows hold is representable
