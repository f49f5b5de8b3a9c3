"""The real model with its K/V on the device: each shipped real-model scenario runs on the
CUDA backend (every layer's cache, writes, copy-on-write, swaps and the paged decode and
prefill kernels on the GPU) and writes, step by step, the tokens the CPU backend writes,
with every paged-vs-dense check passing.

The model is SmolLM2 where it is installed, else the GGUF file ``$PAGESIM_GPU_MODEL`` names
(the GPU check carries SmolLM2 cut to its first layers: the whole file is over what a call
to the GPU machine takes)."""

import os
import re

import pytest
import torch
from pagesim.core.models import ModelFileError, bundled_model_path
from pagesim.core.scenario import parse_scenario, shipped_folder
from pagesim.core.timeline import Timeline

# Each scenario runs twice, and the dense reference beside each run is on the host: on the
# GPU machine with 8 test workers a scenario took 60-150 s (scripts/gpu_check.sh gives the
# whole suite 360).
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

MODEL_ENV = "PAGESIM_GPU_MODEL"
REAL_MODEL_SCENARIOS = (
    "default",
    "parallel_sampling",
    "shared_system_prompt",
    "preemption_swap",
    "preemption_recompute",
    "preemption_v1",
    "prefix_caching_v1",
    "beam_search",
)


@pytest.fixture(scope="module")
def model_file():
    if os.environ.get(MODEL_ENV):
        return os.environ[MODEL_ENV]
    try:
        return str(bundled_model_path())
    except ModelFileError as exc:
        pytest.skip(f"no model file: {exc}; or set {MODEL_ENV} to a Llama-architecture GGUF")


def on_model(name: str, path: str):
    text = (shipped_folder() / f"{name}.toml").read_text(encoding="utf-8")
    text, count = re.subn(r'^model = "[^"]*"$', f'model = "{path}"', text, flags=re.M)
    assert count == 1, f"{name} names no model"
    return parse_scenario(text, name)


def tokens_by_step(scenario, backend):
    timeline = Timeline(scenario, backend, snapshot_data=False, history=False)
    runner = timeline.sim.runner
    if backend.name == "cuda" and torch.cuda.is_available():
        assert runner.llama.device.type == "cuda", "the paged engine's model is not on the device"
    steps = []
    while not timeline.at_end:
        result = timeline.forward()
        report = result.attention
        assert report is None or report.passed, f"step {timeline.position}: {report}"
        if report is not None:
            assert report.backend == backend.name
        steps.append({s: tuple(seq.token_ids) for s, seq in timeline.sim.sequences.items()})
    return steps


@pytest.mark.parametrize("name", REAL_MODEL_SCENARIOS)
def test_the_device_writes_the_cpus_tokens(cuda_backend, cpu_backend, model_file, name):
    scenario = on_model(name, model_file)
    on_gpu = tokens_by_step(scenario, cuda_backend)
    on_cpu = tokens_by_step(scenario, cpu_backend)
    assert len(on_gpu) == len(on_cpu)
    for step, (gpu, cpu) in enumerate(zip(on_gpu, on_cpu, strict=True), 1):
        assert gpu == cpu, f"step {step}: the device's tokens differ from the CPU's"
