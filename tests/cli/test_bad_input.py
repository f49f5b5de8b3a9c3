"""Input a hostile user can reach gets one clear line, never a traceback."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pagesim.app.cli import main
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.errors import OutOfMemoryError, PoolExhaustedError, ScenarioError
from pagesim.core.operations import Add
from pagesim.core.scenario import load_scenario, parse_scenario

HEADER = "num_blocks = 8\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\n"


@pytest.mark.parametrize(
    "text, field, message",
    [
        (HEADER.replace("num_blocks = 8", 'num_blocks = "8"'), "num_blocks", "positive integer"),
        (HEADER + "seed = -1\n", "seed", "non-negative integer"),
        (HEADER + "swap_bandwidth_gbs = nan\n", "swap_bandwidth_gbs", "positive, finite"),
        (HEADER + 'preemption = "swap"\n', "preemption", "needs num_cpu_blocks ≥ 1"),
        (HEADER + "watermark = true\n", "watermark", "fraction"),
        ("x = " + "[" * 5000 + "]" * 5000 + "\n", None, "nested too deeply"),
        ("\ufeff" + HEADER, None, "byte-order mark"),
    ],
)
def test_malformed_headers_name_the_field(text, field, message):
    with pytest.raises(ScenarioError, match=message) as info:
        parse_scenario(text, "bad.toml")
    assert info.value.field == field


@pytest.mark.parametrize("content", [bytes(range(256)), "name = 'café'\n".encode("latin-1")])
def test_files_that_are_not_utf8_text_are_refused(tmp_path, content):
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    with pytest.raises(ScenarioError, match="not UTF-8 text"):
        load_scenario(path)


def test_a_duplicated_request_names_the_request_field(tmp_path):
    path = tmp_path / "dup.toml"
    steps = '[[steps]]\nop = "submit"\nrequest = "r"\ntokens = 2\noutput = 2\n'
    path.write_text(HEADER + steps + steps)
    from pagesim.core.timeline import Timeline
    from pagesim.kernels.cpu_backend import CpuBackend

    timeline = Timeline(load_scenario(path), CpuBackend())
    timeline.forward()
    with pytest.raises(ScenarioError, match="'r' is taken: a request of that name was submitted already") as info:
        timeline.forward()
    assert (info.value.step, info.value.field) == (2, "request")


@pytest.mark.parametrize("field", ["num_blocks", "num_cpu_blocks"])
def test_a_pool_that_cannot_fit_in_memory_is_refused_before_allocating(cpu_backend, field):
    shape = {"num_blocks": 8, "block_size": 16, "num_heads": 8, "head_dim": 128, field: 10**9}
    started = time.perf_counter()
    with pytest.raises(OutOfMemoryError, match=r"blocks of 16 tokens.*GiB.*(available|free)"):
        Simulator(CacheConfig(**shape), cpu_backend)
    assert time.perf_counter() - started < 1.0


def test_a_huge_prompt_on_a_small_pool_is_refused_before_its_tokens_exist(cpu_backend):
    sim = Simulator(CacheConfig(num_blocks=8, block_size=4, num_heads=2, head_dim=8), cpu_backend)
    started = time.perf_counter()
    with pytest.raises(PoolExhaustedError, match="needs 5000000 free block"):
        sim.apply(Add("a", 20_000_000))
    assert time.perf_counter() - started < 0.5


def _run(*argv):
    return subprocess.run(
        [sys.executable, "-m", "pagesim.app.cli", *argv], capture_output=True, text=True, env=os.environ | {"CI": "1"}
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--slots", "0"],
        ["--rate", "nan"],
        ["--rate", "0"],
        ["--requests", "-3"],
        ["--max-len", "0"],
        ["--block-size", "0"],
        ["--slots", "100", "--max-len", "200"],
    ],
)
def test_waste_refuses_bad_arguments_with_one_line(argv):
    done = _run("waste", "--requests", "10", *argv) if "--requests" not in argv else _run("waste", *argv)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "error" in done.stderr


@pytest.mark.parametrize("kind", ["a folder", "under a file", "unwritable"])
def test_run_checks_its_output_paths_before_running(tmp_path, kind, capsys, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir()
    target = {"a folder": tmp_path, "under a file": blocker / "report.json", "unwritable": locked / "r.json"}[kind]
    if kind == "unwritable":  # root may write anywhere: have the OS say no to this folder
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != locked and real_access(p, mode))
    assert main(["run", "seed_demo", "--backend", "cpu", "--quiet", "--json", str(target)]) == 2
    err = capsys.readouterr().err
    assert "--json" in err and str(target) in err
    assert main(["run", "seed_demo", "--backend", "cpu", "--quiet", "--dump", str(blocker)]) == 2


def test_json_dash_writes_the_report_to_stdout():
    done = _run("run", "seed_demo", "--backend", "cpu", "--json", "-")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["passed"] is True and report["stalled"] is None
    assert "PASS" in done.stderr  # the human lines move out of the report's way


def test_gui_screenshot_paths_are_checked_first(tmp_path):
    env = os.environ | {"QT_QPA_PLATFORM": "offscreen"}
    for target in (tmp_path / "shot", tmp_path / "file.png" / "x.png"):
        if target.name == "x.png":
            (tmp_path / "file.png").write_text("x")
        done = subprocess.run(
            [sys.executable, "-m", "pagesim.app.cli", "gui", "seed_demo", "--screenshot", str(target)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 2 and "saved" not in done.stdout and "error" in done.stderr


def test_gui_steps_past_the_end_of_an_emptied_scenario_still_exit(tmp_path):
    path = tmp_path / "empty_end.toml"
    path.write_text(HEADER + '[[steps]]\nop = "add"\nseq = "a"\ntokens = 3\n[[steps]]\nop = "free"\nseq = "a"\n')
    shot = tmp_path / "end.png"
    done = subprocess.run(
        [sys.executable, "-m", "pagesim.app.cli", "gui", str(path), "--steps", "50", "--screenshot", str(shot)],
        capture_output=True,
        text=True,
        env=os.environ | {"QT_QPA_PLATFORM": "offscreen"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert Path(shot).stat().st_size > 0 and "at step 2" in done.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "hi", "--model", "synthetic"],
        ["attach", "tcp://127.0.0.1:1", "--tokenizer", "synthetic", "--duration", "1"],
    ],
)
def test_the_synthetic_model_as_a_model_file_is_refused_without_contradicting_itself(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "synthetic token model has no weights or tokenizer" in err and "got 'synthetic'" not in err


def test_ctrl_c_ends_a_run_with_a_line_not_a_traceback():
    process = subprocess.Popen(
        [sys.executable, "-m", "pagesim.app.cli", "run", "stress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},  # its first line as soon as it is printed
    )
    process.stdout.readline()  # it has started its steps
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--per-step"], "--per-step adds every step's split to the --json file: give --json too"),
        (["--blocks", "5"], "the pool (80 slots from --blocks 5) is smaller than --max-len 2048"),
        (["--blocks", "4096", "--slots", "100000"], "give one pool size: --slots or --blocks, not both"),
        (
            ["--slots", "100000", "--model-shape", "llama-3-8b", "--gpu", "h200"],
            "give one pool size: --slots or --model-shape with --gpu, not both",
        ),
    ],
)
def test_waste_says_what_was_given(capsys, argv, message):
    assert main(["waste", "--requests", "5", *argv]) == 2
    assert message in capsys.readouterr().err


def test_ctrl_c_while_the_command_line_loads_is_a_line_too(monkeypatch, capsys):
    import pagesim.app as entry

    class Interrupting:  # a Ctrl-C arriving while pagesim.app.cli's imports run
        def find_spec(self, name, path=None, target=None):
            if name == "pagesim.app.cli":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "pagesim.app.cli")
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    assert entry.main(["scenarios"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted: nothing was written"


def test_a_prompt_that_is_not_utf8_or_longer_than_the_context_is_named_not_a_traceback(capsys):
    """Bytes a terminal could not decode raised a TypeError in the tokenizer; a prompt past the
    context window was told to use "at most --max-tokens 0"."""
    assert main(["generate", "abc\udcffdef", "--max-tokens", "1"]) == 2
    assert "the prompt is not valid UTF-8 text (at character 3)" in capsys.readouterr().err
    assert main(["generate", "word " * 9000, "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "the prompt alone is" in err and "past the model's context window of 8192" in err


def test_a_typed_prompt_that_is_not_utf8_is_refused_by_the_engine_too():
    from pagesim.core.errors import InvalidOperationError
    from pagesim.core.models.catalog import load_model
    from pagesim.core.token_text import prompt_ids

    with pytest.raises(InvalidOperationError, match="not valid UTF-8"):
        prompt_ids(load_model("smollm2-135m"), "caf\udce9")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", ""], "'': an empty name: give a shipped scenario's name"),  # (it read the folder ".")
        (["trace", "", "-o", "{tmp}/out.jsonl"], "argument workload: an empty name: give a path"),
        (["trace", "{tmp}", "-o", "{tmp}/out.jsonl"], "cannot read: it is a folder, not a workload file"),
        (["trace", "{tmp}/latin1.json", "-o", "{tmp}/out.jsonl"], "is it a JSON file?"),
        (["gui", "seed_demo", "--steps", "-1", "--screenshot", "{tmp}/s.png"], "--steps: expected a whole number ≥ 0"),
        (["gui", "seed_demo", "--size", "0x0", "--screenshot", "{tmp}/s.png"], "from 1 to 16384 pixels; got '0x0'"),
    ],
)
def test_inputs_that_are_no_such_thing_are_named_for_what_they_should_be(tmp_path, capsys, argv, message):
    (tmp_path / "latin1.json").write_bytes("{'café'}".encode("latin-1"))
    argv = [a.format(tmp=tmp_path) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exit_:  # (an argument error: argparse's own exit)
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "s.png").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "seed_demo", "--dump", ""],
        ["run", "seed_demo", "--json", ""],
        ["generate", "Hi", "--json", ""],
        ["trace", "w.json", "-o", ""],
        ["latency", "--workload", "alpaca", "--model-shape", "llama-3-8b", "--gpu", "h200", "--json", ""],
        ["sweep", "seed_demo", "--set", "block_size=4", "--csv", ""],
    ],
)
def test_an_empty_output_path_is_refused_not_taken_as_the_current_folder(argv, tmp_path, monkeypatch, capsys):
    """--dump "" wrote its .npz files into the current folder; --json "" said '--json . is a folder'."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and "an empty name: give a path" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "seed_demo", "--quiet", "--json", "new/"],
        ["waste", "--json", "new/"],
        ["trace", "w.json", "-o", "new/"],
        ["generate", "Hi", "--json", "new/"],
        ["gui", "seed_demo", "--screenshot", "new/"],
        ["latency", "seed_demo", "--json", "new/"],
        ["sweep", "seed_demo", "--set", "block_size=4", "--plot", "new/"],
        ["bench", "--quick", "--json", "new/"],
    ],
)
def test_an_output_file_named_with_a_trailing_slash_is_refused_as_a_folder(argv, tmp_path, monkeypatch, capsys):
    """``--json new/`` wrote a file called ``new``: the slash, which said a folder, was dropped."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "'new/' ends in '/', so it names a folder: give a file's name" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["generate", "Hi", "--model", "notmodel.bin"], "--model 'notmodel.bin' is not a model: give \"smollm2-135m\""),
        (["generate", "Hi", "--model", "synthetic"], "--model synthetic: the synthetic token model has no weights"),
        (["attach", "tcp://127.0.0.1:5999", "--duration", "1", "--tokenizer", "bogus"], "--tokenizer 'bogus' is not"),
    ],
)
def test_a_model_option_that_names_no_model_says_which_option(argv, said, capsys):
    """Both said 'model must be "synthetic", …' (and then refused "synthetic"), naming neither option."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--quiet", "a" * 300 + ".toml"],
        ["trace", "WORKLOAD", "-o", "OUT/" + "a" * 300 + "/trace.jsonl"],
        ["waste", "--requests", "10", "--json", "OUT/" + "a" * 300],
    ],
)
def test_a_path_the_system_refuses_is_one_line_naming_it(argv, tmp_path, monkeypatch, capsys):
    """A name longer than the file system takes (or a folder the user may not enter) raised
    OSError from the checks made before a run: a traceback."""
    monkeypatch.chdir(tmp_path)
    workload = str(Path(__file__).parents[1] / "traces" / "vllm_v1" / "workload-1.json")
    argv = [workload if a == "WORKLOAD" else a.replace("OUT", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "File name too long" in err and "…" in err


@pytest.mark.parametrize(
    "argv",
    [["latency", "", "--model-shape", "llama-3-8b", "--gpu", "h200"], ["sweep", "", "--set", "block_size=4,8"]],
)
def test_an_empty_scenario_name_is_refused_not_taken_as_the_default(argv, capsys):
    assert main(argv) == 2
    assert "an empty name" in capsys.readouterr().err


def _tiny_model_scenario(tmp_path, monkeypatch, header: str, steps: str):
    """A scenario on the tiny test model (context window 256), which loads into a fresh cache."""
    from pagesim.core.models.gguf_loader import CACHE_ENV

    from tests.models import tiny_gguf

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    tiny_gguf.write_llama(tmp_path / "tiny.gguf")
    path = tmp_path / "long.toml"
    path.write_text('model = "tiny.gguf"\n' + header + steps)
    return path


LONG_REQUESTS = (  # 200 + 100 tokens pass the window; 200 + 56 fill it
    '[[steps]]\nop = "submit"\nrequest = "r"\ntokens = 200\noutput = 100\n'
    '[[steps]]\nop = "submit"\nrequest = "q"\ntokens = 200\noutput = 56\n'
)


@pytest.mark.parametrize(
    "steps, said",
    [
        (
            'op = "add"\nseq = "a"\ntokens = 300\n',
            "sequence 'a' would hold 300 tokens, past the model's context window of 256",
        ),
        (
            'op = "add"\nseq = "a"\ntokens = 250\n[[steps]]\nop = "grow"\nseq = "a"\ntokens = 10\n',
            "sequence 'a' would hold 250 + 10 = 260 tokens, past the model's context window of 256",
        ),
    ],
)
def test_a_sequence_past_the_models_context_window_is_refused(tmp_path, monkeypatch, capsys, steps, said):
    """Positions the model was never trained on ran, and the run said PASS (generate refused them)."""
    path = _tiny_model_scenario(tmp_path, monkeypatch, "num_blocks = 128\nblock_size = 4\n[[steps]]\n", steps)
    assert main(["run", "--quiet", str(path)]) == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("scheduler", ["v0", "v1"])
def test_a_request_past_the_models_context_window_is_rejected_as_submitted(tmp_path, monkeypatch, scheduler):
    from pagesim.core.timeline import Timeline
    from pagesim.kernels.cpu_backend import CpuBackend

    header = f'scheduler = "{scheduler}"\nnum_blocks = 160\nblock_size = 4\n'
    path = _tiny_model_scenario(tmp_path, monkeypatch, header, LONG_REQUESTS)
    timeline = Timeline(load_scenario(path), CpuBackend())
    timeline.forward()
    timeline.forward()
    requests = timeline.sim.scheduler.requests
    state = requests["r"]
    assert state.status == "rejected" and "200 prompt + 100 output tokens pass the model's context window of 256" in (
        state.rejection
    )
    assert requests["q"].status != "rejected"  # (256 tokens: the window itself)


@pytest.mark.parametrize("name", ["Seed_Demo", "seed-demo", "seed_demo.toml"])
def test_a_misspelt_shipped_name_is_answered_with_the_name_meant(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ScenarioError, match="did you mean the shipped scenario 'seed_demo'"):
        load_scenario(name)


@pytest.mark.parametrize("scheduler, op", [("v0", "grow"), ("v0", "free"), ("v1", "grow"), ("v1", "free")])
def test_growing_or_freeing_a_waiting_request_says_it_waits(scheduler, op):
    """It said 'unknown sequence 'r' (live sequences: none)'."""
    from pagesim.core.errors import InvalidOperationError
    from pagesim.core.operations import Free, Grow, Submit

    config = CacheConfig(num_blocks=8, block_size=4, num_heads=2, head_dim=8, scheduler=scheduler)
    sim = Simulator(config)
    sim.apply(Submit("r", 2, prompt_len=4))
    with pytest.raises(InvalidOperationError, match="belongs to request 'r' \\(still waiting\\)"):
        sim.apply(Grow("r", 1) if op == "grow" else Free("r"))


@pytest.mark.parametrize("scheduler", ["v0", "v1"])
@pytest.mark.parametrize("op", ["grow", "free"])
def test_growing_or_freeing_a_finished_requests_sequence_says_it_finished(scheduler, op):
    """It said 'unknown sequence 'r' (live sequences: none)', as for a name never heard of."""
    from pagesim.core.errors import InvalidOperationError
    from pagesim.core.operations import Free, Grow, Schedule, Submit

    sim = Simulator(CacheConfig(num_blocks=8, block_size=4, num_heads=2, head_dim=8, scheduler=scheduler))
    sim.apply(Submit("r", 1, prompt_len=4))
    sim.apply(Schedule(4))
    assert sim.scheduler.requests["r"].status == "finished"
    with pytest.raises(InvalidOperationError, match="sequence 'r' was request 'r''s, which has finished"):
        sim.apply(Grow("r", 1) if op == "grow" else Free("r"))


def test_a_knob_set_under_both_its_names_says_they_are_one(capsys):
    assert main(["sweep", "seed_demo", "--set", "engine=v1", "--set", "scheduler=v0"]) == 2
    assert "scheduler (as engine and scheduler) is set twice" in capsys.readouterr().err
    assert main(["sweep", "seed_demo", "--set", "engine=v1", "--set", "engine=v0"]) == 2
    assert "error: engine is set twice" in capsys.readouterr().err


@pytest.mark.parametrize(
    "option, said",
    [
        (["--rate", "0"], "--rate must be a positive number (requests a second); got 0.0"),
        (["--requests", "0"], "--requests must be a positive integer; got 0"),
        (["--block-size", "-4"], "--block-size must be a positive integer; got -4"),
    ],
)
def test_a_workload_option_out_of_range_is_named(option, said, capsys):
    argv = ["latency", "--workload", "uniform", *option, "--model-shape", "llama-3-8b", "--gpu", "h200"]
    assert main(argv) == 2
    assert said in capsys.readouterr().err


def test_a_study_of_a_real_models_scenario_keeps_its_context_window(tmp_path, monkeypatch):
    """The synthetic model that stands in for it had none: a request the run rejects was timed."""
    from pagesim.core.studies.replay import replay_scenario
    from pagesim.core.studies.stand_in import memory_only

    header = 'scheduler = "v1"\nnum_blocks = 160\nblock_size = 4\n'
    path = _tiny_model_scenario(tmp_path, monkeypatch, header, LONG_REQUESTS)
    stand_in, note = memory_only(load_scenario(path))
    assert stand_in.context_window == 256 and "context window" in note
    result = replay_scenario(stand_in)
    assert result.requests["r"].rejected and result.requests["q"].state == "finished"


@pytest.mark.parametrize(
    "name, said",
    [
        ("   ", "is blank"),
        ("a\nb", "holds a line break"),
        ("a\tb", "another control character"),
        ("x" * 101, "101 characters long; a name has at most 100"),
    ],
)
def test_a_new_name_that_would_show_as_nothing_or_break_lines_is_refused(name, said):
    """A blank name made a blank row, a line break a row of two lines, a long one pushed the
    block table off screen."""
    from pagesim.core.errors import InvalidOperationError
    from pagesim.core.operations import Submit

    for make in (lambda: Add(name, 2), lambda: Submit(name, 2, prompt_len=4)):
        with pytest.raises(InvalidOperationError, match=said):
            make()


def test_a_model_path_that_is_a_folder_says_so(tmp_path, capsys):
    """It read 'folder.gguf: No such file or directory' though the folder was there."""
    (tmp_path / "folder.gguf").mkdir()
    path = tmp_path / "s.toml"
    path.write_text('model = "folder.gguf"\nnum_blocks = 8\nblock_size = 4\n')
    assert main(["run", "--quiet", str(path)]) == 2
    assert f"{tmp_path / 'folder.gguf'} is a folder, not a .gguf model file" in capsys.readouterr().err
