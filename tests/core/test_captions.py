"""A caption for every step, in vLLM's words, and the scenario's own narration (`note`)."""

import re

import pytest
from pagesim.core.errors import ScenarioError
from pagesim.core.operations import Add
from pagesim.core.scenario import first_sentence, load_scenario, parse_scenario
from pagesim.core.timeline import Timeline

from tests.scenarios import token_model


def test_every_step_of_the_tour_says_what_it_did_to_the_pool(cpu_backend):
    timeline = Timeline(load_scenario(token_model("default")), cpu_backend)
    timeline.run_to_end()
    captions = timeline.captions()
    assert len(captions) == timeline.length and all(captions)
    assert "A took 2 blocks from the free queue (L0 → #0, L1 → #1)" in captions[0]
    assert "room in its last block: no new block" in captions[2]
    assert "forked from A" in captions[5] and "3 blocks, ref counts up" in captions[5]
    assert "A2 wrote into shared block 5 → copy-on-write gave it block 6" in captions[6]
    assert "block 5 now ref count 1" in captions[6]
    assert "joined the free queue" in captions[11] and "stayed with other holders" in captions[11]


def test_old_steps_keep_their_caption_after_dropping_their_detail(cpu_backend):
    timeline = Timeline(load_scenario(token_model("default")), cpu_backend)
    timeline.run_to_end()
    assert timeline.result(3).detail_dropped  # its TokenWritten events are gone…
    assert "A's token 6 went into block 1, slot 2" in timeline.caption(3)  # …its caption is not


def test_steps_not_played_yet_show_their_operation_and_the_first_sentence_of_their_note(cpu_backend):
    timeline = Timeline(load_scenario(token_model("default")), cpu_backend)
    timeline.forward()
    note = timeline.scenario.note(1)
    assert note and timeline.captions()[1] == f"add B (9 tok) (not played yet): {first_sentence(note, 120)}"


def test_notes_are_read_kept_with_their_step_and_saved():
    scenario = load_scenario(token_model("default"))
    assert scenario.note(6).startswith("A2 writes into a block it shares")
    again = parse_scenario(scenario.to_toml())
    assert again.notes == scenario.notes and again.operations == scenario.operations
    kept = scenario.with_operations([*scenario.operations[:3], Add("U", 4)])
    assert kept.notes == scenario.notes[:3]  # a note leaves with the script it narrates


def test_a_branch_drops_the_scripts_narration_after_it(cpu_backend):
    timeline = Timeline(load_scenario(token_model("default")), cpu_backend)
    timeline.seek(6)
    assert timeline.note(6).startswith("Forking")
    timeline.push(Add("U", 3))
    assert timeline.note(7) == "" and timeline.note(6).startswith("Forking")


@pytest.mark.parametrize("note", [3, "x" * 601])
def test_a_bad_note_is_refused_naming_its_step_and_field(note):
    header = "num_blocks = 4\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\n"
    value = note if isinstance(note, int) else f'"{note}"'
    text = header + f'[[steps]]\nop = "add"\nseq = "a"\ntokens = 2\nnote = {value}\n'
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "t.toml")
    assert "step 1" in str(info.value) and "note" in str(info.value)


def test_a_beam_freed_and_forked_anew_in_one_step_is_told_as_a_new_one(cpu_backend):
    """Beam search frees a pruned beam and forks its name again from a survivor in the same
    step: "b2 was freed; b2 forked from b0" would read as a contradiction."""
    import re

    timeline = Timeline(load_scenario("beam_search"), cpu_backend)  # SmolLM2's: it reuses the names
    timeline.run_to_end()
    reused = 0
    for caption in timeline.captions():
        for name in re.findall(r"(\S+) was freed", caption):
            if f"{name} forked from" in caption:
                reused += 1
                assert f"a new {name} forked from" in caption, caption
    assert reused  # the scenario does it
    # Read from the events: every name freed and forked again in one step, the finishing step's
    # too (whose frees are untold: its request's finishing says them), is told as a new one.
    from pagesim.core import events as ev

    renamed = 0
    for step, caption in enumerate(timeline.captions(), start=1):
        freed = set()
        for e in timeline.result(step).op_events:
            if isinstance(e, ev.SequenceFreed):
                freed.add(e.seq)
            elif isinstance(e, ev.SequenceForked) and e.child in freed:
                renamed += 1
                assert f"a new {e.child} forked from" in caption, caption
    assert renamed >= reused
    # A block's count is of blocks, not of events (two beams letting go of one shared block
    # is one block), and a list names each block once.
    listed = 0
    for step, caption in enumerate(timeline.captions(), start=1):
        events = timeline.result(step).op_events
        for kind, words in ((ev.BlockReleased, "shared blocks? stayed"), (ev.BlockFreed, "blocks? joined")):
            for count, ids in re.findall(rf"(\d+) {words} [a-z ]+ \((#[\d#, ]+)", caption):
                distinct = {e.block for e in events if isinstance(e, kind)}
                numbers = ids.replace("#", "").split(", ")
                assert int(count) <= len(distinct) and len(set(numbers)) == len(numbers), caption
                listed += 1
    assert listed


def test_requests_finishing_together_are_told_once_and_their_shared_blocks_as_freed(cpu_backend):
    """Two requests sharing a cached prefix finish in one step: each is told as finished (not
    also as "was freed"), and blocks the first let go of but the second then freed are told as
    joining the free queue, not as having "stayed with other holders"."""
    text = (
        'name = "together"\nscheduler = "v1"\nprefix_caching = true\nnum_blocks = 24\nblock_size = 4\n'
        "num_heads = 2\nhead_dim = 8\n"
        '[[steps]]\nop = "submit"\nrequest = "r1"\ntokens = 13\nshared_prefix = 12\noutput = 3\n'
        '[[steps]]\nop = "submit"\nrequest = "r2"\ntokens = 13\nshared_prefix = 12\noutput = 3\n'
        + '[[steps]]\nop = "schedule"\nsteps = 1\n'
        * 4
    )
    timeline = Timeline(parse_scenario(text, "together.toml"), cpu_backend)
    timeline.run_to_end()
    last = next(c for c in timeline.captions() if "finished" in c)
    assert "request r1 finished" in last and "request r2 finished" in last, last
    assert "was freed" not in last and "stayed with other holders" not in last, last
    assert "joined the free queue" in last, last
    assert timeline.sim.pool.num_free == 23  # every block free but the null block
    # v1 splits n = 2 into child requests r1/s0 and r1/s1: each finishes as itself, no "was freed".
    text = text.replace("output = 3\n", "output = 3\nn = 2\n", 1)
    timeline = Timeline(parse_scenario(text, "together.toml"), cpu_backend)
    timeline.run_to_end()
    told = " ".join(timeline.captions())
    assert "request r1/s0 finished" in told and "request r1/s1 finished" in told, told
    assert "was freed" not in told, told


def test_a_caption_tells_the_step_in_the_order_it_happened(cpu_backend):
    """Tokens written before their requests finish are told before the finishing; beams freed
    and forked before the writes, before them; each copy says the ref count it left."""
    timeline = Timeline(load_scenario("tests/scenarios/synthetic_preemption_swap.toml"), cpu_backend)
    timeline.run_to_end()
    finishing = next(c for c in timeline.captions() if "request r1 finished" in c)
    assert finishing.index("r1's token") < finishing.index("request r1 finished"), finishing
    beams = Timeline(load_scenario("beam_search"), cpu_backend)  # SmolLM2's: frees and forks, then copies
    beams.seek(3)
    caption = beams.captions()[2]
    assert caption.index("beam/b1 was freed") < caption.index("a new beam/b1 forked") < caption.index("copy-on-write")
    assert "block 9 now ref count 2" in caption and "block 9 now ref count 1" in caption, caption


@pytest.mark.parametrize("name", ["preemption_recompute", "preemption_v1"])
def test_a_preempted_request_is_told_by_its_preemption_not_as_freed_too(cpu_backend, name):
    timeline = Timeline(load_scenario(token_model(name)), cpu_backend)
    timeline.run_to_end()
    preempting = [
        (timeline.result(step), timeline.caption(step))
        for step in range(1, timeline.length + 1)
        if "preempted by recompute" in timeline.caption(step)
    ]
    assert preempting
    for result, caption in preempting:
        victims = {s for e in result.events if type(e).__name__ == "RequestPreempted" for s in e.seqs}
        assert victims and not any(f"{seq} was freed" in caption for seq in victims), caption


def test_a_step_of_decodes_and_prefill_chunks_tells_them_apart_and_what_the_prefix_cache_served(cpu_backend):
    """A prefill chunk was told as "one token each" among the decodes; an arrival's quote was its
    computed tokens only, with no word of those a prefix hit served; a preemption said the K/V
    was dropped while its full blocks stayed cached for its return."""
    timeline = Timeline(load_scenario("preemption_v1"), cpu_backend)  # SmolLM2's, on the v1 engine
    mixed = served = kept = 0
    while not timeline.at_end:
        result = timeline.forward()  # (read now: an old step later drops its per-token events)
        caption = timeline.caption(result.step)
        events = [(type(e).__name__, e) for e in result.events]
        added = {e.seq: e for name, e in events if name == "SequenceAdded"}
        written: dict[str, int] = {}
        for name, e in events:
            if name == "TokenWritten" and e.seq not in added:
                written[e.seq] = written.get(e.seq, 0) + 1
        chunks = {seq: n for seq, n in written.items() if n > 1}
        if len(written) > 2 and chunks:
            mixed += 1
            assert not caption.startswith("a decode step") and "one token's K/V each" in caption, caption
            for seq, n in chunks.items():
                assert f"{seq} " in caption and f"a prefill chunk of {n} tokens" in caption, caption
        for seq, e in added.items():
            computed = sum(1 for name, w in events if name == "TokenWritten" and w.seq == seq)
            if computed < e.num_tokens:
                served += 1
                assert f"{e.num_tokens - computed} served by the prefix cache, {computed} computed" in caption
        for name, e in events:
            if name == "RequestPreempted" and e.cached:
                kept += 1
                assert f"({e.cached} kept in the prefix cache for its return, unless evicted)" in caption, caption
                assert "dropped" not in caption
    assert mixed and served and kept  # each case happens in this scenario


def test_a_swap_is_told_once_by_its_request(cpu_backend):
    """ "8 blocks moved to the CPU pool" was followed by "8 blocks swapped out to the CPU pool"."""
    timeline = Timeline(load_scenario("tests/scenarios/synthetic_preemption_swap.toml"), cpu_backend)
    timeline.run_to_end()
    captions = timeline.captions()
    out = [c for c in captions if "preempted by swap" in c]
    back = [c for c in captions if "swapped back in:" in c]
    assert out and back
    assert not any("swapped out to the CPU pool" in c for c in out)
    assert not any("swapped back in from the CPU pool" in c for c in back)


def test_a_request_is_not_said_to_be_admitted_as_itself_and_its_samples_are_counted():
    from pagesim.core import events as ev

    assert ev.RequestAdmitted("r1", ("r1",), False).describe() == "request r1 admitted"
    assert ev.RequestAdmitted("r3", ("r3/s0", "r3/s1"), True).describe() == "request r3 resumed as r3/s0, r3/s1"
    assert ev.RequestSubmitted("s1", 5, 16, 2).describe() == (
        "request s1 queued: 5 prompt tokens, 16 to generate, 2 sequences side by side (samples or beams)"
    )
    assert ev.RequestSubmitted("s1", 5, 16, 1).describe().endswith("16 to generate")


def test_a_sequence_named_by_a_number_is_called_a_sequence_not_read_as_a_count(cpu_backend):
    # (the seed article's sequences 0 and 1: "1 arrived with 7 prompt tokens; 1 took 2 blocks")
    timeline = Timeline(load_scenario("seed_demo"), cpu_backend)
    timeline.run_to_end()
    second = timeline.caption(2)
    assert second.startswith("sequence 1 arrived with 7 prompt tokens; sequence 1 took 2 blocks"), second


def test_a_v0_group_back_from_recompute_comes_back_and_its_own_tail_is_a_write(cpu_backend):
    """Its first sequence's own tokens were counted with the shared prompt: "arrived with 38
    prompt tokens: -10 served by the prefix cache, 48 computed" (no prefix cache at all)."""
    timeline = Timeline(load_scenario(token_model("preemption_recompute")), cpu_backend)
    timeline.run_to_end()
    captions = timeline.captions()
    back = [c for c in captions if "came back with the" in c]
    assert back, captions
    for caption in back:
        assert "r3/s0 came back with the 10 tokens its samples share, all computed again" in caption
        assert "arrived" not in caption and "served by the prefix cache" not in caption
        assert "r3/s0" in caption.split("; r3/s1 forked", 1)[1]  # its own tokens, told as written after the fork
    assert not any(re.search(r"\s-\d", c) for c in captions)  # no negative count anywhere


_TWO = (
    'name = "t"\nscheduler = "v0"\npreemption = "recompute"\nwatermark = 0.0\nnum_blocks = {blocks}\n'
    "block_size = 4\nnum_heads = 2\nhead_dim = 8\n"
    '[[steps]]\nop = "submit"\nrequest = "a"\ntokens = 4\noutput = 6\n'
    '[[steps]]\nop = "submit"\nrequest = "b"\ntokens = 4\noutput = 6\n'
)


def test_a_single_request_back_from_recompute_comes_back_with_its_prompt(cpu_backend):
    from pagesim.core.scenario import parse_scenario

    steps = '[[steps]]\nop = "schedule"\nsteps = 1\n' * 12
    timeline = Timeline(parse_scenario(_TWO.format(blocks=3) + steps), cpu_backend)
    timeline.run_to_end()
    back = [c for c in timeline.captions() if "came back" in c]
    assert back and all("b came back with its 4 prompt tokens, all computed again" in c for c in back)
    assert not any("samples share" in c or "arrived" in c for c in back)


def test_a_schedule_of_many_steps_tells_each_arrival_as_what_it_was(cpu_backend):
    """One operation, many engine steps: b arrives, is preempted, comes back; its first arrival
    was told as a return and its return counted every write of both lives ('-4 served …')."""
    from pagesim.core.scenario import parse_scenario

    timeline = Timeline(parse_scenario(_TWO.format(blocks=4) + '[[steps]]\nop = "schedule"\nsteps = 30\n'), cpu_backend)
    timeline.run_to_end()
    caption = timeline.caption(3)
    assert "b arrived with 4 prompt tokens; request b admitted" in caption
    assert "b came back with 8 tokens (4 prompt + 4 it had generated), all computed again" in caption
    assert not re.search(r"\s-\d", caption) and "served by the prefix cache" not in caption
