"""A real model's runner on the CUDA backend's own launch code (the emulated module as the
device): every layer's K/V written with ``reshape_and_cache``, prompts through the paged
prefill kernel, decode steps through v1/v2, copy-on-write with ``copy_blocks`` — the path a
GPU runs with the model's dense layers on the host. A tiny Llama (two layers, head dim 8)
keeps the emulation quick; its tokens must be the CPU backend's, step for step."""

import pytest
from pagesim.core.scenario import parse_scenario
from pagesim.core.timeline import Timeline

from tests.cuda_emulation import emulator
from tests.models import tiny_gguf

STEPS = """
[[steps]]
op = "add"
seq = "A"
prompt = "hello the world, hello the world"

[[steps]]
op = "grow"
seq = "A"
tokens = 3

[[steps]]
op = "fork"
seq = "A"
as = "B"

[[steps]]
op = "grow"
seq = "B"
tokens = 2

[[steps]]
op = "add"
seq = "C"
prompt = "the world"

[[steps]]
op = "grow"
seq = "A"
tokens = 9

[[steps]]
op = "free"
seq = "B"

[[steps]]
op = "grow"
seq = "C"
tokens = 4
"""


def tiny_scenario(tmp_path, monkeypatch, dtype: str = "float32"):
    monkeypatch.setenv("PAGESIM_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    tiny_gguf.write_llama(path)
    header = (
        f'name = "tiny"\ndescription = "tiny"\nmodel = "{path}"\n'
        f'num_blocks = 24\nblock_size = 4\ndtype = "{dtype}"\nseed = 3\n'
    )
    return parse_scenario(header + STEPS, "tiny")


@pytest.fixture
def tiny_model_scenario(tmp_path, monkeypatch):
    return tiny_scenario(tmp_path, monkeypatch)


def tokens_by_step(scenario, backend):
    timeline = Timeline(scenario, backend, snapshot_data=False, history=False)
    steps, copies = [], 0
    while not timeline.at_end:
        result = timeline.forward()
        report = result.attention
        assert report is not None and report.passed, f"step {timeline.position}: {report}"
        assert report.backend == backend.name
        copies += sum(type(e).__name__ == "BlockCopied" for e in result.events)
        steps.append({s: tuple(seq.token_ids) for s, seq in timeline.sim.sequences.items()})
    return steps, copies


@pytest.mark.parametrize("variant", ["v1", "v2"])  # (auto asks the device for its kernels' registers)
def test_the_cuda_launch_path_writes_the_cpus_tokens(emulated_module, cpu_backend, tiny_model_scenario, variant):
    backend = emulator.EmulatedCudaBackend(emulated_module, variant)
    on_cuda, copies = tokens_by_step(tiny_model_scenario, backend)
    on_cpu, _ = tokens_by_step(tiny_model_scenario, cpu_backend)
    assert copies >= 1, "the scenario should copy a shared block on write"
    assert on_cuda == on_cpu
    assert len(on_cuda[-1]["A"]) > len(on_cuda[0]["A"])


def test_the_device_resident_path_uploads_a_forwards_tables_once_and_writes_the_cpus_tokens(
    emulated_module, cpu_backend, tiny_model_scenario, monkeypatch
):
    """With the model on the device, the kernels take the model's tensors through DLPack and
    each forward's slots and tables are uploaded once, every layer launching on those
    uploads (here the emulated device reads host memory, so the path runs on any machine):
    the tokens stay the CPU backend's, step for step."""
    backend = emulator.EmulatedCudaBackend(emulated_module, "v2")
    uploads = []
    real_attention = backend.attention_device_for

    def counting(query, key_cache, value_cache, inputs, scale):
        uploads.append("tables" in inputs.uploads)
        return real_attention(query, key_cache, value_cache, inputs, scale)

    monkeypatch.setattr(backend, "attention_device_for", counting)
    timeline = Timeline(tiny_model_scenario, backend, snapshot_data=False, history=False)
    timeline.sim.runner.on_device = True
    steps = []
    while not timeline.at_end:
        report = timeline.forward().attention
        assert report is not None and report.passed, f"step {timeline.position}: {report}"
        steps.append({s: tuple(seq.token_ids) for s, seq in timeline.sim.sequences.items()})
    on_cpu, _ = tokens_by_step(tiny_model_scenario, cpu_backend)
    assert steps == on_cpu
    layers = timeline.sim.runner.num_layers
    assert layers > 1 and len(uploads) % layers == 0
    # each forward: its first layer uploads, every later layer finds the uploads
    assert uploads == [False, *[True] * (layers - 1)] * (len(uploads) // layers)


def test_a_later_layer_of_another_shape_is_refused_before_it_writes(emulated_module):
    """What the first layer checked holds for the others only while their caches and queries
    have its shapes: a layer of another is refused, before anything is written."""
    import numpy as np
    from pagesim.kernels.backend import ForwardInputs, KernelInputError

    backend = emulator.EmulatedCudaBackend(emulated_module, "v1")
    first = backend.allocate_cache(8, 4, 2, 8, np.float32)
    other = backend.allocate_cache(4, 4, 2, 8, np.float32)
    inputs = ForwardInputs(np.array([0, 1], np.int64), np.array([[0]], np.int32), np.array([2], np.int32))
    rows = np.ones((2, 2, 8), np.float32)
    backend.write_kv_for(*first, inputs, rows, rows)
    assert np.array_equal(first[0][0, :2], rows)
    with pytest.raises(KernelInputError, match="first layer's cache"):
        backend.write_kv_for(*other, inputs, rows, rows)
    assert not other[0].any()  # nothing written
    query = np.ones((1, 4, 8), np.float32)
    backend.attention_device_for(query, *first, inputs, 0.5)
    with pytest.raises(KernelInputError, match="first layer's query and cache shapes"):
        backend.attention_device_for(query, *other, inputs, 0.5)
    with pytest.raises(KernelInputError, match="first layer's query and cache shapes"):
        backend.attention_device_for(np.ones((1, 2, 8), np.float32), *first, inputs, 0.5)


def test_a_bf16_cache_reaches_the_kernels_as_its_bit_patterns_on_the_device_path(
    emulated_module, tmp_path, monkeypatch
):
    """A bf16 cache holds 16-bit patterns on the device: the model's q, k and v go to the
    kernels as such through DLPack, and every step's attention and logits are the host
    path's, bit for bit (the tiny model's bf16 logits sit outside the fp32 tolerance on
    every backend, the CPU's too: equality with the host path is what is checked here)."""
    scenario = tiny_scenario(tmp_path, monkeypatch, "bfloat16")
    runs = []
    for on_device in (False, True):
        timeline = Timeline(
            scenario, emulator.EmulatedCudaBackend(emulated_module, "v2"), snapshot_data=False, history=False
        )
        timeline.sim.runner.on_device = on_device
        steps = []
        while not timeline.at_end:
            report = timeline.forward().attention
            logits = {s: timeline.sim.runner.model.logits[s].numpy().tobytes() for s in timeline.sim.sequences}
            steps.append((report.output.tobytes(), report.layers.logits_diff if report.layers else None, logits))
        runs.append(steps)
    assert runs[0] == runs[1]


def test_the_device_path_keeps_its_checkpoints_so_a_seek_back_replays_the_same_text(
    emulated_module, tiny_model_scenario
):
    """A layer's writes on the device path record what they overwrite for the timeline's
    checkpoints as the host path's do: seeking back and stepping forward again gives the
    same tokens, every check passing."""
    timeline = Timeline(tiny_model_scenario, emulator.EmulatedCudaBackend(emulated_module, "v2"), snapshot_every=2)
    timeline.sim.runner.on_device = True
    seen = {}
    while not timeline.at_end:
        timeline.forward()
        seen[timeline.position] = {s: tuple(q.token_ids) for s, q in timeline.sim.sequences.items()}
    end = timeline.position
    timeline.seek(3)
    timeline.sim.runner.on_device = True  # (a seek may rebuild the runner's state, not its flag)
    while timeline.position < end:
        report = timeline.forward().attention
        assert report is None or report.passed
        assert {s: tuple(q.token_ids) for s, q in timeline.sim.sequences.items()} == seen[timeline.position]
