"""A step back on a real model is a restore, not a replay: its timeline keeps the newest
snapshots restorable through the paged caches' undo logs, one per step, and lands on the
same state to the bit. (It replayed up to sixteen steps of every layer: seconds a step back.)"""

import numpy as np
import pytest
from pagesim.core.config import CacheConfig
from pagesim.core.kv_cache import PagedKVCache
from pagesim.core.scenario import load_scenario
from pagesim.core.timeline import DATA_SNAPSHOTS_OF_A_REAL_MODEL, Timeline
from pagesim.kernels.cpu_backend import CpuBackend

from tests.core.helpers import held_kv


def _cache(keep: int) -> PagedKVCache:
    cache = PagedKVCache(CacheConfig(num_blocks=6, block_size=2, num_heads=1, head_dim=4), CpuBackend())
    cache.keep_checkpoints = keep
    return cache


def _write(cache: PagedKVCache, block: int, value: float) -> None:
    data = np.full((1, 2, 1, 4), value, np.float32)
    cache.write_blocks([block], data, data)


def test_the_cache_goes_back_through_each_newer_log_to_an_older_checkpoint():
    cache = _cache(keep=3)
    for block in range(6):
        _write(cache, block, block)
    first = cache.snapshot([0, 1, 2])  # 3–5 free: their contents need not come back
    at_first = np.array(cache.key_cache[:3])
    _write(cache, 0, 10.0)
    second = cache.snapshot([0, 1, 2, 3])
    at_second = np.array(cache.key_cache[:4])
    _write(cache, 1, 20.0)  # live at both checkpoints, first changed after the second
    _write(cache, 3, 30.0)
    third = cache.snapshot([0, 1, 3])  # 2 freed here, but live at the first: still watched
    _write(cache, 2, 40.0)
    _write(cache, 0, 50.0)
    assert all(map(cache.can_restore, (first, second, third)))
    cache.restore(second)
    assert np.array_equal(cache.key_cache[:4], at_second) and not cache.can_restore(third)
    cache.restore(first)
    assert np.array_equal(cache.key_cache[:3], at_first) and not cache.can_restore(second)
    _write(cache, 2, 60.0)  # the log goes on from the first checkpoint
    cache.restore(first)
    assert np.array_equal(cache.key_cache[:3], at_first)


def test_only_the_kept_number_of_checkpoints_stays_restorable():
    cache = _cache(keep=2)
    points = [cache.snapshot(range(6)) for _ in range(3)]
    assert [cache.can_restore(p) for p in points] == [False, True, True]
    single = _cache(keep=1)
    old, new = single.snapshot(range(6)), single.snapshot(range(6))
    assert not single.can_restore(old) and single.can_restore(new)  # (the app's synthetic pools: as before)


@pytest.mark.timeout(600)
def test_stepping_back_on_a_real_model_restores_each_recent_step_to_the_bit(cpu_backend):
    timeline = Timeline(load_scenario("prefix_caching_v1"), cpu_backend)
    states = {}
    while not timeline.at_end:
        timeline.forward()
        sim = timeline.sim
        states[timeline.position] = (held_kv(sim), {k: tuple(s.token_ids) for k, s in sim.sequences.items()})
    end = timeline.position
    for step in range(end - 1, end - DATA_SNAPSHOTS_OF_A_REAL_MODEL, -1):
        timeline.seek(step)
        sim = timeline.sim
        assert (held_kv(sim), {k: tuple(s.token_ids) for k, s in sim.sequences.items()}) == states[step]
        assert sim.last_attention is not None and sim.last_attention.passed
    timeline.seek(end)  # and forward again, to the same state
    assert held_kv(timeline.sim) == states[end][0]
