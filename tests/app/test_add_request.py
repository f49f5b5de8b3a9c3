"""Add on a real model can submit a request for the scheduler (n samples or a beam search)
with a typed prompt, and Schedule (S) runs the scheduler one step at a time."""

from pagesim.core.operations import Submit
from pagesim.core.scenario import load_shipped

from tests.app.conftest import wait_idle


def _submit(window, qtbot, text, **fields):
    before = wait_idle(qtbot, window, timeout=60_000)
    window.add_sequence()
    dialog = window.add_dialog
    dialog.prompt.setPlainText(text)
    dialog.kind.setCurrentIndex(dialog.kind.findData("request"))
    for name, value in fields.items():
        getattr(dialog, name).setValue(value)
    assert dialog.buttons.button(dialog.buttons.StandardButton.Ok).text() == "Submit"
    dialog.buttons.button(dialog.buttons.StandardButton.Ok).click()
    qtbot.waitUntil(lambda: window.frame.position != before.position or window.last_error, timeout=60_000)
    assert window.last_error is None
    frame = wait_idle(qtbot, window, timeout=60_000)
    return dialog, frame, frame.operations[frame.position - 1]


def _schedule(window, qtbot, steps):
    for _ in range(steps):
        window.actions.schedule_action.trigger()
        frame = wait_idle(qtbot, window, timeout=60_000)
    return frame


def test_the_dialog_shows_a_requests_fields_and_beams_set_temperature_and_n_aside(make_window, qtbot):
    window = make_window("default", real=True)
    window.add_sequence()
    dialog = window.add_dialog
    assert not dialog.samples.isVisibleTo(dialog) and dialog.max_tokens.isVisibleTo(dialog)
    dialog.kind.setCurrentIndex(dialog.kind.findData("request"))
    assert dialog.samples.isVisibleTo(dialog) and dialog.output_len.isVisibleTo(dialog)
    assert not dialog.max_tokens.isVisibleTo(dialog) and "Schedule (S)" in dialog.hint.text()
    assert dialog.height() >= dialog.minimumSizeHint().height()  # grown to its new rows, none squeezed
    dialog.temperature.setValue(0.8)
    dialog.samples.setValue(3)
    dialog.beam_width.setValue(2)
    assert dialog.temperature.value() == 0 and not dialog.temperature.isEnabled()
    assert dialog.samples.value() == 1 and not dialog.samples.isEnabled()
    dialog.reject()


def test_in_a_scenario_its_scheduler_runs_add_offers_a_request_first(make_window, qtbot):
    window = make_window("preemption_v1", real=True)  # step 0: its requests not submitted yet
    window.add_sequence()
    dialog = window.add_dialog
    assert dialog.as_request and dialog.samples.isVisibleTo(dialog) and "Schedule (S)" in dialog.hint.text()
    dialog.reject()
    window.load(load_shipped("default"))
    wait_idle(qtbot, window, timeout=60_000)
    window.add_sequence()  # the tour grows its sequences by hand: a sequence first
    assert not window.add_dialog.as_request
    window.add_dialog.reject()


def test_requests_submitted_one_after_another_get_names_of_their_own(make_window, qtbot):
    """A waiting request has no sequence yet, and a finished one none any more: the next
    Add must not offer its name (the scheduler would refuse it)."""
    window = make_window("default", real=True)
    first = _submit(window, qtbot, "One", output_len=1)[0].seq
    dialog, frame, _ = _submit(window, qtbot, "Two", output_len=1)  # before any Schedule
    second = dialog.seq
    assert first != second and {first, second} <= set(frame.queues["waiting"])
    while frame.queues["waiting"] or frame.queues["running"]:  # until both finish
        frame = _schedule(window, qtbot, 1)
    dialog, frame, op = _submit(window, qtbot, "Three", output_len=1)
    assert dialog.seq not in (first, second) and op.request == dialog.seq


def test_a_beam_search_request_is_submitted_and_scheduled_into_two_beams(make_window, qtbot):
    window = make_window("default", real=True)
    dialog, frame, op = _submit(window, qtbot, "Name a colour:", beam_width=2, output_len=4)
    assert isinstance(op, Submit) and op.request == dialog.seq and op.beam_width == 2 and op.output_len == 4
    assert op.sampling is None
    assert dialog.seq in frame.queues["waiting"]
    frame = _schedule(window, qtbot, 2)
    beams = [s.seq_id for s in frame.sequences if s.seq_id.startswith(f"{dialog.seq}/")]
    assert len(beams) == 2
    assert frame.operations[frame.position - 1].describe() == "schedule ×1"


def test_parallel_samples_with_a_temperature_write_their_own_tokens(make_window, qtbot):
    window = make_window("default", real=True)
    dialog, frame, op = _submit(window, qtbot, "Once upon a time", samples=2, temperature=1.0, seed=5, output_len=6)
    assert op.n == 2 and op.sampling.temperature == 1.0 and op.sampling.seed == 5
    frame = _schedule(window, qtbot, 6)
    samples = [s for s in frame.sequences if s.seq_id.startswith(f"{dialog.seq}/")]
    assert len(samples) == 2
    first, second = samples
    prompt = first.prompt_len
    assert first.pieces[:prompt] == second.pieces[:prompt] and first.pieces[prompt:] != second.pieces[prompt:]
    # The prompt's full blocks are shared; each sample writes its own tokens into its own.
    full = prompt // frame.config.block_size
    assert first.block_table[:full] == second.block_table[:full]
    assert first.block_table[-1] != second.block_table[-1]


def test_n_samples_at_temperature_zero_cannot_be_submitted_and_the_dialog_says_why(make_window, qtbot):
    """Two greedy samples wrote the same text, in blocks of their own after copy-on-write."""
    window = make_window("default", real=True)
    window.add_sequence()
    dialog = window.add_dialog
    dialog.kind.setCurrentIndex(dialog.kind.findData("request"))
    ok = dialog.buttons.button(dialog.buttons.StandardButton.Ok)
    dialog.temperature.setValue(0.0)
    dialog.samples.setValue(2)
    assert not ok.isEnabled() and "would all be the same text" in dialog.hint.text()
    dialog.temperature.setValue(0.7)
    assert ok.isEnabled() and "same text" not in dialog.hint.text()
    dialog.reject()


def test_a_request_of_n_greedy_samples_is_refused_by_the_engine():
    import pytest
    from pagesim.core.errors import InvalidOperationError
    from pagesim.core.sampling import SamplingParams

    with pytest.raises(InvalidOperationError, match=r"2 samples at temperature 0 .* would all be the same text"):
        Submit("r", 4, prompt_len=3, n=2, sampling=SamplingParams(temperature=0.0, seed=1))


def test_enter_adds_the_prompt_and_shift_enter_breaks_the_line(make_window, qtbot):
    # (Enter typed a newline into the prompt, which became part of it)
    from PySide6.QtCore import Qt

    window = make_window("default", real=True)
    before = wait_idle(qtbot, window, timeout=60_000)
    window.add_sequence()
    dialog = window.add_dialog
    dialog.prompt.setPlainText("Hello")
    dialog.prompt.moveCursor(dialog.prompt.textCursor().MoveOperation.End)
    qtbot.keyClick(dialog.prompt, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert dialog.prompt.toPlainText() == "Hello\n" and dialog.isVisible()
    dialog.prompt.setPlainText("The capital of Italy is")
    qtbot.keyClick(dialog.prompt, Qt.Key.Key_Return)
    assert dialog.result() == dialog.DialogCode.Accepted and not dialog.isVisible()
    qtbot.waitUntil(lambda: window.frame.position != before.position or window.last_error, timeout=60_000)
    assert window.last_error is None
