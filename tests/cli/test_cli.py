import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pagesim.app.cli import main
from pagesim.core.scenario import load_shipped

from tests.scenarios import token_model


def test_run_seed_demo_shows_the_article_tables_and_a_match(capsys):
    assert main(["run", "assets/scenarios/seed_demo.toml", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "sequence 0 (len=10): physical blocks [0, 3, 5]" in out
    assert "sequence 1 (len=7): physical blocks [1, 7]" in out
    assert "kernel output shape (2, 2, 1, 8)" in out
    assert "PASS: 2 steps" in out and "CPU kernel" in out


def test_run_writes_a_json_report(tmp_path, capsys):
    report_path = tmp_path / "report.json"
    assert main(["run", "default", "--json", str(report_path), "--quiet"]) == 0
    report = json.loads(report_path.read_text())
    assert report["passed"] is True and report["backend"] == "cpu"
    assert len(report["steps"]) == len(load_shipped("default").operations)
    step = report["steps"][5]
    assert step["op"] == "fork A → A2" and step["used_blocks"] + step["free_blocks"] == 32
    assert set(step["sequences"]) == {"A", "B", "A2"}
    assert all(s["max_abs_error"] <= step["tolerance"] for s in step["sequences"].values())
    # The tour runs SmolLM2: a step that ran the model reports every layer's check
    grow = report["steps"][2]
    assert grow["layers"]["passed"] and grow["layers"]["same_next_tokens"]
    assert 0 <= grow["layers"]["worst_layer"] < 30 and grow["layers"]["logits_max_abs_diff"] < 1e-3
    assert "layers" not in step  # a fork runs no forward


def test_dump_holds_exactly_the_kernels_inputs_and_outputs(tmp_path, cpu_backend):
    assert main(["run", "seed_demo", "--dump", str(tmp_path), "--quiet"]) == 0
    data = np.load(tmp_path / "step_0002.npz")
    assert data["query"].shape == (2, 2, 8)
    assert data["key_cache"].shape == data["value_cache"].shape == (8, 4, 2, 8)
    assert data["block_tables"].dtype == np.int32 and data["block_tables"].tolist() == [[0, 3, 5], [1, 7, 0]]
    assert data["context_lens"].tolist() == [10, 7]
    again = cpu_backend.paged_attention(
        data["query"], data["key_cache"], data["value_cache"], data["block_tables"], data["context_lens"], data["scale"]
    )
    np.testing.assert_array_equal(again, data["output"])
    np.testing.assert_allclose(data["output"], data["dense"], atol=1e-5)
    # A second run into the same folder would mix its files with the first's: refused, none replaced.
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("step_*.npz")}
    assert main(["run", "seed_demo", "--dump", str(tmp_path), "--quiet"]) == 2
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("step_*.npz")} == before


def test_malformed_scenario_exits_non_zero_naming_the_fault(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('num_blocks = 4\nblock_size = 2\nnum_heads = 1\nhead_dim = 8\n[[steps]]\nop = "grow"\nseq = "x"\n')
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.toml, step 1, field 'seq'" in err and "unknown sequence 'x'" in err


def test_a_step_beyond_tolerance_fails_the_run(monkeypatch, capsys):
    from pagesim.kernels.cpu_backend import CpuBackend

    real = CpuBackend._paged_attention
    monkeypatch.setattr(CpuBackend, "_paged_attention", lambda self, *a: real(self, *a) + 1e-3)
    assert main(["run", "seed_demo", "--backend", "cpu"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_a_mismatch_shows_the_error_beside_its_own_heads_bound_and_names_the_head(monkeypatch, capsys, tmp_path):
    # An error on the short sequence, under its bound's own scale, above it; the long
    # sequence has the loosest bound. The row paired the largest error with that loosest
    # bound: "1.00e-04 1.5e-04 MISMATCH", an error under the tolerance beside it.
    from pagesim.kernels.cpu_backend import CpuBackend

    real = CpuBackend._paged_attention

    def off_on_the_shortest(self, query, kc, vc, tables, lens, scale):
        out = np.array(real(self, query, kc, vc, tables, lens, scale))
        if lens.size > 1:
            out[int(np.argmin(lens)), 0, 0] += 1e-4
        return out

    monkeypatch.setattr(CpuBackend, "_paged_attention", off_on_the_shortest)
    scenario = Path(__file__).parents[1] / "scenarios" / "synthetic_long_context.toml"
    report = tmp_path / "report.json"
    assert main(["run", str(scenario), "--json", str(report)]) == 1
    out, err = capsys.readouterr()
    row = next(line for line in out.splitlines() if "MISMATCH" in line)
    error, bound = (float(x) for x in row.split("MISMATCH")[0].split()[-2:])
    assert error > bound and "MISMATCH: chat, head 0" in row, row
    assert "(first at step 2: chat, head 0, |err| 1.0e-04 > bound" in err
    step = json.loads(report.read_text())["steps"][1]
    assert step["nearest_bound"]["sequence"] == "chat" and step["nearest_bound"]["head"] == 0
    assert step["nearest_bound"]["max_abs_error"] > step["nearest_bound"]["bound"]
    assert step["sequences"]["chat"]["passed"] is False and step["sequences"]["doc"]["passed"] is True


SCHEDULES = (
    "num_blocks = 24\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\n"
    '[[steps]]\nop = "submit"\nrequest = "r1"\ntokens = 6\noutput = 10\n'
    '[[steps]]\nop = "submit"\nrequest = "r2"\ntokens = 5\noutput = 10\n'
    '[[steps]]\nop = "schedule"\nsteps = 3\n[[steps]]\nop = "schedule"\nsteps = 1\n'
)


@pytest.mark.parametrize("offset", [1e-2, float("nan")])
def test_the_first_mismatch_named_is_the_first_step_that_missed(monkeypatch, capsys, tmp_path, offset):
    # A schedule's earlier engine steps are checked inside it: step 3 failed there, and the
    # summary named step 4 "first". A NaN error is named in the row too (NaN > bound is False).
    from pagesim.kernels.cpu_backend import CpuBackend

    real = CpuBackend._paged_attention

    def off_on_row_zero(self, query, kc, vc, tables, lens, scale):
        out = np.array(real(self, query, kc, vc, tables, lens, scale))
        if lens.size:
            out[0, 0, 0] += offset
        return out

    monkeypatch.setattr(CpuBackend, "_paged_attention", off_on_row_zero)
    path = tmp_path / "schedules.toml"
    path.write_text(SCHEDULES)
    assert main(["run", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "at steps [3, 4] (first at step 3: r1, head 0, |err|" in err, err
    assert "MISMATCH: r1, head 0" in next(line for line in out.splitlines() if line.lstrip().startswith("4 "))


def test_cuda_backend_without_a_device_fails_clearly(capsys):
    assert main(["run", "seed_demo", "--backend", "cuda"]) == 2
    assert "--backend cuda is not usable here" in capsys.readouterr().err


def test_scenarios_and_backends_list(capsys):
    assert main(["scenarios"]) == 0 and main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "seed_demo" in out and "stress" in out and "cpu   available" in out


def test_scenarios_lists_in_the_learners_order_from_headers_within_the_width(capsys, monkeypatch):
    """Each shipped scenario once, in the welcome's order, with the steps and model a parse
    gives; no model is loaded to list them (it took seconds), and a line fits the terminal."""
    from pagesim.core.models import catalog
    from pagesim.core.scenario import SUGGESTED_ORDER, scenario_model, shipped_scenarios

    parsed = {name: load_shipped(name) for name in shipped_scenarios()}

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded to list the scenarios")

    monkeypatch.setattr(catalog, "load_model", refuse)
    monkeypatch.setenv("COLUMNS", "90")
    assert main(["scenarios"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines]
    assert sorted(names) == sorted(parsed) and names[: len(SUGGESTED_ORDER)] == list(SUGGESTED_ORDER)
    for line, name in zip(lines, names, strict=True):
        assert int(line.split()[1]) == len(parsed[name].operations)
        assert line.split()[3] == (scenario_model(name) or "synthetic")
        assert len(line) <= 90 or line.index(" — ") + 20 >= len(line) - 1  # cut at the width, not into the title
        assert parsed[name].name in line


def test_bench_quick_writes_its_results(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--backend", "cpu", "--cuda-kernel", "v2", "--json", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "note: --cuda-kernel v2 is for the CUDA backend; this run uses cpu" in err  # (it was taken silently)
    result = json.loads(path.read_text())
    # Each target's line says its verdict, with the target as the JSON has it (0.16 s read "0.2").
    for name in ("engine", "scheduler", "scheduler_v1"):
        row = result[name]
        said = f"target ≤ {row['target_seconds']:.2f} s: {'met' if row['meets_target'] else 'MISSED'}"
        assert said in out, said
    assert f": {'met' if result['memory'][0]['meets_target'] else 'MISSED'}" in out.split("memory:")[1]
    case = result["kernel"][0]
    assert case["paged_ms"] > 0 and case["dense_sdpa_ms"] > 0 and case["max_abs_error"] < 1e-5
    assert result["engine"]["operations"] == 2000 and result["machine"]["backend"] == "cpu"
    assert result["scheduler"]["scheduler"] == "v0" and result["scheduler_v1"]["scheduler"] == "v1"
    assert result["scheduler_v1"]["finished"] == result["scheduler_v1"]["requests"] == 200
    (memory,) = result["memory"]  # --quick: stress as `pagesim run`
    assert memory["case"] == "stress" and memory["paged_cache_mb"] == 2.0
    assert memory["peak_growth_mb"] > memory["paged_cache_mb"]  # the cache itself is resident
    assert len(memory["overhead_per_token"]) == 2 and memory["curve_mb"]


def test_resident_bytes_counts_only_the_pages_written():
    from pagesim.app.benchmarks import resident_bytes

    untouched = np.zeros(64 << 20, np.uint8)  # calloc'd: no page is resident yet
    assert resident_bytes(untouched) < untouched.nbytes // 8
    untouched[: 32 << 20] = 1
    assert abs(resident_bytes(untouched) - (32 << 20)) < (4 << 20)


QT = ("PySide6", "pyqtgraph", "shiboken6")
LAYER_MODULES = {
    # layer: (modules imported, packages that must stay unloaded)
    "core": (
        "pagesim.core.engine, pagesim.core.timeline, pagesim.core.scheduler, pagesim.core.view_model, "
        "pagesim.core.studies.waste, pagesim.core.studies.workload",
        (*QT, "pagesim.app"),
    ),
    "kernels": (
        "pagesim.kernels.cpu_backend, pagesim.kernels.reference, pagesim.kernels.cuda_backend, "
        "pagesim.kernels.selection",
        (*QT, "pagesim.app", "pagesim.core"),
    ),
    "headless front end": ("pagesim.app.cli, pagesim.app.report, pagesim.app.benchmarks", QT),
}


@pytest.mark.parametrize("layer", sorted(LAYER_MODULES))
def test_layers_never_load_what_they_must_not(layer):
    modules, forbidden = LAYER_MODULES[layer]
    code = (
        f"import sys, {modules}\n"
        f"loaded = {{m for m in sys.modules for f in {forbidden!r} if m == f or m.startswith(f + '.')}}\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_console_script_runs():
    script = Path(sys.executable).with_name("pagesim")  # the venv's console script
    out = subprocess.run([str(script), "run", "seed_demo", "--quiet"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("PASS")


def test_waste_prints_the_split_and_writes_per_step_json(tmp_path, capsys):
    path = tmp_path / "waste.json"
    assert main(["waste", "--requests", "120", "--slots", "4096", "--json", str(path), "--per-step"]) == 0
    out = capsys.readouterr().out
    for name in ("paged", "orca-oracle", "orca-pow2", "orca-max"):
        assert name in out
    report = json.loads(path.read_text())
    paged = report["allocators"][0]
    assert paged["allocator"] == "paged" and paged["shares"]["reservation"] == 0
    assert len(paged["per_step"]) == paged["steps"]
    assert all(sum(step.values()) == 4096 for step in paged["per_step"])


def test_waste_json_says_null_where_the_table_says_no_average(tmp_path, capsys):
    """With no step under load (no request ever waited) the table shows "—"; the JSON said 0.0."""
    path = tmp_path / "waste.json"
    assert main(["waste", "--requests", "50", "--json", str(path)]) == 0
    table = capsys.readouterr().out
    unloaded = [a for a in json.loads(path.read_text())["allocators"] if a["loaded_steps"] == 0]
    assert unloaded and "—" in table
    for allocator in unloaded:
        assert set(allocator["shares"].values()) == {None} and allocator["token_share_of_allocated"] is None


def test_scheduler_scenarios_run_from_the_cli(capsys):
    assert main(["run", token_model("preemption_swap"), "--quiet"]) == 0
    assert capsys.readouterr().out.startswith("PASS")


def test_benchmarks_module_runs_on_its_own(tmp_path):
    path = tmp_path / "bench.json"
    subprocess.run(
        [sys.executable, "-m", "pagesim.app.benchmarks", "--quick", "--backend", "cpu", "--json", str(path)],
        check=True,
        capture_output=True,
    )
    assert json.loads(path.read_text())["quick"] is True


@pytest.mark.parametrize(
    "argv, passive",
    [
        (["pagesim"], True),
        (["pagesim", "gui", "default"], True),
        (["pagesim", "bench", "--gui"], True),
        (["pagesim", "bench"], False),
        (["pagesim", "run", "default"], False),
    ],
)
def test_only_the_window_asks_openmp_threads_to_sleep_and_before_torch_loads(argv, passive):
    """libgomp reads OMP_WAIT_POLICY once, when torch loads it: set after, it does nothing."""
    probe = (
        f"import sys; sys.argv = {argv!r}; import pagesim.app, os; "
        "assert 'torch' not in sys.modules; print(os.environ.get('OMP_WAIT_POLICY'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == ("PASSIVE" if passive else "None")


def test_bench_repeats_runs_each_one_core_benchmark_in_a_fresh_process_and_reports_the_median():
    from pagesim.app.benchmarks import _fresh_one_core_run, _median_row

    row = _fresh_one_core_run("v1", quick=True)  # its own process, one core
    assert row["scheduler"] == "v1" and row["finished"] == row["requests"] == 200 and row["seconds"] > 0
    runs = [{**row, "seconds": s} for s in (3.0, 9.0, 5.0)]
    median = _median_row(runs)
    assert median["seconds"] == 5.0 and median["runs_seconds"] == [3.0, 9.0, 5.0]
    assert median["meets_target"] == (row["target_seconds"] >= 5.0)
    engine = _median_row(
        [{"operations": 100, "ops_per_second": 0, "seconds": s, "target_seconds": 1.0} for s in (2.0, 4.0)]
    )
    assert engine["seconds"] == 3.0 and engine["ops_per_second"] == 100 / 3.0 and not engine["meets_target"]
    # A run on the step path's sources beside it says so; paired runs give their median and the ratio.
    from pagesim.core import compiled_core

    pure = _fresh_one_core_run("v1", quick=True, pure_python=True)
    assert pure["engine_core"].startswith("pure Python (PAGESIM_PURE_PYTHON is set")
    assert row["engine_core"] == compiled_core.status.describe()
    assert {k: v for k, v in pure.items() if k not in ("seconds", "engine_core", "meets_target")} == {
        k: v for k, v in row.items() if k not in ("seconds", "engine_core", "meets_target")
    }  # (the same run, step for step)
    paired = _median_row(runs, [{**row, "seconds": s} for s in (10.0, 8.0, 12.0)])
    assert paired["seconds"] == 5.0 and paired["pure_python_seconds"] == 10.0
    assert paired["pure_python_runs_seconds"] == [10.0, 8.0, 12.0] and paired["compiled_over_pure_python"] == 0.5


MILAN_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse4_2 avx avx2

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9999
"""


def test_a_benchmark_names_the_cpu_generation_that_the_vms_model_name_leaves_out():
    # Two VMs both called "AMD EPYC" ran the schedulers at 9.8 and 6.1 s: Zen 3 and Zen 4.
    from pagesim.app.benchmarks import cpu_identity, describe_cpu

    milan = cpu_identity(MILAN_CPUINFO)  # (the first processor's block only)
    assert milan == {"cpu": "AMD EPYC", "cpu_generation": "Zen 3", "cpu_family": 25, "cpu_model": 1}
    assert describe_cpu(milan) == "AMD EPYC (Zen 3)"
    genoa = cpu_identity(MILAN_CPUINFO.replace("model\t\t: 1\n", "model\t\t: 17\n", 1))
    assert genoa["cpu_generation"] == "Zen 4"
    unknown = cpu_identity(MILAN_CPUINFO.replace("cpu family\t: 25", "cpu family\t: 99", 1))
    assert unknown["cpu_generation"] == "family 99, model 1"
    bare = cpu_identity("")
    assert bare["cpu_generation"] is None and describe_cpu({**bare, "cpu": "x86_64"}) == "x86_64"


def test_a_benchmark_names_the_interpreter_it_ran_on():
    # The schedulers took 13-16 % longer on pyenv's build of CPython 3.11 (no PGO, no LTO)
    # than on Debian's: a result names the interpreter's real path.
    import os
    import sys

    from pagesim.app.benchmarks import describe_python, machine_info
    from pagesim.kernels.selection import select_backend

    info = machine_info(select_backend("cpu"))
    assert info["python_interpreter"] == os.path.realpath(sys._base_executable)
    assert os.path.isabs(info["python_interpreter"]) and os.path.exists(info["python_interpreter"])
    assert describe_python({"python": "3.11.2", "python_interpreter": "/usr/bin/python3.11"}) == (
        "Python 3.11.2 (/usr/bin/python3.11)"
    )
    assert describe_python({"python": "3.11.2"}) == "Python 3.11.2"  # (results written before it was recorded)
    # ... and whether the engine's step path ran compiled, as the run found it
    from pagesim.core import compiled_core

    assert info["engine_core"] == compiled_core.status.describe()
    assert describe_python(info).endswith(f" · core {compiled_core.status.describe()}")


@pytest.mark.parametrize("extra", [["--gui"], ["--model"], ["--backend", "cuda"]])
def test_bench_repeats_is_refused_where_no_one_core_benchmark_runs(extra, capsys):
    assert main(["bench", "--repeats", "3", *extra]) == 2
    assert "--repeats is for the engine and scheduler benchmarks" in capsys.readouterr().err


def test_bench_repeats_is_refused_by_the_module_entry_too(tmp_path, capsys):
    import argparse

    from pagesim.app.benchmarks import run_benchmarks
    from pagesim.app.options import add_bench_options

    parser = argparse.ArgumentParser()
    add_bench_options(parser)
    args = parser.parse_args(["--model", "--repeats", "3", "--json", str(tmp_path / "out.json")])
    assert run_benchmarks(args) == 2
    assert "--repeats is for the engine and scheduler benchmarks" in capsys.readouterr().err


def test_bench_repeats_must_be_a_small_whole_number(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--repeats", "0"])
    assert "from 1 to 50" in capsys.readouterr().err


def test_waste_on_a_pool_never_full_says_so_instead_of_zero_shares(capsys):
    assert main(["waste", "--requests", "5", "--slots", "65536"]) == 0
    out = capsys.readouterr().out
    paged = next(line for line in out.splitlines() if line.startswith("paged"))
    assert "0.0%" not in paged and "—" in paged
    assert "no request ever waited for memory under paged" in out


ONE_SCHEDULE = (
    'num_blocks = 16\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\nscheduler = "{engine}"\n'
    '[[steps]]\nop = "submit"\nrequest = "r1"\ntokens = 10\noutput = 5\n'
    '[[steps]]\nop = "schedule"\nsteps = 20\n'
)


@pytest.mark.parametrize(("engine", "checks"), [("v0", 5), ("v1", 4)])  # (v1 never computes the last token)
def test_each_engine_step_of_one_schedule_is_checked(tmp_path, capsys, monkeypatch, engine, checks):
    # (r1 ran and finished inside the schedule, checked only at its end: "NOTHING CHECKED:
    # no sequence was live", and a passed JSON report)
    path = tmp_path / "one_schedule.toml"
    path.write_text(ONE_SCHEDULE.format(engine=engine))
    report_path = tmp_path / "report.json"
    assert main(["run", str(path), "--backend", "cpu", "--json", str(report_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(
        rf"PASS: 2 steps, {checks} checks \([{checks - 1}{checks}] at engine steps inside schedules\)", out
    )
    (_, schedule) = json.loads(report_path.read_text())["steps"]
    assert [check["passed"] for check in schedule["engine_steps_before"]] == [True] * checks
    # A check that fails inside the schedule fails the run.
    from pagesim.core.model_runner import AttentionReport

    monkeypatch.setattr(AttentionReport, "passed", property(lambda report: report.context_lens.max() < 12))
    assert main(["run", str(path), "--backend", "cpu", "--json", str(report_path)]) == 1
    assert "FAIL: kernel and dense attention differ beyond rounding at steps [2]" in capsys.readouterr().err
    assert json.loads(report_path.read_text())["passed"] is False


def test_a_step_that_leaves_no_sequence_is_not_reported_as_a_passed_check(tmp_path, capsys):
    """After the last sequence is freed the check attends over nothing: no figures, no "ok"."""
    scenario = tmp_path / "empty.toml"
    scenario.write_text(
        'name = "t"\nnum_blocks = 8\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\n'
        '[[steps]]\nop = "add"\nseq = "a"\ntokens = 5\n[[steps]]\nop = "free"\nseq = "a"\n'
    )
    assert main(["run", str(scenario)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if re.match(r"\s+2\s+free", line))
    assert row.rstrip().endswith("-  no sequences") and "0.00e+00" not in row


def test_a_forward_checked_before_every_sequence_finished_says_so():
    """A real model's step in which every request finished: its forward was checked layer by
    layer, then the check after it attended over nothing; the row read '0.00e+00 0.0e+00 ok'
    and the JSON max_abs_error 0.0, tolerance 0.0."""
    from dataclasses import replace
    from types import SimpleNamespace

    from pagesim.app.report import format_step, step_report
    from pagesim.core.config import CacheConfig
    from pagesim.core.llama_runner import empty_report
    from pagesim.kernels.selection import select_backend

    config = CacheConfig(num_blocks=16, block_size=8, num_heads=2, head_dim=8)
    layers = SimpleNamespace(
        passed=True, worst_layer=0, ratios=np.array([0.01]), attention_passed=True, logits_diff=2e-5, tokens_agree=True
    )
    report = replace(empty_report(select_backend("cpu"), config, np.float32), layers=layers)
    metrics = SimpleNamespace(
        utilisation=0.0, slots_allocated=0, used_blocks=1, free_blocks=15, as_dict=lambda: {"used_blocks": 1}
    )
    op = SimpleNamespace(describe=lambda: "schedule ×1")
    result = SimpleNamespace(step=23, op=op, metrics=metrics, attention=report, inner_checks=())
    row = format_step(result)
    assert row.endswith("ok: its forward (no sequence left)") and "0.00e+00" not in row
    doc = step_report(result)
    assert doc["max_abs_error"] is None and doc["tolerance"] is None and doc["passed"] is True
    assert doc["layers"]["same_next_tokens"] is True


def test_a_run_whose_logits_alone_left_their_bound_does_not_blame_the_kernel(tmp_path, monkeypatch, capsys):
    """A degenerate greedy run drifted to 3.9e-3 in its logits while every layer's attention
    held: the run said 'kernel and dense attention differ beyond rounding'."""
    from pagesim.core.layer_check import LayerCheck

    monkeypatch.setattr(LayerCheck, "passed", property(lambda self: False))  # the logits' check, failed
    scenario = tmp_path / "real.toml"
    scenario.write_text(
        'name = "r"\nmodel = "smollm2-135m"\nnum_blocks = 8\nblock_size = 8\n'
        '[[steps]]\nop = "add"\nseq = "a"\nprompt = "Hi"\n[[steps]]\nop = "grow"\nseq = "a"\ntokens = 1\n'
    )
    assert main(["run", str(scenario), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "FAIL: every layer's paged attention held its bound, but the logits" in err
    assert "kernel and dense attention differ" not in err


def test_dump_says_what_it_could_not_write_for_checks_inside_a_schedule(tmp_path, capsys):
    """'PASS: … 4 checks (4 at engine steps inside schedules)' with no --dump folder made and
    nothing said."""
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        'name = "s"\nnum_blocks = 8\nblock_size = 4\nnum_heads = 1\nhead_dim = 8\n'
        '[[steps]]\nop = "submit"\nrequest = "r"\ntokens = 6\noutput = 3\n[[steps]]\nop = "schedule"\nsteps = 6\n'
    )
    assert main(["run", str(scenario), "--quiet", "--dump", str(tmp_path / "d")]) == 0
    err = capsys.readouterr().err
    assert "checks ran at engine steps inside schedules, which keep no kernel inputs" in err


@pytest.mark.parametrize("argv", [["run", "seed_demo", "--quiet"], ["generate", "Hi", "--max-tokens", "1"]])
def test_a_cuda_kernel_choice_on_the_cpu_backend_is_said_to_do_nothing(argv, capsys):
    assert main([*argv, "--backend", "cpu", "--cuda-kernel", "v2"]) == 0
    assert "note: --cuda-kernel v2 is for the CUDA backend; this run uses cpu" in capsys.readouterr().err
