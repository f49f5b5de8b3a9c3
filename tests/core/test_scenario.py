import pytest
from pagesim.core.errors import ScenarioError
from pagesim.core.operations import Add, Fork, Free, Grow, Schedule
from pagesim.core.scenario import load_scenario, load_shipped, parse_scenario, shipped_scenarios

HEADER = "num_blocks = 8\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\n"


def test_a_scenario_parses_into_a_config_and_operations():
    scenario = parse_scenario(
        HEADER
        + """
[[steps]]
op = "add"
seq = 0
tokens = 10
blocks = [0, 3, 5]
[[steps]]
op = "grow"
seq = 0
[[steps]]
op = "fork"
seq = 0
as = "child"
[[steps]]
op = "grow"
seq = "child"
token_ids = [5, 6]
[[steps]]
op = "free"
seq = 0
""",
        "demo.toml",
    )
    assert scenario.config.num_kv_heads == 2 and scenario.config.dtype == "float32"
    assert scenario.operations == (
        Add("0", 10, blocks=(0, 3, 5)),
        Grow("0", 1),
        Fork("0", "child"),
        Grow("child", None, (5, 6)),
        Free("0"),
    )
    assert parse_scenario(scenario.to_toml(), "again.toml").operations == scenario.operations


@pytest.mark.parametrize(
    "text, step, field, message",
    [
        ("num_blocks = 8\nblock_size = 4\nhead_dim = 8\n", None, "num_heads", "missing"),
        (HEADER + "colour = 'red'\n", None, "colour", "unknown header field"),
        (HEADER + "dtype = 'int8'\n", None, "dtype", "dtype must be one of"),
        (HEADER.replace("block_size = 4", "block_size = 0"), None, "block_size", "positive integer"),
        (HEADER + "num_kv_heads = 3\n", None, "num_kv_heads", "must divide"),
        (HEADER + '[[steps]]\nop = "add"\nseq = "a"\ntokens = 2\n[[steps]]\nop = "jump"\nseq = "a"\n', 2, "op", "jump"),
        (HEADER + "[[steps]]\nop = {a = 1}\n", 1, "op", "op must be one of"),
        (HEADER + '[[steps]]\nop = ["add"]\n', 1, "op", "op must be one of"),
        (HEADER + '[[steps]]\nop = "add"\nseq = "a"\n', 1, "tokens", "exactly one of"),
        (HEADER + '[[steps]]\nop = "add"\nseq = "a"\ntokens = -3\n', 1, "tokens", "positive integer"),
        (HEADER + '[[steps]]\nop = "add"\nseq = "a"\ntokens = 2\nblocks = "0"\n', 1, "blocks", "list of integers"),
        (HEADER + '[[steps]]\nop = "grow"\nseq = "a"\nspeed = 2\n', 1, "speed", "unknown field"),
        (HEADER + '[[steps]]\nop = "fork"\nseq = "a"\n', 1, "as", "missing"),
        (HEADER + '[[steps]]\nop = "free"\n', 1, "seq", "missing"),
        (HEADER + 'scheduler = "v1"\nwatermark = 0.5\n', None, "watermark", "v1.* admits without one"),
        (HEADER + 'scheduler = "v1"\nnum_cpu_blocks = 50\n', None, "num_cpu_blocks", "v1.* has no CPU pool"),
        (HEADER + "max_num_batched_tokens = 8\n", None, "max_num_batched_tokens", "v1's token budget.*v0"),
        # (their defaults too: the value would suggest it did something)
        (HEADER + 'scheduler = "v1"\nwatermark = 0.01\n', None, "watermark", "v1.* admits without one"),
        (HEADER + 'scheduler = "v1"\nnum_cpu_blocks = 0\n', None, "num_cpu_blocks", "v1.* has no CPU pool"),
        (HEADER + "max_num_batched_tokens = 2048\n", None, "max_num_batched_tokens", "v1's token budget.*v0"),
    ],
)
def test_malformed_scenarios_name_the_file_step_and_field(text, step, field, message):
    with pytest.raises(ScenarioError, match=message) as info:
        parse_scenario(text, "bad.toml")
    assert (info.value.source, info.value.step, info.value.field) == ("bad.toml", step, field)
    assert str(info.value).startswith("bad.toml")


def test_invalid_toml_is_reported_with_its_position():
    with pytest.raises(ScenarioError, match=r"bad.toml: not valid TOML: .*line 1"):
        parse_scenario("num_blocks = = 3", "bad.toml")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "nope.toml")


def test_shipped_scenarios_include_the_required_ones():
    assert {"seed_demo", "default", "stress"} <= set(shipped_scenarios())
    seed = load_shipped("seed_demo")
    c = seed.config
    assert (c.num_blocks, c.block_size, c.num_heads, c.head_dim) == (8, 4, 2, 8)
    assert seed.operations == (Add("0", 10, blocks=(0, 3, 5)), Add("1", 7, blocks=(1, 7)))
    assert load_scenario("default").operations == load_shipped("default").operations


def test_the_examples_list_reads_headers_alone_and_says_what_parsing_says(monkeypatch):
    """A list of the shipped scenarios (the welcome, File → Examples) must not wait for a
    real model's load: it is read from each file's header, in the suggested order, with the
    title and first sentence a full parse gives."""
    from pagesim.core.models import catalog
    from pagesim.core.scenario import SUGGESTED_ORDER, examples

    parsed = {name: load_shipped(name) for name in shipped_scenarios()}

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded to list the examples")

    monkeypatch.setattr(catalog, "load_model", refuse)
    listed = examples()
    assert [e.name for e in listed[: len(SUGGESTED_ORDER)]] == list(SUGGESTED_ORDER)
    assert sorted(e.name for e in listed) == sorted(parsed)
    for example in listed:
        scenario = parsed[example.name]
        assert (example.title, example.description) == (scenario.name, scenario.description)
        assert example.summary() == scenario.summary() and example.summary(30) == scenario.summary(30)


@pytest.mark.parametrize("name", sorted(shipped_scenarios()))
def test_every_shipped_scenario_runs_headless_and_matches_dense(cpu_backend, name):
    """One walk through each shipped scenario (the real-model ones take seconds) checks all
    that a whole run shows: every step's attention matches dense, with rounding at most a
    quarter of the error model's bound (measured: ≤ 0.024 of it); and no step schedules with
    nothing to run, so a run ends when its requests do."""
    from pagesim.core.timeline import Timeline

    scenario = load_shipped(name)
    assert scenario.description.strip(), f"{name} needs a description for the app"
    timeline = Timeline(scenario, cpu_backend)
    steps, worst = 0, 0.0
    while not timeline.at_end:
        sched = timeline.sim.scheduler
        busy = bool(sched.running or sched.waiting or sched.swapped)
        result = timeline.forward()
        steps += 1
        assert busy or not isinstance(result.op, Schedule), f"step {result.step} schedules with nothing to run"
        attention = result.attention
        if attention is not None:  # (a real model's report may hold only its layers' and logits' checks)
            assert attention.passed, f"step {result.step}"
            if attention.seq_ids:
                worst = max(worst, float((attention.head_errors / attention.tolerances).max()))
    assert steps == len(scenario.operations)
    assert worst < 0.25  # rounding stays far inside the bound


def test_scheduler_operations_parse_and_round_trip():
    from pagesim.core.operations import Schedule, Submit

    scenario = parse_scenario(
        HEADER
        + 'preemption = "swap"\nnum_cpu_blocks = 4\nprefix_caching = true\n'
        + '[[steps]]\nop = "submit"\nrequest = "r"\ntokens = 9\noutput = 5\nn = 2\nshared_prefix = 4\n'
        + '[[steps]]\nop = "submit"\nrequest = 7\nprompt = [1, 2, 3]\noutput = 2\nbeam_width = 3\n'
        + '[[steps]]\nop = "schedule"\nsteps = 3\n',
        "sched.toml",
    )
    assert scenario.config.preemption == "swap" and scenario.config.prefix_caching
    assert scenario.operations == (
        Submit("r", 5, prompt_len=9, n=2, shared_prefix=4),
        Submit("7", 2, prompt=(1, 2, 3), beam_width=3),
        Schedule(3),
    )
    assert parse_scenario(scenario.to_toml(), "again.toml").operations == scenario.operations


@pytest.mark.parametrize(
    "step, field, message",
    [
        ('op = "submit"\ntokens = 3\noutput = 2\n', "request", "missing"),
        ('op = "submit"\nrequest = "r"\ntokens = 3\n', "output", "missing"),
        ('op = "submit"\nrequest = "r"\noutput = 2\n', "tokens", "exactly one of"),
        ('op = "submit"\nrequest = "r"\ntokens = 3\noutput = 2\nn = 2\nbeam_width = 2\n', "beam_width", "not both"),
        ('op = "schedule"\nsteps = 0\n', "steps", "positive integer"),
        ('op = "schedule"\nseq = "a"\n', "seq", "unknown field"),
    ],
)
def test_bad_scheduler_steps_name_their_field(step, field, message):
    with pytest.raises(ScenarioError, match=message) as info:
        parse_scenario(HEADER + "[[steps]]\n" + step, "bad.toml")
    assert (info.value.step, info.value.field) == (1, field)


def test_bad_scheduler_settings_are_refused():
    with pytest.raises(ScenarioError, match="preemption must be recompute or swap"):
        parse_scenario(HEADER + 'preemption = "drop"\n', "bad.toml")
    with pytest.raises(ScenarioError, match="prefix_caching must be true or false"):
        parse_scenario(HEADER + "prefix_caching = 1\n", "bad.toml")


def test_the_names_operations_bring_in_are_listed_once_in_order():
    from pagesim.core.operations import Add, Fork, Free, Grow, Schedule, Submit, introduced_names

    ops = (Add("A", 4), Submit("r1", 3, prompt_len=5), Grow("A", 1), Fork("A", "A2"), Free("A"), Add("A", 2),
           Schedule(1), Submit("r2", 1, prompt_len=2, n=2))  # fmt: skip
    assert introduced_names(ops) == ("A", "r1", "A2", "r2")
    assert introduced_names(()) == ()
