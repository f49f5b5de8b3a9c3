"""The real model inside the engine: the Llama runner's paged forward (per-layer paged
caches, one block table, the paged prefill and decode kernels) against the dense engine,
token for token, through prefix-cache hits, forks with copy-on-write and preemption."""

import pytest
from pagesim.core.engine import Simulator
from pagesim.core.models.catalog import config_for_model
from pagesim.core.operations import Add, Fork, Grow, Schedule, Submit
from pagesim.kernels.cpu_backend import CpuBackend

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("one_kernel_thread")]

CHAT = [{"role": "user", "content": "Name three colours."}]


def simulator(block_size=16, **fields):
    fields.setdefault("num_blocks", 24)
    return Simulator(config_for_model("smollm2-135m", block_size=block_size, **fields), CpuBackend())


def checked(sim, result):
    """Every check of the step passed: each computed sequence's logits against the dense
    engine's, and the last layer's paged decode attention against dense SDPA."""
    checks = sim.runner.logits_checks
    assert checks and all(c.passed for c in checks), checks
    assert result.attention.passed
    return result


def outputs(sim, seq_id, prompt):
    return list(sim.sequence(seq_id).token_ids[len(prompt) :])


def test_paged_generation_equals_the_dense_engine(smollm, engine):
    prompt = smollm.tokenizer.encode_chat(CHAT)
    sim = simulator()
    checked(sim, sim.apply(Add("a", prompt=prompt)))
    assert sim.runner.computed_tokens == len(prompt)
    for _ in range(16):
        checked(sim, sim.apply(Grow("a")))
        assert sim.runner.computed_tokens == 1  # a decode step runs the new token only
    expected = engine.generate(prompt, max_new_tokens=16, stop_ids=[])
    assert outputs(sim, "a", prompt) == expected.token_ids
    assert sim.verify_kv("a") is None  # the last layer's pool reads back what was written
    assert len(sim.sequence("a").block_table) == -(-(len(prompt) + 16) // 16)


def test_a_prefix_cache_hit_skips_the_hit_tokens_and_gives_the_same_tokens(smollm):
    prompt = smollm.tokenizer.encode_chat(CHAT)  # 36 tokens: two full blocks and a tail
    sim = simulator(prefix_caching=True)
    sim.apply(Add("miss", prompt=prompt))
    checked(sim, sim.apply(Grow("miss", 6)))
    checked(sim, sim.apply(Add("hit", prompt=prompt)))
    full = len(prompt) // 16
    assert sim.metrics().prefix_hit_blocks == full
    assert sim.runner.computed_tokens == len(prompt) - 16 * full  # the hit tokens are not run again
    assert sim.sequence("hit").block_table[:full] == sim.sequence("miss").block_table[:full]
    for _ in range(6):
        checked(sim, sim.apply(Grow("hit")))
    assert outputs(sim, "hit", prompt) == outputs(sim, "miss", prompt)


def test_a_fork_shares_blocks_and_copy_on_write_keeps_both_continuations_dense(smollm, engine):
    """Parallel sampling's shape: two continuations of one prompt. The fork shares every
    block; the first divergent token copies the shared last block in every layer."""
    prompt = smollm.tokenizer.encode_chat(CHAT)
    assert len(prompt) % 16  # the last block is partly filled: the first write copies it
    sim = simulator()
    sim.apply(Add("a", prompt=prompt))
    sim.apply(Fork("a", "b"))
    assert sim.sequence("b").block_table == sim.sequence("a").block_table
    first_a, first_b = smollm.tokenizer.encode("Red"), smollm.tokenizer.encode("Blue")
    checked(sim, sim.apply(Grow("a", token_ids=first_a)))
    checked(sim, sim.apply(Grow("b", token_ids=first_b)))
    table_a, table_b = sim.sequence("a").block_table, sim.sequence("b").block_table
    assert table_a[:-1] == table_b[:-1] and table_a[-1] != table_b[-1]  # copy-on-write of the tail
    for _ in range(6):
        checked(sim, sim.apply(Grow("a")))
        checked(sim, sim.apply(Grow("b")))
    for seq_id, first in (("a", first_a), ("b", first_b)):
        expected = engine.generate(prompt + first, max_new_tokens=6, stop_ids=[])
        assert outputs(sim, seq_id, prompt)[len(first) :] == expected.token_ids, seq_id
        assert sim.verify_kv(seq_id) is None


def test_the_scheduler_runs_parallel_samples_and_preempts_by_swap(smollm, engine):
    """n = 2 samples of one prompt and a second request through vLLM v0's scheduler, on a
    pool that runs out: the newest request is swapped out (every layer's blocks) and back
    in, every step's logits stay within the bound of the dense engine's, and its greedy
    tokens are the dense engine's."""
    prompt = smollm.tokenizer.encode_chat(CHAT)
    other = smollm.tokenizer.encode("Once upon a time")
    sim = simulator(block_size=8, num_blocks=10, num_cpu_blocks=16, preemption="swap", watermark=0.0)
    sim.apply(Submit("r", output_len=16, prompt=tuple(prompt), n=2))
    sim.apply(Submit("q", output_len=14, prompt=tuple(other)))
    modes, seen = [], {}
    for _ in range(40):
        result = sim.apply(Schedule())
        modes += [e.mode for e in result.events if type(e).__name__ == "RequestPreempted"]
        assert all(c.passed for c in sim.runner.logits_checks), sim.runner.logits_checks
        seen.update({s: list(seq.token_ids) for s, seq in sim.sequences.items()})
        if not sim.sequences and not sim.swapped:
            break
    assert modes and set(modes) == {"swap"}
    samples = [seen[s][len(prompt) :] for s in seen if s.startswith("r")]
    assert len(samples) == 2 and samples[0] == samples[1]  # greedy: both samples alike
    produced = seen["q"][len(other) :]
    assert len(produced) >= 12
    assert produced == engine.generate(other, max_new_tokens=len(produced), stop_ids=[]).token_ids
