"""The beam tree on the real model's beam search (a node per kept beam per step, pruned
nodes marked, the live beams' text the sequences' own, the same tree after a step back and
forward), and the step's work bar: prefill tokens on an add, one decode token per sequence
on a grow and on a scheduler's decode step, prefix-cache hits as skipped."""

import pytest
from pagesim.core import events as ev
from pagesim.core.beam_tree import LIVE, PRUNED
from pagesim.core.scenario import load_shipped, parse_scenario
from pagesim.core.step_work import DECODE, PREFILL
from PySide6.QtCore import QPointF, Qt
from PySide6.QtTest import QTest

from tests.app.conftest import wait_idle


def open_window(qtbot, settings, scenario):
    from pagesim.app.gui.main_window import MainWindow

    window = MainWindow("cpu", settings=settings, speed=0.0)
    qtbot.addWidget(window)
    window.resize(1024, 700)
    window.show()
    window.load(scenario)
    wait_idle(qtbot, window)
    return window


def seek(qtbot, window, step, timeout=20_000):
    window.controller.seek(step)
    qtbot.waitUntil(lambda: window.frame.position == step and window.controller.pending == 0, timeout=timeout)
    return window.frame


WORK = """
name = "prefill and decode"
num_blocks = 24
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
[[steps]]
op = "submit"
request = "r"
tokens = 6
output = 4
n = 2
[[steps]]
op = "schedule"
steps = 1
[[steps]]
op = "schedule"
steps = 1
"""


def test_the_step_bar_shows_prefill_decode_and_skipped_prefix_tokens(qtbot, settings):
    window = open_window(qtbot, settings, parse_scenario(WORK))
    bar, rows = window.step_work_bar, window.sequence_view
    seek(qtbot, window, 1)
    assert [(w.seq, w.kind, w.tokens, skipped) for _, w, skipped in bar.segments] == [("A", PREFILL, 9, False)]
    assert "prefill 9 tokens" in bar.title() and rows._rows["A"].text(1) == "9 (+9 prefill)"

    seek(qtbot, window, 2)  # B's first two blocks are A's: a prefix-cache hit, not computed
    (skip_rect, hit, skipped), (rect, computed, _) = bar.segments
    assert skipped and hit.cached == 8 and computed.tokens == 2 and skip_rect.right() == rect.left()
    assert "8 prompt tokens skipped" in bar.tooltip_at(skip_rect.center())
    assert "8 skipped (prefix-cache hit)" in bar.title()
    assert rows._rows["A"].text(1) == "9"  # A did nothing this step

    seek(qtbot, window, 3)  # a grow by one token: a decode
    ((rect, work, _),) = bar.segments
    assert (work.seq, work.kind, work.tokens) == ("A", DECODE, 1)
    assert rect.width() < bar.bar_rect().width() / 3  # one token against A's 10: small
    assert bar.tooltip_at(rect.center()).startswith("A: decode, 1 token")
    assert rows._rows["A"].text(1) == "10 (+1 decode)"  # the count holds the new token: not read as 11
    # The bar's empty end says what its full width is (a bar read as a budget being filled).
    assert bar.scale_labels()[0] == "full width: 10 tokens, the longest context"
    image, empty = bar.grab().toImage(), bar.bar_rect().adjusted(rect.width() + 8, 2, -2, -2)
    inked = {image.pixel(int(x), int(empty.center().y())) for x in range(int(empty.left()), int(empty.right()))}
    assert len(inked) > 2  # text drawn there, not the bare fill

    seek(qtbot, window, 4)  # a submit computes nothing, but the kernel's check still ran (the badge says ✓)
    assert bar.work is None and not bar.segments and window.frame.attention is not None
    assert "no token computed; the kernel still read every live sequence's K/V" in bar.title()
    seek(qtbot, window, 5)  # the scheduler admits r: its prompt prefilled once, then forked
    assert bar.work.prefill_tokens == 6 and bar.work.decode_tokens == 0
    frame = seek(qtbot, window, 6)  # the next step decodes one token for each of r's two samples
    assert [(w.kind, w.tokens) for w in frame.step_work.sequences] == [(DECODE, 1), (DECODE, 1)]
    assert bar.work.decode_tokens == 2 and "decode 2 (1 per sequence)" in bar.title()
    lanes = window.scheduler_view
    lanes.repaint()
    assert "This step: decode" in lanes.chip_tooltip("r", "running")
    window.close()


@pytest.mark.timeout(900)
def test_the_beam_tree_follows_the_real_search_and_survives_a_step_back(qtbot, settings):
    scenario = load_shipped("beam_search")
    window = open_window(qtbot, settings, scenario)
    frame = seek(qtbot, window, 5, timeout=600_000)  # submit, prefill, then three beam steps
    (tree,) = frame.beam_trees
    work = frame.step_work  # a decode step of three beams, timed on the real model
    assert (work.decode_tokens, work.prefill_tokens) == (3, 0) and work.decode_seconds > 0
    assert window.step_work_bar.title().endswith(" ms")
    timeline = window.controller._worker._timeline  # idle: read here, after the worker's last reply
    chosen = [e for k in range(1, 6) for e in timeline.result(k).op_events if isinstance(e, ev.BeamsSelected)]
    assert {n.step for n in tree.nodes} == {0, 3, 4, 5}
    assert all(sum(n.step == k for n in tree.nodes) == tree.width for k in (3, 4, 5))
    assert len(chosen) == 3 and len(tree.nodes) == 1 + sum(len(e.beams) for e in chosen)
    dropped = sum(len(e.dropped) for e in chosen[1:])  # (the first step drops only the prompt's copies)
    assert sum(n.state == PRUNED for n in tree.nodes) >= dropped > 0
    assert all(n.pruned_at is not None for n in tree.nodes if n.state == PRUNED and n.depth < 3)
    tokenizer = timeline.sim.runner.model.tokenizer
    live = {n.beam: n for n in tree.nodes if n.state == LIVE}
    assert set(live) == {s.seq_id for s in frame.sequences}
    for seq in timeline.sim.sequences.values():
        assert live[seq.seq_id].continuation == tokenizer.decode(seq.token_ids[seq.prompt_len :])
    canvas = window.beam_tree.canvas
    assert window.beam_tree_dock.isVisible() and len(canvas.boxes) == len(tree.nodes)
    # Spaces read as "·", as in the token map and the Guide; the prompt's box fits its label.
    spaced = next(n for n in tree.nodes if n.parent is not None and n.text.startswith(" "))
    assert canvas._label(spaced, tree).startswith("·") and "␣" not in canvas._label(spaced, tree)
    rect, _, prompt = canvas.boxes[0]
    assert prompt.parent is None
    assert rect.width() >= canvas.fontMetrics().horizontalAdvance(canvas._label(prompt, tree)) + 8
    rect, _, node = next(b for b in canvas.boxes if b[2].state == PRUNED)
    assert "pruned" in canvas.tooltip_at(rect.center()) and node.text.strip() in canvas.tooltip_at(rect.center())
    # A vocabulary id is named as one ("token 49" read as a position, as "token N" does elsewhere).
    assert f"(token id {node.token})" in canvas.tooltip_at(rect.center())
    # A live beam's box selects its sequence (a pruned one's does nothing).
    rect, _, node = next(b for b in canvas.boxes if b[2].state == LIVE and b[2].beam != window.selected_seq)
    QTest.mouseClick(canvas, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, rect.center().toPoint())
    assert window.selected_seq == node.beam and "click to select" in canvas.tooltip_at(rect.center())
    seek(qtbot, window, 4, timeout=600_000)
    assert len(window.frame.beam_trees[0].nodes) == 1 + 2 * len(chosen[0].beams)
    again = seek(qtbot, window, 5, timeout=600_000)
    assert again.beam_trees == (tree,)
    assert canvas.tooltip_at(QPointF(-5, -5)).startswith("Beam search as a tree")
    # At 1024 × 700 the tree outgrows its panel: it follows the newest column, then the ranking.
    view = window.beam_tree
    across, down = view.horizontalScrollBar(), view.verticalScrollBar()
    seek(qtbot, window, 13, timeout=600_000)
    qtbot.waitUntil(lambda: across.maximum() > 0 and across.value() == across.maximum())
    last = seek(qtbot, window, frame.length, timeout=600_000)
    assert last.beam_trees[0].finals
    qtbot.waitUntil(lambda: across.value() == 0 and down.maximum() > 0 and down.value() == down.maximum())
    window.close()


ONE_TOKEN = '[[steps]]\nop = "grow"\nseq = "A"\n'
DECODES = (
    'name = "decodes, then a long grow"\nnum_blocks = 64\nblock_size = 4\nnum_heads = 1\nhead_dim = 8\n'
    + '[[steps]]\nop = "add"\nseq = "A"\ntokens = 9\n'
    + ONE_TOKEN * 3
    + ONE_TOKEN
    + "tokens = 120\n"
)


def test_a_decode_step_does_not_remeasure_the_rows_unless_a_cell_outgrows_its_column(qtbot, settings, monkeypatch):
    """Measuring a column walks every row (256 rows: milliseconds a step): a step whose
    Tokens cell fits the column as sized leaves it alone; one that does not widens it."""
    window = open_window(qtbot, settings, parse_scenario(DECODES))
    rows = window.sequence_view
    seek(qtbot, window, 2)
    measured = []
    real_resize = rows.resizeColumnToContents
    monkeypatch.setattr(rows, "resizeColumnToContents", lambda column: (measured.append(column), real_resize(column)))
    for step in (3, 4):  # "11 (+1 decode)", "12 (+1 decode)": as wide as the one the column was sized for
        seek(qtbot, window, step)
        assert "+1 decode" in rows._rows["A"].text(1)
    assert measured == []
    seek(qtbot, window, 5)  # "132 (+120 prefill)": wider
    assert rows._rows["A"].text(1) == "132 (+120 prefill)" and 1 in measured
    assert rows.columnWidth(1) >= rows.sizeHintForColumn(1)  # the new text is not cut off
    window.close()


def test_a_final_hypothesis_says_what_its_score_divides():
    """vLLM ranks finished beams by log-probability over the whole length, prompt included:
    the line says so (a student dividing by the written tokens alone got another number)."""
    from types import SimpleNamespace

    from pagesim.app.gui.views.beam_tree import _ranking

    tree = SimpleNamespace(prompt_len=38, final_scores=(-12.77 / 52, -0.5))
    node = SimpleNamespace(depth=14, logprob=-12.77)
    assert _ranking(tree, 0, node) == "-0.246 = -12.77 ÷ 52 tokens (38 prompt + 14 written)"
    assert "length^penalty" in _ranking(tree, 1, node)  # a penalty other than 1: not a plain division
