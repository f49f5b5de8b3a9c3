"""The v1 scheduler (scenario header ``scheduler = "v1"``): vLLM v1's step, one rule at a time."""

import pytest
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.errors import ScenarioError
from pagesim.core.operations import Add, Schedule, Submit
from pagesim.core.scenario import parse_scenario
from pagesim.core.timeline import Timeline

from tests.on_the_sources import on_the_sources

HEADER = "num_blocks = 16\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\n"


def v1(kv_data=False, **fields) -> Simulator:
    shape = {"num_blocks": 16, "block_size": 4, "num_heads": 2, "head_dim": 8, "scheduler": "v1"} | fields
    return Simulator(CacheConfig(**shape), kv_data=kv_data)


def step(sim: Simulator):
    sim.apply(Schedule(1), attend=False)
    return sim.scheduler.last_step


def test_the_header_chooses_the_scheduler_and_round_trips():
    assert parse_scenario(HEADER).config.scheduler == "v0"  # absent: v0, as every older file
    scenario = parse_scenario(HEADER + 'scheduler = "v1"\nmax_num_batched_tokens = 64\n')
    assert (scenario.config.scheduler, scenario.config.max_num_batched_tokens) == ("v1", 64)
    assert parse_scenario(scenario.to_toml()).config == scenario.config


@pytest.mark.parametrize(
    "extra, field, message",
    [
        ('scheduler = "v2"\n', "scheduler", 'must be "v0" or "v1"'),
        ('scheduler = "v1"\npreemption = "swap"\nnum_cpu_blocks = 4\n', "num_cpu_blocks", "has no CPU pool"),
        (
            'scheduler = "v1"\nmax_num_batched_tokens = 0\n',
            "max_num_batched_tokens",
            "an integer from 1 to 2,147,483,647",
        ),
    ],
)
def test_a_bad_scheduler_header_names_its_field(extra, field, message):
    with pytest.raises(ScenarioError, match=message) as info:
        parse_scenario(HEADER + extra, "bad.toml")
    assert info.value.field == field


def test_block_zero_is_the_null_block_and_never_handed_out():
    sim = v1(num_blocks=6)
    assert sim.pool.num_free == 5 and not sim.pool.is_free(0)
    sim.apply(Submit("a", 2, prompt=tuple(range(1, 18))), attend=False)  # 17 tokens: 5 blocks
    step(sim)
    assert 0 not in sim.sequence("a").block_table and sim.pool.num_free == 0


def test_one_token_budget_running_first_then_waiting_in_chunks():
    sim = v1(max_num_batched_tokens=8)
    sim.apply(Submit("a", 3, prompt=tuple(range(1, 11))), attend=False)  # 10 tokens
    sim.apply(Submit("b", 3, prompt=tuple(range(20, 26))), attend=False)  # 6 tokens
    first = step(sim)
    assert [(s.request, s.kind, s.tokens) for s in first.scheduled] == [("a", "new", 8)]
    assert first.sampled == {}  # a partial prefill samples nothing
    second = step(sim)
    # a's last 2 prompt tokens complete its prompt and sample its first token; b gets the rest of the budget
    assert [(s.request, s.kind, s.tokens) for s in second.scheduled] == [("a", "running", 2), ("b", "new", 6)]
    assert set(second.sampled) == {"a", "b"}
    state = sim.scheduler.requests["a"]
    # the newest sampled token is not in the cache: the next step computes it
    assert len(state.tokens) == 11 and sim.sequence("a").num_tokens == 10


def test_admission_credits_prefix_hits_on_free_cached_blocks():
    sim = v1(prefix_caching=True)
    prompt = tuple(range(1, 14))  # 13 tokens: 3 full blocks may hit
    sim.apply(Submit("a", 1, prompt=prompt), attend=False)
    step(sim)  # a computes its prompt, samples its only token and finishes: its blocks are free, cached
    assert sim.scheduler.requests["a"].status == "finished"
    sim.apply(Submit("b", 1, prompt=prompt), attend=False)
    admitted = step(sim).scheduled[0]
    assert (admitted.prefix_hit_tokens, admitted.computed_before, admitted.tokens) == (12, 12, 1)


def test_freed_blocks_unhashed_to_the_head_hashed_to_the_tail():
    sim = v1(num_blocks=8, prefix_caching=True)
    sim.apply(Submit("a", 1, prompt=tuple(range(1, 11))), attend=False)  # blocks 1, 2 full; 3 partial
    step(sim)
    free = sim.pool.free_blocks()
    assert free[0] == 3 and free[-2:] == [2, 1]  # tail first: the partial block reused first


def test_preemption_frees_the_newest_running_and_admits_nobody_that_step():
    sim = v1(num_blocks=5, max_num_batched_tokens=64)  # 4 usable blocks
    sim.apply(Submit("a", 6, prompt=tuple(range(1, 8))), attend=False)  # 7 tokens: 2 blocks
    sim.apply(Submit("b", 6, prompt=tuple(range(10, 17))), attend=False)
    step(sim)
    sim.apply(Submit("c", 1, prompt=(5,)), attend=False)
    record = step(sim)  # a's 8th token fits; b's 8th too; both need a block at the 9th
    while not record.preempted:
        record = step(sim)
    assert record.preempted == ["b"] and all(s.kind == "running" for s in record.scheduled)
    assert list(sim.scheduler.waiting) == ["b", "c"]  # the preempted request goes first
    sim.apply(Schedule(100), attend=False)
    assert {r: s.status for r, s in sim.scheduler.requests.items()} == dict.fromkeys("abc", "finished")
    assert sim.scheduler.requests["b"].preemptions == 1


def test_parallel_samples_are_child_requests_counted_by_max_num_seqs():
    sim = v1(prefix_caching=True, max_num_seqs=2)
    sim.apply(Submit("r", 2, prompt=tuple(range(1, 10)), n=3), attend=False)
    record = step(sim)
    assert [s.request for s in record.scheduled] == ["r/s0", "r/s1"]
    assert record.scheduled[1].prefix_hit_tokens == 8  # the first sample's full blocks, cached as scheduled
    assert list(sim.scheduler.waiting) == ["r/s2"]
    sim.apply(Schedule(10), attend=False)
    samples = [sim.scheduler.requests[f"r/s{i}"].tokens[9:] for i in range(3)]
    assert len({tuple(s) for s in samples}) == 3  # each child samples its own tokens


def test_what_can_never_run_is_rejected_at_submission():
    sim = v1(num_blocks=4)
    sim.apply(Submit("long", 8, prompt=tuple(range(1, 10))), attend=False)  # 16 cached tokens > 3 blocks
    sim.apply(Submit("beams", 2, prompt=(1, 2), beam_width=2), attend=False)
    assert {r: s.status for r, s in sim.scheduler.requests.items()} == {"long": "rejected", "beams": "rejected"}


def test_user_blocks_that_starve_the_queue_are_a_stall_not_a_loop():
    sim = v1(num_blocks=4)
    sim.apply(Add("mine", 8), attend=False)  # 2 of the 3 usable blocks
    sim.apply(Submit("a", 2, prompt=tuple(range(1, 8))), attend=False)
    sim.apply(Schedule(2**31), attend=False)
    assert "needs 2 blocks; 1 are free" in sim.scheduler.stalled()


def test_kv_data_runs_and_matches_dense_attention_through_preemption_and_back(cpu_backend):
    scenario = parse_scenario(
        HEADER.replace("16", "6")
        + 'scheduler = "v1"\nprefix_caching = true\nmax_num_batched_tokens = 6\n'
        + "".join(
            f'[[steps]]\nop = "submit"\nrequest = "{r}"\ntokens = 7\nshared_prefix = 4\noutput = 6\n' for r in "abc"
        )
        + '[[steps]]\nop = "schedule"\n' * 14
    )
    timeline = Timeline(scenario, cpu_backend)
    results = timeline.run_to_end()
    assert all(r.attention is None or r.attention.passed for r in results)
    assert timeline.sim.scheduler.stats.preemptions and timeline.sim.scheduler.stats.finished == 3
    end = timeline.sim.scheduler.snapshot()
    timeline.seek(6)
    assert all(timeline.sim.verify_kv(s) is None for s in timeline.sim.sequences)
    timeline.seek(len(results))
    assert timeline.sim.scheduler.snapshot().requests == end.requests


def run_workload(count: int, runs_at_once: bool, monkeypatch) -> tuple[list, list, list]:
    """A seeded ShareGPT-like workload through a pool small enough to preempt and a budget
    small enough to chunk prompts: every step's decisions and block tables, the events, and
    the runs of decoding requests scheduled at once."""
    from pagesim.core.scheduler_v1 import SchedulerV1
    from pagesim.core.studies.workload import generate

    runs = []  # (requests preempted so far this step, the run's length)
    original = SchedulerV1._decode_run

    def counted(self, record, scheduled, start, budget):
        runs.append((len(record.preempted), original(self, record, scheduled, start, budget)))
        return runs[-1][1]

    with monkeypatch.context() as patch:
        patch.setattr(SchedulerV1, "_decode_run", counted if runs_at_once else lambda *args: 0)
        sim = v1(num_blocks=160, block_size=8, prefix_caching=True, max_num_seqs=24, max_num_batched_tokens=96)
        sim.scheduler.record_tables = True
        specs, index, records, events = (
            generate("sharegpt", count, rate=20.0, seed=3, shared_prefix=16, max_len=300),
            0,
            [],
            [],
        )
        clock = 0.0
        while index < len(specs) or sim.scheduler.waiting or sim.scheduler.running:
            while index < len(specs) and specs[index].arrival <= clock:
                s = specs[index]
                sim.apply(Submit(s.request_id, s.output_len, prompt_len=s.prompt_len, shared_prefix=16), attend=False)
                index += 1
            events.extend(sim.apply(Schedule(1), attend=False).events)
            records.append(sim.scheduler.last_step)
            clock += 0.05
    return [r for r in records if r is not None], events, runs


@on_the_sources  # (it patches the compiled core)
def test_decoding_requests_scheduled_at_once_decide_as_one_at_a_time(monkeypatch):
    """Runs of running requests that each decode one token, within the pool and the budget,
    are scheduled at once (in the common step, all of them); a prompt's next chunk, or a
    request the pool does not cover, one at a time. With the runs off, every decision,
    block table and event is the same."""
    fast, fast_events, runs = run_workload(60, True, monkeypatch)
    slow, slow_events, _ = run_workload(60, False, monkeypatch)
    assert fast == slow and fast_events == slow_events
    assert any(length > 1 for _, length in runs)
    assert any(preempted and length for preempted, length in runs)  # a run after a preemption
    chunked = [s for r in fast for s in r.scheduled if s.kind == "running" and s.tokens > 1]
    assert chunked  # and prompts continued in chunks, one at a time


def test_a_model_that_gives_too_few_tokens_is_an_error_not_a_short_step():
    """The samples' dict is built only when read: the count is checked when they are taken."""
    sim = v1()
    sim.apply(Submit("a", 4, prompt_len=3))
    sim.apply(Submit("b", 4, prompt_len=3))
    model = sim.scheduler.model
    real = model.next_token_ids
    model.next_token_ids = lambda ids, positions, *rest: real(ids, positions)[:-1]
    with pytest.raises(ValueError, match="1 tokens for 2 requests"):
        sim.apply(Schedule(1), attend=False)


def test_a_chunked_prompt_arrives_as_its_first_chunk_of_the_whole_prompt():
    sim = v1(max_num_batched_tokens=8)
    sim.apply(Submit("a", 3, prompt=tuple(range(1, 11))), attend=False)  # 10 prompt tokens
    result = sim.apply(Schedule(1), attend=False)
    (added,) = [e for e in result.events if type(e).__name__ == "SequenceAdded"]
    assert (added.num_tokens, added.prompt_len) == (8, 10)
    assert added.describe() == "a arrived with the first 8 of its 10 prompt tokens"
    assert sim.sequence("a").prompt_len == 10  # the Text tab: 8 of 10 prompt tokens so far, none written
    sim.apply(Schedule(2), attend=False)
    assert sim.sequence("a").generated == 1  # its first sampled token is computed in the third step


def test_a_preempted_request_comes_back_with_what_it_had_generated_told_apart_from_its_prompt():
    sim = v1(num_blocks=5, max_num_batched_tokens=64)
    sim.apply(Submit("a", 6, prompt=tuple(range(1, 8))), attend=False)
    sim.apply(Submit("b", 6, prompt=tuple(range(10, 17))), attend=False)
    while not sim.scheduler.requests["b"].preemptions:
        sim.apply(Schedule(1), attend=False)
    while "b" not in sim.sequences:
        result = sim.apply(Schedule(1), attend=False)
    (added,) = [e for e in result.events if type(e).__name__ == "SequenceAdded"]
    assert added.prompt_len == 7 and added.num_tokens > 7
    assert added.describe() == (
        f"b came back with {added.num_tokens} tokens (7 prompt + {added.num_tokens - 7} it had generated)"
    )
    assert sim.sequence("b").prompt_len == 7


def test_the_prefix_hit_rate_counts_a_chunked_prompts_whole_lookup():
    """A prompt's full blocks are all looked up at admission, whatever its first chunk."""
    rates = {}
    for budget in (4, 1000):
        sim = v1(prefix_caching=True, max_num_batched_tokens=budget)
        sim.apply(Submit("a", 1, prompt=tuple(range(1, 18))), attend=False)  # 17 tokens: 4 full blocks
        sim.apply(Schedule(10), attend=False)
        sim.apply(Submit("b", 1, prompt=tuple(range(1, 9)) + tuple(range(50, 59))), attend=False)  # 2 shared
        sim.apply(Schedule(10), attend=False)
        m = sim.metrics()
        rates[budget] = (m.prefix_lookup_blocks, m.prefix_hit_blocks)
    assert rates[4] == rates[1000] == (8, 2)


def test_the_null_block_is_no_sequences_slots():
    sim = v1(num_blocks=8)
    empty = sim.metrics()
    assert empty.used_blocks == 1 and empty.slots_allocated == 0 and empty.internal_fragmentation == 0
    sim.apply(Submit("a", 2, prompt=tuple(range(1, 7))), attend=False)  # 6 tokens: 2 blocks of 4
    sim.apply(Schedule(1), attend=False)
    m = sim.metrics()
    assert (m.used_blocks, m.slots_allocated, m.slots_filled, m.internal_fragmentation) == (3, 8, 6, 2)
    assert m.utilisation == 0.75
