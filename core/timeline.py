"""Deterministic replay: the state after step k is a pure function of the scenario and
its first k operations. Snapshots every few steps make stepping back cheap."""

from __future__ import annotations

from dataclasses import replace

from core.engine import Simulator, StepResult, without_data
from core.errors import (
    DuplicateSequenceError,
    InvalidPlacementError,
    PagesimError,
    PoolExhaustedError,
    ScenarioError,
    UnknownSequenceError,
)
from core.operations import Fork, Operation, Submit
from core.scenario import Scenario
from kernels.backend import Backend

SNAPSHOT_EVERY = 16
KEEP_ATTENTION = 32  # steps whose kernel and dense outputs stay cached; older ones recompute on a seek


def _field_at_fault(op: Operation, exc: PagesimError) -> str | None:
    if isinstance(exc, UnknownSequenceError):
        return "seq"
    if isinstance(exc, DuplicateSequenceError):
        return "as" if isinstance(op, Fork) else "request" if isinstance(op, Submit) else "seq"
    if isinstance(exc, InvalidPlacementError):
        return "blocks"
    if isinstance(exc, PoolExhaustedError):
        return "tokens"
    return None


class Timeline:
    """A scenario being played: step forward and back, seek, or branch with a new operation."""

    def __init__(
        self,
        scenario: Scenario,
        backend: Backend | None = None,
        snapshot_every: int = SNAPSHOT_EVERY,
        snapshot_data: bool = True,
    ):
        """``snapshot_data=False``: no snapshot keeps K/V arrays (a run that never steps
        back; a seek still works, rebuilding the data from the tokens)."""
        self.scenario = scenario
        self.sim = Simulator(scenario.config, backend)
        self.operations: list[Operation] = list(scenario.operations)
        self.snapshot_every = snapshot_every
        self.snapshot_data = snapshot_data
        self._snapshots = {0: self._take_snapshot()}
        self._results: dict[int, StepResult] = {}

    def _take_snapshot(self):
        snap = self.sim.snapshot()
        return snap if self.snapshot_data else without_data(snap)

    @property
    def position(self) -> int:
        """Steps applied so far (0 = the scenario's empty start)."""
        return self.sim.step

    @property
    def length(self) -> int:
        return len(self.operations)

    @property
    def at_end(self) -> bool:
        return self.position >= self.length

    @property
    def current(self) -> StepResult | None:
        return self._results.get(self.position)

    def result(self, step: int) -> StepResult | None:
        return self._results.get(step)

    def forward(self) -> StepResult:
        """Apply the next operation. A failing step raises :class:`ScenarioError` and changes nothing."""
        if self.at_end:
            raise IndexError("already at the last step")
        op = self.operations[self.position]
        try:
            result = self.sim.apply(op)
        except PagesimError as exc:
            raise ScenarioError(
                self.scenario.source, f"{op.describe()}: {exc}", self.position + 1, _field_at_fault(op, exc)
            ) from exc
        self._record(result)
        return result

    def back(self) -> StepResult | None:
        if self.position == 0:
            raise IndexError("already at the start")
        self.seek(self.position - 1)
        return self.current

    def seek(self, step: int) -> None:
        if not 0 <= step <= self.length:
            raise IndexError(f"step {step} is outside 0..{self.length}")
        if step < self.position:
            base = max(s for s in self._snapshots if s <= step)
            self.sim.restore(self._snapshots[base])
        while self.position < step:
            # Replayed steps skip attention: only the state matters on the way.
            last = self.position + 1 == step
            cached = self._results.get(self.position + 1)
            # The target step always ends with its attention check, computed once and cached.
            needs_attention = last and (cached is None or cached.attention is None)
            result = self.sim.apply(self.operations[self.position], attend=needs_attention)
            if cached is None or needs_attention:
                self._record(result)
            elif last:
                self.sim.last_attention = cached.attention

    def push(self, op: Operation) -> StepResult:
        """Apply a user's operation at the current position, dropping any later steps.
        A refused operation raises and leaves the timeline as it was."""
        result = self.sim.apply(op)  # atomic: raises before any change
        del self.operations[self.position - 1 :]
        self.operations.append(op)
        self._snapshots = {k: v for k, v in self._snapshots.items() if k < self.position}
        self._results = {k: v for k, v in self._results.items() if k < self.position}
        self._record(result)
        return result

    def run_to_end(self) -> list[StepResult]:
        out = []
        while not self.at_end:
            out.append(self.forward())
        return out

    def _record(self, result: StepResult) -> None:
        self._results[result.step] = result
        # Old steps keep their events and metrics; their attention arrays are recomputed if a
        # seek lands there, so memory does not grow with the steps played.
        old = self._results.get(result.step - KEEP_ATTENTION)
        if old is not None and old.attention is not None:
            self._results[old.step] = replace(old, attention=None)
        if result.step % self.snapshot_every == 0:
            # Only the newest snapshot keeps the K/V arrays; older ones rebuild them from the
            # tokens when restored, so memory stays flat however many steps are played.
            self._snapshots = {k: without_data(v) if v.cache is not None else v for k, v in self._snapshots.items()}
            self._snapshots[result.step] = self._take_snapshot()
