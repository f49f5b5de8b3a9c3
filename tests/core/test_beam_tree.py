"""The beam tree from BeamsSelected events: one node per kept beam per step, linked by the
events' parents even when a freed name is forked again; pruned beams marked; the final
hypotheses ranked; and per-step work (prefill, decode, prefix hits) from a step's events."""

from dataclasses import dataclass, field

from pagesim.core import events as ev
from pagesim.core.beam_tree import FINAL, KEPT, LIVE, PRUNED, build_beam_trees
from pagesim.core.scenario import parse_scenario
from pagesim.core.step_work import DECODE, PREFILL, step_work
from pagesim.core.timeline import Timeline


@dataclass
class FakeRequest:
    """What the tree reads from a v0 RequestState."""

    prompt: tuple = (1, 2, 3)
    beam_width: int = 2
    status: str = "running"
    outputs: dict = field(default_factory=dict)
    beam_scores: dict = field(default_factory=dict)
    sampling: None = None


def decode(ids):
    return "".join(f"<{i}>" for i in ids)


# Step 2: b0 proposes 10 (b0) and 11 (b1). Step 3: b0 is chosen twice; b1 is dropped and its
# name forked again from b0, so the new b1 is a child of b0's node, not of the old b1.
STEPS = [
    (2, [ev.BeamsSelected("r", (("r/b0", "r/b0", 10, -1.0), ("r/b1", "r/b0", 11, -2.0)), ("r/b1",))]),
    (3, [ev.BeamsSelected("r", (("r/b0", "r/b0", 20, -1.5), ("r/b1", "r/b0", 21, -1.8)), ("r/b1",))]),
]


def test_tree_follows_parents_not_names():
    (tree,) = build_beam_trees(STEPS, {"r": FakeRequest()}, decode)
    assert len(tree.nodes) == 1 + 2 + 2  # the prompt, then a node per kept beam per step
    by = {(n.step, n.beam): n for n in tree.nodes}
    old_b0, old_b1 = by[(2, "r/b0")], by[(2, "r/b1")]
    assert old_b0.parent == old_b1.parent == 0  # the first beams grow from the prompt
    assert by[(3, "r/b1")].parent == old_b0.index  # re-forked from b0, not the freed b1
    assert old_b1.state == PRUNED and old_b1.pruned_at == 3
    assert old_b0.state == KEPT and by[(3, "r/b0")].state == by[(3, "r/b1")].state == LIVE
    assert by[(3, "r/b1")].continuation == "<10><21>" and by[(3, "r/b1")].text == "<21>"
    assert tree.live == {"r/b0": by[(3, "r/b0")].index, "r/b1": by[(3, "r/b1")].index}


def test_finished_search_ranks_its_hypotheses_and_adds_the_end_token():
    done = FakeRequest(status="finished", outputs={"r/h0": (10, 99), "r/b1": (10, 21)})
    done.beam_scores = {"r/h0": -1.2, "r/b1": -1.8}
    (tree,) = build_beam_trees(STEPS, {"r": done}, decode)
    first, second = (tree.nodes[i] for i in tree.finals)
    assert (first.rank, first.token, first.state, first.continuation) == (0, 99, FINAL, "<10><99>")
    assert tree.nodes[first.parent].step == 2  # the end token grew from the step-2 beam
    assert (second.rank, second.state, second.step) == (1, FINAL, 3)
    assert tree.live == {} and tree.finished
    assert tree.final_scores[0] == -1.2 / 5  # log-probability per token, prompt included


PREFIX = """
name = "prefix work"
num_blocks = 16
block_size = 4
num_heads = 2
num_kv_heads = 1
head_dim = 8
prefix_caching = true
[[steps]]
op = "add"
seq = "A"
prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
[[steps]]
op = "add"
seq = "B"
prompt = [1, 2, 3, 4, 5, 6, 7, 8, 10, 11]
[[steps]]
op = "grow"
seq = "A"
tokens = 1
[[steps]]
op = "grow"
seq = "B"
tokens = 3
"""


def test_step_work_counts_prefill_decode_and_prefix_hits():
    timeline = Timeline(parse_scenario(PREFIX))
    work = [step_work(timeline.forward().op_events, 4) for _ in range(4)]
    (a,) = work[0].sequences
    assert (a.seq, a.kind, a.tokens, a.cached) == ("A", PREFILL, 9, 0)
    (b,) = work[1].sequences
    assert (b.kind, b.tokens, b.cached) == (PREFILL, 2, 8)  # two full blocks were hits: skipped
    assert (work[1].prefill_tokens, work[1].cached_tokens) == (2, 8)
    assert work[2].sequences[0].kind == DECODE and work[2].decode_tokens == 1
    assert work[3].sequences[0].kind == PREFILL and work[3].prefill_tokens == 3  # a grow of 3


def test_a_real_models_grow_by_several_tokens_is_decode_one_forward_each():
    wrote = [ev.TokenWritten("A", p, 7, 1, p % 4) for p in (5, 6)]
    real = step_work(wrote, 4, forwards=[(DECODE, 1, 0.02), (DECODE, 1, 0.03)])
    assert [(w.kind, w.tokens) for w in real.sequences] == [(DECODE, 2)]
    assert real.decode_seconds == 0.05 and real.timing() == "50 ms"
    assert "one forward each" in real.summary()
    synthetic = step_work(wrote, 4)  # the token model writes a grow's tokens in one pass
    assert [(w.kind, w.tokens) for w in synthetic.sequences] == [(PREFILL, 2)]


def test_a_decode_that_finishes_every_sequence_keeps_its_contexts_scale():
    """The bar's width is the longest context: a last step that frees its sequences still
    read theirs (it was drawn against its own 3 tokens, filling the bar)."""
    wrote = [ev.TokenWritten(seq, 51, 7, 1, 3) for seq in ("b0", "b1", "b2")]
    assert step_work(wrote, 4, longest=0).longest == 52  # every sequence freed after the step
    assert step_work(wrote, 4, longest=60).longest == 60
