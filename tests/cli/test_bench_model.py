"""``pagesim bench --model --quick`` on a tiny GGUF file: every measurement runs and lands in
the JSON with the fields docs/benchmarks.md quotes (no timing is asserted: this machine is
shared)."""

import json

import numba
import pytest
import torch
from pagesim.app.cli import main
from pagesim.core.llama_model import LOGITS_TOLERANCES
from pagesim.core.models.precision import DTYPE_ENV

from tests.models import tiny_gguf

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def restored_threads():
    """The benchmark sets both thread pools as ``pagesim`` does; later tests get theirs back."""
    saved = torch.get_num_threads(), numba.get_num_threads()
    yield
    torch.set_num_threads(saved[0])
    numba.set_num_threads(saved[1])


@pytest.mark.parametrize(("dtype", "weights"), [("fp32", "float32"), ("bf16", "bfloat16")])
def test_model_bench_quick_writes_every_measurement(tmp_path, monkeypatch, capsys, restored_threads, dtype, weights):
    monkeypatch.setenv("PAGESIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(DTYPE_ENV, "fp32")  # (the benchmark sets it for its measuring processes)
    model = tmp_path / "tiny.gguf"
    tiny_gguf.write_llama(model)
    out = tmp_path / "model-bench.json"
    assert main(["bench", "--model", str(model), "--quick", "--dtype", dtype, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{dtype} weights" in printed and "decode: 2 sequences" in printed and "prefill:" in printed
    report = json.loads(out.read_text())
    assert report["quick"] is True
    assert report["model"]["dtype"] == weights and report["model"]["dtype_choice"] == dtype
    assert "thread" in report["model"]["threads"]
    assert report["machine"]["cpu"] and len(report["machine"]["load_average_before"]) == 3

    load = report["load"]
    assert load["first"]["cache_status"] == "built" and load["cached"]["cache_status"] == "hit"
    assert load["first"]["load_s"] > 0 and load["cached"]["load_s"] > 0

    rss = report["rss"]
    assert rss["peak_rss_mb"] > rss["weights_mb"] + rss["kv_cache_mb"] > 0
    assert rss["budget_mb"] == pytest.approx(rss["weights_mb"] + rss["kv_cache_mb"] + rss["headroom_mb"])

    rows = {(r["threads"], r["other_core_busy"]) for r in report["threads"]}
    assert rows == {(1, False), (2, False), (1, True), (2, True)}
    assert all(r["paged_ms"] > 0 for r in report["threads"])

    (decode,) = report["decode"]
    assert (decode["batch"], decode["context"]) == (2, 40)
    assert decode["paged_ms"] > 0 and decode["dense_ms"] > 0 and decode["paged_over_dense"] > 0
    assert decode["logits_max_abs_diff"] <= LOGITS_TOLERANCES[weights]
    prefill = report["prefill"]
    assert prefill["tokens"] == 40 and prefill["paged_tokens_per_s"] > 0 and prefill["dense_tokens_per_s"] > 0
    assert prefill["logits_max_abs_diff"] <= LOGITS_TOLERANCES[weights]
    if weights == "float32":  # bf16 may round a near tie differently: its verdict is the bound alone
        assert decode["same_next_tokens"] and prefill["same_next_tokens"]
    assert set(report["targets_met"]) == {"load", "rss", "decode", "prefill"}


def test_model_bench_refuses_the_cuda_backend(capsys):
    assert main(["bench", "--model", "--backend", "cuda", "--json", "-"]) == 2
    assert "CPU backend" in capsys.readouterr().err
