"""The model's steps on the GPU, paged against dense, both engines on the device (the GPU
check runs this): decode steps of 8 and 32 sequences at context 512 and a 512-token
prefill, medians side by side, as ``pagesim bench --model`` measures them on the CPU; then
where the host's time goes in the paged steps (cProfile, beside OUT.json as OUT.profile.txt):
on a GPU a step this small is bound by the host's launches and waits, not by the device.

    python scripts/gpu_model_bench.py MODEL.gguf OUT.json
"""

import cProfile
import io
import json
import pstats
import sys

import torch
from pagesim.core.models import load_gguf
from pagesim.core.models.bench import ModelBenchPlan, PagedDecode, bench_decode, bench_prefill, paged_runner
from pagesim.kernels.cuda_backend import CudaBackend


def main(model: str, out: str) -> None:
    file = load_gguf(model)
    backend = CudaBackend()
    plan = ModelBenchPlan()
    report = {
        "model": file.config.name,
        "layers": file.config.num_layers,
        "device": backend.device,
        "torch": torch.__version__,
        "decode": [],
    }
    report["torch_device"] = str(paged_runner(file, backend, 4, plan.block_size).llama.device)  # the paged engine's
    for batch in plan.batches:
        row = bench_decode(file, backend, batch, plan)
        report["decode"].append(row)
        print(
            f"decode {batch} × {plan.context}: paged {row['paged_ms']:.2f} ms, dense {row['dense_ms']:.2f} ms "
            f"({row['paged_over_dense']:.2f}×), logits diff {row['logits_max_abs_diff']:.2e}, "
            f"same tokens {row['same_next_tokens']}",
            flush=True,
        )
    row = report["prefill"] = bench_prefill(file, backend, plan)
    print(
        f"prefill {row['tokens']}: paged {row['paged_ms']:.2f} ms, dense {row['dense_ms']:.2f} ms "
        f"({row['paged_over_dense_speed']:.2f}× the speed), logits diff {row['logits_max_abs_diff']:.2e}"
    )
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    step = PagedDecode(file, backend, plan.batches[0], plan.context, plan.block_size, dense=False)
    step.paged_step()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(20):
        step.paged_step()
    profile.disable()
    text = io.StringIO()
    text.write(f"20 paged decode steps of {plan.batches[0]} sequences at context {plan.context}, host time\n")
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    with open(out.removesuffix(".json") + ".profile.txt", "w", encoding="utf-8") as f:
        f.write(text.getvalue())


if __name__ == "__main__":
    main(*sys.argv[1:3])
