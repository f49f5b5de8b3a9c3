"""A v1 step's token budget on the frame: decode tokens and prefill chunks per request,
against max_num_batched_tokens, read from the scheduler's own record of the step."""

from pathlib import Path

from pagesim.core.scenario import load_scenario, parse_scenario
from pagesim.core.timeline import Timeline
from pagesim.core.view_model import build_frame

CHUNKED = Path(__file__).resolve().parents[1] / "app" / "scenarios" / "chunked_prefill_v1.toml"

# Three 7-token requests sharing 4 tokens in a pool of 5 usable blocks: c is preempted,
# then readmitted to compute its prompt and its first sample again.
PREEMPTED = (
    'num_blocks = 6\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\nscheduler = "v1"\n'
    "prefix_caching = true\nmax_num_batched_tokens = 6\n"
    + "".join(f'[[steps]]\nop = "submit"\nrequest = "{r}"\ntokens = 7\nshared_prefix = 4\noutput = 6\n' for r in "abc")
    + '[[steps]]\nop = "schedule"\n' * 14
)


def frames(timeline):
    frame = build_frame(timeline, None)
    out = [frame]
    while not timeline.at_end:
        result = timeline.forward()
        frame = build_frame(timeline, None, result, frame)
        out.append(frame)
    return out


def shares(budget):
    return [(s.request, s.kind, s.tokens) for s in budget.segments]


def test_decodes_first_then_a_chunk_of_the_long_prompt(cpu_backend):
    by_step = frames(Timeline(load_scenario(CHUNKED), cpu_backend))
    fifth = by_step[5].token_budget
    assert shares(fifth) == [("r1", "decode", 1), ("r2", "decode", 1), ("r3", "prefill", 62)]
    assert (fifth.decode_tokens, fifth.prefill_tokens, fifth.used, fifth.budget) == (2, 62, 64, 64)
    assert fifth.segments[2].describe().startswith("r3: prefill chunk of 62 tokens (62/150 of its prompt)")
    assert by_step[5].prefilling == {"r3": (62, 150)} and by_step[6].prefilling == {"r3": (124, 150)}
    last_chunk, admitted = by_step[8].token_budget.segments[2:]
    assert (last_chunk.request, last_chunk.tokens, last_chunk.computed_after) == ("r3", 26, 150)
    assert last_chunk.sampled and not last_chunk.finished
    assert (admitted.request, admitted.prefix_hit_tokens, admitted.tokens) == ("r4", 32, 16)
    assert "32 tokens came from the prefix cache, outside the budget" in admitted.describe()
    assert by_step[8].prefilling == {}
    for frame in by_step[1:]:
        budget = frame.token_budget
        if budget is not None:
            assert budget.used <= budget.budget
            assert all(0 < s.computed_after <= s.target for s in budget.segments)


def test_only_a_schedule_step_has_a_budget(cpu_backend):
    timeline = Timeline(load_scenario(CHUNKED), cpu_backend)
    by_step = frames(timeline)
    assert by_step[0].token_budget is None and by_step[1].token_budget is None
    timeline.seek(4)  # submits r3: the scheduler's record of step 3 is still there, and is not this step's
    assert timeline.sim.scheduler.last_step is not None
    assert build_frame(timeline, None).token_budget is None
    assert by_step[4].prefilling == {}


def test_a_seek_back_shows_the_same_budget_as_playing_forward(cpu_backend):
    scenario = load_scenario(CHUNKED)
    played = [f.token_budget for f in frames(Timeline(scenario, cpu_backend))]
    timeline = Timeline(scenario, cpu_backend, snapshot_every=4)
    timeline.seek(timeline.length)
    for step in reversed(range(timeline.length + 1)):
        timeline.seek(step)
        assert build_frame(timeline, None).token_budget == played[step], step


def test_a_preempted_request_recomputes_its_prompt_and_outputs(cpu_backend):
    by_step = frames(Timeline(parse_scenario(PREEMPTED), cpu_backend))
    assert by_step[7].token_budget.preempted == ("c",)
    assert "preempted c: no admissions this step" in by_step[7].token_budget.summary()
    (resumed,) = by_step[11].token_budget.segments
    assert (resumed.request, resumed.kind, resumed.admission, resumed.outputs_before) == ("c", "prefill", "resumed", 1)
    assert resumed.describe().startswith("c: recompute chunk of 4 tokens (8/8: its prompt and 1 generated token")
    assert by_step[16].token_budget is None  # nothing left to schedule
    finished = by_step[10].token_budget.segments
    assert all(s.kind == "decode" and s.finished for s in finished)


def test_the_v0_scheduler_has_no_budget_to_show(cpu_backend):
    v0 = PREEMPTED.replace('scheduler = "v1"\n', "").replace("max_num_batched_tokens = 6\n", "")  # (v1's own)
    for frame in frames(Timeline(parse_scenario(v0), cpu_backend)):
        assert frame.token_budget is None and frame.prefilling == {}
