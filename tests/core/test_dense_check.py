"""The dense check's error bounds come from each sequence's largest ‖k‖ and |v|, folded in
only when a bound is asked for: whatever the writes, forks and snapshots in between, the
bounds are those of every token the sequence holds, bit for bit."""

import numpy as np
import pytest
from pagesim.core.dense_check import DenseCheck, error_bounds

KV_HEADS, HEAD_DIM = 2, 8


def _tokens(rng, n, dtype):
    shape = (n, KV_HEADS, HEAD_DIM)
    return (rng.standard_normal(shape) * 3).astype(dtype), (rng.standard_normal(shape) * 3).astype(dtype)


def _expected(check: DenseCheck, seq_id: str, query: np.ndarray) -> np.ndarray:
    """The bound computed afresh from every token the sequence holds."""
    keys, values = (a.astype(np.float32) for a in check.view(seq_id))
    k_norm = np.sqrt(np.add.reduce(keys * keys, axis=2)).max(axis=0)
    v_abs = np.abs(values).max(axis=(0, 2))
    return error_bounds(query, 0.125, np.array([len(keys)]), k_norm[None], v_abs[None])[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bounds_cover_every_token_written_forked_and_restored(dtype):
    rng = np.random.default_rng(7)
    check = DenseCheck(KV_HEADS, HEAD_DIM, np.dtype(dtype))
    query = rng.standard_normal((1, 4, HEAD_DIM)).astype(np.float32)

    def bound(seq_id):
        return check.bounds((seq_id,), query, 0.125, np.array([check.reference.length(seq_id)]))[0]

    check.add("a")
    for n in (5, 1, 1, 20, 3):  # writes across chunk boundaries, none asked about
        check.append("a", *_tokens(rng, n, dtype))
    np.testing.assert_array_equal(bound("a"), _expected(check, "a", query))

    check.append("a", *_tokens(rng, 2, dtype))
    check.fork("a", "b")  # the child holds the parent's tokens not yet folded in
    keys, values = _tokens(rng, 1, dtype)
    check.append("b", keys * 10, values * 10)  # the child's new largest
    np.testing.assert_array_equal(bound("b"), _expected(check, "b", query))
    np.testing.assert_array_equal(bound("a"), _expected(check, "a", query))
    assert (bound("b") > bound("a")).all()

    for with_data in (True, False):
        keys, values = _tokens(rng, 3, dtype)
        check.append("a", keys * 20, values * 20)  # not yet folded in when the snapshot is taken
        snap = check.snapshot(with_data)
        held = {s: check.view(s) for s in ("a", "b")}
        check.append("a", *_tokens(rng, 40, dtype))
        check.restore(snap)
        if not with_data:  # the engine refills the rows from the tokens
            for seq_id, (k, v) in held.items():
                check.rebuild_row(seq_id, k, v)
        for seq_id in ("a", "b"):
            np.testing.assert_array_equal(check.view(seq_id)[0], held[seq_id][0])
            np.testing.assert_array_equal(bound(seq_id), _expected(check, seq_id, query))


def test_a_chunks_pieces_from_any_token_cover_the_rest_of_the_row():
    rng = np.random.default_rng(1)
    check = DenseCheck(KV_HEADS, HEAD_DIM, np.dtype(np.float32))
    check.add("a")
    keys, values = _tokens(rng, 37, np.float32)
    check.append("a", keys, values)
    for start in (0, 1, 15, 16, 17, 36, 37):
        pieces = list(check.reference.pieces("a", start))
        got = np.concatenate([k for k, _ in pieces]) if pieces else np.empty((0, KV_HEADS, HEAD_DIM))
        np.testing.assert_array_equal(got, keys[start:])
        assert sum(len(v) for _, v in pieces) == 37 - start
