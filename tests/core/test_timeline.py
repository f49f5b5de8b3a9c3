import pytest
from pagesim.core.errors import InvalidOperationError, PoolExhaustedError, ScenarioError
from pagesim.core.operations import Add, Grow, Schedule, Submit
from pagesim.core.scenario import load_scenario, parse_scenario
from pagesim.core.timeline import Timeline

from tests.core.helpers import check_invariants, state_fingerprint
from tests.scenarios import token_model


def test_stepping_back_restores_exactly_the_earlier_state(cpu_backend):
    timeline = Timeline(load_scenario(token_model("default")), cpu_backend, snapshot_every=4)
    fingerprints = [state_fingerprint(timeline.sim)]
    while not timeline.at_end:
        timeline.forward()
        fingerprints.append(state_fingerprint(timeline.sim))
    for step in [timeline.length - 1, 9, 3, 0, 5, 16]:
        timeline.seek(step)
        assert timeline.position == step
        assert state_fingerprint(timeline.sim) == fingerprints[step]
        check_invariants(timeline.sim)
    timeline.seek(7)
    result = timeline.back()
    assert timeline.position == 6 and result.step == 6
    assert timeline.sim.last_attention is result.attention


def test_replay_is_deterministic_across_fresh_runs(cpu_backend):
    one = Timeline(load_scenario(token_model("default")), cpu_backend)
    two = Timeline(load_scenario(token_model("default")), cpu_backend)
    one.run_to_end()
    two.seek(two.length)
    assert state_fingerprint(one.sim) == state_fingerprint(two.sim)


def test_a_user_operation_branches_the_timeline(cpu_backend):
    timeline = Timeline(load_scenario(token_model("default")), cpu_backend, snapshot_every=2)
    timeline.seek(6)
    timeline.push(Add("user", 3))
    assert timeline.length == 7 and timeline.at_end
    assert timeline.operations[-1] == Add("user", 3)
    timeline.back()
    timeline.forward()
    assert "user" in timeline.sim.sequences


def test_a_refused_user_operation_changes_nothing(cpu_backend):
    timeline = Timeline(load_scenario(token_model("default")), cpu_backend)
    timeline.seek(3)
    before = (state_fingerprint(timeline.sim), list(timeline.operations))
    with pytest.raises(PoolExhaustedError):
        timeline.push(Grow("A", 1000))
    assert (state_fingerprint(timeline.sim), list(timeline.operations)) == before


@pytest.mark.parametrize(
    "scheduler, op, why",
    [
        ("v1", Submit("big", 999, prompt_len=5), "need"),
        ("v1", Submit("beams", 4, prompt_len=5, beam_width=2), "no beam search"),
        ("v0", Submit("long", 4, prompt_len=100), "needs"),
    ],
)
def test_a_users_request_the_scheduler_would_reject_at_once_is_refused_before_it_branches(scheduler, op, why):
    scenario = parse_scenario(
        f'num_blocks = 8\nblock_size = 4\nnum_heads = 1\nhead_dim = 8\nscheduler = "{scheduler}"\n'
        '[[steps]]\nop = "submit"\nrequest = "r"\ntokens = 6\noutput = 3\n'
        '[[steps]]\nop = "submit"\nrequest = "x"\ntokens = 100\noutput = 3\n'
    )
    timeline = Timeline(scenario)
    timeline.seek(1)
    before = (state_fingerprint(timeline.sim), list(timeline.operations), timeline.branch_step)
    with pytest.raises(InvalidOperationError, match=f"request {op.request} would be rejected at once: .*{why}"):
        timeline.push(op)
    assert (state_fingerprint(timeline.sim), list(timeline.operations), timeline.branch_step) == before
    rejected = timeline.forward()  # a scenario's own rejection still runs as a step
    assert any(type(e).__name__ == "RequestRejected" for e in rejected.events)


def test_a_failing_scenario_step_names_its_step_and_field(cpu_backend):
    scenario = parse_scenario(
        "num_blocks = 2\nblock_size = 2\nnum_heads = 1\nhead_dim = 8\n"
        '[[steps]]\nop = "add"\nseq = "a"\ntokens = 3\n'
        '[[steps]]\nop = "grow"\nseq = "a"\ntokens = 5\n',
        "tight.toml",
    )
    timeline = Timeline(scenario, cpu_backend)
    timeline.forward()
    before = state_fingerprint(timeline.sim)
    with pytest.raises(ScenarioError, match=r"tight.toml, step 2, field 'tokens': grow a \+5: KV-cache pool exhausted"):
        timeline.forward()
    assert state_fingerprint(timeline.sim) == before


def test_a_pool_that_runs_out_names_the_field_that_asked_for_the_tokens(cpu_backend):
    """An add with ``prompt = [...]`` was said to fail in its field 'tokens', which it did not have."""
    header = "num_blocks = 3\nblock_size = 4\nnum_heads = 1\nhead_dim = 8\n"
    first = '[[steps]]\nop = "add"\nseq = "a"\nprompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]\n'
    for step, field in (
        ('[[steps]]\nop = "add"\nseq = "b"\nprompt = [1, 2, 3, 4, 5]\n', "prompt"),
        ('[[steps]]\nop = "grow"\nseq = "a"\ntoken_ids = [1, 2, 3, 4, 5, 6, 7, 8]\n', "token_ids"),
        ('[[steps]]\nop = "grow"\nseq = "a"\ntokens = 8\n', "tokens"),
    ):
        timeline = Timeline(parse_scenario(header + first + step, "tight.toml"), cpu_backend)
        timeline.forward()
        with pytest.raises(ScenarioError, match=rf"tight.toml, step 2, field '{field}': .*KV-cache pool exhausted"):
            timeline.forward()


def test_a_seek_past_a_failing_step_stops_on_the_step_before_it_and_names_it(cpu_backend):
    scenario = parse_scenario(
        "num_blocks = 4\nblock_size = 2\nnum_heads = 1\nhead_dim = 8\n"
        '[[steps]]\nop = "add"\nseq = "a"\ntokens = 3\n'
        '[[steps]]\nop = "grow"\nseq = "a"\n'
        '[[steps]]\nop = "grow"\nseq = "a"\ntokens = 50\n'
        '[[steps]]\nop = "grow"\nseq = "a"\n',
        "tight.toml",
    )
    timeline = Timeline(scenario, cpu_backend)
    reference = Timeline(scenario, cpu_backend)
    reference.seek(2)
    for start in (0, 1, 2):  # from before the step, replaying the ones between, or from just before it
        timeline.seek(start)
        with pytest.raises(ScenarioError, match=r"tight.toml, step 3, field 'tokens': grow a \+50: KV-cache pool"):
            timeline.seek(4)
        assert timeline.position == 2 and state_fingerprint(timeline.sim) == state_fingerprint(reference.sim)
        report = timeline.sim.last_attention  # the step it stopped on has its check, as a seek there gives
        assert report is not None and report.passed and set(report.seq_ids) == {"a"}
        timeline.seek(0)


def test_every_step_reached_by_seeking_has_its_attention_check(cpu_backend):
    timeline = Timeline(load_scenario(token_model("default")), cpu_backend, snapshot_every=4)
    timeline.seek(12)  # steps 1..11 replayed without attention on the way
    for step in (5, 9, 12, 1):
        timeline.seek(step)
        report = timeline.sim.last_attention
        assert report is not None and report.passed
        assert set(report.seq_ids) == set(timeline.sim.sequences)
        assert timeline.current.attention is report


def test_incremental_frames_equal_full_ones(cpu_backend):
    import numpy as np
    from pagesim.core.view_model import build_frame

    kept_weights = 0
    for name in ("default", "parallel_sampling", "preemption_swap", "preemption_recompute", "shared_system_prompt"):
        timeline = Timeline(load_scenario(token_model(name)), cpu_backend)
        frame = build_frame(timeline, None)  # (None: the focus is the first sequence)
        while not timeline.at_end:
            result = timeline.forward()
            previous, frame = frame, build_frame(timeline, None, result, frame)
            full = build_frame(timeline, None)
            assert frame.holders == full.holders, (name, timeline.position)
            np.testing.assert_array_equal(frame.ref_counts, full.ref_counts)
            np.testing.assert_array_equal(frame.block_fill, full.block_fill)
            assert frame.history == full.history
            assert frame.sequences == full.sequences, (name, timeline.position)
            assert (frame.focus is None) == (full.focus is None)
            if frame.focus is not None:  # weights kept from the step before are still right
                np.testing.assert_array_equal(frame.focus.weights, full.focus.weights)
                np.testing.assert_array_equal(frame.focus.token_blocks, full.focus.token_blocks)
                np.testing.assert_array_equal(frame.focus.output, full.focus.output)
                kept_weights += previous.focus is not None and frame.focus.weights is previous.focus.weights
    assert kept_weights > 0  # and some were kept


def test_an_action_mid_scenario_sets_the_future_aside_and_undo_brings_it_back(cpu_backend):
    timeline = Timeline(load_scenario(token_model("default")), cpu_backend, snapshot_every=4)
    script = list(timeline.operations)
    fingerprints = [state_fingerprint(timeline.sim)]
    while not timeline.at_end:
        timeline.forward()
        fingerprints.append(state_fingerprint(timeline.sim))
    timeline.seek(2)
    assert timeline.branch_step is None and not timeline.can_undo
    timeline.push(Add("U", 5))
    assert timeline.length == 3 and timeline.branch_step == 2 and timeline.can_undo
    timeline.forward() if not timeline.at_end else None
    timeline.push(Grow("U", 2))
    assert timeline.length == 4
    timeline.undo()  # the grow: back to the state after the add
    assert timeline.length == 3 and timeline.position == 3 and timeline.can_redo
    timeline.undo()  # the add: the script returns, at the state before it
    assert timeline.operations == script and timeline.position == 2 and timeline.branch_step is None
    assert state_fingerprint(timeline.sim) == fingerprints[2]
    check_invariants(timeline.sim)
    for step in (9, 5, timeline.length):  # the restored future replays exactly as before
        timeline.seek(step)
        assert state_fingerprint(timeline.sim) == fingerprints[step]
    timeline.seek(2)
    timeline.redo()
    assert timeline.position == 3 and timeline.operations[2] == Add("U", 5) and timeline.length == 3
    timeline.redo()
    assert timeline.operations[3] == Grow("U", 2) and not timeline.can_redo
    check_invariants(timeline.sim)
    with pytest.raises(IndexError):
        timeline.redo()


def test_a_new_action_after_undo_drops_the_redo_branch(cpu_backend):
    timeline = Timeline(load_scenario(token_model("default")), cpu_backend)
    timeline.seek(3)
    timeline.push(Add("U", 5))
    timeline.undo()
    assert timeline.can_redo
    timeline.push(Add("V", 3))
    assert not timeline.can_redo and timeline.operations[3] == Add("V", 3)
    timeline.undo()
    timeline.undo() if timeline.can_undo else None
    assert timeline.operations == list(load_scenario(token_model("default")).operations)


def test_a_steps_attention_events_are_built_only_when_asked_for_and_as_before(cpu_backend):
    """The window reads one sequence's lookup per step; the 2 × 256 lookup and check
    events are built from the report only for the event log (and are the same events)."""
    from pagesim.core import events as ev
    from pagesim.core.view_model import build_frame

    timeline = Timeline(load_scenario(token_model("parallel_sampling")), cpu_backend)
    frame = build_frame(timeline, None)
    while not timeline.at_end:
        result = timeline.forward()
        frame = build_frame(timeline, None, result, frame)
        if result.attention is None:
            continue
        assert "events" not in result.__dict__  # the frame and the caption did not need them
        lookups = {e.seq: e.blocks for e in result.events if isinstance(e, ev.LookupPerformed)}
        checks = [e for e in result.events if isinstance(e, ev.AttentionComputed)]
        assert set(lookups) == set(timeline.sim.sequences) == {c.seq for c in checks}
        for seq_id, seq in timeline.sim.sequences.items():
            assert lookups[seq_id] == tuple(seq.block_table) == result.lookup_of(seq_id)
        assert isinstance(result.events[-1], ev.KernelLaunched)
        assert result.events[: len(result.op_events)] == result.op_events
    assert result.lookup_of("no such sequence") is None
    unrecorded = Timeline(load_scenario(token_model("parallel_sampling")), cpu_backend).sim.apply(
        timeline.operations[0], record=False
    )
    assert unrecorded.events == () and unrecorded.lookup_of("A") is None


def test_the_caption_log_kept_between_calls_equals_a_rebuild(cpu_backend):
    """captions() rewrites only the lines of steps recorded since the last call: after steps,
    a long seek's replay, a user's action, undo and redo it must equal a rebuild from scratch."""
    timeline = Timeline(load_scenario(token_model("default")), cpu_backend, snapshot_every=4)

    def check():
        kept = timeline.captions()
        timeline._caption_log = None
        assert kept == timeline.captions(), timeline.position

    check()
    for _ in range(3):
        timeline.forward()
        check()
    timeline.seek(12)  # nine steps recorded without a call in between
    check()
    timeline.seek(5)
    timeline.push(Add("U", 5))
    check()
    timeline.undo()
    check()
    timeline.redo()
    check()


def test_a_long_seek_stops_at_the_next_step_when_asked():
    """The app's worker asks this when the window closes: closing never waits for a long seek."""
    from pagesim.core.errors import Interrupted
    from pagesim.core.scenario import parse_scenario
    from pagesim.kernels.cpu_backend import CpuBackend

    text = 'name = "long"\nnum_blocks = 64\nblock_size = 16\nnum_heads = 2\nhead_dim = 8\n'
    text += '[[steps]]\nop = "add"\nseq = "a"\ntokens = 4\n' + '[[steps]]\nop = "grow"\nseq = "a"\n' * 300
    timeline = Timeline(parse_scenario(text), CpuBackend())
    asked = []
    timeline.stop_requested = lambda: asked.append(timeline.position) or len(asked) > 40
    with pytest.raises(Interrupted, match="stopped at step 40"):
        timeline.seek(timeline.length)
    assert timeline.position == 40  # one step past the request at most, not the whole replay
    with pytest.raises(Interrupted):
        list(timeline.events_through_now())


def test_a_users_schedule_step_with_no_request_to_run_is_refused_not_recorded(cpu_backend):
    """It recorded a step that did nothing ("no token computed") beside sequences that did not decode."""
    timeline = Timeline(load_scenario(token_model("default")), cpu_backend)
    timeline.seek(3)
    length, before = timeline.length, state_fingerprint(timeline.sim)
    with pytest.raises(InvalidOperationError, match="the scheduler has no requests to run: submit one first"):
        timeline.push(Schedule(1))
    assert timeline.length == length and timeline.position == 3 and state_fingerprint(timeline.sim) == before
    timeline.push(Submit("r", 2, prompt_len=3))
    assert timeline.push(Schedule(1)).step == 5  # with a request queued, it runs
