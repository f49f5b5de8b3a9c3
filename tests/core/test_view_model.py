"""Frames are plain data: views draw from values, never from engine objects."""

import dataclasses

import numpy as np
import pytest
from pagesim.core.engine import Simulator, StepResult
from pagesim.core.model_runner import AttentionReport, ModelRunner
from pagesim.core.scenario import load_scenario
from pagesim.core.timeline import Timeline
from pagesim.core.view_model import build_frame

from tests.scenarios import token_model

ENGINE_TYPES = (StepResult, AttentionReport, Simulator, ModelRunner, Timeline)


def _engine_objects(value, path="frame"):
    """Paths inside ``value`` that hold an engine object."""
    if isinstance(value, ENGINE_TYPES):
        return [path]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
        return [p for name, v in fields for p in _engine_objects(v, f"{path}.{name}")]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _engine_objects(v, f"{path}[{k!r}]")]
    if isinstance(value, tuple | list | frozenset | set):
        return [p for i, v in enumerate(value) for p in _engine_objects(v, f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("name", ["default", "preemption_swap", "beam_search"])
def test_frames_carry_plain_values_and_the_verdict_computed_in_core(cpu_backend, name):
    timeline = Timeline(load_scenario(token_model(name)), cpu_backend)
    frame = build_frame(timeline, None)
    assert frame.events is None and frame.step_lookup("A") is None  # not a step: nothing to animate
    while not timeline.at_end:
        result = timeline.forward()
        frame = build_frame(timeline, None, result, frame)
        assert _engine_objects(frame) == [], (name, timeline.position)
        assert frame.events == result.op_events
        assert frame.status_notes == tuple(n for e in result.op_events if (n := e.status_note()))
        report = result.attention
        if report is None:
            assert frame.attention is None
            continue
        assert frame.attention.passed == report.passed and frame.attention.seq_ids == report.seq_ids
        for seq_id in report.seq_ids:
            assert frame.step_lookup(seq_id) == result.lookup_of(seq_id)
        if frame.focus is not None:
            row = report.index_of(frame.focus.seq_id)
            np.testing.assert_array_equal(frame.focus.head_passed, report.head_errors[row] <= report.tolerances[row])
    assert frame.backend == cpu_backend.name and frame.device == cpu_backend.device
