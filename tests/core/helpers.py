import numpy as np
from pagesim.core.block_manager import NULL_BLOCK, holders_from_tables
from pagesim.core.engine import Simulator


def held_kv(sim: Simulator) -> dict:
    """The K/V bytes the state holds: the filled slots of every referenced or cached block,
    and of every swapped-out block. Free slots hold nothing the kernel may read (a restore
    rebuilds only what is held), so they are not part of the state."""
    pool, kc, vc = sim.pool, np.asarray(sim.runner.cache.key_cache), np.asarray(sim.runner.cache.value_cache)
    out = {}
    for block in range(pool.num_blocks):
        if pool.ref_count(block) or pool.is_cached(block):
            n = sim.block_fill(block)
            out[("gpu", block)] = (kc[block, :n].tobytes(), vc[block, :n].tobytes())
    bs, space = sim.config.block_size, sim.runner.swap_space
    for seq in sim.swapped.values():
        for index, block in enumerate(seq.block_table):
            n = min(bs, seq.num_tokens - index * bs)
            out[("cpu", block)] = (space.keys[block, :n].tobytes(), space.values[block, :n].tobytes())
    return out


def state_fingerprint(sim: Simulator):
    """Everything a refused operation must leave untouched, the K/V the state holds included."""
    return (
        sim.step,
        sim.pool.snapshot(),
        {k: (tuple(s.token_ids), tuple(s.block_table)) for k, s in sim.sequences.items()},
        {k: (tuple(s.token_ids), tuple(s.block_table)) for k, s in sim.swapped.items()},
        held_kv(sim),
        {k: tuple(a.tobytes() for a in sim.dense_kv(k)) for k in sim.sequences},
        sim.metrics(),
    )


def check_invariants(sim: Simulator) -> None:
    pool = sim.pool
    holders = [0] * pool.num_blocks
    expected_map: dict[int, set] = {}
    for seq in sim.sequences.values():
        assert len(seq.block_table) == sim.config.blocks_for(seq.num_tokens)
        for index, block in enumerate(seq.block_table):
            holders[block] += 1
            expected_map.setdefault(block, set()).add((seq.seq_id, index))
    assert {b: set(h) for b, h in sim.holders_map().items()} == expected_map
    # ... and in the order the sequences took each block, which a restore rebuilds from the tables.
    rebuilt = holders_from_tables(sim.sequences.values())
    assert {b: tuple(h.items()) for b, h in rebuilt.items()} == sim.holders_map()
    if sim.config.scheduler == "v1":  # the null block: held from the start, in no table
        holders[NULL_BLOCK] += 1
        assert NULL_BLOCK not in expected_map, "the null block is in a block table"
    free = set(pool.free_blocks())
    for seq in sim.swapped.values():  # swapped sequences hold CPU blocks only
        assert all(0 <= b < sim.config.num_cpu_blocks for b in seq.block_table)
    for block in range(pool.num_blocks):
        assert (block in free) != (holders[block] > 0), f"block {block} must be free xor referenced"
        assert pool.ref_count(block) == holders[block], f"block {block}: ref count != tables holding it"
    assert pool.num_free + pool.num_used == pool.num_blocks
    free_list = pool.free_blocks()
    assert len(free_list) == pool.num_free, "the free queue's length and the free count disagree"
    assert pool.num_cached_free() == sum(1 for b in free_list if pool.is_cached(b)), "cached-free count is off"
    # Prefix cache: a cached block holds exactly the tokens of every table that holds it.
    bs = sim.config.block_size
    for seq in sim.sequences.values():
        assert len(seq.block_hashes) == (seq.num_tokens // bs if sim.config.prefix_caching else 0)
        for index, h in enumerate(seq.block_hashes):
            block = seq.block_table[index]
            if pool.is_cached(block):
                assert pool.hash_of(block) == h and block in pool.blocks_under(h)
                tokens = tuple(seq.token_ids[index * bs : (index + 1) * bs])
                assert pool.cached_block(h, tokens) in pool.blocks_under(h)  # this block or a twin
    # A sequence's K/V, read through its table, are exactly what its own tokens wrote.
    for seq in sim.sequences.values():
        keys, values = sim.runner.cache.read_sequence(seq.block_table, seq.num_tokens)
        dense_k, dense_v = sim.dense_kv(seq.seq_id)
        np.testing.assert_array_equal(keys, dense_k)
        np.testing.assert_array_equal(values, dense_v)
        _, k_expected, v_expected = sim.runner.model.qkv(seq.token_ids, np.arange(seq.num_tokens))
        np.testing.assert_array_equal(keys, k_expected.astype(sim.runner.cache.dtype))
        np.testing.assert_array_equal(values, v_expected.astype(sim.runner.cache.dtype))
    m = sim.metrics()
    assert m.slots_filled == sum(sim.block_fill(b) for b in range(pool.num_blocks) if pool.ref_count(b))
    assert all(
        sim.block_fill(b) == 0 for b in range(pool.num_blocks) if not pool.ref_count(b) and not pool.is_cached(b)
    )
    assert m.logical_tokens == sum(s.num_tokens for s in sim.sequences.values())
    reserve = sim.config.max_model_len
    assert m.contiguous_blocks == sum(sim.config.blocks_for(max(reserve, s.num_tokens)) for s in sim.sequences.values())
    assert m.shared_blocks == sum(1 for b in range(pool.num_blocks) if pool.ref_count(b) > 1)
