"""A step back on a real model is a restore, not a replay: its timeline keeps the newest
snapshots restorable through the paged caches' undo logs, one per step, and lands on the
same state to the bit. (It replayed up to sixteen steps of every layer: seconds a step back.)"""

import numpy as np
import pytest
from pagesim.core.config import CacheConfig
from pagesim.core.kv_cache import PagedKVCache
from pagesim.core.scenario import load_scenario, parse_scenario
from pagesim.core.timeline import DATA_SNAPSHOTS_OF_A_REAL_MODEL, Timeline
from pagesim.core.view_model import build_frame
from pagesim.kernels.cpu_backend import CpuBackend


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


# A small pool under pressure on the real model: prompts that share prefixes, preemptions,
# cached blocks evicted and written again within a few steps, so a restore has slots to undo.
PRESSED = (
    'model = "smollm2-135m"\nscheduler = "v1"\nnum_blocks = 9\nblock_size = 4\nseed = 3\n'
    "prefix_caching = true\nmax_num_batched_tokens = 12\n"
    + "".join(
        f'[[steps]]\nop = "submit"\nrequest = "q{i}"\nprompt = {prompt}\noutput = {out}\n'
        for i, (prompt, out) in enumerate(
            [
                ([11, 12, 13, 14, 15, 16, 17], 6),
                ([11, 12, 13, 14, 21, 22], 5),
                ([31, 32, 33, 34, 35, 36, 37, 38, 39], 4),
                ([11, 12, 13, 14, 15, 16, 17, 41], 5),
            ]
        )
    )
    + '[[steps]]\nop = "schedule"\n' * 22
)


def every_layers_kv(sim) -> dict:
    """The K/V bytes of every held or cached block's filled slots, in every layer of the model."""
    pool, out = sim.pool, {}
    for layer, cache in enumerate(sim.runner.paged_caches()):
        keys, values = np.asarray(cache.key_cache), np.asarray(cache.value_cache)
        for block in range(pool.num_blocks):
            if pool.ref_count(block) or pool.is_cached(block):
                n = sim.block_fill(block)
                out[layer, block] = (keys[block, :n].tobytes(), values[block, :n].tobytes())
    return out


def _state(sim):
    return every_layers_kv(sim), {k: tuple(s.token_ids) for k, s in sim.sequences.items()}, sim.pool.snapshot()


@pytest.mark.timeout(900)
def test_stepping_back_on_a_real_model_restores_each_recent_step_to_the_bit(cpu_backend):
    timeline = Timeline(parse_scenario(PRESSED, "pressed.toml"), cpu_backend)
    states, restored = {}, 0
    calls = []
    real = PagedKVCache.restore

    def counted(cache, checkpoint):
        calls.append(checkpoint)
        return real(cache, checkpoint)

    PagedKVCache.restore = counted
    try:
        while not timeline.at_end:
            timeline.forward()
            states[timeline.position] = _state(timeline.sim)
            here = timeline.position
            if here % 3 or here < DATA_SNAPSHOTS_OF_A_REAL_MODEL:
                continue
            for step in (here - 1, here - 3, here - 2, here):  # back, further back, forward, forward again
                calls.clear()
                timeline.seek(step)
                restored += bool(calls)
                assert _state(timeline.sim) == states[step], f"at step {step}, back from {here}"
                if timeline.sim.sequences:  # (a step before any is admitted has nothing to check)
                    assert timeline.sim.last_attention is not None and timeline.sim.last_attention.passed
    finally:
        PagedKVCache.restore = real
    assert restored >= 10  # (the states came from undo logs, not from replays from further back)
    assert timeline.sim.scheduler.stats.preemptions and timeline.sim.scheduler.stats.finished == 4


def _work(timeline):
    work = build_frame(timeline, None).step_work
    if work is None:
        return None
    return work.summary(), work.timing(), tuple((w.seq, w.kind, w.tokens, w.cached) for w in work.sequences)


@pytest.mark.timeout(600)
def test_a_step_seen_again_going_back_says_what_it_computed_and_its_time_as_it_did_going_forward(cpu_backend):
    # (going back restored the state but read the work off the last forward run, and off an
    # old step's events with its writes dropped: a decode showed as a prefill of 0 ms, or as
    # "no token computed", and a step showed the time of the step after it)
    timeline = Timeline(load_scenario("default"), cpu_backend)
    seen = {}
    while not timeline.at_end:
        timeline.forward()
        seen[timeline.position] = _work(timeline)
    assert sum(work is not None and "decode" in work[0] for work in seen.values()) >= 5
    for step in range(timeline.position - 1, 0, -1):
        timeline.seek(step)
        assert _work(timeline) == seen[step], f"step {step}, seen again going back"
