"""Real generation: sampling parameters per sequence (temperature, top-k, top-p, a seed),
stopping at the end-of-sequence token or max_tokens, and parallel samples through the
scheduler, each against the dense engine fed the same tokens and drawing with the same seed."""

import json
import math
import re

import pytest
import torch
from pagesim.core import events as ev
from pagesim.core.engine import Simulator
from pagesim.core.errors import InvalidOperationError, ScenarioError
from pagesim.core.models.catalog import config_for_model
from pagesim.core.operations import Add, Grow, Schedule, Submit
from pagesim.core.sampling import SamplingParams, choose_token, masked_logits
from pagesim.core.scenario import parse_scenario
from pagesim.core.timeline import Timeline
from pagesim.kernels.cpu_backend import CpuBackend

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("one_kernel_thread")]

SYNTHETIC = "num_blocks = 8\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\n"
HEADER = """
model = "smollm2-135m"
num_blocks = 16
block_size = 8
"""


def simulator(block_size=8, **fields):
    fields.setdefault("num_blocks", 24)
    return Simulator(config_for_model("smollm2-135m", block_size=block_size, **fields), CpuBackend())


def all_checks_passed(sim):
    checks = sim.runner.logits_checks
    assert all(c.passed for c in checks), checks


# -- the choice itself (no model) ------------------------------------------------------------
def test_top_k_and_top_p_keep_vllms_sets_and_a_draw_depends_on_seed_index_and_position():
    logits = torch.log(torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15]))

    def kept(**kw):
        finite = masked_logits(logits, SamplingParams(1.0, **kw)).isfinite()
        return set(torch.nonzero(finite).flatten().tolist())

    assert kept(top_k=2) == {1, 3}
    assert kept(top_p=0.7) == {1, 3}  # 0.4 + 0.3 = 0.7 ≥ p: the smallest such set
    assert kept(top_p=0.71) == {1, 3, 4}
    assert kept(top_p=0.01) == {1}  # at least the most probable
    assert kept(top_k=3, top_p=0.5) == {1, 3}  # nucleus within the top-k, renormalised
    assert kept() == set(range(5))
    params = SamplingParams(0.9, seed=4)
    draws = [choose_token(logits, params, p) for p in range(64)]
    assert draws == [choose_token(logits, params, p) for p in range(64)]  # the same three numbers
    assert draws != [choose_token(logits, params.for_index(1), p) for p in range(64)]  # another sample
    assert draws != [choose_token(logits, SamplingParams(0.9, seed=5), p) for p in range(64)]
    assert all(choose_token(logits, SamplingParams(seed=s), 3) == 1 for s in range(5))  # temperature 0: argmax
    # A vanishing temperature is greedy too (vLLM's 1e-5): logits / 1e-40 were inf, their
    # softmax NaN, and every draw token 0.
    for tiny in (1e-300, 1e-40, 9e-6):
        assert SamplingParams(tiny).greedy and all(
            choose_token(logits, SamplingParams(tiny, seed=s), 3) == 1 for s in range(5)
        )
    assert not SamplingParams(1e-5).greedy
    counts = torch.bincount(torch.tensor([choose_token(logits, SamplingParams(1.0, seed=s), 0) for s in range(2000)]))
    assert math.isclose(counts[1] / 2000, 0.4, abs_tol=0.05) and math.isclose(counts[0] / 2000, 0.05, abs_tol=0.02)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", -0.5, "temperature must be a number ≥ 0"),
        ("top_p", 0, "top_p must be a number in (0, 1]"),
        ("top_p", 1.2, "top_p must be a number in (0, 1]"),
        ("top_k", -1, "top_k must be an integer ≥ 0"),
        ("seed", -3, "seed must be an integer"),
        ("max_tokens", 0, "max_tokens must be a positive integer"),
        ("n", 0, "n must be a positive integer"),
    ],
)
def test_a_bad_sampling_field_is_refused_by_name(field, value, message):
    output = "" if field == "max_tokens" else "output = 2\n"  # (a request's max_tokens is its output)
    text = f'{SYNTHETIC}[[steps]]\nop = "submit"\nrequest = "r"\ntokens = 4\n{output}{field} = {value}\n'
    with pytest.raises(ScenarioError, match=re.escape(message)) as info:
        parse_scenario(text)
    assert info.value.field == field


def test_the_synthetic_model_ignores_sampling():
    text = SYNTHETIC + '[[steps]]\nop = "add"\nseq = "a"\ntokens = 5\n[[steps]]\nop = "grow"\nseq = "a"\ntokens = 3\n'
    plain = Timeline(parse_scenario(text), CpuBackend())
    sampled = Timeline(
        parse_scenario(text.replace("tokens = 5", "tokens = 5\ntemperature = 1.5\nseed = 9")), CpuBackend()
    )
    for timeline in (plain, sampled):
        timeline.seek(2)
    assert list(plain.sim.sequence("a").token_ids) == list(sampled.sim.sequence("a").token_ids)


# -- the real model --------------------------------------------------------------------------
SAMPLED = (
    HEADER
    + """
[[steps]]
op = "add"
seq = "a"
prompt = "Once upon a time"
temperature = 0.9
top_p = 0.95
top_k = 50
seed = 11

[[steps]]
op = "grow"
seq = "a"
tokens = 2

[[steps]]
op = "grow"
seq = "a"
tokens = 2
"""
)


def test_sampled_text_is_the_dense_engines_and_replay_step_back_and_branch_reproduce_it(smollm, engine):
    scenario = parse_scenario(SAMPLED)
    params = scenario.operations[0].sampling
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.9, 0.95, 50, 11)
    timeline = Timeline(scenario, CpuBackend())
    timeline.seek(3)
    all_checks_passed(timeline.sim)
    text = list(timeline.sim.sequence("a").token_ids)
    prompt = list(scenario.operations[0].prompt)
    expected = engine.generate(prompt, max_new_tokens=4, stop_ids=[], sampling=params)
    assert text[len(prompt) :] == expected.token_ids
    greedy = engine.generate(prompt, max_new_tokens=4, stop_ids=[]).token_ids
    assert text[len(prompt) :] != greedy  # it did sample
    timeline.back()
    timeline.forward()  # a step back, then forward
    assert list(timeline.sim.sequence("a").token_ids) == text
    timeline.seek(1)
    timeline.push(Grow("a", 4))  # a branch: the same four tokens, as one grow
    assert list(timeline.sim.sequence("a").token_ids) == text
    again = Timeline(parse_scenario(SAMPLED), CpuBackend())
    again.seek(3)  # a replay
    assert list(again.sim.sequence("a").token_ids) == text


QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_a_sequence_stops_at_eos_or_max_tokens_and_a_request_that_samples_eos_finishes(smollm):
    prompt = smollm.tokenizer.encode_chat(QUESTION)
    eos = smollm.config.eos_id
    sim = simulator()
    sim.apply(Add("a", prompt=prompt))
    sim.apply(Grow("a", 20))  # "The capital of France is Paris." then the end of its turn
    generated = list(sim.sequence("a").token_ids)[len(prompt) :]
    assert generated[-1] == eos and len(generated) < 20
    with pytest.raises(InvalidOperationError, match="has finished: it generated the end-of-sequence token"):
        sim.apply(Grow("a"))
    sim.apply(Add("b", prompt=prompt, sampling=SamplingParams(max_tokens=2)))
    sim.apply(Grow("b", 5))
    assert sim.sequence("b").generated == 2
    with pytest.raises(InvalidOperationError, match="max_tokens = 2"):
        sim.apply(Grow("b"))
    # Through the scheduler: the request finishes at its end-of-sequence token, not at 20.
    sim = simulator()
    sim.apply(Submit("r", output_len=20, prompt=tuple(prompt)))
    finished = []
    for _ in range(20):
        result = sim.apply(Schedule())
        all_checks_passed(sim)
        finished += [e for e in result.events if isinstance(e, ev.RequestFinished)]
        if finished:
            break
    state = sim.scheduler.requests["r"]
    assert state.status == "finished" and state.outputs["r"] == tuple(generated)
    assert finished[0].output_tokens == len(generated) < 20
    assert not sim.sequences and sim.pool.num_free == sim.config.num_blocks  # its blocks freed


def run_samples(sim, request, steps):
    """Schedule until ``request`` finishes; each sample's generated tokens and, for every
    copy-on-write, the position it wrote (the number of tokens generated by that step)."""
    copies = []
    for _ in range(steps):
        result = sim.apply(Schedule())
        all_checks_passed(sim)
        generated = sim.scheduler.requests[request].generated
        copies += [(generated, e.seq) for e in result.events if isinstance(e, ev.BlockCopied)]
        if sim.scheduler.requests[request].status == "finished":
            return sim.scheduler.requests[request].outputs, copies
    raise AssertionError("did not finish")


@pytest.mark.parametrize("block_size", [8, 4])  # the 4-token prompt: a partly filled block, a full one
def test_parallel_samples_share_the_prompt_diverge_by_seed_and_each_is_a_dense_replay(smollm, engine, block_size):
    """n = 2 samples at temperature 1: the forks share every prompt block and draw with
    their own seeds (index 0 and 1). Copy-on-write is vLLM's rule, not the text's: the
    first write into the shared, partly filled last block copies it (the first decode
    step, whether or not the two tokens differ); a prompt that fills its last block has no
    shared block to write into and copies nothing."""
    prompt = smollm.tokenizer.encode("Once upon a time")
    sampling = SamplingParams(1.0, seed=3, top_k=40)
    sim = simulator(block_size)
    sim.apply(Submit("r", output_len=4, prompt=tuple(prompt), n=2, sampling=sampling))
    outputs, copies = run_samples(sim, "r", 6)
    a, b = outputs["r/s0"], outputs["r/s1"]
    assert a != b
    for index, out in enumerate((a, b)):
        dense = engine.generate(prompt, max_new_tokens=4, sampling=sampling.for_index(index))
        assert list(out) == dense.token_ids
    if len(prompt) % block_size:
        assert len(copies) == 1 and copies[0][0] == 1  # the first decode step, whichever sample writes first
    else:
        assert copies == []


def test_generate_samples_with_a_seed_and_says_so(capsys):
    from pagesim.app.cli import main

    args = ["generate", "Once upon a time", "--max-tokens", "3", "--backend", "cpu", "--json", "-"]
    sampled = [*args, "--temperature", "0.8", "--top-p", "0.9", "--top-k", "20", "--seed", "5"]
    reports = []
    for command in (sampled, sampled):
        assert main(command) == 0
        reports.append(json.loads(capsys.readouterr().out))
    assert reports[0]["output_token_ids"] == reports[1]["output_token_ids"]  # the same seed, the same text
    assert reports[0]["sampling"] == {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 5}
    assert all(s["passed"] for s in reports[0]["steps"])
    assert main([*args, "--top-p", "0"]) == 2
    assert "top_p must be a number in (0, 1]" in capsys.readouterr().err
