"""Every layer is checked: each layer's paged attention against dense attention on the same
stored K/V, and the logits against the dense engine's; the report names the worst layer."""

import numpy as np
import pytest
from pagesim.core import events as ev
from pagesim.core.engine import Simulator
from pagesim.core.models.catalog import config_for_model
from pagesim.core.operations import Add, Grow
from pagesim.kernels.cpu_backend import CpuBackend

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("one_kernel_thread")]


def started(smollm, backend=None):
    sim = Simulator(config_for_model("smollm2-135m", block_size=8, num_blocks=24), backend or CpuBackend())
    prompt = smollm.tokenizer.encode("The quick brown fox jumps over the lazy dog because")
    return sim, sim.apply(Add("a", prompt=tuple(prompt)))


def test_a_step_checks_all_layers_and_names_the_worst(smollm):
    sim, result = started(smollm)
    layers = result.attention.layers
    assert layers.errors.shape == (smollm.config.num_layers, 1, smollm.config.num_heads)
    assert layers.passed and result.attention.passed
    checked = [e for e in result.events if isinstance(e, ev.LayersChecked)]
    assert len(checked) == 1 and checked[0].worst_layer == layers.worst_layer
    assert f"layer {layers.worst_layer}" in checked[0].describe()
    assert 0 < layers.ratios.max() < 1
    result = sim.apply(Grow("a"))  # a decode step: the decode kernel in every layer
    assert result.attention.layers.passed
    assert sim.apply(Add("b", prompt=(1, 2, 3))).attention.layers.seq_ids == ("b",)  # what the forward ran


def test_a_kernel_wrong_in_one_layer_fails_the_step_and_is_named(smollm):
    """The decode kernel errs in layer 7 only (a whole head's output shifted): the check of
    that layer fails and names it; the checked layer's report alone would not have seen it."""

    class WrongInOneLayer(CpuBackend):
        calls = 0

        def paged_attention(self, *args, **kwargs):
            out = super().paged_attention(*args, **kwargs)
            WrongInOneLayer.calls += 1
            if WrongInOneLayer.calls == 8:  # layer 7 of the decode step
                out = np.array(out)
                out[:, 0, :] += 1e-3
            return out

    sim, _ = started(smollm, WrongInOneLayer())
    WrongInOneLayer.calls = 0
    result = sim.apply(Grow("a"))
    layers = result.attention.layers
    assert not layers.attention_passed and not result.attention.passed
    assert layers.worst_layer == 7
    assert "BEYOND" in layers.describe()


def test_a_corrupted_block_in_a_middle_layer_fails_on_the_logits(smollm):
    """A block of layer 3 overwritten behind the engine's back: the layer check reads the
    same pool, but the logits leave the dense engine's, so the step fails."""
    sim, _ = started(smollm)
    cache = sim.runner.caches[3]
    block = sim.sequence("a").block_table[0]
    cache.key_cache[block] = cache.key_cache[block][::-1].copy()
    result = sim.apply(Grow("a"))
    layers = result.attention.layers
    assert layers.logits_diff > layers.logits_tolerance
    assert not result.attention.passed
