"""Inputs that used to hang or read without end: refused quickly with a clear error."""

import os
import threading
import time

import pytest
from pagesim.core.config import CacheConfig
from pagesim.core.errors import InvalidStudyError, ScenarioError
from pagesim.core.scenario import MAX_SCENARIO_BYTES, load_scenario, parse_scenario
from pagesim.core.studies.waste import MAX_STEPS, check_bounded, simulate
from pagesim.core.studies.workload import MAX_REQUESTS, RequestSpec, generate

HEADER = "num_blocks = 8\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\n"


def _quick(fn, seconds=5.0):
    """Run ``fn`` on a thread; fail (not hang) if it has not returned in ``seconds``."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.parametrize("value", [2**31, 2**63 - 1, 10**30])
def test_an_absurd_max_model_len_is_refused_at_load(value):
    with pytest.raises(ScenarioError, match="max_model_len must be ≤") as info:
        parse_scenario(HEADER + f"max_model_len = {value}\n", "big.toml")
    assert info.value.field == "max_model_len"


def test_a_large_max_model_len_loads_and_runs_at_once(cpu_backend):
    from pagesim.core.timeline import Timeline

    scenario = parse_scenario(HEADER + 'max_model_len = 10000000\n[[steps]]\nop = "add"\nseq = "a"\ntokens = 5\n')
    started = time.perf_counter()
    Timeline(scenario, cpu_backend).run_to_end()
    assert time.perf_counter() - started < 5.0


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "scenario.toml"
    os.mkfifo(fifo)
    with pytest.raises(ScenarioError, match="not a regular file"):
        _quick(lambda: load_scenario(fifo))


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_an_endless_device_is_refused_without_reading_it(device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    with pytest.raises(ScenarioError, match="not a regular file") as info:
        _quick(lambda: load_scenario(device))
    assert device in str(info.value)


def test_a_file_over_the_size_limit_is_refused(tmp_path):
    path = tmp_path / "huge.toml"
    with open(path, "wb") as f:
        f.truncate(MAX_SCENARIO_BYTES + 1)  # sparse: no disk used
    with pytest.raises(ScenarioError, match=r"too large: .*\(a scenario file holds at most"):
        load_scenario(path)


def test_a_workload_over_the_size_limit_is_named_a_workload(tmp_path):
    from pagesim.core.trace import load_workload

    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(MAX_SCENARIO_BYTES + 1)
    with pytest.raises(ScenarioError, match=r"a workload file holds at most 16,777,216\)"):
        load_workload(path)


def test_a_folder_named_like_a_shipped_scenario_does_not_hide_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "default").mkdir()
    assert "assets" in load_scenario("default").source
    with pytest.raises(ScenarioError, match="folder"):
        load_scenario(tmp_path)


def test_a_local_file_named_like_a_shipped_scenario_is_still_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "default").write_text('name = "mine"\n' + HEADER)
    assert load_scenario("default").name == "mine"


def test_a_shared_prefix_longer_than_the_prompt_is_refused():
    step = '[[steps]]\nop = "submit"\nrequest = "r"\ntokens = 4\noutput = 2\nshared_prefix = 9\n'
    with pytest.raises(ScenarioError, match=r"shared_prefix \(9\) is longer than the prompt \(4 tokens\)") as info:
        parse_scenario(HEADER + step, "s.toml")
    assert (info.value.step, info.value.field) == (1, "shared_prefix")


def test_a_vanishing_arrival_rate_is_refused_not_replayed():
    workload = generate("sharegpt", 20, rate=1e-300, seed=0)
    with pytest.raises(ValueError, match="raise the arrival rate"):
        check_bounded(workload)
    with pytest.raises(ValueError, match="raise the arrival rate"):
        _quick(lambda: simulate("paged", workload, 32768))


def test_a_block_that_cannot_hold_a_max_length_request_is_refused():
    workload = [RequestSpec("r", 0.0, 40, 40)]
    with pytest.raises(ValueError, match="blocks"):
        _quick(lambda: simulate("paged", workload, 100, block_size=64, max_len=100))
    with pytest.raises(ValueError, match="longer than max_len"):
        _quick(lambda: simulate("paged", [RequestSpec("r", 0.0, 90, 90)], 100, block_size=4, max_len=100))


def test_an_ordinary_workload_is_well_inside_the_bound():
    workload = generate("sharegpt", 1000, rate=2000.0, seed=0)
    check_bounded(workload)
    assert simulate("paged", workload, 32768).steps < MAX_STEPS


def test_a_workload_of_more_requests_than_a_replay_could_take_is_refused_before_it_is_made():
    # (a billion filled a GB of specs in seconds, saying nothing, before any check ran)
    with pytest.raises(InvalidStudyError, match=r"1,000,001 requests is more than a workload may hold \(1,000,000\)"):
        _quick(lambda: generate("sharegpt", MAX_REQUESTS + 1, rate=2000.0))


@pytest.mark.parametrize("field", ["max_num_seqs", "max_num_batched_tokens"])
def test_a_batch_count_past_32_bits_is_refused_by_name(field):
    """2^63 reached itertools.islice, whose own error leaked into a sweep's 'cannot run' reason."""
    extra = {"scheduler": "v1"} if field == "max_num_batched_tokens" else {}
    with pytest.raises(ValueError, match=f"{field} must be an integer from 1 to 2,147,483,647; got {2**63}"):
        CacheConfig(num_blocks=8, block_size=4, num_heads=1, head_dim=8, **{field: 2**63}, **extra)
