"""The kernel-vs-dense check can catch a fault: its bounds come from an error model
(core.dense_check.error_bounds), sit well above what rounding does, and well below what a
wrong block or a lost slot does; a bit-exact K/V check sees what the softmax average hides."""

import numpy as np
import pytest
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.operations import Add, Grow


def _pair(cpu_backend, length, dtype="float16", head_dim=64):
    blocks = 2 * -(-length // 16) + 2
    config = CacheConfig(
        num_blocks=blocks, block_size=16, num_heads=4, num_kv_heads=2, head_dim=head_dim, dtype=dtype,
        max_model_len=length + 16,
    )  # fmt: skip
    sim = Simulator(config, cpu_backend)
    sim.apply(Add("a", length), attend=False)
    sim.apply(Add("b", length), attend=False)
    return sim


@pytest.mark.parametrize("length", [64, 1024, 8192, 32768])
def test_reading_one_block_of_another_sequence_is_caught_at_every_context_length(cpu_backend, length):
    sim = _pair(cpu_backend, length)
    a, b = sim.sequence("a"), sim.sequence("b")
    middle = len(a.block_table) // 2
    sim.runner.cache.key_cache[a.block_table[middle]] = sim.runner.cache.key_cache[b.block_table[middle]]
    sim.runner.cache.value_cache[a.block_table[middle]] = sim.runner.cache.value_cache[b.block_table[middle]]
    report = sim.apply(Grow("b", 1))
    row = report.attention.index_of("a")
    assert (report.attention.head_errors[row] > report.attention.tolerances[row]).any()
    assert not report.attention.passed
    assert "is not what was written" in sim.verify_kv("a") and sim.verify_kv("b") is None


@pytest.mark.parametrize("length", [16, 100, 512])
def test_one_zeroed_slot_is_caught_at_short_contexts(cpu_backend, length):
    sim = _pair(cpu_backend, length, dtype="bfloat16")
    a = sim.sequence("a")
    block, slot = a.block_table[(length // 2) // 16], (length // 2) % 16
    sim.runner.cache.key_cache[block, slot] = 0
    sim.runner.cache.value_cache[block, slot] = 0
    assert not sim.apply(Grow("b", 1)).attention.passed


def test_a_flipped_bit_the_average_hides_is_seen_by_the_bit_exact_check(cpu_backend):
    sim = _pair(cpu_backend, 4096, dtype="float32")
    a = sim.sequence("a")
    bits = sim.runner.cache.value_cache.view(np.uint32)
    bits[a.block_table[100], 3, 1, 7] ^= 1  # the last mantissa bit of one value of one slot
    result = sim.apply(Grow("b", 1))
    assert result.attention.passed  # ~1e-7 of one of 4096 values: far below any rounding bound
    message = sim.verify_kv("a")
    assert message is not None and "token 1603" in message and f"block {a.block_table[100]}" in message
