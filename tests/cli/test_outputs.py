"""The CLI's outputs: written atomically, checked before the work, and every failure to
write (a full disk, /dev/full, a closed or ASCII-only stdout) one line, never a traceback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pagesim.app import benchmarks
from pagesim.app.cli import main
from pagesim.app.options import json_text
from pagesim.kernels import atomic_write as aw

HEADER = "num_blocks = 8\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\n"


def _run(*argv, env=None, timeout=300, **kw):
    return subprocess.run(
        [sys.executable, "-m", "pagesim.app.cli", *argv],
        capture_output=True,
        text=True,
        env=os.environ | {"CI": "1"} | (env or {}),
        timeout=timeout,
        **kw,
    )


def _one_line_error(text: str) -> str:
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, text
    return lines[0]


def test_a_full_disk_for_json_keeps_the_old_report_and_says_so(tmp_path, capsys, full_disk):
    report = tmp_path / "report.json"
    report.write_text('{"old": true}\n')
    assert main(["run", "seed_demo", "--backend", "cpu", "--quiet", "--json", str(report)]) == 1
    line = _one_line_error(capsys.readouterr().err)
    assert "--json" in line and str(report) in line and "No space left" in line
    assert report.read_text() == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_a_full_disk_for_dump_says_which_folder(tmp_path, capsys, full_disk):
    dumps = tmp_path / "dumps"
    assert main(["run", "seed_demo", "--backend", "cpu", "--quiet", "--dump", str(dumps)]) == 1
    line = _one_line_error(capsys.readouterr().err)
    assert "--dump" in line and str(dumps) in line and "No space left" in line
    assert not [p for p in dumps.iterdir() if p.suffix == ".npz"]


def test_a_full_disk_for_waste_json_keeps_the_old_file(tmp_path, capsys, full_disk):
    out = tmp_path / "waste.json"
    out.write_text("old")
    assert main(["waste", "--requests", "20", "--json", str(out)]) == 1
    line = _one_line_error(capsys.readouterr().err)
    assert str(out) in line and "No space left" in line
    assert out.read_text() == "old"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize(
    "argv",
    [
        ["run", "seed_demo", "--backend", "cpu", "--quiet", "--json", "/dev/full"],
        ["waste", "--requests", "20", "--json", "/dev/full"],
    ],
)
def test_dev_full_as_the_output_file_is_one_line(argv):
    done = _run(*argv)
    assert done.returncode == 1
    line = _one_line_error(done.stderr)
    assert "/dev/full" in line and "No space left" in line


def test_json_and_dump_naming_one_path_are_refused_before_running(tmp_path, capsys):
    same = tmp_path / "out"
    assert main(["run", "seed_demo", "--backend", "cpu", "--json", str(same), "--dump", str(same)]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "--json" in line and "--dump" in line and str(same) in line
    assert not same.exists()


def test_bench_json_naming_a_folder_is_refused_before_measuring(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(benchmarks, "select_backend", lambda *_: pytest.fail("measured before checking --json"))
    assert main(["bench", "--quick", "--backend", "cpu", "--json", str(tmp_path)]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "--json" in line and str(tmp_path) in line and "folder" in line


def test_bench_results_are_written_atomically(tmp_path, monkeypatch, full_disk):
    out = tmp_path / "bench.json"
    out.write_text("old results")
    with pytest.raises(OSError):
        benchmarks.write_results(out, {"new": 1})
    assert out.read_text() == "old results"


def test_gui_bench_uses_the_json_name_given(monkeypatch, tmp_path):
    from argparse import Namespace

    from pagesim.app.options import DEFAULT_GUI_BENCH_JSON, bench_json

    assert bench_json(Namespace(json=tmp_path / "mine.json"), gui=True) == tmp_path / "mine.json"
    assert bench_json(Namespace(json=None), gui=True) == DEFAULT_GUI_BENCH_JSON


def test_waste_max_len_one_is_an_argument_error():
    done = _run("waste", "--max-len", "1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--max-len" in done.stderr


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--block-size", "4096", "--slots", "2048", "--max-len", "2048"], ["--block-size", "--slots"]),
        (["--block-size", "64", "--slots", "100", "--max-len", "100"], ["--max-len", "blocks"]),
        (["--rate", "1e-300"], ["--rate", "raise the arrival rate"]),
        # (arriving at once, they take as long to decode: the rate is not to blame)
        (["--requests", "100000", "--rate", "1000000"], ["--requests 100000", "send fewer requests or shorter"]),
    ],
)
def test_waste_that_could_never_end_is_refused_at_once(argv, words):
    done = _run("waste", "--requests", "50", *argv, timeout=60)
    assert done.returncode == 2
    line = _one_line_error(done.stderr)
    assert all(w in line for w in words)


def test_waste_json_dash_writes_to_stdout(tmp_path):
    done = _run("waste", "--requests", "20", "--json", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["workload"]["requests"] == 20
    assert "pagesim waste" in done.stderr  # the table moves out of the report's way
    assert not (tmp_path / "-").exists()


def test_a_closed_pipe_ends_quietly():
    # The stress scenario's table is far longer than a pipe's buffer.
    proc = subprocess.Popen(
        [sys.executable, "-m", "pagesim.app.cli", "run", "stress", "--backend", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=os.environ | {"CI": "1"},
    )
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=300)
    proc.stderr.close()
    assert first.startswith(b"pagesim run")
    assert err == "" and code == 141


@pytest.mark.parametrize("argv", [["scenarios"], ["backends"], ["run", "seed_demo", "--backend", "cpu"]])
def test_a_closed_stdout_is_one_line(argv):
    # (a shell's ">&-": Python's sys.stdout is None)
    done = _run(*argv, stdout=None, pass_fds=(), preexec_fn=lambda: os.close(1))
    assert done.returncode == 1
    assert "standard output" in _one_line_error(done.stderr) and "closed" in done.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_stdout_is_one_line():
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "pagesim.app.cli", "run", "seed_demo", "--backend", "cpu"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ | {"CI": "1"},
            timeout=300,
        )
    assert done.returncode == 1
    assert "standard output" in _one_line_error(done.stderr)


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"}, {"LANG": "C", "LC_ALL": "C"}])
def test_an_ascii_only_stdout_gets_ascii_spellings(env):
    done = _run("run", "seed_demo", "--backend", "cpu", env=env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "PASS" in done.stdout
    done = _run("waste", "--requests", "20", env=env)
    assert done.returncode == 0, done.stderr
    assert "pagesim waste" in done.stdout


def test_a_scenario_with_nothing_to_check_does_not_claim_a_match(tmp_path, capsys):
    empty = tmp_path / "empty.toml"
    empty.write_text(HEADER)
    assert main(["run", str(empty), "--backend", "cpu", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "PASS" not in out and "NOTHING CHECKED" in out and "no steps" in out


def test_a_shipped_name_wins_over_a_local_folder_of_that_name(tmp_path):
    (tmp_path / "default").mkdir()
    done = _run("run", "default", "--backend", "cpu", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "PASS" in done.stdout


def test_scenario_sources_that_never_end_are_refused(tmp_path):
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    for source in (str(fifo), "/dev/zero"):
        done = _run("run", source, "--backend", "cpu", timeout=60)
        assert done.returncode == 2
        assert source in _one_line_error(done.stderr)


def test_old_report_survives_a_rerun_that_fails(tmp_path, capsys, monkeypatch):
    """A kill while the report is being written leaves the previous report readable."""
    report = tmp_path / "r.json"
    assert main(["run", "seed_demo", "--backend", "cpu", "--quiet", "--json", str(report)]) == 0
    before = report.read_text()

    def killed(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(aw.os, "replace", killed)
    assert main(["run", "seed_demo", "--backend", "cpu", "--quiet", "--json", str(report)]) == 130  # Ctrl-C's status
    assert "interrupted" in capsys.readouterr().err
    assert report.read_text() == before and json.loads(before)["passed"] is True
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["r.json"]


def test_a_request_that_can_never_fit_is_reported_not_passed(tmp_path, capsys):
    path = tmp_path / "never.toml"
    path.write_text(
        HEADER.replace("num_blocks = 8", "num_blocks = 4")
        + '[[steps]]\nop = "submit"\nrequest = "r"\ntokens = 40\noutput = 4\n[[steps]]\nop = "schedule"\nsteps = 3\n'
    )
    assert main(["run", str(path), "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "REJECTED: r rejected" in out and "PASS" not in out
    assert "100.0%" not in out  # no block held: no utilisation to claim
    assert len([line for line in out.splitlines() if "      –  " in line]) == 2  # util: "–" at both steps
    report = tmp_path / "never.json"
    assert main(["run", str(path), "--backend", "cpu", "--quiet", "--json", str(report)]) == 0
    steps = json.loads(report.read_text())["steps"]
    assert [s["slots_allocated"] for s in steps] == [0, 0]
    assert [s["utilisation"] for s in steps] == [None, None]  # null, not 1.0: nothing to utilise


def test_a_first_start_reports_its_paint_its_first_frame_and_the_stall_between():
    """``make app`` as the GUI benchmark starts it (a fresh settings folder: the welcome
    opens while the tour's model loads): the window paints, then the tour's first frame
    comes, and the longest the GUI thread went unanswered in between is reported."""
    from pagesim.app.gui.bench import launch_seconds

    launch = launch_seconds(timeout_s=240)
    assert 0 < launch["window_s"] < launch["tour_frame_s"]
    assert 0 < launch["load_stall_ms"] < 1e3 * (launch["tour_frame_s"] - launch["window_s"]) + 50


@pytest.mark.parametrize(
    "command",
    [
        ["run", "{src}", "--json", "{out}"],
        ["sweep", "{src}", "--set", "block_size=4", "--csv", "{out}"],
        ["latency", "{src}", "--model-shape", "llama-3-8b", "--gpu", "h200", "--json", "{out}"],
    ],
)
def test_an_output_naming_the_scenario_being_read_is_refused_and_the_file_kept(tmp_path, capsys, command):
    src = tmp_path / "mine.toml"
    src.write_text(
        'name = "mine"\nnum_blocks = 8\nblock_size = 4\nnum_heads = 1\nhead_dim = 8\n'
        '[[steps]]\nop = "submit"\nrequest = "r"\ntokens = 6\noutput = 3\n'
        '[[steps]]\nop = "schedule"\nsteps = 4\n'
    )
    before = src.read_bytes()
    other_name = tmp_path / "sub" / ".." / "mine.toml"  # the same file by another path
    (tmp_path / "sub").mkdir()
    for out in (src, other_name):
        argv = [a.format(src=src, out=out) for a in command]
        assert main(argv) == 2
        assert "is the scenario being read: it would be overwritten" in capsys.readouterr().err
        assert src.read_bytes() == before


def test_a_trace_written_over_its_workload_is_refused(tmp_path, capsys):
    workload = tmp_path / "w.json"
    workload.write_text('{"config": {}, "requests": []}')
    assert main(["trace", str(workload), "-o", str(workload)]) == 2
    assert "is the workload being read" in capsys.readouterr().err and workload.read_text().startswith('{"config"')


@pytest.mark.parametrize(
    ("command", "what"),
    [
        (
            ["generate", "Hi", "--max-tokens", "1", "--model", "{model}", "--json", "{model}"],
            "the --model file being read",
        ),
        (
            ["latency", "--workload", "sharegpt", "--requests", "3", "--model-shape", "{model}", "--gpu", "h200",
             "--json", "{model}"],
            "the --model-shape file being read",
        ),
        (["run", "{scenario}", "--json", "{model}"], "the model file the scenario loads"),
    ],
)  # fmt: skip
def test_an_output_naming_a_model_file_being_read_is_refused_and_the_model_kept(tmp_path, capsys, command, what):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(64))  # (refused before anything reads it)
    scenario = tmp_path / "s.toml"
    scenario.write_text('name = "s"\nmodel = "m.gguf"\nnum_blocks = 8\nblock_size = 4\n[[steps]]\nop = "add"\n')
    argv = [a.format(model=model, scenario=scenario) for a in command]
    assert main(argv) == 2
    assert f"is {what}: it would be overwritten" in capsys.readouterr().err
    assert model.read_bytes() == b"GGUF" + bytes(64)


def test_an_output_naming_a_shipped_scenario_by_its_file_is_refused(capsys):
    from pagesim.core.scenario import scenario_file

    shipped = scenario_file("seed_demo")
    before = shipped.read_bytes()
    assert main(["run", "seed_demo", "--quiet", "--json", str(shipped)]) == 2
    assert "is the scenario being read" in capsys.readouterr().err
    assert shipped.read_bytes() == before


@pytest.mark.parametrize(
    "command",
    [
        ["sweep", "seed_demo", "--set", "block_size=4,8", "--json", "{out}", "--csv", "{out}"],
        ["sweep", "seed_demo", "--set", "block_size=4,8", "--plot", "{png}", "--json", "{png}"],
    ],
)
def test_two_outputs_naming_one_file_are_refused_before_anything_runs(tmp_path, capsys, command):
    out, png = tmp_path / "same.out", tmp_path / "same.png"
    argv = [a.format(out=out, png=png) for a in command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "name the same file" in err and err.count("\n") == 1, err
    assert not out.exists() and not png.exists()


def test_a_report_inside_the_dump_folder_is_refused_before_anything_runs(tmp_path, capsys):
    """It replaced step 1's dump, unsaid."""
    dumps = tmp_path / "dumps"
    assert main(["run", "seed_demo", "--backend", "cpu", "--quiet", "--dump", str(dumps), "--json",
                 str(dumps / "step_0001.npz")]) == 2  # fmt: skip
    assert "is inside the --dump folder" in capsys.readouterr().err
    assert not dumps.exists()


def test_ctrl_c_in_a_dumping_run_says_which_step_files_it_left(tmp_path, capsys, monkeypatch):
    """It said "nothing more was written" beside a folder of an unfinished run's step files."""
    import pagesim.app.cli as cli

    dumps, calls = tmp_path / "dumps", []
    real = cli.dump_step

    def interrupted_at_the_second(folder, timeline, result):
        calls.append(result.step)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(folder, timeline, result)

    monkeypatch.setattr(cli, "dump_step", interrupted_at_the_second)
    assert main(["run", "seed_demo", "--backend", "cpu", "--quiet", "--dump", str(dumps)]) == 130
    err = capsys.readouterr().err
    written = sorted(p.name for p in dumps.iterdir())
    assert written == ["step_0001.npz"] and "holds the step files of this unfinished run (step_0001.npz … " in err
    assert "nothing more was written" not in err


def test_json_reports_say_null_for_what_json_cannot_name():
    # (a model whose logits overflow: its error is NaN; json.dumps would write NaN, which no
    # strict reader takes, or raise with allow_nan=False)
    text = json_text({"max_abs_logit_diff": float("nan"), "steps": [{"error": float("inf")}], "ok": 1.5})
    assert json.loads(text) == {"max_abs_logit_diff": None, "steps": [{"error": None}], "ok": 1.5}
    assert "NaN" not in text and "Infinity" not in text


@pytest.mark.parametrize(
    "command",
    [["run", "default", "--json", "{model}"], ["generate", "Hi", "--max-tokens", "1", "--json", "{model}"]],
)
def test_a_report_written_over_the_bundled_model_is_refused(command):
    """The bundled model's file was looked for as a file named 'smollm2-135m': a --json onto
    the model inside the installed package replaced it. (Asked of the guard alone: a run that
    got past it would destroy the model.)"""
    from pagesim.app.cli import build_parser, overwrites_input
    from pagesim.core.models.gguf_loader import bundled_model_path

    model = bundled_model_path()
    reason = overwrites_input(build_parser().parse_args([a.format(model=model) for a in command]))
    assert reason is not None and f"--json {model} is the " in reason and "it would be overwritten" in reason
