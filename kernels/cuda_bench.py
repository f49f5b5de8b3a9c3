"""``pagesim bench --backend cuda``: the GPU figures, CUDA events, warm-ups, medians.

- achieved bandwidth: bytes of K/V the kernel must read ÷ kernel time, against the
  device's device-to-device copy bandwidth measured in the same run;
- paging overhead: the same kernel on a scattered table vs an identity table;
- against torch: gather the blocks into contiguous K/V, then SDPA;
- v1 vs v2 over context lengths 512 … 32k.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics

import numpy as np
from pagesim.kernels.backend import default_scale
from pagesim.kernels.cuda_backend import CudaBackend, choose_variant
from pagesim.kernels.cuda_build import heads_per_block
from pagesim.kernels.dtypes import storage_dtype

TARGET_BANDWIDTH_FRACTION = 0.85
TARGET_PAGING_OVERHEAD = 0.10
TARGET_SINGLE_CONTEXT_FRACTION = 0.90  # one long sequence: the split-K kernel must fill the GPU alone


def event_median_ms(fn, repeats: int = 20, warmup: int = 3) -> float:
    import cupy

    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(start, stop))
    return statistics.median(samples)


def copy_bandwidth_gbs(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy: nbytes read + nbytes written per copy."""
    import cupy

    src = cupy.empty(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    ms = event_median_ms(lambda: dst.data.copy_from_device_async(src.data, nbytes), repeats=10)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def make_case(backend: CudaBackend, batch, context, num_heads, num_kv_heads, head_dim, block_size, dtype, seed=0):
    import cupy

    rng = np.random.default_rng(seed)
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    dt_ = backend.array_dtype(storage_dtype(dtype))
    gen = cupy.random.default_rng(seed)
    key_cache = gen.standard_normal(shape, dtype=cupy.float32)
    value_cache = gen.standard_normal(shape, dtype=cupy.float32)
    if dtype == "bfloat16":  # round to bf16 bits on the device
        key_cache = (key_cache.view(cupy.uint32) >> 16).astype(cupy.uint16)
        value_cache = (value_cache.view(cupy.uint32) >> 16).astype(cupy.uint16)
    else:
        key_cache, value_cache = key_cache.astype(dt_), value_cache.astype(dt_)
    query = backend.to_device(
        rng.standard_normal((batch, num_heads, head_dim), dtype=np.float32).astype(storage_dtype(dtype))
    )
    scattered = rng.permutation(num_blocks).astype(np.int32).reshape(batch, blocks_per_seq)
    identity = np.arange(num_blocks, dtype=np.int32).reshape(batch, blocks_per_seq)
    lens = np.full(batch, context, dtype=np.int32)
    return query, key_cache, value_cache, scattered, identity, lens


def torch_gather_sdpa(query, key_cache, value_cache, tables, context: int):
    """The torch baseline: gather every sequence's blocks into contiguous K/V, then SDPA."""
    import torch
    import torch.nn.functional as F

    kc, vc, q = (torch.from_dlpack(a) for a in (key_cache, value_cache, query))
    if kc.dtype == torch.uint16:
        kc, vc, q = kc.view(torch.bfloat16), vc.view(torch.bfloat16), q.view(torch.bfloat16)
    idx = torch.from_numpy(tables).to(kc.device).long()
    batch = idx.shape[0]

    def run():
        k = kc[idx].reshape(batch, -1, kc.shape[2], kc.shape[3])[:, :context].transpose(1, 2)
        v = vc[idx].reshape(batch, -1, vc.shape[2], vc.shape[3])[:, :context].transpose(1, 2)
        return F.scaled_dot_product_attention(q[:, :, None, :], k, v, enable_gqa=q.shape[1] != k.shape[1])

    return run


def timed_launch(
    backend: CudaBackend, q, kc, vc, tables: np.ndarray, lens: np.ndarray, scale: float, variant=None, heads=None
):
    """A launch to time: the tables and lengths uploaded once, and the launch planned (heads a
    thread block, v1 or v2 as the backend chooses: host work that an idle stream's events
    would count), here, outside the timed region."""
    tables_dev, lens_dev = backend.to_device(tables), backend.to_device(lens)
    max_context = int(lens.max())
    num_seqs, num_heads, _ = q.shape
    if heads is None:
        heads = heads_per_block(num_heads, kc.shape[2])
    if variant is None:
        variant = backend.variant_for(kc, num_seqs, num_heads, max_context, heads)
    return lambda: backend.launch_paged_attention(q, kc, vc, tables_dev, lens_dev, max_context, scale, variant, heads)


def bench_headline(backend: CudaBackend, copy_gbs: float, quick: bool) -> dict:
    """Batch 64 × context 4096 × 32 heads × head dim 128, fp16, block size 16."""
    b, t, h, d, bs = (8, 1024, 8, 128, 16) if quick else (64, 4096, 32, 128, 16)
    q, kc, vc, scattered, identity, lens = make_case(backend, b, t, h, h, d, bs, "float16")
    scale = default_scale(d)
    kv_bytes = 2 * b * t * h * d * 2
    paged_ms = event_median_ms(timed_launch(backend, q, kc, vc, scattered, lens, scale))
    identity_ms = event_median_ms(timed_launch(backend, q, kc, vc, identity, lens, scale))
    plan = backend.launch_plan(kc, b, h, t)
    launched = backend.variant_for(kc, b, h, t, heads_per_block(h, h))  # (--cuda-kernel may force one)
    torch_ms = event_median_ms(torch_gather_sdpa(q, kc, vc, scattered, t))
    achieved = kv_bytes / (paged_ms * 1e-3) / 1e9
    return {
        "batch": b,
        "context": t,
        "num_heads": h,
        "head_dim": d,
        "block_size": bs,
        "dtype": "float16",
        "variant": launched,  # what was launched: the occupancy model's choice unless --cuda-kernel forced one
        "occupancy_choice": plan.variant,
        "occupancy_plan": {"waves": plan.waves, "blocks_per_sm": plan.blocks_per_sm, "reason": plan.reason},
        "vllm_rule": choose_variant(t, b, h),
        "paged_ms": paged_ms,
        "identity_table_ms": identity_ms,
        "torch_gather_sdpa_ms": torch_ms,
        "achieved_gbs": achieved,
        "fraction_of_copy": achieved / copy_gbs,
        "paging_overhead": paged_ms / identity_ms - 1,
        "speedup_vs_torch": torch_ms / paged_ms,
        "meets_bandwidth_target": achieved / copy_gbs >= TARGET_BANDWIDTH_FRACTION,
        "meets_paging_target": paged_ms / identity_ms - 1 <= TARGET_PAGING_OVERHEAD,
    }


def bench_context(backend: CudaBackend, context: int, batch: int) -> dict:
    """v1 against v2 (and torch) at one context length: 32 query heads over 8 KV heads."""
    q, kc, vc, scattered, _, lens = make_case(backend, batch, context, 32, 8, 128, 16, "float16", seed=context)
    scale = default_scale(128)
    v1 = event_median_ms(timed_launch(backend, q, kc, vc, scattered, lens, scale, "v1"))
    v2 = event_median_ms(timed_launch(backend, q, kc, vc, scattered, lens, scale, "v2"))
    th = event_median_ms(torch_gather_sdpa(q, kc, vc, scattered, context))
    bytes_read = 2 * batch * context * 8 * 128 * 2
    return {
        "batch": batch,
        "context": context,
        "num_heads": 32,
        "num_kv_heads": 8,
        "heads_per_block": heads_per_block(32, 8),  # query heads sharing each thread block's K/V loads
        "head_dim": 128,
        "v1_ms": v1,
        "v2_ms": v2,
        "torch_gather_sdpa_ms": th,
        "auto": backend.launch_plan(kc, batch, 32, context).variant,
        "vllm_rule": choose_variant(context, batch, 32),
        "best_gbs": bytes_read / (min(v1, v2) * 1e-3) / 1e9,
    }


def bench_single_context(backend: CudaBackend, context: int, copy_gbs: float) -> dict:
    """One sequence of a long context (32 query heads over 8 KV heads × 128, fp16): only the
    split-K kernel (v2) has the work to fill the device."""
    q, kc, vc, scattered, _, lens = make_case(backend, 1, context, 32, 8, 128, 16, "float16", seed=context + 1)
    launch = timed_launch(backend, q, kc, vc, scattered, lens, default_scale(128))
    ms = event_median_ms(launch)
    achieved = 2 * context * 8 * 128 * 2 / (ms * 1e-3) / 1e9
    return {
        "context": context,
        "variant": backend.variant_for(kc, 1, 32, context, heads_per_block(32, 8)),  # (as launched)
        "occupancy_choice": backend.launch_plan(kc, 1, 32, context).variant,
        "ms": ms,
        "achieved_gbs": achieved,
        "fraction_of_copy": achieved / copy_gbs,
        "meets_target": achieved / copy_gbs >= TARGET_SINGLE_CONTEXT_FRACTION,
    }


def bench_heads_per_block(backend: CudaBackend, batch: int, context: int, copy_gbs: float) -> list[dict]:
    """GQA (32 query heads over 8 KV heads × 128, fp16): 1, 2 or 4 query heads per thread
    block. More heads share each K/V load but hold more registers (fewer blocks a SM)."""
    q, kc, vc, scattered, _, lens = make_case(backend, batch, context, 32, 8, 128, 16, "float16", seed=batch)
    kv_bytes = 2 * batch * context * 8 * 128 * 2
    rows = []
    for variant in ("v1", "v2") if batch > 1 else ("v2",):
        for heads in (1, 2, 4):
            ms = event_median_ms(timed_launch(backend, q, kc, vc, scattered, lens, default_scale(128), variant, heads))
            gbs = kv_bytes / (ms * 1e-3) / 1e9
            rows.append({"batch": batch, "context": context, "variant": variant, "heads_per_block": heads, "ms": ms,
                         "achieved_gbs": gbs, "fraction_of_copy": gbs / copy_gbs})  # fmt: skip
    return rows


def run_cuda_benchmarks(args: argparse.Namespace, backend: CudaBackend) -> dict:
    """Run the CUDA benchmarks and return their report (the caller writes it)."""
    import cupy
    import torch

    copy_gbs = copy_bandwidth_gbs()
    report: dict = {
        "machine": {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "device": backend.device,
            "cupy": cupy.__version__,
            "torch": torch.__version__,
            "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
            "driver": cupy.cuda.runtime.driverGetVersion(),
        },
        "copy_bandwidth_gbs": copy_gbs,
    }
    print(f"pagesim bench · {backend.device} · device copy bandwidth {copy_gbs:.0f} GB/s")
    head = bench_headline(backend, copy_gbs, args.quick)
    report["headline"] = head
    print(
        f"decode {head['batch']}×{head['context']}×{head['num_heads']}×{head['head_dim']} fp16: "
        f"{head['paged_ms']:.3f} ms, {head['achieved_gbs']:.0f} GB/s = {head['fraction_of_copy']:.0%} of copy "
        f"(target {TARGET_BANDWIDTH_FRACTION:.0%}); identity table {head['identity_table_ms']:.3f} ms "
        f"(paging overhead {head['paging_overhead']:+.1%}); torch gather+SDPA {head['torch_gather_sdpa_ms']:.3f} ms"
    )
    rows = []
    contexts = (512, 2048) if args.quick else (512, 1024, 2048, 4096, 8192, 16384, 32768)
    for context in contexts:
        batch = 2 if args.quick else max(1, 32768 * 8 // context)
        rows.append(bench_context(backend, context, batch))
        r = rows[-1]
        print(
            f"context {context:>6} × batch {batch:>3}: v1 {r['v1_ms']:.3f} ms · v2 {r['v2_ms']:.3f} ms · "
            f"torch {r['torch_gather_sdpa_ms']:.3f} ms (auto picks {r['auto']}, vLLM's rule {r['vllm_rule']})"
        )
        cupy.get_default_memory_pool().free_all_blocks()
    report["contexts"] = rows
    singles = []
    for context in (32768,) if args.quick else (32768, 131072, 524288):
        singles.append(bench_single_context(backend, context, copy_gbs))
        r = singles[-1]
        print(
            f"one sequence of {context} tokens: {r['ms']:.3f} ms ({r['variant']}), {r['achieved_gbs']:.0f} GB/s = "
            f"{r['fraction_of_copy']:.0%} of copy (target {TARGET_SINGLE_CONTEXT_FRACTION:.0%})"
        )
        cupy.get_default_memory_pool().free_all_blocks()
    report["single_contexts"] = singles
    heads_rows = []
    for batch, context in ((8, 1024),) if args.quick else ((64, 4096), (1, 131072)):
        heads_rows += bench_heads_per_block(backend, batch, context, copy_gbs)
        cupy.get_default_memory_pool().free_all_blocks()
    for r in heads_rows:
        print(
            f"GQA {r['batch']}×{r['context']} {r['variant']}, {r['heads_per_block']} heads a block: {r['ms']:.3f} ms, "
            f"{r['fraction_of_copy']:.0%} of copy"
        )
    report["heads_per_block"] = heads_rows
    return report
