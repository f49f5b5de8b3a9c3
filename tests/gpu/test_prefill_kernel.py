"""The CUDA paged prefill kernel on a real device: against the CPU prefill kernel and dense
causal attention (torch SDPA on K/V gathered from the block table)."""

import numpy as np
import pytest
from pagesim.kernels.backend import KernelInputError, default_scale
from pagesim.kernels.dtypes import tolerance
from pagesim.kernels.reference import paged_prefill_reference

from tests.kernels.test_prefill_kernel import mixed_batch, prefill_case

pytestmark = pytest.mark.gpu


def on_device(backend, case):
    query, kc, vc, starts, tables, lens = case
    return backend.to_device(query), backend.to_device(kc), backend.to_device(vc), starts, tables, lens


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("gqa", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("head_dim", [8, 24, 64, 128, 256])
@pytest.mark.parametrize("block_size", [1, 3, 16, 32])
def test_prefill_matches_the_cpu_kernel(cuda_backend, cpu_backend, block_size, head_dim, gqa, dtype):
    rng = np.random.default_rng([block_size, head_dim, gqa, len(dtype)])
    num_kv_heads = {3: 3, 8: 1}.get(gqa, 2)
    batch = [*mixed_batch(block_size), (600, 200), (2000, 1)]  # KV past a v2 partition, a long decode
    case = prefill_case(
        rng, batch, block_size=block_size, num_heads=num_kv_heads * gqa, num_kv_heads=num_kv_heads,
        head_dim=head_dim, dtype=dtype,
    )  # fmt: skip
    scale = default_scale(head_dim)
    gpu = cuda_backend.paged_prefill(*on_device(cuda_backend, case), scale)
    cpu = cpu_backend.paged_prefill(*case, scale)
    assert np.isfinite(gpu).all(), "a masked or unused slot leaked into the output"
    # One algorithm, but not one exponential (the GPU's is the hardware's approximation) nor
    # one order of rounding: in fp32 rows differ by a few ulps of their sums (2.4e-6 at most
    # on an H200), so they are held to the dense check's bound; in fp16 and bf16 the inputs'
    # rounding, the same on both sides, dominates, and a tenth of it holds.
    atol = tolerance(dtype) if dtype == "float32" else tolerance(dtype) / 10
    np.testing.assert_allclose(gpu, cpu, atol=atol, rtol=0)


def test_prefill_matches_dense_causal_attention_on_the_device(cuda_backend):
    rng = np.random.default_rng(3)
    case = prefill_case(
        rng, [(4096, 4096), (700, 333), (5, 1)], block_size=16, num_heads=9, num_kv_heads=3, head_dim=64,
        dtype="bfloat16",
    )  # fmt: skip
    gpu = cuda_backend.paged_prefill(*on_device(cuda_backend, case), 0.125)
    np.testing.assert_allclose(gpu, paged_prefill_reference(*case, 0.125).numpy(), atol=1e-4, rtol=0)


def test_one_query_token_is_the_decode_kernel_on_the_device(cuda_backend):
    rng = np.random.default_rng(4)
    case = prefill_case(
        rng, [(n, 1) for n in (1, 17, 600, 3000)], block_size=16, num_heads=8, num_kv_heads=2, head_dim=128,
        dtype="float16",
    )  # fmt: skip
    q, kc, vc, starts, tables, lens = on_device(cuda_backend, case)
    prefill = cuda_backend.paged_prefill(q, kc, vc, starts, tables, lens, 0.1)
    for variant in ("v1", "v2"):
        decode = cuda_backend.to_numpy(cuda_backend.paged_attention_device(q, kc, vc, tables, lens, 0.1, variant))
        np.testing.assert_allclose(prefill, decode, atol=1e-5, rtol=0)


def test_bad_query_starts_are_refused_on_the_host(cuda_backend):
    rng = np.random.default_rng(5)
    case = prefill_case(rng, [(5, 2), (8, 8)], block_size=4, num_heads=2, num_kv_heads=2, head_dim=8, dtype="float32")
    q, kc, vc, _, tables, lens = on_device(cuda_backend, case)
    with pytest.raises(KernelInputError, match="but a context of 5"):
        cuda_backend.paged_prefill(q, kc, vc, [0, 6, 10], tables, lens, 0.3)
