"""The Waste tab replays on a served model's pool (a preset, or a block count), says which,
and the Memory tab draws the prefix cache's hit rate beside its plots."""

import math

import pytest
from pagesim.core.scenario import parse_scenario
from pagesim.core.studies.serving_time import GPUS, MODEL_SHAPES
from pagesim.core.studies.waste import pool_from_preset

from tests.app.conftest import wait_idle
from tests.app.study_scenarios import BY_HAND, SHARED_PREFIX, ToyWindows


@pytest.fixture
def toy(qtbot, settings):
    windows = ToyWindows(qtbot, settings)
    yield windows
    windows.close()


def compare(window, qtbot):
    with qtbot.waitSignal(window.controller.wasteReady, timeout=60_000) as blocker:
        window.waste_panel.run_button.click()
    wait_idle(qtbot, window)
    return blocker.args[0]


def test_waste_on_a_toy_scenario_uses_a_presets_pool_and_batches(toy, qtbot):
    window = toy(BY_HAND)
    panel = window.waste_panel
    assert window.frame.config.num_blocks == 24  # the scenario's own pool: one request at a time
    panel.count.setValue(100)
    study = compare(window, qtbot)
    expected = pool_from_preset(MODEL_SHAPES["llama-13b"], GPUS["a100-40gb"], 16)
    assert study.slots == expected.slots and study.pool == expected.describe()
    assert "A100-40GB after LLaMA-13B's weights" in panel.summary.text()
    assert panel.summary.text().startswith(f"Pool: {expected.slots} slots")
    paged = study.allocators[0]
    assert paged.allocator == "paged" and paged.peak_batch > 1
    assert all(r.peak_batch > 1 for r in study.allocators[:-1])


def test_waste_on_a_block_count_says_so(toy, qtbot):
    window = toy(BY_HAND)
    panel = window.waste_panel
    panel.pool_kind.setCurrentIndex(panel.pool_kind.findData("blocks"))
    assert panel.blocks.isVisibleTo(panel) and not panel.model_box.isVisibleTo(panel)
    panel.blocks.setValue(1024)
    panel.count.setValue(100)
    study = compare(window, qtbot)
    assert study.slots == 1024 * 16
    assert "1024 blocks, as chosen" in panel.summary.text()
    assert study.allocators[0].peak_batch > 1


def test_a_refused_study_clears_the_last_chart_and_says_why_in_the_panel(toy, qtbot):
    """The last study's bars stayed under the new settings, read as theirs, while the
    refusal went to a banner of its own."""
    window = toy(BY_HAND)
    panel = window.waste_panel
    panel.count.setValue(100)
    compare(window, qtbot)
    assert panel.bars and panel.result is not None
    panel.model_box.setCurrentIndex(panel.model_box.findData("llama-3-70b"))
    panel.gpu_box.setCurrentIndex(panel.gpu_box.findData("a100-40gb"))
    with qtbot.waitSignal(window.controller.studyFailed, timeout=60_000) as blocker:
        panel.run_button.click()
    wait_idle(qtbot, window)
    assert blocker.args[0] == "waste"
    assert panel.bars == [] and panel.result is None
    assert panel.summary.text().startswith("✗ could not compare the allocators: Llama-3-70B's weights (131.4 GiB)")
    panel.model_box.setCurrentIndex(panel.model_box.findData("llama-13b"))  # a study that runs clears it
    compare(window, qtbot)
    assert panel.bars and panel.summary.text().startswith("Pool: ") and panel.summary.styleSheet() == ""


def test_memory_tab_draws_the_prefix_hit_rate_from_the_frames(toy, qtbot):
    window = toy(SHARED_PREFIX)
    window.seek_end()
    frame = wait_idle(qtbot, window)
    panel = window.memory_panel
    panel.flush()
    assert panel.shows_hits and "prefix hits" in panel.util_plot.title_item.text
    xs, ys = panel.hit_curve.getData()
    assert len(xs) == frame.position
    rates = [100 * m.prefix_hit_rate for m in frame.history if m.prefix_lookup_blocks]
    drawn = [y for y in ys if not math.isnan(y)]
    assert drawn == rates and max(drawn) > 0  # the shared prompt is found in the cache
    window.load(parse_scenario(BY_HAND))  # no prefix cache: no hit-rate curve
    wait_idle(qtbot, window)
    panel.flush()
    assert not panel.shows_hits and "prefix hits" not in panel.util_plot.title_item.text
    assert panel.hit_curve.getData()[0] is None or len(panel.hit_curve.getData()[0]) == 0
