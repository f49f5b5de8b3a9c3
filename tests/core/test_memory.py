"""What keeps memory flat over a run: the chunked dense reference,
the undo-log checkpoint of the paged cache, old steps that drop their detail, a run
without history, shared model weights and long prompts projected in pieces."""

import numpy as np
from pagesim.core import model_runner
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.events import AttentionComputed, KernelLaunched
from pagesim.core.kv_cache import ChunkedKVReference
from pagesim.core.operations import Add, Fork, Free, Grow
from pagesim.core.scenario import Scenario, load_scenario, load_shipped
from pagesim.core.timeline import KEEP_ATTENTION, MAX_SNAPSHOTS, Timeline
from pagesim.core.token_model import TokenModel

from tests.core.helpers import check_invariants, held_kv, state_fingerprint
from tests.scenarios import token_model


def _rows(n: int, seed: int, dtype=np.float16) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 2, 4)).astype(dtype)


def test_the_reference_shares_chunks_with_forks_and_copies_a_shared_tail_before_writing():
    ref = ChunkedKVReference(2, 4, np.float16)
    ref.add("a")
    k, v = _rows(40, 1), _rows(40, 2)
    ref.append("a", k, v)
    ref.fork("a", "b")
    assert all(x is y for x, y in zip(ref.rows["a"].keys, ref.rows["b"].keys, strict=True))
    ref.append("a", _rows(3, 3), _rows(3, 4))  # into the shared partial tail: copied first
    ref.append("b", _rows(30, 5), _rows(30, 6))
    np.testing.assert_array_equal(ref.view("b")[0][:40], k)
    np.testing.assert_array_equal(ref.view("a")[0][:40], k)
    np.testing.assert_array_equal(ref.view("a")[0][40:], _rows(3, 3))
    np.testing.assert_array_equal(ref.view("b")[1][40:], _rows(30, 6))
    full = 40 // ref.CHUNK_TOKENS
    assert all(x is y for x, y in zip(ref.rows["a"].keys[:full], ref.rows["b"].keys[:full], strict=True))
    assert ref.rows["a"].keys[full] is not ref.rows["b"].keys[full]
    # distinct chunks: 2 shared full ones, each side's copy of the tail, b's 2 new ones
    chunk_bytes = 2 * ref.CHUNK_TOKENS * 2 * 4 * np.dtype(np.float16).itemsize
    assert ref.nbytes == 6 * chunk_bytes


def test_a_reference_snapshot_never_sees_later_writes():
    ref = ChunkedKVReference(2, 4, np.float32)
    ref.add("a")
    ref.append("a", _rows(5, 1, np.float32), _rows(5, 2, np.float32))
    snap = ref.snapshot()
    ref.append("a", _rows(7, 3, np.float32), _rows(7, 4, np.float32))
    ref.free("a")
    restored = ChunkedKVReference(2, 4, np.float32)
    restored.restore(snap)
    np.testing.assert_array_equal(restored.view("a")[0], _rows(5, 1, np.float32))
    assert restored.length("a") == 5


def test_the_newest_checkpoint_undoes_changes_to_live_blocks_only(cpu_backend):
    config = CacheConfig(num_blocks=8, block_size=4, num_heads=2, num_kv_heads=1, head_dim=8, dtype="float32")
    sim = Simulator(config, cpu_backend)
    sim.apply(Add("a", 6))
    snap = sim.snapshot()
    before = held_kv(sim), state_fingerprint(sim)
    sim.apply(Grow("a", 3))  # writes into a's partial block 1 (live: saved) and a new block
    sim.apply(Fork("a", "b"))
    sim.apply(Grow("b", 1))  # copy-on-write into a free block (not saved)
    assert set(sim.runner.cache._undo) == {sim.sequences["a"].block_table[1]}
    sim.restore(snap)
    assert (held_kv(sim), state_fingerprint(sim)) == before
    check_invariants(sim)
    # A newer checkpoint replaces the log: the older snapshot is rebuilt from the tokens instead.
    sim.apply(Grow("a", 5))
    sim.snapshot()
    sim.apply(Free("a"))
    sim.restore(snap)
    assert state_fingerprint(sim) == before[1]
    check_invariants(sim)


def test_old_steps_drop_their_detail_and_a_seek_brings_it_back(cpu_backend):
    timeline = Timeline(load_scenario(token_model("default")), cpu_backend)
    originals = [timeline.forward() for _ in range(KEEP_ATTENTION + 6)]
    old = timeline.result(2)
    assert old.detail_dropped and old.attention is None
    assert not any(e.detail for e in old.events)
    assert any(e.detail for e in originals[1].events)
    timeline.seek(2)
    again = timeline.result(2)

    # Equal, but for timings and dense's rounding (which depends on what else SDPA's batch held).
    def same(e):
        if isinstance(e, AttentionComputed):
            return e.seq, e.context_len, e.passed
        return (e.backend, e.num_seqs) if isinstance(e, KernelLaunched) else e

    assert [same(e) for e in again.events] == [same(e) for e in originals[1].events]
    assert again.attention is not None and timeline.sim.last_attention is again.attention


def test_an_export_holds_every_event_even_of_steps_that_dropped_their_detail(cpu_backend):
    full = Timeline(load_scenario(token_model("default")), cpu_backend)
    expected = [r.events for r in full.run_to_end()]
    timeline = Timeline(load_scenario(token_model("default")), cpu_backend)
    timeline.run_to_end()
    assert any(timeline.result(k).detail_dropped for k in range(1, timeline.length + 1))
    exported = [r.events for r in timeline.events_through_now()]
    assert [[type(e).__name__ for e in step] for step in exported] == [
        [type(e).__name__ for e in step] for step in expected
    ]
    assert [
        [e.describe() for e in step if not isinstance(e, AttentionComputed | KernelLaunched)] for step in exported
    ] == [[e.describe() for e in step if not isinstance(e, AttentionComputed | KernelLaunched)] for step in expected]


def test_a_run_without_history_keeps_one_result_one_caption_and_only_the_first_snapshot(cpu_backend):
    timeline = Timeline(load_shipped("stress"), cpu_backend, snapshot_data=False, history=False)
    for _ in range(70):
        timeline.forward()
    assert list(timeline._results) == [70]
    assert list(timeline._captions) == [70] and timeline.caption(70)
    assert list(timeline._snapshots) == [0]
    fingerprint = state_fingerprint(timeline.sim)
    timeline.seek(40)
    timeline.seek(70)  # still exact, replayed from step 0
    assert state_fingerprint(timeline.sim) == fingerprint


def test_snapshots_thin_out_over_a_long_run_and_seeks_stay_exact(cpu_backend):
    timeline = Timeline(load_shipped("stress"), cpu_backend, snapshot_every=4)
    fingerprints = {0: state_fingerprint(timeline.sim)}
    while not timeline.at_end:
        timeline.forward()
        if timeline.position % 37 == 0:
            fingerprints[timeline.position] = state_fingerprint(timeline.sim)
    assert len(timeline._snapshots) <= MAX_SNAPSHOTS and 0 in timeline._snapshots
    for step in sorted(fingerprints, reverse=True):
        timeline.seek(step)
        assert state_fingerprint(timeline.sim) == fingerprints[step]


def test_models_of_one_seed_and_shape_share_read_only_weights():
    config = CacheConfig(num_blocks=4, block_size=4, num_heads=2, num_kv_heads=1, head_dim=8, seed=3)
    one, two = TokenModel(config), TokenModel(config)
    assert one.embedding is two.embedding and not one.embedding.flags.writeable
    other = TokenModel(CacheConfig(num_blocks=4, block_size=4, num_heads=2, num_kv_heads=1, head_dim=8, seed=4))
    assert not np.array_equal(one.embedding, other.embedding)


def test_a_long_prompt_is_projected_in_pieces_with_the_same_kv(cpu_backend, monkeypatch):
    monkeypatch.setattr(model_runner, "QKV_PIECE_TOKENS", 7)
    config = CacheConfig(num_blocks=32, block_size=4, num_heads=2, num_kv_heads=1, head_dim=8, dtype="float16")
    sim = Simulator(config, cpu_backend)
    sim.apply(Add("a", 30))
    sim.apply(Add("b", 3))
    sim.apply(Fork("a", "c"))
    sim.apply(Grow("c", 9))
    check_invariants(sim)  # every sequence's K/V, in the pool and the reference, from the whole prompt at once
    assert sim.verify_kv("c") is None
    q, _, _ = sim.runner.model.qkv(sim.sequences["c"].token_ids, np.arange(39))
    np.testing.assert_array_equal(sim.runner._last_query["c"], q[-1])


def test_a_run_of_forks_holds_one_copy_of_the_shared_prefix(cpu_backend):
    config = CacheConfig(num_blocks=64, block_size=4, num_heads=2, num_kv_heads=1, head_dim=8, dtype="float16")
    ops = [Add("p", 120)] + [Fork("p", f"c{i}") for i in range(8)] + [Grow(f"c{i}", 1) for i in range(8)]
    timeline = Timeline(Scenario("forks", "", config, tuple(ops)), cpu_backend)
    timeline.run_to_end()
    token_bytes = 2 * config.num_kv_heads * config.head_dim * 2
    # 120 shared tokens once, plus each child's copied partial tail (at most a chunk each)
    chunk = ChunkedKVReference.CHUNK_TOKENS
    assert timeline.sim.runner.dense.reference.nbytes <= (128 + 8 * chunk) * token_bytes
