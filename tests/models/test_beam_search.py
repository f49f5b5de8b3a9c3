"""Beam search on the real model: the paged engine's beams (forks sharing blocks, dropped
beams freed) against a beam search written here on the dense engine from vLLM's rules, and
the same outputs after the group is preempted by swap or by recompute."""

import pytest
import torch
from pagesim.core import events as ev
from pagesim.core.engine import Simulator
from pagesim.core.models.catalog import config_for_model
from pagesim.core.models.llama import DenseKVCache
from pagesim.core.operations import Schedule, Submit
from pagesim.core.sampling import SamplingParams
from pagesim.kernels.cpu_backend import CpuBackend

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("one_kernel_thread")]

CHAT = [{"role": "user", "content": "Write a haiku about paging."}]
WIDTH, OUTPUT = 3, 8


def dense_beam_search(engine, prompt, width, output_len, eos_id, length_penalty=1.0):
    """vLLM v0's beam search on contiguous K/V: 2·width candidates by cumulative
    log-probability; EOS candidates finish; the best width of the rest go on; an early stop
    once no running beam can beat the worst of width finished; the best width outputs."""

    def score(tokens, logprob):
        length = len(prompt) + len(tokens) - (bool(tokens) and tokens[-1] == eos_id)
        return logprob / length**length_penalty

    cache = DenseKVCache(engine.model.config, capacity=len(prompt) + output_len + 1)
    logits = engine.step(cache, prompt)
    beams = [([], 0.0, cache, logits)]
    finished = []
    for step in range(output_len):
        cands = []
        for b, (_, cum, _, last) in enumerate(beams):
            logprobs = torch.log_softmax(last.to(torch.float64), -1)
            top = torch.topk(logprobs, 2 * width)
            cands += [(cum + float(v), b, int(t)) for v, t in zip(top.values, top.indices, strict=True)]
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        going = []
        for cum, b, token in cands[: 2 * width]:
            if token == eos_id:
                finished.append(([*beams[b][0], token], cum))
            elif len(going) < width:
                going.append((cum, b, token))
        finished = sorted(finished, key=lambda h: -score(*h))[:width]
        if not going:
            break
        worst = score(*finished[-1]) if len(finished) >= width else None
        if worst is not None and worst >= going[0][0] / (len(prompt) + step + 1) ** length_penalty:
            beams = []
            break
        new = []
        for cum, b, token in going:
            tokens, _, parent_cache, _ = beams[b]
            child = DenseKVCache(engine.model.config, capacity=len(prompt) + output_len + 1)
            n = parent_cache.length
            child.keys[:, :, :n], child.values[:, :, :n] = parent_cache.keys[:, :, :n], parent_cache.values[:, :, :n]
            child.length = n
            new.append(([*tokens, token], cum, child, engine.step(child, [token])))
        beams = new
    finished += [(tokens, cum) for tokens, cum, _, _ in beams]
    return [tuple(t) for t, _ in sorted(finished, key=lambda h: -score(*h))[:width]]


def beam_simulator(**fields):
    fields.setdefault("num_blocks", 40)
    return Simulator(config_for_model("smollm2-135m", block_size=8, **fields), CpuBackend())


def run_beams(sim, prompt, steps=OUTPUT + 2, sampling=None, between=None):
    sim.apply(Submit("beam", OUTPUT, prompt=tuple(prompt), beam_width=WIDTH, sampling=sampling))
    selections = []
    for i in range(steps):
        result = sim.apply(Schedule(1))
        assert all(c.passed for c in sim.runner.logits_checks), sim.runner.logits_checks
        selections += [e for e in result.events if isinstance(e, ev.BeamsSelected)]
        if between is not None:
            between(i, sim)
    state = sim.scheduler.requests["beam"]
    assert state.status == "finished"
    return state, selections


def test_paged_beams_equal_a_dense_beam_search(smollm, engine):
    prompt = smollm.tokenizer.encode_chat(CHAT)
    sim = beam_simulator()
    state, selections = run_beams(sim, prompt)
    expected = dense_beam_search(engine, prompt, WIDTH, OUTPUT, smollm.config.eos_id)
    assert list(state.outputs.values()) == expected
    assert len(set(expected)) == WIDTH  # three different texts: the search did branch
    assert selections and any(e.dropped for e in selections)  # some beam lost and was freed
    scores = [state.beam_scores[label] for label in state.outputs]
    assert all(s < 0 for s in scores)
    assert sim.metrics().used_blocks == 0  # every beam's blocks back in the pool


def test_beams_share_their_common_prefix_and_a_dropped_beam_frees_its_own_blocks(smollm):
    prompt = smollm.tokenizer.encode_chat(CHAT)
    sim = beam_simulator()
    sim.apply(Submit("beam", OUTPUT, prompt=tuple(prompt), beam_width=WIDTH))
    prompt_blocks = len(prompt) // 8
    for _ in range(5):
        free_before = sim.metrics().free_blocks
        result = sim.apply(Schedule(1))
        tables = [sim.sequence(s).block_table for s in sim.scheduler.requests["beam"].seqs]
        assert all(t[:prompt_blocks] == tables[0][:prompt_blocks] for t in tables)  # the prompt, shared
        for e in result.events:
            if isinstance(e, ev.BeamsSelected) and e.dropped:
                freed = [x for x in result.events if isinstance(x, ev.BlockFreed)]
                assert freed or sim.metrics().free_blocks >= free_before - WIDTH


@pytest.mark.parametrize("preemption", ["swap", "recompute"])
def test_a_preempted_beam_search_gives_the_uninterrupted_outputs(smollm, preemption):
    """An older request runs beside the beams; a user sequence takes the rest of the pool,
    so the newest group, the beams, is preempted (swapped, or freed and recomputed), comes
    back once the user frees it, and ends with the same hypotheses as a run that was never
    interrupted."""
    from pagesim.core.operations import Add, Free

    prompt = smollm.tokenizer.encode_chat(CHAT)
    other = smollm.tokenizer.encode("The sky is")

    def start(**fields):
        sim = beam_simulator(num_blocks=28, **fields)
        sim.apply(Submit("other", 24, prompt=tuple(other)))
        sim.apply(Submit("beam", OUTPUT, prompt=tuple(prompt), beam_width=WIDTH))
        sim.apply(Schedule(3))
        return sim

    alone = start()
    alone.apply(Schedule(OUTPUT + 2))
    cpu = 28 if preemption == "swap" else 0
    sim = start(num_cpu_blocks=cpu, preemption=preemption)
    sim.apply(Add("hog", prompt=tuple(prompt[:1]) * (sim.metrics().free_blocks * 8)))
    preempted = []
    for _ in range(6):  # until a beam needs a new block (or a copy) that the pool no longer has
        result = sim.apply(Schedule(1))
        if preempted := [e for e in result.events if isinstance(e, ev.RequestPreempted)]:
            break
    assert [(e.request, e.mode) for e in preempted] == [("beam", preemption)]
    sim.apply(Free("hog"))
    sim.apply(Schedule(OUTPUT + 2))
    state, expected = sim.scheduler.requests["beam"], alone.scheduler.requests["beam"]
    assert state.status == expected.status == "finished"
    assert state.outputs == expected.outputs


def test_beam_search_refuses_a_temperature():
    with pytest.raises(Exception, match="temperature"):
        Submit("beam", 4, prompt=(1, 2), beam_width=2, sampling=SamplingParams(temperature=0.7))
