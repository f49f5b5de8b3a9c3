"""The CUDA kernels on a real device: against dense attention (torch, fp32, on the GPU)."""

import numpy as np
import pytest
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.operations import Add, Fork, Grow
from pagesim.core.scenario import load_shipped
from pagesim.core.timeline import Timeline
from pagesim.kernels.backend import KernelInputError, default_scale
from pagesim.kernels.dtypes import tolerance

from tests.core.helpers import check_invariants
from tests.kernels.test_cpu_kernel import boundary_case, dense_for, make_case

pytestmark = pytest.mark.gpu


def on_device(backend, case):
    query, kc, vc, tables, lens = case
    return backend.to_device(query), backend.to_device(kc), backend.to_device(vc), tables, lens


def dense_on_gpu(device_case, scale):
    """Dense fp32 SDPA on the GPU, on zero-copy DLPack views of the device cache."""
    import torch
    from pagesim.kernels.reference import dense_attention, to_torch

    query, kc, vc, tables, lens = device_case
    kc_t, vc_t, q_t = to_torch(kc), to_torch(vc), to_torch(query)
    bs = kc.shape[1]
    out = []
    for s, n in enumerate(lens):
        positions = torch.arange(int(n), device=kc_t.device)
        blocks = torch.as_tensor(tables[s], device=kc_t.device).long()[positions // bs]
        keys, values = kc_t[blocks, positions % bs], vc_t[blocks, positions % bs]
        out.append(dense_attention(q_t[s], keys, values, scale))
    return torch.stack(out).cpu().numpy()


@pytest.mark.parametrize("variant", ["v1", "v2"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("gqa", [1, 2, 8])
@pytest.mark.parametrize("head_dim", [8, 24, 64, 128, 256])
@pytest.mark.parametrize("block_size", [1, 3, 8, 16, 32, 64])
def test_kernel_matches_dense_attention(cuda_backend, block_size, head_dim, gqa, dtype, variant):
    rng = np.random.default_rng(block_size * 7 + head_dim + gqa)
    case = boundary_case(rng, block_size, head_dim, gqa, dtype, longest=1100 if variant == "v2" else 130)
    scale = default_scale(head_dim)
    q, kc, vc, tables, ctx = on_device(cuda_backend, case)
    out = cuda_backend.paged_attention_device(q, kc, vc, tables, ctx, scale, variant)
    got = cuda_backend.to_numpy(out)
    assert np.isfinite(got).all(), "a masked or unused slot leaked into the output"
    np.testing.assert_allclose(got, dense_on_gpu((q, kc, vc, tables, ctx), scale), atol=tolerance(dtype), rtol=0)


@pytest.mark.parametrize("context", [511, 512, 513, 3000, 9000])
def test_v1_and_v2_agree(cuda_backend, context):
    rng = np.random.default_rng(context)
    case = make_case(
        rng,
        num_seqs=3,
        context_lens=[context, context // 2 + 1, 5],
        block_size=16,
        num_heads=8,
        num_kv_heads=2,
        head_dim=128,
        dtype="float16",
    )
    q, kc, vc, tables, ctx = on_device(cuda_backend, case)
    v1 = cuda_backend.to_numpy(cuda_backend.paged_attention_device(q, kc, vc, tables, ctx, 0.1, "v1"))
    v2 = cuda_backend.to_numpy(cuda_backend.paged_attention_device(q, kc, vc, tables, ctx, 0.1, "v2"))
    np.testing.assert_allclose(v1, v2, atol=1e-5)
    np.testing.assert_allclose(v1, dense_for(*case, 0.1), atol=1e-3)


def test_shared_blocks_read_identically(cuda_backend):
    rng = np.random.default_rng(4)
    kc = rng.standard_normal((6, 16, 2, 64), dtype=np.float32).astype(np.float16)
    vc = rng.standard_normal((6, 16, 2, 64), dtype=np.float32).astype(np.float16)
    query = np.repeat(rng.standard_normal((1, 4, 64), dtype=np.float32).astype(np.float16), 2, axis=0)
    tables = np.array([[4, 2, 0], [4, 2, 0]], dtype=np.int32)  # two tables, the same blocks
    lens = np.array([40, 40], np.int32)
    dev = (cuda_backend.to_device(query), cuda_backend.to_device(kc), cuda_backend.to_device(vc), tables, lens)
    out = cuda_backend.paged_attention(*dev, 0.125)
    np.testing.assert_array_equal(out[0], out[1])
    np.testing.assert_allclose(out, dense_on_gpu(dev, 0.125), atol=1e-3)


def test_gpu_and_cpu_kernels_agree(cuda_backend, cpu_backend):
    rng = np.random.default_rng(9)
    case = make_case(
        rng,
        num_seqs=4,
        context_lens=[1, 17, 64, 200],
        block_size=16,
        num_heads=8,
        num_kv_heads=8,
        head_dim=64,
        dtype="float32",
    )
    cpu = cpu_backend.paged_attention(*case, 0.125)
    gpu = cuda_backend.paged_attention(*on_device(cuda_backend, case), 0.125)
    np.testing.assert_allclose(cpu, gpu, atol=1e-5)


def test_bad_tables_are_refused_on_the_host(cuda_backend):
    rng = np.random.default_rng(2)
    case = make_case(
        rng, num_seqs=2, context_lens=[5, 8], block_size=4, num_heads=2, num_kv_heads=2, head_dim=8, dtype="float32"
    )
    q, kc, vc, tables, ctx = on_device(cuda_backend, case)
    tables = tables.copy()
    tables[0, 1] = 10_000
    with pytest.raises(KernelInputError, match="out of range"):
        cuda_backend.paged_attention(q, kc, vc, tables, ctx, 0.3)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_engine_on_the_device_with_copy_on_write(cuda_backend, dtype):
    config = CacheConfig(num_blocks=16, block_size=4, num_heads=4, num_kv_heads=2, head_dim=32, dtype=dtype)
    sim = Simulator(config, cuda_backend)
    sim.apply(Add("a", 6))
    sim.apply(Fork("a", "b"))
    result = sim.apply(Grow("b", 3))  # copy-on-write on the device
    assert any(type(e).__name__ == "BlockCopied" for e in result.events)
    assert result.attention.passed and result.attention.backend == "cuda"
    check_invariants(sim)


@pytest.mark.parametrize("name", ["seed_demo", "worst_case_fragmentation", "stress"])  # the synthetic ones
def test_shipped_scenarios_run_on_the_device(cuda_backend, name):
    results = Timeline(load_shipped(name), cuda_backend).run_to_end()
    assert all(r.attention is None or r.attention.passed for r in results)


def test_cli_run_with_the_cuda_backend(cuda_backend, capsys):
    from pagesim.app.cli import main

    if main(["run", "seed_demo", "--backend", "cuda"]) != 0:
        pytest.fail(capsys.readouterr().err)
    assert "CUDA" in capsys.readouterr().out


def test_the_occupancy_model_reads_the_device_and_plans_the_headline_case(cuda_backend):
    import cupy
    from pagesim.kernels.occupancy import MIN_WAVES

    limits = cuda_backend.device_limits()
    assert limits.sm_count == cupy.cuda.Device().attributes["MultiProcessorCount"] > 0
    kc = cuda_backend.allocate_cache(16, 16, 32, 128, np.dtype(np.float16))[0]
    plan = cuda_backend.launch_plan(kc, 64, 32, 4096)  # the headline case
    assert plan.blocks_per_sm > 0 and plan.waves >= MIN_WAVES, plan  # not a 1.3-wave launch


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_every_heads_per_block_reads_the_same_attention(cuda_backend, variant):
    rng = np.random.default_rng(12)
    case = make_case(
        rng, num_seqs=3, context_lens=[700, 33, 1500], block_size=16, num_heads=16, num_kv_heads=2, head_dim=128,
        dtype="float16",
    )  # fmt: skip
    q, kc, vc, tables, ctx = on_device(cuda_backend, case)
    tables_dev, lens_dev = cuda_backend.to_device(tables), cuda_backend.to_device(ctx)
    outs = [
        cuda_backend.to_numpy(
            cuda_backend.launch_paged_attention(q, kc, vc, tables_dev, lens_dev, int(ctx.max()), 0.1, variant, heads)
        )
        for heads in (1, 2, 4)
    ]
    for out in outs[1:]:
        np.testing.assert_allclose(out, outs[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(outs[0], dense_for(*case, 0.1), atol=1e-3)
    with pytest.raises(KernelInputError, match="1, 2 or 4 heads"):
        cuda_backend.launch_paged_attention(q, kc, vc, tables_dev, lens_dev, int(ctx.max()), 0.1, variant, 3)
