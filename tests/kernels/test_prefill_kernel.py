"""The CPU paged prefill kernel against dense causal attention (torch SDPA on K/V gathered
from the block table), and its host checks."""

import itertools

import numpy as np
import pytest
import torch
from pagesim.kernels.backend import KernelInputError, default_scale, query_tiles
from pagesim.kernels.cpu_prefill import QUERY_TILE
from pagesim.kernels.dtypes import storage_dtype
from pagesim.kernels.reference import causal_attention, paged_prefill_reference

from tests.kernels.test_cpu_kernel import make_case

# Kernel and reference widen the same stored values exactly and compute in fp32, so their gap
# is fp32 rounding alone whatever the storage dtype (≲ 1e-6 here); a token masked wrongly, a
# row's position off by one or a lost rescale moves outputs by ≳ 1e-3.
ATOL = 1e-5


def prefill_case(rng, seqs, *, block_size, num_heads, num_kv_heads, head_dim, dtype):
    """``seqs``: (context_len, q_len) per sequence, the q_len newest tokens being the queries.
    Every sequence's blocks are scattered over the pool; every slot past a context, and every
    spare block, holds NaN (from ``make_case``)."""
    context_lens = [c for c, _ in seqs]
    _, key_cache, value_cache, tables, lens = make_case(
        rng, num_seqs=len(seqs), context_lens=context_lens, block_size=block_size, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
    )  # fmt: skip
    query_starts = np.concatenate([[0], np.cumsum([q for _, q in seqs])]).astype(np.int32)
    query = rng.standard_normal((int(query_starts[-1]), num_heads, head_dim), dtype=np.float32)
    return query.astype(storage_dtype(dtype)), key_cache, value_cache, query_starts, tables, lens


def mixed_batch(block_size: int) -> list[tuple[int, int]]:
    """(context_len, q_len): a one-token prompt, a prompt shorter than a block, decodes, whole
    prompts over several query tiles, a chunk starting mid-block after a cached prefix."""
    half = max(1, block_size // 2)
    return [
        (1, 1),
        (3, 3),
        (45, 1),
        (50, 50),
        (block_size + half + 40, 40),
        (70, 33),
        (2 * QUERY_TILE + 1, 2 * QUERY_TILE + 1),
    ]


def check(backend, case, scale, atol=ATOL):
    out = backend.paged_prefill(*case, scale)
    expected = paged_prefill_reference(*case, scale).numpy()
    assert out.shape == expected.shape and out.dtype == np.float32
    assert np.isfinite(out).all(), "a masked or unused slot leaked into the output"
    np.testing.assert_allclose(out, expected, atol=atol, rtol=0)
    return out


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("gqa", [1, 3, 4])
@pytest.mark.parametrize("head_dim", [64, 128, 32])
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_prefill_matches_dense_causal_attention(cpu_backend, block_size, head_dim, gqa, dtype):
    rng = np.random.default_rng([block_size, head_dim, gqa, len(dtype)])
    num_kv_heads = 3 if gqa == 3 else 2  # gqa 3 over 3 KV heads: SmolLM2's 9/3
    case = prefill_case(
        rng, mixed_batch(block_size), block_size=block_size, num_heads=num_kv_heads * gqa,
        num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
    )  # fmt: skip
    check(cpu_backend, case, default_scale(head_dim))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_long_prompt_over_many_query_and_kv_tiles(cpu_backend, dtype):
    rng = np.random.default_rng(7)
    seqs = [(300, 300), (300, QUERY_TILE - 1), (301, QUERY_TILE), (302, QUERY_TILE + 1), (777, 129)]
    case = prefill_case(rng, seqs, block_size=16, num_heads=9, num_kv_heads=3, head_dim=64, dtype=dtype)
    check(cpu_backend, case, default_scale(64))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_one_query_token_is_the_decode_kernel(cpu_backend, dtype):
    """q_len 1 everywhere: the prefill kernel computes what the decode kernel does (one
    partition or several: the decode kernel splits a few long sequences)."""
    rng = np.random.default_rng(8)
    for lens in ([1, 16, 17, 100, 33], [3000, 1100, 5]):
        case = prefill_case(
            rng, [(n, 1) for n in lens], block_size=16, num_heads=8, num_kv_heads=2, head_dim=64, dtype=dtype
        )
        query, kc, vc, _, tables, context_lens = case
        prefill = cpu_backend.paged_prefill(*case, 0.125)
        decode = cpu_backend.paged_attention(query, kc, vc, tables, context_lens, 0.125)
        np.testing.assert_allclose(prefill, decode, atol=1e-6, rtol=0)


def test_chunked_prefill_gives_the_whole_prompts_rows(cpu_backend):
    """A prompt attended in chunks (each over the cached prefix, as after a prefix-cache hit or
    in chunked prefill) gives the rows the whole prompt does."""
    rng = np.random.default_rng(9)
    query, kc, vc, _, tables, lens = prefill_case(
        rng, [(90, 90)], block_size=16, num_heads=4, num_kv_heads=2, head_dim=32, dtype="float16"
    )
    whole = cpu_backend.paged_prefill(query, kc, vc, np.array([0, 90]), tables, lens, 0.2)
    for cuts in ([0, 37, 90], [0, 16, 17, 64, 90], [0, 89, 90]):
        for begin, end in itertools.pairwise(cuts):
            chunk = cpu_backend.paged_prefill(
                query[begin:end].copy(), kc, vc, np.array([0, end - begin]), tables, np.array([end]), 0.2
            )
            np.testing.assert_allclose(chunk, whole[begin:end], atol=1e-6, rtol=0)


def test_the_reference_masks_causally_from_the_bottom_right():
    """The reference against a float64 loop: query row j of q_len over a context of T sees
    positions 0..T - q_len + j."""
    rng = np.random.default_rng(10)
    T, q_len, heads, kv_heads, d = 11, 4, 4, 2, 8
    q = rng.standard_normal((q_len, heads, d))
    k = rng.standard_normal((T, kv_heads, d))
    v = rng.standard_normal((T, kv_heads, d))
    got = causal_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), 0.3).numpy()
    for j in range(q_len):
        seen = T - q_len + j + 1
        for h in range(heads):
            s = k[:seen, h // 2] @ q[j, h] * 0.3
            w = np.exp(s - s.max())
            np.testing.assert_allclose(got[j, h], w @ v[:seen, h // 2] / w.sum(), atol=1e-6)


def test_prefill_reads_through_the_table(cpu_backend):
    rng = np.random.default_rng(11)
    case = prefill_case(rng, [(9, 9), (12, 5)], block_size=4, num_heads=2, num_kv_heads=2, head_dim=8, dtype="float32")
    query, kc, vc, query_starts, tables, lens = case
    right = cpu_backend.paged_prefill(*case, 0.3)
    swapped = tables.copy()
    swapped[1, 0] = tables[0, 0]  # sequence 1's first block now another's
    wrong = cpu_backend.paged_prefill(query, kc, vc, query_starts, swapped, lens, 0.3)
    np.testing.assert_array_equal(right[:9], wrong[:9])
    assert np.abs(right[9:] - wrong[9:]).max() > 1e-3


def test_the_work_items_cover_every_query_row_once():
    starts = np.array([0, 1, 1 + QUERY_TILE, 1 + 3 * QUERY_TILE + 5, 1 + 3 * QUERY_TILE + 6], np.int32)
    seqs, rows = query_tiles(starts, QUERY_TILE)
    covered = []
    for s, r in zip(seqs, rows, strict=True):
        assert starts[s] <= r < starts[s + 1]
        covered += range(r, min(r + QUERY_TILE, starts[s + 1]))
    assert covered == list(range(starts[-1]))
    assert seqs.tolist() == [0, 1, 2, 2, 2, 3]


def test_an_empty_batch_gives_an_empty_output(cpu_backend):
    kc = np.zeros((2, 4, 1, 8), np.float32)
    out = cpu_backend.paged_prefill(
        np.zeros((0, 2, 8), np.float32), kc, kc.copy(), np.zeros(1), np.zeros((0, 1)), np.zeros(0), 0.3
    )
    assert out.shape == (0, 2, 8)


def _valid_inputs():
    rng = np.random.default_rng(12)
    case = prefill_case(rng, [(5, 2), (8, 8)], block_size=4, num_heads=4, num_kv_heads=2, head_dim=8, dtype="float32")
    return list(case)


def _set(index, *key_value):
    def mutate(args):
        args[index] = args[index].copy()
        args[index][key_value[0]] = key_value[1]

    return mutate


@pytest.mark.parametrize(
    "mutate, message",
    [
        (_set(3, 0, 1), "from 0 to the 10 query tokens"),
        (_set(3, 2, 9), "from 0 to the 10 query tokens"),
        (_set(3, 1, 0), "sequence 0 has 0 query tokens"),
        (_set(3, 1, 11), "must run from 0|must increase"),
        (_set(3, 1, 6), "sequence 0: 6 query tokens but a context of 5"),
        (lambda a: a.__setitem__(3, a[3][:2]), r"query_starts must be \(num_seqs \+ 1,\)"),
        (_set(5, 1, 7), "sequence 1: 8 query tokens but a context of 7"),
        (_set(4, (0, 1), 99), "out of range"),
        (_set(4, (1, 0), -1), "out of range"),
        (_set(5, 0, 0), "≥ 1 token"),
        (_set(5, 1, 40), "needs 10 blocks"),
        (lambda a: a.__setitem__(0, a[0].astype(np.float16)), "share one dtype"),
        (lambda a: a.__setitem__(0, a[0][:, :, :4].copy()), r"query must be \(total_query_tokens"),
        (lambda a: a.__setitem__(0, np.concatenate([a[0], a[0][:, :1]], axis=1)), "must divide"),
        (lambda a: a.__setitem__(4, a[4][0]), "block_tables must be"),
    ],
)
def test_bad_prefill_inputs_are_refused_before_launch(cpu_backend, mutate, message):
    args = _valid_inputs()
    mutate(args)
    with pytest.raises(KernelInputError, match=message):
        cpu_backend.paged_prefill(*args, 0.3)


@pytest.mark.parametrize("head_dim", [32, 64])
def test_an_fp32_prefill_kernel_computes_what_the_any_kind_kernel_does(head_dim):
    """fp32 launches run prefill kernels compiled for fp32 alone (head size 64 its own); each
    must agree with the any-kind kernel and with dense causal attention."""
    from pagesim.kernels.cpu_prefill import _KINDS, _prefill_any_kind, prefill_kernel_for

    fp32 = _KINDS["float32"]
    assert prefill_kernel_for(64, fp32) is not prefill_kernel_for(32, fp32)
    assert prefill_kernel_for(32, fp32) is prefill_kernel_for(96, fp32) is not _prefill_any_kind
    assert all(prefill_kernel_for(head_dim, _KINDS[k]) is _prefill_any_kind for k in ("float16", "bfloat16"))
    rng = np.random.default_rng(head_dim)
    case = prefill_case(rng, mixed_batch(16), block_size=16, num_heads=6, num_kv_heads=2, head_dim=head_dim,
                        dtype="float32")  # fmt: skip
    query, key_cache, value_cache, query_starts, tables, lens = case
    work_seqs, work_rows = query_tiles(query_starts, QUERY_TILE)
    scale = np.float32(default_scale(head_dim))
    outputs = []
    for kernel in (prefill_kernel_for(head_dim, fp32), _prefill_any_kind):
        out = np.empty(query.shape, np.float32)
        kernel(out, query, key_cache, value_cache, query_starts, tables, lens, scale, fp32, work_seqs, work_rows)
        outputs.append(out)
    np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-6, rtol=0)
    np.testing.assert_allclose(outputs[0], paged_prefill_reference(*case, scale).numpy(), atol=ATOL, rtol=0)
