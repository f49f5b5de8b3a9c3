"""On a real model the text view says where the selected sequence parts from those it shares
blocks with: the tour's fork A2 shares A's first two blocks, and their samples part at the
first token A2 wrote (the one copy-on-write gave its own block)."""

from tests.app.conftest import wait_idle


def _text_at(window, qtbot, step, seq):
    window.actions.scrubber.setValue(step)
    frame = wait_idle(qtbot, window, timeout=60_000)
    window.select_sequence(seq)
    window.tokens_and_text.setCurrentWidget(window.sequence_text)
    return frame, window.sequence_text.parting


def test_the_fork_and_its_parent_part_at_the_first_token_the_fork_wrote(make_window, qtbot):
    window = make_window("default", real=True)
    frame, parting = _text_at(window, qtbot, 6, "A2")  # just forked: every block shared
    assert parting.isVisible()
    assert "Shares its first 3 blocks with <b>A</b>, the same text so far" in parting.text()
    frame, parting = _text_at(window, qtbot, 8, "A2")  # A2 wrote one token, A two
    a, a2 = frame.sequence("A"), frame.sequence("A2")
    forked_at = a2.num_tokens - 1
    assert a.pieces[:forked_at] == a2.pieces[:forked_at] and a.pieces[forked_at] != a2.pieces[forked_at]
    assert a.block_table[:2] == a2.block_table[:2] and a.block_table[2] != a2.block_table[2]  # the copy
    text = parting.text()
    assert f"Shares its first 2 blocks with <b>A</b>; parts at token {forked_at}:" in text
    assert a2.pieces[forked_at].strip() in text and a.pieces[forked_at].strip() in text


def test_a_sequence_sharing_nothing_has_no_parting_note(make_window, qtbot):
    window = make_window("default", real=True)
    _, parting = _text_at(window, qtbot, 4, "B")
    assert not parting.isVisible()


def test_the_note_goes_with_its_sequence(make_window, qtbot):
    """Selecting nothing (or opening another scenario, whose start selects nothing) leaves no
    note about the sequence shown before."""
    window = make_window("default", real=True)
    _, parting = _text_at(window, qtbot, 6, "A2")
    assert parting.isVisible()
    window.select_sequence(None)
    assert not parting.isVisibleTo(window.sequence_text)
