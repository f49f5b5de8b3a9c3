"""The worker turns only pagesim's own errors into refusals the user reads; any other
exception is a bug, reported as an internal error with its traceback logged."""

import logging

import pytest
from pagesim.app.gui.controller import Back, Failed, Forward, FrameReply, Load, Seek, SimulationWorker, Undo
from pagesim.core.scenario import load_scenario

from tests.scenarios import synthetic


@pytest.fixture
def worker(qtbot):
    worker = SimulationWorker("cpu")
    replies = []
    worker.replied.connect(replies.append)
    worker.handle(Load(load_scenario(synthetic("default"))))
    worker.replies = replies
    return worker


def _answer(worker, request):
    worker.replies.clear()
    worker.handle(request)
    (reply,) = worker.replies
    return reply


def test_an_index_error_inside_the_engine_is_reported_as_a_bug_not_a_refusal(worker, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise IndexError("list index out of range")

    monkeypatch.setattr(worker._timeline.sim, "apply", broken)
    with caplog.at_level(logging.ERROR, logger="pagesim.worker"):
        reply = _answer(worker, Forward())
    assert isinstance(reply, Failed) and reply.shortfall is None
    assert reply.message.startswith("internal error: IndexError(")
    (record,) = [r for r in caplog.records if r.name == "pagesim.worker"]
    assert record.exc_info is not None and record.exc_info[0] is IndexError  # the traceback is logged
    monkeypatch.undo()
    assert isinstance(_answer(worker, Forward()), FrameReply)  # the worker lives on


def test_a_value_error_inside_the_engine_is_a_bug_too(worker, monkeypatch):
    monkeypatch.setattr(worker._timeline.sim, "apply", lambda *a, **k: int("x"))
    assert _answer(worker, Forward()).message.startswith("internal error: ValueError(")


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (Back(), "already at the start"),
        (Undo(), "nothing to undo"),
        (Seek(10_000), "step 10000 is outside 0.."),
    ],
)
def test_the_timelines_own_refusals_stay_refusals(worker, caplog, request_, message):
    reply = _answer(worker, request_)
    assert isinstance(reply, Failed) and reply.message.startswith(message)
    assert not [r for r in caplog.records if r.name == "pagesim.worker"]


def test_views_follow_the_controllers_frames_on_their_own(qtbot):
    """No window: a view bound to the controller draws each frame it sends."""
    from pagesim.app.gui.controller import SimulationController
    from pagesim.app.gui.palette import THEMES, SequenceColours
    from pagesim.app.gui.selection import Selection
    from pagesim.app.gui.views.sequence_view import SequenceView
    from pagesim.app.gui.views.step_log import StepLog

    theme = next(iter(THEMES.values()))
    controller = SimulationController("cpu")
    try:
        selection, log, table = Selection(), StepLog(), SequenceView(SequenceColours(), theme)
        for widget in (log, table):
            qtbot.addWidget(widget)
            widget.show()
        selection.bind(controller)
        table.bind(controller, selection)
        log.bind(controller)
        controller.load(load_scenario(synthetic("default")))
        qtbot.waitUntil(lambda: controller.frame is not None and not controller.pending, timeout=20_000)
        controller.seek(3)
        qtbot.waitUntil(lambda: controller.frame.position == 3 and not controller.pending, timeout=20_000)
        live = [s.seq_id for s in controller.frame.sequences]
        assert live and table.topLevelItemCount() == len(live) and table.selected == selection.current == live[0]
        assert log.count() == controller.frame.length and log.currentRow() == 2
    finally:
        controller.shutdown()


def test_a_seek_that_stops_short_answers_with_the_frame_where_it_stopped(qtbot):
    from pagesim.app.gui.controller import Stopped
    from pagesim.core.scenario import parse_scenario

    scenario = parse_scenario(
        "num_blocks = 4\nblock_size = 2\nnum_heads = 1\nhead_dim = 8\n"
        '[[steps]]\nop = "add"\nseq = "a"\ntokens = 3\n'
        '[[steps]]\nop = "grow"\nseq = "a"\ntokens = 50\n'
        '[[steps]]\nop = "grow"\nseq = "a"\n',
        "tight.toml",
    )
    worker = SimulationWorker("cpu")
    worker.replies = []
    worker.replied.connect(worker.replies.append)
    worker.handle(Load(scenario))
    for start, target in ((1, 2), (0, 3)):  # onto the failing step (one forward), and past it (a replay)
        worker.handle(Seek(start))
        reply = _answer(worker, Seek(target))
        assert isinstance(reply, Stopped) and reply.frame.position == worker._timeline.position == 1
        assert "step 2" in reply.message and reply.message.endswith("stopped at step 1")
        assert reply.shortfall is not None and reply.shortfall[0] > reply.shortfall[1]
