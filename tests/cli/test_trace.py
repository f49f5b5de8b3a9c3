"""``pagesim trace WORKLOAD -o OUT``: the v1 scheduler's trace of a workload of the vLLM v1
traces, in their format; bad input is one line and exit 2."""

import gzip
import json
from pathlib import Path

import pytest
from pagesim.app.cli import main
from pagesim.core.trace import compare_traces, read_trace

TRACES = Path(__file__).parents[1] / "traces" / "vllm_v1"


def test_trace_writes_vllms_trace_of_the_workload(tmp_path):
    out = tmp_path / "sub" / "trace.jsonl"
    assert main(["trace", str(TRACES / "workload-3.json"), "-o", str(out)]) == 0
    with gzip.open(TRACES / "workload-3.vllm.jsonl.gz", "rt", encoding="utf-8") as f:
        theirs = read_trace(f)
    assert compare_traces(read_trace(out.read_text().splitlines()), theirs) == []


def test_trace_to_stdout(capsys):
    assert main(["trace", str(TRACES / "workload-8.json"), "-o", "-"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert records[0]["kind"] == "header" and records[-1]["kind"] == "summary"


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot read"),
        ("{not json", "not valid JSON"),
        ('{"config": {"num_gpu_blocks": 1' + "0" * 5000 + "}}", "not valid JSON: Exceeds the limit"),
        ('{"config": {}, "requests": []}', "config.num_gpu_blocks is missing"),
        (
            '{"config": {"num_gpu_blocks": 8, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 64, '
            '"enable_prefix_cache": true}, "requests": []}',
            "config.enable_prefix_cache is not a field of the format",
        ),
        (
            '{"config": {"num_gpu_blocks": 0, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 64, '
            '"enable_prefix_caching": true}, "requests": []}',
            "config.num_gpu_blocks must be a positive integer",
        ),
        ("[1, 2]", "a workload is an object"),
        (
            '{"config": {"num_gpu_blocks": 1, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 64, '
            '"enable_prefix_caching": true}, "requests": []}',
            "config.num_gpu_blocks must be at least 2: block 0 is the null block",
        ),
        # (a repeated key: the last would win, silently, as Python's json takes it)
        (
            '{"config": {"num_gpu_blocks": 8, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 64, '
            '"enable_prefix_caching": true}, "requests": [{"id": "a", "prompt": [1], "max_new_tokens": 1, '
            '"output": [2]}], "requests": []}',
            "'requests' is given twice in one object",
        ),
        (
            '{"config": {"num_gpu_blocks": 8, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 64, '
            '"enable_prefix_caching": true}, "requests": [], "seed": "x"}',
            "seed must be a non-negative integer; got 'x'",
        ),
        (
            '{"config": {"num_gpu_blocks": 8, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 64, '
            '"enable_prefix_caching": true}, "requests": [], "max_step": 5}',
            "max_step is not a field of a workload",
        ),
        (
            '{"config": {"num_gpu_blocks": 8, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 64, '
            '"enable_prefix_caching": true}, "requests": [{"id": "a", "prompt": [1], "max_new_tokens": 1, '
            '"output": [2], "arrival_steps": 3}]}',
            "requests[0].arrival_steps is not a field of a request",
        ),
        # (a step a record: ten billion steps filled gigabytes before writing anything)
        (
            '{"config": {"num_gpu_blocks": 8, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 64, '
            '"enable_prefix_caching": true}, "requests": [], "max_steps": 10000000000}',
            "max_steps must be an integer from 1 to 100,000; got 10000000000",
        ),
        (
            '{"config": {"num_gpu_blocks": 8, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 64, '
            '"enable_prefix_caching": true}, "requests": [{"id": "a", "prompt": [1], "max_new_tokens": 1, '
            '"output": [2], "arrival_step": 600}], "max_steps": 600}',
            "requests[0].arrival_step must be an integer from 0 to max_steps − 1 (599); got 600",
        ),
        (
            '{"config": {"num_gpu_blocks": 8, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 64, '
            '"enable_prefix_caching": true}, "requests": [{"id": "a", "prompt": [1], "max_new_tokens": 1, '
            '"output": [2], "arrival_step": 10000}]}',
            "(9999, max_steps being 10,000 when not given); got 10000",
        ),
    ],
)
def test_a_missing_or_malformed_workload_is_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "workload.json"
    if content is not None:
        path.write_text(content)
    assert main(["trace", str(path), "-o", str(tmp_path / "out.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(path) in err
    assert not (tmp_path / "out.jsonl").exists()


def test_a_request_without_enough_output_tokens_is_refused(tmp_path, capsys):
    doc = json.loads((TRACES / "workload-8.json").read_text())
    doc["requests"][0]["output"] = doc["requests"][0]["output"][:1]
    path = tmp_path / "short.json"
    path.write_text(json.dumps(doc))
    assert main(["trace", str(path), "-o", str(tmp_path / "out.jsonl")]) == 2
    assert "requests[0].output holds 1 tokens" in capsys.readouterr().err


def test_a_run_that_leaves_requests_unfinished_says_so(tmp_path, capsys):
    workload = tmp_path / "w.json"
    workload.write_text(
        '{"config": {"num_gpu_blocks": 8, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 64, '
        '"enable_prefix_caching": false}, "max_steps": 2, '
        '"requests": [{"id": "a", "prompt": [1, 2, 3], "max_new_tokens": 5, "output": [4, 5, 6, 7, 8]}]}'
    )
    assert main(["trace", str(workload), "-o", str(tmp_path / "out.jsonl")]) == 0
    assert "note: 1 of 1 requests did not finish within 2 steps (max_steps 2): a" in capsys.readouterr().err


def test_a_request_that_can_never_fit_is_named_as_rejected_not_as_unfinished(tmp_path, capsys):
    doc = {
        "config": {"num_gpu_blocks": 8, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 64,
                   "enable_prefix_caching": True},
        "requests": [
            {"id": "long", "prompt": list(range(1, 60)), "max_new_tokens": 2, "output": [5, 6]},
            {"id": "short", "prompt": [1, 2, 3], "max_new_tokens": 2, "output": [5, 6]},
        ],
    }  # fmt: skip
    path, out = tmp_path / "w.json", tmp_path / "t.jsonl"
    path.write_text(json.dumps(doc))
    assert main(["trace", str(path), "-o", str(out)]) == 0
    summary = read_trace(out.read_text().splitlines())[-1]
    assert list(summary["rejected"]) == ["long"] and "blocks" in summary["rejected"]["long"]
    assert summary["unfinished"] == [] and list(summary["finished"]) == ["short"]
    err = capsys.readouterr().err
    assert err.startswith("note: request long rejected: ") and "did not finish" not in err


def test_a_workload_of_a_large_vocabulary_is_traced(tmp_path):
    """Ids of SmolLM2 (49,152) or Llama-3 (128,256) were refused as outside [0, 32000), the
    synthetic model's vocabulary, though a trace only hashes them."""
    workload = tmp_path / "w.json"
    config = {"num_gpu_blocks": 16, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 64}
    request = {"id": "a", "prompt": [128_000, 127_999, 100_000, 50_000, 7], "max_new_tokens": 3,
               "output": [120_000, 2, 128_255]}  # fmt: skip
    workload.write_text(json.dumps({"config": {**config, "enable_prefix_caching": True}, "requests": [request]}))
    out = tmp_path / "t.jsonl"
    assert main(["trace", str(workload), "-o", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[-1]["kind"] == "summary"
