"""Per-request serving time of a scenario (the app's Latency panel) and the what-if panel's
suggested values."""

import json
import math
from dataclasses import replace

import pytest
from pagesim.core.config import CacheConfig
from pagesim.core.errors import InvalidStudyError
from pagesim.core.operations import Submit
from pagesim.core.scenario import load_scenario, parse_scenario
from pagesim.core.studies.replay import replay_scenario
from pagesim.core.studies.request_latency import scenario_latency
from pagesim.core.studies.stand_in import memory_only
from pagesim.core.studies.sweep import parse_setting
from pagesim.core.studies.whatif import PANEL_KNOBS, suggested_values

from tests.scenarios import token_model

SETTINGS = "num_blocks = 24\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\nwatermark = 0.0\n"
# Three requests that outgrow the pool: the newest (two samples) is preempted and recomputed.
REQUESTS = (
    'name = "requests"\n' + SETTINGS
    + '[[steps]]\nop = "submit"\nrequest = "r1"\ntokens = 18\noutput = 20\n'
    + '[[steps]]\nop = "submit"\nrequest = "r2"\ntokens = 14\noutput = 20\n'
    + '[[steps]]\nop = "submit"\nrequest = "r3"\ntokens = 10\noutput = 16\nn = 2\n'
    + '[[steps]]\nop = "schedule"\nsteps = 6\n'
)  # fmt: skip
BY_HAND = 'name = "by hand"\n' + SETTINGS + '[[steps]]\nop = "add"\nseq = "A"\ntokens = 6\n'


def test_each_request_has_its_figures_and_they_agree_with_the_summary():
    study = scenario_latency(parse_scenario(REQUESTS), "llama-3-8b", "h200")
    assert (study.model_shape, study.gpu) == ("Llama-3-8B", "H200")
    assert study.pool.startswith("24 blocks of 4 tokens")
    by_name = {r.request: r for r in study.requests}
    assert set(by_name) == {"r1", "r2", "r3"} and {r.state for r in study.requests} == {"finished"}
    assert by_name["r3"].preemptions > 0 and by_name["r1"].preemptions == 0
    # r3 is preempted and recomputed: its tokens come slower than r1's.
    assert by_name["r3"].tpot > by_name["r1"].tpot > 0
    mean_ttft = sum(r.ttft for r in study.requests) / 3
    assert math.isclose(study.summary.ttft["mean"], mean_ttft)
    assert study.summary.throughput > 0 and study.stalled is None and study.note == ""


def test_a_scenario_without_requests_has_no_rows_and_an_unknown_preset_is_refused():
    assert scenario_latency(parse_scenario(BY_HAND)).requests == ()
    with pytest.raises(InvalidStudyError, match="unknown GPU"):
        scenario_latency(parse_scenario(BY_HAND), "llama-3-8b", "v100")


TOY = CacheConfig(num_blocks=24, block_size=4, num_heads=1, head_dim=8)
CONFIGS = {
    "toy": TOY,
    "swap": replace(TOY, preemption="swap", num_cpu_blocks=8, watermark=0.0, max_num_seqs=2),
    "v1 with prefix caching": replace(TOY, scheduler="v1", prefix_caching=True, block_size=1),
}


@pytest.mark.parametrize("knob", PANEL_KNOBS)
@pytest.mark.parametrize("name", CONFIGS)
def test_suggested_values_parse_and_differ_from_the_scenario(knob, name):
    config = CONFIGS[name]
    field, values = parse_setting(f"{knob}={suggested_values(knob, config)}")
    assert values and getattr(config, field) not in values


def test_suggestions_follow_the_scenario():
    config = TOY
    assert suggested_values("block_size", config) == "2,8"  # half and double its 4
    assert suggested_values("scheduler", replace(config, scheduler="v1")) == "v0"


REAL = (
    'name = "real"\nmodel = "smollm2-135m"\nnum_blocks = 16\nblock_size = 4\n'
    '[[steps]]\nop = "submit"\nrequest = "a"\nprompt = [1, 2, 3, 40000, 5, 6, 7, 8, 9]\noutput = 6\n'
    '[[steps]]\nop = "submit"\nrequest = "b"\nprompt = [1, 2, 3, 40000, 5, 6, 7, 8, 10]\noutput = 4\n'
    '[[steps]]\nop = "schedule"\nsteps = 2\n'
)


def test_a_real_models_scenario_is_replayed_on_the_synthetic_model_and_says_so():
    real = parse_scenario(REAL)
    with pytest.raises(InvalidStudyError, match="real model needs its K/V"):
        replay_scenario(real)  # what the stand-in is for
    stand_in, note = memory_only(real)
    assert stand_in.config.model == "synthetic" and note.startswith("smollm2-135m is played by the synthetic model")
    assert stand_in.config.num_blocks == 16 and stand_in.config.block_size == 4
    prompts = [op.prompt for op in stand_in.operations if isinstance(op, Submit)]
    assert prompts[0][3] == prompts[1][3] == 40000  # the ids themselves: a memory-only run only hashes them
    assert [len(p) for p in prompts] == [9, 9]
    study = scenario_latency(real)
    assert study.note == note and study.summary.requests == 2
    assert {r.output_tokens for r in study.requests} == {6, 4}  # every output to its length


def test_a_stand_ins_prefix_hits_are_the_real_prompts_not_ids_folded_together():
    """Ids folded into the synthetic vocabulary (t % 32000) made [5..13] and [32005..32013],
    which share no token, hit each other's blocks: a 50 % hit rate."""
    prompts = ([5, 6, 7, 8, 9, 10, 11, 12, 13], [32005, 32006, 32007, 32008, 32009, 32010, 32011, 32012, 32013])
    text = 'name = "two"\nmodel = "smollm2-135m"\nnum_blocks = 16\nblock_size = 4\nprefix_caching = true\n'
    for name, prompt in zip("ab", prompts, strict=True):
        text += f'[[steps]]\nop = "submit"\nrequest = "{name}"\nprompt = {prompt}\noutput = 2\n'
        text += '[[steps]]\nop = "schedule"\nsteps = 4\n'
    stand_in, _ = memory_only(parse_scenario(text))
    assert replay_scenario(stand_in).prefix_hit_rate == 0.0


def test_a_synthetic_scenario_is_its_own_stand_in():
    scenario = parse_scenario(REQUESTS)
    assert memory_only(scenario) == (scenario, "")


def test_the_latency_panel_refuses_a_model_or_a_pool_the_gpu_cannot_hold():
    """It gave a 70B model's timings on a 40 GB A100 (the weights alone are 131 GiB)."""
    scenario = load_scenario(token_model("preemption_recompute"))
    with pytest.raises(InvalidStudyError, match=r"Llama-3-70B's weights .* do not fit"):
        scenario_latency(scenario, "llama-3-70b", "a100-40gb")
    big = replace(scenario, config=replace(scenario.config, num_blocks=10_000_000, max_model_len=None))
    with pytest.raises(InvalidStudyError, match=r"pool: 10000000 blocks of .* at most"):
        scenario_latency(big, "llama-3-8b", "h200")


def test_a_replay_that_runs_out_of_iterations_counts_the_requests_still_to_arrive(monkeypatch, capsys):
    """They were never submitted, so no record and no count: 2,659 of 5,000 'finished · 3
    unfinished', the other 2,338 gone from the report."""
    import pagesim.core.studies.replay as replay_module
    from pagesim.app.cli import main
    from pagesim.core.studies.workload import RequestSpec

    monkeypatch.setattr(replay_module, "MAX_ITERATIONS", 30)
    specs = [RequestSpec(f"r{i}", arrival=i * 0.05, prompt_len=8, output_len=4) for i in range(40)]
    config = CacheConfig(num_blocks=64, block_size=4, num_heads=1, head_dim=8)
    result = replay_module.replay_workload(config, specs)
    assert result.iterations == 30 and result.capped
    assert set(result.requests) == {s.request_id for s in specs}
    to_arrive = [r for r in result.requests.values() if r.arrival > result.clock]
    assert result.never_submitted == len(to_arrive) > 0
    assert all(r.state == "unfinished" and r.admitted is None for r in to_arrive)
    finished = sum(r.state == "finished" for r in result.requests.values())
    assert result.unfinished == len(specs) - finished
    monkeypatch.setattr("pagesim.app.serving_cli.MAX_ITERATIONS", 30)
    argv = ["latency", "--workload", "uniform", "--requests", "200", "--model-shape", "llama-3-8b", "--gpu", "h200"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "note: a replay stops after 30 steps; this one left" in out
    assert "of them not yet arrived: send fewer requests, or raise --rate" in out
    assert main([*argv, "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stopped_at_step_cap"] and doc["steps"] == 30
    assert doc["unfinished"] == sum(r["state"] == "unfinished" for r in doc["requests"]) > doc["not_yet_arrived"] > 0
