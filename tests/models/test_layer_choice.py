"""Any layer of a real model can be shown and replayed: each sequence's newest query is kept
for every layer, and a layer's detail reads that layer's own cache through the block table."""

import numpy as np
import pytest
import torch
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.errors import InvalidOperationError
from pagesim.core.models.catalog import config_for_model
from pagesim.core.operations import Add, Fork, Grow
from pagesim.core.scenario import load_shipped
from pagesim.core.timeline import Timeline
from pagesim.core.view_model import build_frame
from pagesim.core.walkthrough import walk_through
from pagesim.kernels.cpu_backend import CpuBackend
from pagesim.kernels.reference import causal_attention

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("one_kernel_thread")]


def started(smollm):
    sim = Simulator(config_for_model("smollm2-135m", block_size=4, num_blocks=32), CpuBackend())
    prompt = smollm.tokenizer.encode("The capital of France is Paris, and the capital of Italy is")
    sim.apply(Add("a", prompt=tuple(prompt)))
    sim.apply(Grow("a", 2))  # two decode steps: the query is a decode step's
    return sim


def dense_queries(runner, token_ids) -> np.ndarray:
    """Every layer's query of the last token, from a plain causal forward over the whole text."""
    queries = []

    def attention(layer, q, k, v):
        queries.append(q[-1].numpy().copy())
        return causal_attention(q, k, v, runner.scale)

    n = len(token_ids)
    runner.llama.forward(torch.tensor(token_ids), torch.arange(n), attention)
    return np.stack(queries)


def test_each_layer_keeps_its_own_query_and_reads_its_own_cache(smollm):
    sim = started(smollm)
    seq = sim.sequence("a")
    runner = sim.runner
    expected = dense_queries(runner, list(seq.token_ids))
    context = seq.num_tokens
    outputs = []
    for layer in range(runner.num_layers):
        detail = sim.layer_detail("a", layer, context)
        # The query of that layer, not another's (a plain forward agrees to fp32 rounding).
        np.testing.assert_allclose(detail.query.astype(np.float32), expected[layer], atol=2e-3, rtol=1e-3)
        assert (detail.errors <= detail.bounds).all(), layer
        np.testing.assert_allclose(detail.weights.sum(axis=1), 1.0, atol=1e-5)
        assert detail.weights.shape == (runner.config.num_heads, context)
        outputs.append(detail.output)
    # The report's layer: the same kernel output as the step's own report.
    report = sim.last_attention
    np.testing.assert_allclose(outputs[runner.check_layer], report.output[0], atol=float(report.tolerances.max()))
    assert not np.allclose(outputs[0], outputs[runner.check_layer], atol=1e-3)  # layers differ
    with pytest.raises(InvalidOperationError, match=r"layer 30 is outside 0\.\.29"):
        sim.layer_detail("a", 30, context)


def test_a_layers_detail_survives_a_fork_and_a_seek_back(smollm):
    sim = started(smollm)
    sim.apply(Fork("a", "b"))
    context = sim.sequence("a").num_tokens
    parent, child = sim.layer_detail("a", 3, context), sim.layer_detail("b", 3, context)
    np.testing.assert_array_equal(parent.output, child.output)
    timeline = Timeline(load_shipped("default"), CpuBackend())
    timeline.seek(4)
    before = build_frame(timeline, None, focus_layer=5).focus
    timeline.seek(timeline.length)
    timeline.seek(4)
    after = build_frame(timeline, None, focus_layer=5).focus
    assert before.layer == after.layer == 5 and before.gathered
    np.testing.assert_array_equal(before.output, after.output)
    np.testing.assert_array_equal(before.weights, after.weights)


def test_the_frame_shows_the_worst_layer_by_default_and_the_walk_through_follows(smollm):
    timeline = Timeline(load_shipped("default"), CpuBackend())
    timeline.seek(5)
    sim = timeline.sim
    frame = build_frame(timeline, None)
    worst = sim.last_attention.layers.worst_layer
    assert frame.num_layers == 30 and frame.worst_layer == worst
    assert frame.focus.layer == worst and frame.focus.worst_layer == worst
    other = 1 if worst == 0 else 0  # (which layer is worst is rounding: any other will do)
    chosen = build_frame(timeline, None, focus_layer=other).focus
    assert chosen.layer == other and chosen.gathered and not np.array_equal(chosen.weights, frame.focus.weights)
    seq = frame.focus.seq_id
    for layer in (None, 0, 29):
        walk = walk_through(sim, seq, 2, "cpu", 512, layer)
        assert walk.layer == (worst if layer is None else layer) and walk.num_layers == 30
        assert walk.trace_error <= walk.bound and walk.dense_error <= walk.bound
    # The replay reads that layer's K/V: its scores are that layer's q·k.
    detail = sim.layer_detail(seq, 0, frame.focus.context_len)
    walk = walk_through(sim, seq, 2, "cpu", 512, 0)
    np.testing.assert_allclose(walk.kernel_output, detail.output[2])
    scores = np.exp(walk.trace.scores - walk.trace.scores.max())
    np.testing.assert_allclose(scores / scores.sum(), detail.weights[2], atol=1e-5)


def test_the_synthetic_model_has_one_layer_and_refuses_another():
    sim = Simulator(CacheConfig(num_blocks=8, block_size=4, num_heads=2, head_dim=8), CpuBackend())
    sim.apply(Add("a", 5))
    assert sim.runner.num_layers == 1 and sim.worst_layer() is None and sim.shown_layer(None) == 0
    with pytest.raises(InvalidOperationError, match="one attention"):
        sim.layer_detail("a", 0, 5)
