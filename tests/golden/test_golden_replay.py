"""Behaviour is unchanged: each shipped scenario's run report and event log equal the ones
recorded in tests/golden (``python -m tests.golden.replay --record`` after an intended change)."""

import gzip
import json

import pytest
from pagesim.core.scenario import shipped_scenarios

from tests.golden.replay import clean, path_for, replay


@pytest.mark.parametrize("name", sorted(shipped_scenarios()))
def test_replay_matches_the_recorded_one(name):
    recorded = json.loads(gzip.decompress(path_for(name).read_bytes()))
    # (Files recorded before a key was dropped still hold it.)
    recorded = {key: [clean(r, False) for r in recorded[key]] for key in ("steps", "events")}
    now = replay(name)
    # A real model's steps: every layer within its bound and the paged engine's tokens the
    # dense engine's (the recorded file says so too; this says it whatever was recorded).
    for step in now["steps"]:
        assert step["passed"], f"step {step['step']} failed its check"
        if "layers" in step:
            assert step["layers"]["passed"] and step["layers"]["same_next_tokens"], step["step"]
    assert now["steps"] == recorded["steps"]
    assert len(now["events"]) == len(recorded["events"])
    for i, (got, want) in enumerate(zip(now["events"], recorded["events"], strict=True)):
        assert got == want, f"event {i} differs"
