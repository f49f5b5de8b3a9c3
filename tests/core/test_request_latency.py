"""Per-request serving time of a scenario (the app's Latency panel) and the what-if panel's
suggested values."""

import math
from dataclasses import replace

import pytest
from pagesim.core.errors import InvalidStudyError
from pagesim.core.scenario import load_shipped
from pagesim.core.studies.request_latency import scenario_latency
from pagesim.core.studies.sweep import parse_setting
from pagesim.core.studies.whatif import PANEL_KNOBS, suggested_values


def test_each_request_has_its_figures_and_they_agree_with_the_summary():
    study = scenario_latency(load_shipped("preemption_recompute"), "llama-3-8b", "h200")
    assert (study.model_shape, study.gpu) == ("Llama-3-8B", "H200")
    assert study.pool.startswith("24 blocks of 4 tokens")
    by_name = {r.request: r for r in study.requests}
    assert set(by_name) == {"r1", "r2", "r3"} and {r.state for r in study.requests} == {"finished"}
    assert by_name["r3"].preemptions > 0 and by_name["r1"].preemptions == 0
    # r3 is preempted and recomputed: its tokens come slower than r1's.
    assert by_name["r3"].tpot > by_name["r1"].tpot > 0
    mean_ttft = sum(r.ttft for r in study.requests) / 3
    assert math.isclose(study.summary.ttft["mean"], mean_ttft)
    assert study.summary.throughput > 0 and study.stalled is None


def test_a_scenario_without_requests_has_no_rows_and_an_unknown_preset_is_refused():
    assert scenario_latency(load_shipped("default")).requests == ()
    with pytest.raises(InvalidStudyError, match="unknown GPU"):
        scenario_latency(load_shipped("default"), "llama-3-8b", "v100")


@pytest.mark.parametrize("knob", PANEL_KNOBS)
@pytest.mark.parametrize("name", ["default", "preemption_swap", "shared_system_prompt"])
def test_suggested_values_parse_and_differ_from_the_scenario(knob, name):
    config = load_shipped(name).config
    field, values = parse_setting(f"{knob}={suggested_values(knob, config)}")
    assert values and getattr(config, field) not in values


def test_suggestions_follow_the_scenario():
    config = load_shipped("default").config
    assert suggested_values("block_size", config) == "2,8"  # half and double its 4
    assert suggested_values("scheduler", replace(config, scheduler="v1")) == "v0"
