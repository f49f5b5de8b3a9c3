"""Which sequence stays selected as frames come: a freed selection passes to the row that took
its place, not to the first row (the walk-through then replayed a sequence the step never ran)."""

from types import SimpleNamespace

from pagesim.app.gui.selection import Selection


def _frame(*names, focus=None):
    return SimpleNamespace(
        sequences=[SimpleNamespace(seq_id=n) for n in names],
        focus=None if focus is None else SimpleNamespace(seq_id=focus),
    )


def test_a_freed_selection_passes_to_the_next_row_or_the_one_before_the_last():
    selection = Selection()
    selection.reconcile(_frame("A2", "C", "s1", "s2", focus="A2"))
    selection.current = "s1"
    assert selection.reconcile(_frame("A2", "C", "s2", focus="A2")) == "s2"  # s1 freed: s2 took its row
    assert selection.reconcile(_frame("A2", "C", focus="A2")) == "C"  # s2, the last row, freed: the one before
    selection.current = "gone"  # (a name no frame showed): the worker's focus
    assert selection.reconcile(_frame("A2", "C", focus="A2")) == "A2"


def test_a_selection_still_live_and_an_expected_new_one_win():
    selection = Selection()
    selection.reconcile(_frame("a", "b"))
    selection.current = "b"
    assert selection.reconcile(_frame("b", "a")) == "b"
    selection.expect("c")
    assert selection.reconcile(_frame("a", "b", "c")) == "c"
