"""``pagesim sweep`` and ``pagesim latency``: the table, the files (JSON, CSV, PNG) and
one-line refusals."""

import csv
import json
import time

import pytest
from pagesim.app.cli import main

from tests.scenarios import token_model


def _one_line_error(text: str) -> str:
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, text
    return lines[0]


def test_a_3x2_sweep_prints_its_table_and_writes_json_csv_and_a_png(tmp_path, capsys):
    paths = {ext: tmp_path / "out" / f"sweep.{ext}" for ext in ("json", "csv", "png")}
    began = time.perf_counter()
    code = main(
        [
            "sweep",
            token_model("preemption_recompute"),
            "--set",
            "block_size=2,4,8",
            "--set",
            "prefix_caching=true,false",
            "--json",
            str(paths["json"]),
            "--csv",
            str(paths["csv"]),
            "--plot",
            str(paths["png"]),
        ]
    )
    assert code == 0
    assert time.perf_counter() - began < 60
    captured = capsys.readouterr()
    table = [line for line in captured.out.splitlines() if line.startswith(("original", "block_size="))]
    assert len(table) == 7 and table[0].split()[:3] == ["original", "ok", "28"]
    assert "[7/7] block_size=8 prefix_caching=false: ok" in captured.err  # progress
    doc = json.loads(paths["json"].read_text())
    assert [v["variant"] for v in doc["variants"]][:2] == ["original", "block_size=2 prefix_caching=true"]
    assert doc["settings"] == {"block_size": [2, 4, 8], "prefix_caching": [True, False]}
    assert len(doc["variants"][0]["used_blocks"]) == doc["variants"][0]["steps"]
    rows = list(csv.DictReader(paths["csv"].read_text().splitlines()))
    assert len(rows) == 7 and rows[3]["block_size"] == "4" and rows[3]["num_blocks"] == "24"
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_sweep_with_a_model_shape_and_a_gpu_shows_latency(capsys):
    code = main(
        [
            "sweep",
            token_model("parallel_sampling"),
            "--set",
            "engine=v0,v1",
            "--model-shape",
            "llama-3-8b",
            "--gpu",
            "h200",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "Llama-3-8B on H200 (roofline)" in out and "TTFT ms" in out and "tok/s" in out


def test_a_sweep_of_a_workload_sizes_its_pool_from_the_preset(capsys):
    argv = ["sweep", "--workload", "alpaca", "--requests", "30", "--rate", "50", "--set", "block_size=16,64"]
    code = main([*argv, "--model-shape", "llama-13b", "--gpu", "a100-40gb"])
    assert code == 0
    out = capsys.readouterr().out
    assert "pool 963 blocks of 16 tokens" in out and "GiB" in out


def test_an_unknown_knob_a_bad_value_or_no_grid_is_one_line_and_exit_2(capsys):
    assert main(["sweep", "seed_demo", "--set", "blocksize=8"]) == 2
    assert "unknown knob 'blocksize'" in _one_line_error(capsys.readouterr().err)
    assert main(["sweep", "seed_demo", "--set", "watermark=2"]) == 2
    assert "watermark: bad value '2'" in _one_line_error(capsys.readouterr().err)
    assert main(["sweep", "seed_demo"]) == 2
    assert "nothing to sweep" in _one_line_error(capsys.readouterr().err)
    assert main(["sweep", "seed_demo", "--set", "block_size=8", "--gpu", "h200"]) == 2
    assert "go together" in _one_line_error(capsys.readouterr().err)


def test_a_variant_that_cannot_run_is_a_row_not_a_failure(capsys):
    assert main(["sweep", "seed_demo", "--set", "num_blocks=4,8"]) == 0
    out = capsys.readouterr().out
    assert "num_blocks=4" in out and "cannot run" in out and "out of range" in out


def test_latency_prints_each_requests_queue_ttft_and_tpot(tmp_path, capsys):
    report = tmp_path / "latency.json"
    code = main(
        [
            "latency",
            token_model("preemption_recompute"),
            "--model-shape",
            "llama-3-8b",
            "--gpu",
            "h200",
            "--json",
            str(report),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "TTFT ms" in out and "TPOT ms" in out and "tokens/s" in out
    rows = [line.split()[0] for line in out.splitlines() if line.startswith("r") and line[1].isdigit()]
    assert rows == ["r1", "r2", "r3"]
    doc = json.loads(report.read_text())
    assert doc["summary"]["requests"] == 3 and doc["summary"]["ttft_s"]["mean"] > 0
    assert main(["latency", token_model("preemption_recompute")]) == 2
    assert "needs --model-shape and --gpu" in _one_line_error(capsys.readouterr().err)
    assert main(["latency", "seed_demo", "--model-shape", "llama-4", "--gpu", "h200"]) == 2
    assert "unknown model shape 'llama-4'" in _one_line_error(capsys.readouterr().err)


def test_waste_sizes_its_pool_from_a_preset_or_blocks_and_says_which(tmp_path, capsys):
    report = tmp_path / "waste.json"
    argv = ["waste", "--workload", "alpaca", "--requests", "200", "--gpu", "a100-40gb", "--model-shape", "llama-13b"]
    assert main([*argv, "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "pool: 15408 slots (963 blocks of 16) · A100-40GB after LLaMA-13B's weights" in out
    assert json.loads(report.read_text())["pool"].startswith("15408 slots")
    assert main(["waste", "--workload", "alpaca", "--requests", "50", "--blocks", "512"]) == 0
    assert "pool: 8192 slots (512 blocks of 16) · --blocks 512" in capsys.readouterr().out
    assert main(["waste", "--blocks", "512", "--gpu", "h200", "--model-shape", "llama-3-8b"]) == 2
    assert "not both" in _one_line_error(capsys.readouterr().err)
    assert main(["waste", "--gpu", "a100-80gb", "--model-shape", "llama-3-70b"]) == 2
    assert "do not fit" in _one_line_error(capsys.readouterr().err)


def test_latency_and_sweep_run_a_real_models_scenario_on_the_synthetic_model_and_say_so(capsys):
    """As the README shows them: a shipped scenario on SmolLM2, replayed memory only."""
    assert main(["latency", "preemption_recompute", "--model-shape", "llama-3-8b", "--gpu", "h200"]) == 0
    out, err = capsys.readouterr()
    assert "smollm2-135m is played by the synthetic model here" in err and "r1 " in out
    assert main(["sweep", "preemption_recompute", "--set", "block_size=4,8"]) == 0
    out, err = capsys.readouterr()
    assert "cannot run" not in out and "played by the synthetic model" in err


def test_json_with_no_finished_request_is_strict_json(tmp_path, capsys):
    """A mean over no finished request is NaN, which JSON has not: the files say null."""
    latency_json, sweep_json = tmp_path / "latency.json", tmp_path / "sweep.json"
    common = ["--workload", "sharegpt", "--requests", "5", "--blocks", "1", "--model-shape", "llama-3-8b"]
    assert main(["latency", *common, "--gpu", "h200", "--json", str(latency_json)]) == 0
    assert main(["sweep", *common, "--gpu", "h200", "--set", "num_blocks=1,2", "--json", str(sweep_json)]) == 0
    for path in (latency_json, sweep_json):
        text = path.read_text()
        assert "NaN" not in text and "Infinity" not in text
        json.loads(text, parse_constant=lambda name, path=path: pytest.fail(f"{path.name} holds {name}"))
    assert json.loads(latency_json.read_text())["summary"]["ttft_s"]["mean"] is None


def test_a_plot_named_other_than_png_is_refused_before_running(tmp_path, capsys):
    assert main(["sweep", token_model("seed_demo"), "--set", "block_size=4", "--plot", str(tmp_path / "x.pdf")]) == 2
    assert "the plot is a PNG image" in capsys.readouterr().err and not (tmp_path / "x.pdf").exists()


def test_a_workload_flag_given_with_a_scenario_is_refused_not_ignored(capsys):
    argv = ["latency", token_model("seed_demo"), "--block-size", "8", "--model-shape", "llama-3-8b", "--gpu", "h200"]
    assert main(argv) == 2
    # (latency has no --set: its message does not offer one)
    assert "--block-size shapes a --workload; a scenario has its own (edit it)" in capsys.readouterr().err
    assert main(["sweep", token_model("seed_demo"), "--requests", "5", "--set", "block_size=8"]) == 2
    assert "--requests shapes a --workload; a scenario has its own (edit it, or use --set)" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["latency", "sweep", "waste"])
def test_a_negative_seed_is_refused_not_taken_as_its_absolute_value(command, capsys):
    """random.Random(-3) draws what random.Random(3) does: --seed -3 repeated seed 3's workload."""
    argv = [command, "--workload", "alpaca", "--requests", "5", "--seed", "-3"]
    if command == "sweep":
        argv += ["--set", "block_size=8,16"]
    if command == "latency":
        argv += ["--model-shape", "llama-3-8b", "--gpu", "h200"]
    assert main(argv) == 2
    assert "the seed must be a non-negative integer; got -3" in _one_line_error(capsys.readouterr().err)


def test_latency_says_which_requests_were_rejected(capsys):
    argv = ["latency", "--workload", "sharegpt", "--requests", "5", "--blocks", "1", "--model-shape", "llama-3-8b"]
    assert main([*argv, "--gpu", "h200"]) == 0
    out = capsys.readouterr().out
    assert out.count("  rejected") == 5 and "0 finished · 5 rejected" in out and "nan" not in out


def test_a_pool_larger_than_the_gpu_after_the_weights_is_refused(capsys):
    argv = ["latency", "--workload", "uniform", "--blocks", "100000000", "--model-shape", "llama-3-8b", "--gpu", "h200"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--blocks: 100000000 blocks of 16 tokens take 195312.50 GiB of KV cache; Llama-3-8B on H200 leaves" in err


@pytest.mark.parametrize("command", ["latency", "sweep"])
def test_a_scenarios_own_pool_or_a_model_the_gpu_cannot_hold_is_refused_before_anything_runs(tmp_path, capsys, command):
    """They gave timings for a pool of 195 GiB on a 141 GiB GPU, and for a 70B model on a 40 GB A100."""
    big = tmp_path / "bigpool.toml"
    big.write_text(
        'num_blocks = 100000\nblock_size = 16\nnum_heads = 2\nhead_dim = 8\n[[steps]]\nop = "submit"\n'
        'request = "a"\ntokens = 100\noutput = 10\n[[steps]]\nop = "schedule"\nsteps = 20\n'
    )
    extra = ["--set", "max_num_seqs=4"] if command == "sweep" else []
    assert main([command, str(big), "--model-shape", "llama-3-8b", "--gpu", "h200", *extra]) == 2
    err = capsys.readouterr().err
    assert "bigpool's pool: 100000 blocks of 16 tokens take 195.31 GiB" in err and "(--blocks sets another)" in err
    assert main([command, "preemption_recompute", "--model-shape", "llama-3-70b", "--gpu", "a100-40gb", *extra]) == 2
    # (the figure it does not fit in is the 90 % vLLM uses, and it says so)
    assert (
        "Llama-3-70B's weights (131.4 GiB) do not fit in the 36.0 GiB that vLLM uses (90% of the A100-40GB's 40.0 GiB)"
        in (capsys.readouterr().err)
    )


def test_a_block_larger_than_the_memory_after_the_weights_is_named_as_such(capsys):
    argv = ["latency", "--workload", "sharegpt", "--requests", "5", "--block-size", "10000000"]
    assert main([*argv, "--model-shape", "llama-3-8b", "--gpu", "h200"]) == 2
    assert "one block of 10000000 tokens is larger than what H200 leaves" in capsys.readouterr().err


def test_a_sweep_where_nothing_can_run_exits_2_and_draws_no_plot(tmp_path, capsys):
    scenario = tmp_path / "dup.toml"
    scenario.write_text(
        'name = "dup"\nnum_blocks = 8\nblock_size = 4\nnum_heads = 1\nhead_dim = 8\n'
        '[[steps]]\nop = "add"\nseq = "a"\ntokens = 3\n[[steps]]\nop = "add"\nseq = "a"\ntokens = 3\n'
    )
    plot = tmp_path / "p.png"
    assert main(["sweep", str(scenario), "--set", "block_size=2,8", "--plot", str(plot)]) == 2
    captured = capsys.readouterr()
    assert captured.out.count("cannot run") == 3 and not plot.exists()
    assert captured.err.strip().endswith("no variant could run, the original included: see the reasons above")


def test_a_variant_whose_requests_were_rejected_says_so_in_its_status(capsys):
    assert main(["sweep", "preemption_v1", "--set", "num_blocks=3,8"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("num_blocks=3"))
    assert row.split()[1] == "rejected" and "requests rejected: they can never fit" in row


def test_a_v0_only_knob_swept_on_a_v1_scenario_cannot_run_and_says_why(capsys):
    assert main(["sweep", "preemption_v1", "--set", "watermark=0,0.5"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("watermark=")]
    assert len(rows) == 2 and all("cannot run" in row and "admits without one" in row for row in rows)


def test_v1s_token_budget_swept_on_a_v0_scenario_cannot_run_and_a_switch_to_v0_leaves_it_behind(capsys):
    """v0 ran with max_num_batched_tokens=1 as with 100000: it has no token budget, and said nothing."""
    assert main(["sweep", "preemption_recompute", "--set", "max_num_batched_tokens=1,100000"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("max_num_batched_tokens=")]
    assert len(rows) == 2 and all("cannot run" in row and "v1's token budget" in row for row in rows)
    assert main(["sweep", "preemption_v1", "--set", "scheduler=v0"]) == 0  # (its budget of 32 is v1's own)
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("scheduler=v0"))
    assert row.split()[1] == "ok"


def test_a_swap_variant_with_no_cpu_pool_of_its_own_setting_cannot_run(capsys):
    """num_cpu_blocks=0 beside preemption=swap swapped 16 blocks into a pool the row said was empty."""
    assert main(["sweep", "preemption_recompute", "--set", "preemption=swap", "--set", "num_cpu_blocks=0,8"]) == 0
    out = capsys.readouterr().out.splitlines()
    zero = next(line for line in out if "num_cpu_blocks=0" in line)
    eight = next(line for line in out if "num_cpu_blocks=8" in line)
    assert "cannot run" in zero and "needs num_cpu_blocks ≥ 1" in zero and " ok " in eight


def test_latency_shows_the_outputs_of_each_of_n_samples_as_the_throughput_counts_them(tmp_path, capsys):
    report = tmp_path / "l.json"
    argv = ["latency", "preemption_recompute", "--model-shape", "opt-13b", "--gpu", "a100-40gb", "--json", str(report)]
    assert main(argv) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("r")}
    doc = json.loads(report.read_text())
    by_name = {r["request"]: r for r in doc["requests"]}
    assert by_name["r3"]["samples"] == 2 and rows["r3"].endswith(f"{by_name['r3']['output_tokens']} × 2")
    assert doc["summary"]["output_tokens"] == sum(r["output_tokens"] * r["samples"] for r in doc["requests"])


def test_a_rate_so_low_that_the_clock_loses_its_milliseconds_is_refused(capsys):
    """--rate 1e-300 printed TTFTs of 0.00 ms and a run of 10^300 seconds."""
    argv = ["latency", "--workload", "sharegpt", "--requests", "5", "--rate", "1e-300"]
    assert main([*argv, "--model-shape", "llama-3-8b", "--gpu", "h200"]) == 2
    assert (
        "a step's milliseconds would be lost in the clock's rounding; raise the arrival rate" in capsys.readouterr().err
    )


def test_a_one_knob_sweep_where_only_the_original_ran_still_draws_its_plot(tmp_path, capsys):
    """block_size=1000 (larger than the pool) left --json written and crashed drawing a log axis of nothing."""
    plot, report = tmp_path / "s.png", tmp_path / "s.json"
    assert main(["sweep", "preemption_recompute", "--set", "block_size=1000", "--plot", str(plot), "--json",
                 str(report)]) == 0  # fmt: skip
    assert plot.read_bytes().startswith(b"\x89PNG") and json.loads(report.read_text())["variants"][1]["status"] == (
        "cannot run"
    )


def test_a_variant_whose_requests_are_refused_for_one_reason_gives_that_reason(capsys):
    """Beam search under v1 read "rejected: they can never fit"; v1 has no beam search."""
    assert main(["sweep", "beam_search", "--set", "scheduler=v1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("scheduler=v1"))
    assert "1 of 1 requests rejected: the v1 scheduler has no beam search" in row and "never fit" not in row


def test_v0_and_v1_variants_count_the_same_requests(capsys):
    """v1 runs n samples as child requests: its row said 4 done where v0's said 3, and took its
    means over the children."""
    assert main(["sweep", "preemption_recompute", "--set", "scheduler=v1", "--json", "-"]) == 0
    variants = json.loads(capsys.readouterr().out)["variants"]
    assert [v["finished"] for v in variants] == [3, 3]


def test_latency_tells_aborted_requests_from_rejected_ones_and_leaves_their_tokens_out(tmp_path, capsys):
    """A 20-block pool: v0 admits ShareGPT requests whose outputs then outgrow it; they were
    listed as "rejected (never fit …)" and their tokens counted as throughput."""
    report = tmp_path / "l.json"
    argv = ["latency", "--workload", "sharegpt", "--requests", "20", "--blocks", "20"]
    assert main([*argv, "--model-shape", "llama-3-8b", "--gpu", "h200", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    doc = json.loads(report.read_text())
    aborted = [r for r in doc["requests"] if r["aborted"]]
    finished = [r for r in doc["requests"] if r["finished"] is not None]
    assert aborted and all(r["rejected"] and r["admitted"] is not None for r in aborted)
    assert f"{len(aborted)} aborted after running (outgrew the pool)" in out
    assert doc["summary"]["output_tokens"] == sum(r["output_tokens"] * r["samples"] for r in finished)
    assert doc["summary"]["discarded_output_tokens"] >= sum(r["output_tokens"] for r in aborted) > 0
    assert f"not counted: {doc['summary']['discarded_output_tokens']} output tokens" in out


def test_a_sweep_of_a_scenario_without_requests_says_so_and_prints_no_nan(tmp_path, capsys):
    """shared_system_prompt adds its sequences by hand: every row read 'ok … 0 … nan' and the
    scheduler knob changed nothing, unexplained; the CSV held 'nan'."""
    table = tmp_path / "s.csv"
    argv = ["sweep", token_model("shared_system_prompt"), "--set", "scheduler=v0,v1", "--csv", str(table)]
    assert main([*argv, "--model-shape", "llama-3-8b", "--gpu", "h200"]) == 0
    captured = capsys.readouterr()
    assert "submits no requests (its sequences are added by hand)" in captured.err
    assert "nan" not in captured.out.lower()
    rows = list(csv.DictReader(table.read_text().splitlines()))
    assert rows and all(row["ttft_mean_s"] == "" and row["normalized_latency_s_per_token"] == "" for row in rows)


def test_sweep_labels_are_shown_whole_so_rows_stay_apart(capsys):
    argv = ["sweep", token_model("preemption_recompute"), "--set", "prefix_caching=true,false"]
    assert main([*argv, "--set", "max_num_seqs=2,3,4", "--set", "watermark=0.0,0.01"]) == 0
    out = capsys.readouterr().out
    labels = [
        f"prefix_caching={p} max_num_seqs={n} watermark={w}"
        for p in ("true",)
        for n in (2, 3, 4)
        for w in ("0", "0.01")
    ]
    assert all(label in out for label in labels), out


def test_latency_says_at_which_bandwidth_it_priced_the_swaps(capsys):
    """The scenario's swap_bandwidth_gbs times the engine's events; the roofline uses the GPU's
    host link, and the output said neither."""
    argv = ["latency", token_model("preemption_swap"), "--model-shape", "llama-3-8b", "--gpu", "h200"]
    assert main(argv) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("swaps:"))
    assert "blocks moved over the H200's host link (64 GB/s a direction)" in line


def test_a_sweep_counts_aborted_requests_apart_from_those_that_never_fit(tmp_path, capsys):
    """It said '14 of 20 requests rejected: they can never fit' where 11 of them had run."""
    table = tmp_path / "s.csv"
    argv = ["sweep", "--workload", "sharegpt", "--requests", "20", "--blocks", "20", "--set", "block_size=16"]
    assert main([*argv, "--model-shape", "llama-3-8b", "--gpu", "h200", "--csv", str(table)]) == 0
    out = capsys.readouterr().out
    row = next(r for r in csv.DictReader(table.read_text().splitlines()) if r["variant"] == "original")
    aborted, rejected = int(row["aborted"]), int(row["rejected"])
    assert 0 < aborted < rejected and int(row["discarded_output_tokens"]) > 0
    assert f"{rejected - aborted} of 20 requests rejected" in out
    assert f"{aborted} aborted after running: grew past what the pool can hold" in out


def test_latency_help_says_its_model_shape_and_gpu_are_required(capsys):
    # (it refused without them while its usage line showed both as optional)
    with pytest.raises(SystemExit):
        main(["latency", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--model-shape SHAPE a published model shape" in text and text.count("(required)") == 2
