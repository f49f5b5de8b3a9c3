import numpy as np
import pytest
from pagesim.core.config import CacheConfig
from pagesim.core.token_model import TokenModel


def config(**kw):
    return CacheConfig(num_blocks=4, block_size=4, num_heads=4, num_kv_heads=2, head_dim=16, **kw)


def test_kv_depends_only_on_token_and_position_bit_for_bit():
    model = TokenModel(config())
    tokens = [5, 17, 5, 900, 31_999]
    _, k_all, v_all = model.qkv(tokens, np.arange(5))
    for i, token in enumerate(tokens):
        _, k_one, v_one = model.qkv([token], [i])
        np.testing.assert_array_equal(k_one[0], k_all[i])
        np.testing.assert_array_equal(v_one[0], v_all[i])


def test_rotary_changes_keys_with_position_but_not_values():
    model = TokenModel(config())
    _, k, v = model.qkv([7, 7], [0, 3])
    assert not np.array_equal(k[0], k[1])
    np.testing.assert_array_equal(v[0], v[1])
    # A rotation keeps each pair's norm.
    np.testing.assert_allclose(np.linalg.norm(k[0], axis=-1), np.linalg.norm(k[1], axis=-1), rtol=1e-5)


def test_seed_changes_the_model_and_names_give_stable_token_ids():
    a, b = TokenModel(config(seed=1)), TokenModel(config(seed=2))
    assert not np.array_equal(a.qkv([3], [0])[1], b.qkv([3], [0])[1])
    assert a.token_ids("x", 0, 4) == TokenModel(config(seed=1)).token_ids("x", 0, 4)
    assert a.token_ids("x", 0, 4) != a.token_ids("y", 0, 4)


def test_the_rotary_table_grows_to_the_positions_used_and_never_depends_on_how_it_grew():
    from pagesim.core.token_model import _RotaryTable

    head_dim = 24  # a head dim no other test uses: its table starts empty here
    short = TokenModel(CacheConfig(num_blocks=4, block_size=4, num_heads=2, head_dim=head_dim, max_model_len=16))
    table = _RotaryTable.for_head_dim(head_dim)
    assert table.filled == 0  # nothing computed before a position is reached
    _, k_short, _ = short.qkv([3, 4], [1, 15])
    assert table.filled >= 16
    long = TokenModel(CacheConfig(num_blocks=300, block_size=4, num_heads=2, head_dim=head_dim, max_model_len=1200))
    _, k_long, _ = long.qkv([3, 4, 5], [1, 15, 1100])
    assert table.filled >= 1101 and table.cos.shape[0] >= 1101  # grown in place to the position reached
    np.testing.assert_array_equal(k_short, k_long[:2])  # positions computed before keep their values
    fresh = _RotaryTable(head_dim)
    cos, sin = fresh.at(np.array([1100]))
    np.testing.assert_array_equal(cos, table.cos[[1100]])  # and match a table grown in one go
    np.testing.assert_array_equal(sin, table.sin[[1100]])


def test_a_huge_max_model_len_costs_nothing_until_its_positions_are_reached():
    import time

    from pagesim.core.token_model import _RotaryTable

    started = time.perf_counter()
    model = TokenModel(CacheConfig(num_blocks=4, block_size=4, num_heads=2, head_dim=40, max_model_len=10**7))
    model.qkv([1, 2], [0, 9])
    assert time.perf_counter() - started < 2.0  # filled eagerly, 10^7 positions took minutes
    assert _RotaryTable.for_head_dim(40).cos.shape[0] < 10_000


def test_a_sequence_keeps_its_token_ids_in_eight_bytes_each_and_a_copy_is_independent():
    from array import array

    from pagesim.core.sequence import Sequence

    seq = Sequence("s", [1, 2, 3])
    assert isinstance(seq.token_ids, array) and seq.token_ids.itemsize == 8
    # An array of another item type is taken as ids, not as bytes: the same tokens, the same hash.
    signed = Sequence("t", array("q", [1, 2, 3]))
    assert signed.token_ids == seq.token_ids and signed.token_ids.typecode == seq.token_ids.typecode
    child = seq.copy("c")
    child.token_ids.append(4)
    assert list(seq.token_ids) == [1, 2, 3] and list(child.token_ids) == [1, 2, 3, 4]


def test_a_decode_steps_tokens_are_the_ones_each_sequence_holds_at_that_position():
    """next_token_ids hashes each sequence's (seed, name) rounds once and only the
    position's round per step: it must give exactly token_id's answer, new names or not."""
    model = TokenModel(CacheConfig(num_blocks=16, block_size=4, num_heads=2, num_kv_heads=1, head_dim=8, seed=7))
    names = ["a", "b", "r12/b3", "long name with spaces", "a"]
    for positions in ([0, 1, 2, 3, 4], [10**6, 5, 2**40, 17, 0]):
        expected = [model.token_id(n, p) for n, p in zip(names, positions, strict=True)]
        assert model.next_token_ids(names, positions) == expected
    assert model.next_token_ids(["fresh", "a"], [3, 3]) == [model.token_id("fresh", 3), model.token_id("a", 3)]
    assert model.next_token_ids([], []) == []
    with pytest.raises(ValueError, match="2 sequences but 1 positions"):  # (the compiled loop has no bounds check)
        model.next_token_ids(["a", "b"], [3])


def test_a_decode_steps_ids_are_the_same_splitmix_compiled_as_in_arrays():
    """The compiled one-round mixer a decode step uses gives, id for id, what the array
    version (and the scalar one) give, at the edges of uint64 too."""
    from pagesim.core import token_model as tm

    rng = np.random.default_rng(7)
    states = np.concatenate(
        [
            rng.integers(0, 2**63, 997, dtype=np.int64).view(np.uint64) * np.uint64(3),
            np.array([0, 2**64 - 1], np.uint64),
        ]
    )
    positions = np.concatenate([rng.integers(0, 10**7, 997), [2**40, 0]]).astype(np.uint64)
    out = np.empty(len(states), np.int64)
    tm._position_mixer()(states, positions, out)
    assert (out == tm._mix_array_from(states.copy(), positions)).all()
    assert [int(x) for x in out[-2:]] == [
        tm._mix_from(int(s), int(p)) % tm.VOCAB_SIZE for s, p in zip(states[-2:], positions[-2:], strict=True)
    ]
    with pytest.raises(TypeError):  # int64 positions would mix types, and Numba would round through float64
        tm._position_mixer()(states, positions.astype(np.int64), out)


def test_a_long_run_of_ids_is_the_same_as_each_id_on_its_own():
    """token_ids hashes a name's (seed, name) rounds once, in Python, then the compiled
    mixer runs a round per position: each id must be token_id's, short runs and long,
    large seeds too."""
    for seed in (0, 7, 2**63 + 11):
        model = TokenModel(config(seed=seed))
        for name, start, count in (("x", 0, 8), ("x", 0, 9), ("r12/s3", 5, 300), ("shared", 2**40, 64)):
            assert model.token_ids(name, start, count) == [model.token_id(name, p) for p in range(start, start + count)]


@pytest.mark.parametrize("head_dim", [2, 7, 32, 65])
def test_the_compiled_rotation_gives_numpy_s_bits_for_any_batch(head_dim):
    """q and k are rotated in a compiled loop: two float32 products and their sum per
    element, rounded as NumPy's array passes round them (no fused multiply-add), for one
    token or many, from the strided view qkv hands it; an odd dim's last element unrotated."""
    model = TokenModel(CacheConfig(num_blocks=64, block_size=16, num_heads=4, num_kv_heads=2, head_dim=head_dim))
    rng = np.random.default_rng(head_dim)
    table, half = model._rotary, head_dim // 2
    for n in (1, 3, 40):
        rows = (rng.standard_normal((n, 6 * head_dim + 5)) * 30).astype(np.float32)
        x = rows[:, : 6 * head_dim].reshape(n, 6, head_dim)
        positions = rng.integers(0, 3000, n)
        table.fill(int(positions.max()) + 1)
        cos, neg_sin, sin = (table.factors[positions][:, None, k] for k in range(3))
        x1, x2 = x[..., :half], x[..., half : 2 * half]
        expected = np.concatenate([x1 * cos + x2 * neg_sin, x2 * cos + x1 * sin, x[..., 2 * half :]], axis=2)
        assert model._rotate(x, positions).tobytes() == expected.astype(np.float32).tobytes()
    with pytest.raises(ValueError, match="non-negative"):
        model._rotate(x[:1], np.array([-1]))
    with pytest.raises(ValueError, match="positions"):
        model._rotate(x[:2], np.array([1]))
    with pytest.raises(ValueError, match="rotary table of head dim"):
        model._rotate(np.ones((1, 6, head_dim + 2), np.float32), np.array([1]))
