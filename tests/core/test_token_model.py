import numpy as np

from core.config import CacheConfig
from core.token_model import TokenModel


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
