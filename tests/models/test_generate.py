"""``pagesim generate`` and scenarios that name a real model."""

import json
import os

import pytest
from pagesim.app.cli import main
from pagesim.core.errors import ScenarioError
from pagesim.core.scenario import parse_scenario
from pagesim.core.timeline import Timeline
from pagesim.kernels.cpu_backend import CpuBackend

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("one_kernel_thread", "smollm")]

QUESTION = "What is the capital of France?"


def test_generate_answers_the_question_and_reports_every_step(tmp_path, capsys, smollm):
    out = tmp_path / "gen.json"
    args = ["generate", QUESTION, "--chat", "--max-tokens", "12", "--json", str(out), "--backend", "cpu"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    header, _, text = printed.splitlines()[:3]
    assert "fp32 weights (the default)" in header and "thread" in header  # what runs: weights, threads, kernel
    assert "Paris" in text  # streamed after the header, then the table and the verdict
    assert "block table of sequence 0" in printed and "✓" in printed
    report = json.loads(out.read_text())
    assert report["dtype"] == "float32"
    tok = smollm.tokenizer
    assert report["prompt_token_ids"] == tok.encode_chat([{"role": "user", "content": QUESTION}])
    assert "Paris" in report["text"]
    assert report["text"] == tok.decode(report["output_token_ids"], skip_special=True)
    assert report["output_token_ids"][-1] == smollm.config.eos_id  # it ended its turn before 12
    steps = report["steps"]
    assert [s["token"] for s in steps] == report["output_token_ids"]
    assert all(s["passed"] and s["paged_token"] == s["dense_token"] for s in steps)
    assert all(s["max_abs_logit_diff"] <= s["tolerance"] for s in steps)
    assert len(report["block_table"]) == -(-(len(report["prompt_token_ids"]) + len(steps)) // 16)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device always full)")
def test_a_report_that_cannot_be_written_is_one_line_and_exit_1(capsys):
    assert main(["generate", "hi", "--max-tokens", "1", "--backend", "cpu", "--json", "/dev/full"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: could not write --json /dev/full") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("missing.gguf", "No such file"),
        ("garbage.gguf", "garbage.gguf"),
        ("gpt-5", "--model 'gpt-5' is not a model: give \"smollm2-135m\" (bundled) or a path to a .gguf file"),
    ],
)
def test_generate_refuses_a_bad_model_in_one_line(tmp_path, capsys, monkeypatch, model, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "garbage.gguf").write_bytes(b"not a model at all" * 10)
    assert main(["generate", "hi", "--model", model, "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_generate_refuses_more_tokens_than_the_models_context_window(capsys, smollm):
    assert main(["generate", "hi", "--max-tokens", "100000"]) == 2
    err = capsys.readouterr().err
    assert "pass the model's context window of 8192 tokens" in err and err.count("\n") == 1


SCENARIO = """
name = "A real model"
model = "smollm2-135m"
num_blocks = 16
block_size = 8
prefix_caching = true

[[steps]]
op = "add"
seq = "a"
prompt = "The capital of Italy is Rome. The capital of France is"

[[steps]]
op = "grow"
seq = "a"
tokens = 3

[[steps]]
op = "fork"
seq = "a"
as = "b"

[[steps]]
op = "grow"
seq = "b"

[[steps]]
op = "add"
seq = "c"
prompt = "The capital of Italy is Rome. The capital of France is"
"""


def test_a_scenario_names_the_model_and_gives_prompts_as_text(smollm):
    scenario = parse_scenario(SCENARIO)
    c = scenario.config
    assert (c.model, c.num_heads, c.num_kv_heads, c.head_dim) == ("smollm2-135m", 9, 3, 64)
    prompt = smollm.tokenizer.encode("The capital of Italy is Rome. The capital of France is")
    assert scenario.operations[0].prompt == tuple(prompt)
    timeline = Timeline(scenario, CpuBackend())
    while not timeline.at_end:
        result = timeline.forward()
        assert result.attention.passed
        assert all(check.passed for check in timeline.sim.runner.logits_checks)
    sim = timeline.sim
    a, b = list(sim.sequence("a").token_ids), list(sim.sequence("b").token_ids)
    assert b[:-1] == a and len(b) == len(a) + 1
    assert smollm.tokenizer.decode(a[-3:]).startswith(" Paris")
    assert sim.metrics().prefix_hit_blocks >= 1  # c's prompt: a's full block, cached


def test_a_header_field_that_contradicts_the_model_is_named(smollm):
    with pytest.raises(ScenarioError, match="num_heads = 8 contradicts the model") as info:
        parse_scenario(SCENARIO.replace("block_size = 8", "block_size = 8\nnum_heads = 8\nhead_dim = 64"))
    assert info.value.field == "num_heads"
    parse_scenario(SCENARIO.replace("block_size = 8", "block_size = 8\nnum_kv_heads = 3"))  # agreeing: fine


def test_prompt_text_needs_a_real_model():
    text = SCENARIO.replace('model = "smollm2-135m"', "num_heads = 2\nhead_dim = 8")
    with pytest.raises(ScenarioError, match="needs a real model") as info:
        parse_scenario(text)
    assert info.value.field == "prompt"


def test_a_grow_that_ends_at_max_tokens_says_it_stopped_short(tmp_path, capsys):
    scenario = tmp_path / "short.toml"
    scenario.write_text(
        'model = "smollm2-135m"\nnum_blocks = 8\nblock_size = 4\n'
        '[[steps]]\nop = "add"\nseq = 0\nprompt = "Hi"\nmax_tokens = 2\n'
        '[[steps]]\nop = "grow"\nseq = 0\ntokens = 5\n'
    )
    assert main(["run", str(scenario), "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "0 stopped after 2 of the 5 tokens asked: it finished" in out
