"""vLLM v1's scheduler on the real model: chunked prefill through the paged prefill kernel,
prefix-cache hits credited at admission, preemption by recompute, each request's sampling
parameters, and a stop at the end-of-sequence token. Every step's logits are held to the
dense engine's, and every request's text is the dense engine's generation of its prompt."""

import pytest
from pagesim.core.engine import Simulator
from pagesim.core.models.catalog import config_for_model
from pagesim.core.operations import Schedule, Submit
from pagesim.core.sampling import SamplingParams
from pagesim.kernels.cpu_backend import CpuBackend

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("one_kernel_thread")]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def v1(**fields):
    fields = {"num_blocks": 24, "max_num_batched_tokens": 16, "scheduler": "v1"} | fields
    return Simulator(config_for_model("smollm2-135m", block_size=8, **fields), CpuBackend())


def run(sim, steps=60):
    chunks = []
    for _ in range(steps):
        sim.apply(Schedule(1))
        assert all(c.passed for c in sim.runner.logits_checks), sim.runner.logits_checks
        chunks.append(sim.runner.computed_tokens)
        if not (sim.scheduler.running or sim.scheduler.waiting):
            break
    return chunks


def text_of(sim, request):
    state = sim.scheduler.requests[request]
    return state.tokens[state.prompt_len :].tolist()


def test_chunked_prefill_gives_the_dense_engines_text(smollm, engine):
    prompt = smollm.tokenizer.encode_chat(QUESTION)
    sim = v1()
    sim.apply(Submit("q", 12, prompt=tuple(prompt)))
    chunks = run(sim)
    assert chunks[:2] == [16, 16]  # the prompt is computed in budget-sized chunks
    expected = engine.generate(prompt, max_new_tokens=12)
    assert text_of(sim, "q") == expected.token_ids
    assert "Paris" in smollm.tokenizer.decode(text_of(sim, "q"))


def test_a_prefix_hit_skips_its_tokens_and_gives_the_same_text(smollm):
    prompt = smollm.tokenizer.encode_chat(QUESTION)
    sim = v1(prefix_caching=True, max_num_batched_tokens=64)
    sim.apply(Submit("first", 6, prompt=tuple(prompt)))
    run(sim)
    sim.apply(Submit("again", 6, prompt=tuple(prompt)))
    sim.apply(Schedule(1))
    state = sim.scheduler.requests["again"]
    assert state.prefix_hits == [len(prompt) // 8 * 8]
    assert sim.runner.computed_tokens == len(prompt) - state.prefix_hits[0]
    run(sim)
    assert text_of(sim, "again") == text_of(sim, "first")


def test_preemption_by_recompute_gives_the_uninterrupted_text(smollm, engine):
    prompts = [smollm.tokenizer.encode(t) for t in ("Once upon a time", "The sky is", "My favourite food is")]
    sim = v1(num_blocks=9, max_num_batched_tokens=32)
    for i, prompt in enumerate(prompts):
        sim.apply(Submit(f"r{i}", 20, prompt=tuple(prompt)))
    run(sim, 120)
    assert sim.scheduler.stats.preemptions > 0
    for i, prompt in enumerate(prompts):
        assert text_of(sim, f"r{i}") == engine.generate(prompt, max_new_tokens=20).token_ids


def test_sampling_parameters_and_parallel_samples_follow_each_requests_seed(smollm, engine):
    prompt = smollm.tokenizer.encode("A short poem about the sea:")
    sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=7)
    sim = v1(max_num_batched_tokens=64)
    sim.apply(Submit("p", 10, prompt=tuple(prompt), n=2, sampling=sampling))
    run(sim)
    for index in range(2):
        expected = engine.generate(prompt, 10, sampling=sampling.for_index(index))
        assert text_of(sim, f"p/s{index}") == expected.token_ids
    assert text_of(sim, "p/s0") != text_of(sim, "p/s1")  # each sample draws with its own index


def test_a_request_stops_at_the_end_of_sequence_token(smollm):
    prompt = smollm.tokenizer.encode_chat(QUESTION)
    sim = v1(max_num_batched_tokens=64)
    sim.apply(Submit("q", 64, prompt=tuple(prompt)))
    run(sim, 80)
    out = text_of(sim, "q")
    assert out[-1] == smollm.config.eos_id and len(out) < 64
    assert sim.scheduler.requests["q"].status == "finished"
