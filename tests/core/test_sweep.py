"""What-if sweeps: the grid, the refusals that name a knob or a value, and variants that
cannot run reported beside the others."""

import pytest
from pagesim.core.errors import InvalidStudyError
from pagesim.core.scenario import load_scenario
from pagesim.core.studies.serving_time import gpu, model_shape, pool_blocks
from pagesim.core.studies.sweep import MAX_VARIANTS, Hardware, Source, expand, parse_setting, sweep

from tests.scenarios import token_model


def _source(name: str) -> Source:
    scenario = load_scenario(token_model(name))
    return Source(scenario.name, scenario.config, scenario)


def test_settings_parse_each_knobs_values():
    assert parse_setting("block_size=8,16,32") == ("block_size", (8, 16, 32))
    assert parse_setting("prefix_caching=true,false") == ("prefix_caching", (True, False))
    assert parse_setting("engine=v0,v1") == ("scheduler", ("v0", "v1"))
    assert parse_setting("watermark=0,0.05") == ("watermark", (0.0, 0.05))
    assert parse_setting("max-num-batched-tokens=64") == ("max_num_batched_tokens", (64,))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("blocksize=8", "unknown knob 'blocksize'; the knobs are block_size"),
        ("block_size=0", "block_size: bad value '0' (expected a positive integer)"),
        ("block_size=8,x", "block_size: bad value 'x'"),
        ("prefix_caching=maybe", "prefix_caching: bad value 'maybe' (expected true or false)"),
        ("preemption=drop", "preemption: bad value 'drop' (expected one of recompute, swap)"),
        ("watermark=1", "watermark: bad value '1' (expected a fraction in [0, 1))"),
        ("scheduler=v2", "scheduler: bad value 'v2'"),
        ("block_size=8,8", "listed twice"),
        ("block_size", "expected KNOB=VALUE"),
    ],
)
def test_an_unknown_knob_or_a_bad_value_is_refused_by_name(text, message):
    with pytest.raises(InvalidStudyError) as caught:
        parse_setting(text)
    assert message in str(caught.value)


def test_the_grid_is_every_combination_in_order():
    grid = expand([parse_setting("block_size=8,16,32"), parse_setting("prefix_caching=true,false")])
    assert grid == [{"block_size": b, "prefix_caching": p} for b in (8, 16, 32) for p in (True, False)]
    with pytest.raises(InvalidStudyError, match="block_size is set twice"):
        expand([parse_setting("block_size=8"), parse_setting("block_size=16")])
    with pytest.raises(InvalidStudyError, match=f"at most {MAX_VARIANTS}"):
        expand(
            [
                parse_setting("num_blocks=" + ",".join(map(str, range(1, 18)))),
                parse_setting("max_num_seqs=" + ",".join(map(str, range(1, 18)))),
            ]
        )


def test_a_sweep_runs_the_original_first_and_keeps_the_pools_memory_across_block_sizes():
    seen = []
    result = sweep(
        _source("preemption_recompute"),
        [parse_setting("block_size=2,4,8"), parse_setting("prefix_caching=true,false")],
        progress=lambda i, n, v: seen.append((i, n, v.label)),
    )
    assert [v.label for v in result.variants][:3] == [
        "original",
        "block_size=2 prefix_caching=true",
        "block_size=2 prefix_caching=false",
    ]
    assert len(result.variants) == 7 and seen[-1][:2] == (7, 7)
    assert all(v.status == "ok" and v.finished == 3 for v in result.variants)
    slots = {v.config.num_blocks * v.config.block_size for v in result.variants}
    assert slots == {24 * 4}  # the same memory in blocks of 2, 4 or 8
    original = result.original
    # r3's two samples come back in 8 blocks (the prompt once, forked): re-admitted at once and
    # preempted again twice before r1 and r2 finish
    assert original.steps == 28 and original.preemptions == 3 and original.peak_blocks <= 24
    assert len(original.used_blocks) == original.steps
    # prefix caching lets the preempted request's recompute hit its own cached blocks
    cached = [v for v in result.variants if v.changes.get("prefix_caching")]
    assert all(v.prefix_hit_rate > 0 for v in cached)
    assert all(v.latency is None for v in result.variants)  # no model shape: steps only


def test_variants_that_cannot_run_are_reported_and_the_rest_still_run():
    result = sweep(
        _source("preemption_recompute"), [parse_setting("scheduler=v0,v1"), parse_setting("preemption=recompute,swap")]
    )
    by = {v.label: v for v in result.variants}
    refused = by["scheduler=v1 preemption=swap"]
    assert refused.status == "cannot run" and "recompute only" in refused.reason
    assert by["scheduler=v0 preemption=swap"].status == "ok"  # given a CPU pool as large as the GPU's
    assert by["scheduler=v0 preemption=swap"].swapped_blocks > 0
    assert by["scheduler=v1 preemption=recompute"].status == "ok"
    placed = sweep(_source("seed_demo"), [parse_setting("num_blocks=4,8")])
    small = placed.variants[1]
    assert small.status == "cannot run" and "step 1" in small.reason and "out of range" in small.reason
    assert placed.variants[2].status == "ok"
    # A block larger than the whole pool cannot keep the pool's memory: refused, not one huge block.
    pool = _source("preemption_recompute").config.num_slots
    huge = sweep(_source("preemption_recompute"), [parse_setting(f"block_size={pool},{pool + 1}")])
    fits, too_big = huge.variants[1:]
    assert fits.ran and fits.config.num_blocks == 1  # (it runs; its requests may not fit one block)
    assert too_big.status == "cannot run" and f"larger than the whole pool ({pool} token slots)" in too_big.reason


def test_with_a_model_shape_and_a_gpu_each_variant_has_its_latency():
    hardware = Hardware(model_shape("llama-3-8b"), gpu("h200"))
    result = sweep(_source("parallel_sampling"), [parse_setting("max_num_seqs=2,4,256")], hardware)
    two = result.variants[1]
    assert two.rejected == 1 and two.finished == 1  # four samples never fit a batch of two sequences
    for v in (result.original, *result.variants[2:]):
        assert v.latency is not None and v.latency.requests == 2
        assert v.latency.ttft["mean"] > 0 and v.latency.throughput > 0
        assert v.pool_gib == pytest.approx(v.config.num_blocks * 8 * 128 * 1024 / 2**30)


def test_with_a_model_shape_and_a_gpu_a_pool_past_the_memory_after_the_weights_cannot_run():
    """num_blocks=100000 of Llama-3-8B's 2 MiB blocks (195 GiB) ran on a 40 GB A100 as if it fitted."""
    hardware = Hardware(model_shape("llama-3-8b"), gpu("a100-40gb"))
    source = _source("parallel_sampling")
    size = source.config.block_size
    room = pool_blocks(model_shape("llama-3-8b"), gpu("a100-40gb"), size)
    assert 16 * 10_000 < room * size < 16 * 11_000  # 0.9 of 40 GiB less 15 GiB of weights, 128 KiB a token
    result = sweep(source, [parse_setting(f"num_blocks={room},{room + 1}")], hardware)
    fits, too_big = result.variants[1:]
    assert fits.status == "ok" and fits.config.num_blocks == room
    assert too_big.status == "cannot run"
    assert (
        f"{room + 1} blocks of {size} tokens take" in too_big.reason and f"at most {room} such blocks" in too_big.reason
    )
    assert result.original.status == "ok"  # (the scenario's own pool is not the variant's)


def test_a_sweep_on_a_gpu_that_cannot_hold_the_model_is_refused_before_anything_runs():
    """The app's What-if panel calls sweep() itself: it gave a 70B model's timings on a 40 GB A100."""
    with pytest.raises(InvalidStudyError, match=r"Llama-3-70B's weights .* do not fit"):
        sweep(_source("preemption_recompute"), [parse_setting("prefix_caching=true")],
              Hardware(model_shape("llama-3-70b"), gpu("a100-40gb")))  # fmt: skip
