"""Serving time: the roofline against a hand calculation, the replay's per-request times on
tiny scenarios worked out by hand (v0 and v1), and the presets' published figures."""

import math
from dataclasses import replace

import pytest
from pagesim.core.config import CacheConfig
from pagesim.core.errors import InvalidStudyError
from pagesim.core.operations import Schedule, Submit
from pagesim.core.scenario import Scenario, load_scenario
from pagesim.core.studies.replay import Work, WorkTally, replay_scenario, replay_workload
from pagesim.core.studies.serving_time import (
    GPUS,
    MODEL_SHAPES,
    GpuSpec,
    ModelShape,
    Roofline,
    gpu,
    latency,
    model_shape,
    pool_blocks,
    pool_bytes,
)
from pagesim.core.studies.workload import RequestSpec

from tests.scenarios import token_model

TINY = ModelShape("tiny", layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=10)


def one_second_a_step(work: Work) -> float:
    return 0.0 if work.empty else 1.0


def test_one_steps_roofline_against_a_hand_calculation():
    tally = WorkTally(block_size=4)
    tally.chunk(2, 2)  # a two-token prompt
    tally.chunk(1, 5)  # a decode at context 5
    work = tally.work()
    # tokens 3, sequences 2, pairs (2·2 − 1) + 5 = 8, context read 2 + 5, blocks 1 + 2
    assert work == Work(tokens=3, seqs=2, decode_tokens=1, attended=8, kv_read=7, blocks_read=3)
    # per layer: q, o 8·2·4 each, k, v 8·1·4 each, MLP 3·8·16 -> 576; two layers 1152
    assert TINY.layer_params == 1152
    assert TINY.step_weight_bytes == (1152 + 10 * 8) * 2 == 2464
    assert TINY.kv_bytes_per_token == 2 * 2 * 1 * 4 * 2 == 32
    # bytes: weights + K/V of (7 read + 3 written + 3 blocks · 2 tokens overhead) = 16 tokens
    # flops: 2 · 1152 · 3 + LM head 2 · 8 · 10 · 2 + attention 4 · 2 layers · 2 heads · 4 · 8
    nbytes, flops = 2464 + 16 * 32, 2 * 1152 * 3 + 2 * 8 * 10 * 2 + 4 * 2 * 2 * 4 * 8
    assert (nbytes, flops) == (2976, 7744)
    slow_compute = GpuSpec("slow", 10**9, bandwidth=1000.0, peak_flops=1000.0, pcie_bandwidth=100.0)
    cost = Roofline(TINY, slow_compute, block_size=4).cost(work)
    assert (cost.bytes, cost.flops, cost.bound) == (2976, 7744, "compute")
    assert cost.seconds == pytest.approx(7.744)
    fast_compute = GpuSpec("fast", 10**9, bandwidth=1000.0, peak_flops=1e6, pcie_bandwidth=100.0)
    assert Roofline(TINY, fast_compute, 4)(work) == pytest.approx(2.976)
    # a swap of 2 blocks of 4 tokens over the host link, on top of the step
    swapped = replace(work, swapped_blocks=2)
    assert Roofline(TINY, fast_compute, 4)(swapped) == pytest.approx(2.976 + 2 * 4 * 32 / 100.0)
    assert Roofline(TINY, fast_compute, 4)(Work()) == 0.0


def _scenario(config: CacheConfig, *ops) -> Scenario:
    return Scenario("tiny", "", config, tuple(ops))


def test_ttft_tpot_and_queue_time_in_v0_by_hand():
    # One sequence at a time: a runs, then b. Iterations of one second each:
    # 1 admit a (prefill) · 2 a's 1st token · 3 a's 2nd · 4 a's 3rd, done · 5 admit b ·
    # 6 b's 1st · 7 b's 2nd, done.
    config = CacheConfig(num_blocks=16, block_size=4, num_heads=1, head_dim=8, max_num_seqs=1, watermark=0.0)
    scenario = _scenario(config, Submit("a", 3, 4), Submit("b", 2, 4), Schedule(20))
    result = replay_scenario(scenario, seconds=one_second_a_step)
    a, b = result.requests["a"], result.requests["b"]
    assert (a.arrival, a.admitted, a.first_token, a.finished, a.output_tokens) == (0.0, 0.0, 2.0, 4.0, 3)
    assert (b.arrival, b.admitted, b.first_token, b.finished, b.output_tokens) == (0.0, 4.0, 6.0, 7.0, 2)
    assert result.iterations == 7
    assert result.works[0] == Work(tokens=4, seqs=1, attended=10, kv_read=4, blocks_read=1)
    assert result.works[1] == Work(tokens=1, seqs=1, decode_tokens=1, attended=5, kv_read=5, blocks_read=2)
    summary = latency(result)
    assert summary.queue["mean"] == 2.0  # (0 + 4) / 2
    assert summary.ttft["mean"] == 4.0  # (2 + 6) / 2
    assert summary.tpot["mean"] == 1.0  # a: (4 − 2) / 2, b: (7 − 6) / 1
    assert summary.throughput == pytest.approx(5 / 7)
    assert summary.normalized["mean"] == pytest.approx((4 / 3 + 7 / 2) / 2)


def test_v0s_parallel_samples_each_count_in_the_throughput_as_v1s_child_requests_do():
    """n = 2 writes two tokens a step: v0 runs them as one group, v1 as two child requests."""
    tokens = {}
    for scheduler in ("v0", "v1"):
        config = CacheConfig(num_blocks=32, block_size=4, num_heads=1, head_dim=8, scheduler=scheduler)
        scenario = _scenario(config, Submit("a", 3, 4), Submit("b", 5, 4, n=2), Schedule(40))
        summary = latency(replay_scenario(scenario, seconds=one_second_a_step))
        tokens[scheduler] = summary.output_tokens
        if scheduler == "v0":
            assert summary.tpot["mean"] == 1.0  # each sample's own pace: one token a step
    assert tokens == {"v0": 3 + 2 * 5, "v1": 3 + 2 * 5}


def test_ttft_and_tpot_in_v1_by_hand():
    # v1: the step that completes a prompt samples the first token. 1 both prompts, first
    # tokens · 2 both decode, b done (2 tokens) · 3 a done (3 tokens).
    config = CacheConfig(num_blocks=16, block_size=4, num_heads=1, head_dim=8, scheduler="v1")
    scenario = _scenario(config, Submit("a", 3, 4), Submit("b", 2, 4), Schedule(20))
    result = replay_scenario(scenario, seconds=one_second_a_step)
    a, b = result.requests["a"], result.requests["b"]
    assert (a.first_token, a.finished, b.first_token, b.finished) == (1.0, 3.0, 1.0, 2.0)
    assert result.works[0].tokens == 8 and result.works[0].seqs == 2
    summary = latency(result)
    assert summary.ttft["mean"] == 1.0
    assert summary.tpot["mean"] == 1.0  # a: (3 − 1) / 2, b: (2 − 1) / 1


def test_a_workload_arrives_on_the_clock_and_an_idle_engine_waits():
    config = CacheConfig(num_blocks=16, block_size=4, num_heads=1, head_dim=8)
    specs = [RequestSpec("x", 0.0, 4, 2), RequestSpec("y", 10.0, 4, 2)]
    result = replay_workload(config, specs, seconds=one_second_a_step)
    x, y = result.requests["x"], result.requests["y"]
    assert (x.admitted, x.finished) == (0.0, 3.0)
    assert (y.arrival, y.admitted, y.first_token, y.finished) == (10.0, 10.0, 12.0, 13.0)


def test_swaps_are_counted_and_priced_over_the_host_link():
    scenario = load_scenario(token_model("preemption_swap"))
    spec = gpu("h100-sxm")
    result = replay_scenario(scenario, seconds=Roofline(model_shape("llama-3-8b"), spec, 4))
    assert result.preemptions >= 1 and result.swapped_blocks > 0
    assert sum(w.swapped_blocks for w in result.works) == result.swapped_blocks


def test_published_shapes_and_datasheet_figures():
    llama8 = MODEL_SHAPES["llama-3-8b"]
    assert llama8.params == pytest.approx(8.03e9, rel=1e-3)
    assert llama8.kv_bytes_per_token == 128 * 1024  # 32 layers · 8 KV heads · 128 · 2 (K, V) · 2 bytes
    assert MODEL_SHAPES["llama-3-70b"].params == pytest.approx(70.55e9, rel=1e-3)
    assert MODEL_SHAPES["qwen2.5-7b"].params == pytest.approx(7.6e9, rel=1e-2)
    assert MODEL_SHAPES["llama-13b"].params == pytest.approx(13.0e9, rel=1e-2)
    assert MODEL_SHAPES["llama-13b"].kv_bytes_per_token == 800 * 1024  # the vLLM paper's 800 KB a token
    assert {"a100-40gb", "a100-80gb", "h100-sxm", "h200"} <= set(GPUS)
    # a 13B model on an A100-40GB: about 12 GiB left for the KV cache, ~15k tokens
    left = pool_bytes(MODEL_SHAPES["llama-13b"], GPUS["a100-40gb"])
    assert 11 * 2**30 < left < 13 * 2**30
    assert pool_blocks(MODEL_SHAPES["llama-13b"], GPUS["a100-40gb"], 16) == left // (16 * 800 * 1024)


def test_unknown_presets_and_a_model_too_large_are_refused_by_name():
    with pytest.raises(InvalidStudyError, match=r"unknown model shape 'llama-4'.*llama-3-8b"):
        model_shape("llama-4")
    with pytest.raises(InvalidStudyError, match="unknown GPU 'v100'"):
        gpu("v100")
    with pytest.raises(InvalidStudyError, match="do not fit"):
        pool_bytes(MODEL_SHAPES["llama-3-70b"], GPUS["a100-80gb"])


def test_latency_of_nothing_finished_is_nan_not_an_error():
    config = CacheConfig(num_blocks=16, block_size=4, num_heads=1, head_dim=8)
    summary = latency(replay_scenario(_scenario(config)))
    assert summary.requests == 0 and math.isnan(summary.ttft["mean"]) and math.isnan(summary.throughput)


def test_a_v0_request_aborted_after_running_counts_apart_from_the_throughput():
    # b's prompt fits, so v0 admits it; its output outgrows the whole pool and it is aborted.
    config = CacheConfig(num_blocks=4, block_size=4, num_heads=1, head_dim=8, max_num_seqs=1, watermark=0.0)
    scenario = _scenario(config, Submit("a", 3, 4), Submit("b", 30, 4), Schedule(60))
    result = replay_scenario(scenario, seconds=one_second_a_step)
    a, b = result.requests["a"], result.requests["b"]
    assert a.finished is not None and not a.rejected
    assert b.rejected and b.aborted and b.admitted is not None and b.output_tokens > 0
    assert "grew past what the pool can hold" in b.rejection
    summary = latency(result)
    assert summary.output_tokens == 3 and summary.discarded_tokens == b.output_tokens
    assert summary.throughput == pytest.approx(3 / result.clock)


def test_a_v0_group_recomputed_is_charged_its_prompt_once_not_once_per_sample():
    """The engine re-prefills a preempted group's shared prompt once and forks it; the time
    model charged it per sample (2 × 48 tokens where the engine computed 38 + 2 × 10)."""
    config = CacheConfig(num_blocks=12, block_size=4, num_heads=1, head_dim=8, watermark=0.0, preemption="recompute")
    scenario = _scenario(config, Submit("a", 12, 10), Submit("g", 12, 10, n=2), Schedule(200))
    result = replay_scenario(scenario, seconds=one_second_a_step)
    assert result.preemptions > 0 and result.requests["g"].finished is not None
    prefilled = sum(w.tokens - w.decode_tokens for w in result.works)
    assert prefilled == 10 + 10 + result.recomputed_tokens  # each prompt once, then what the engine recomputed
