"""Deterministic replay: the state after step k is a pure function of the scenario and
its first k operations. Snapshots every few steps make stepping back cheap."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from pagesim.core.captions import step_caption
from pagesim.core.engine import Simulator, StepResult, without_data
from pagesim.core.errors import (
    DuplicateSequenceError,
    Interrupted,
    InvalidOperationError,
    InvalidPlacementError,
    PagesimError,
    PoolExhaustedError,
    ScenarioError,
    TimelineRangeError,
    UnknownSequenceError,
)
from pagesim.core.operations import Add, Fork, Grow, Operation, Schedule, Submit
from pagesim.core.scenario import Scenario, first_sentence
from pagesim.core.token_text import text_function
from pagesim.kernels.backend import Backend

SNAPSHOT_EVERY = 16
# A real model's step costs a forward of every layer: its timeline takes a snapshot each step
# and keeps the newest few restorable with their data (undo logs), so a step back is a restore,
# not a replay from a snapshot up to sixteen steps before.
DATA_SNAPSHOTS_OF_A_REAL_MODEL = 12  # (about 5 MB each on the shipped real-model scenarios)
KEEP_ATTENTION = 4  # steps whose kernel and dense outputs stay cached; older ones recompute on a seek
_UNKNOWN = object()
MAX_SNAPSHOTS = 8  # beyond this, the snapshot closest to its neighbours goes: memory stays flat


def _field_at_fault(op: Operation, exc: PagesimError) -> str | None:
    if isinstance(exc, UnknownSequenceError):
        return "seq"
    if isinstance(exc, DuplicateSequenceError):
        return "as" if isinstance(op, Fork) else "request" if isinstance(op, Submit) else "seq"
    if isinstance(exc, InvalidPlacementError):
        return "blocks"
    if isinstance(exc, PoolExhaustedError):  # the field that asked for the tokens
        if isinstance(op, Grow) and op.token_ids is not None:
            return "token_ids"
        if isinstance(op, Add | Submit) and op.prompt is not None:
            return "prompt"
        return "tokens"
    return None


@dataclass(frozen=True)
class Edit:
    """One user action, as undo and redo need it: applied at position ``at``, it replaced
    the operations from there on (``before``: the scripted future it set aside) by ``after``."""

    at: int
    before: tuple[Operation, ...]
    after: tuple[Operation, ...]


def _never() -> bool:
    return False


class Timeline:
    """A scenario being played: step forward and back, seek, or branch with a new operation
    (undoable: the future it set aside comes back)."""

    def __init__(
        self,
        scenario: Scenario,
        backend: Backend | None = None,
        snapshot_every: int = SNAPSHOT_EVERY,
        snapshot_data: bool = True,
        history: bool = True,
    ):
        """``snapshot_data=False``: no snapshot keeps K/V arrays (a run that never steps
        back; a seek still works, rebuilding the data from the tokens). ``history=False``:
        only the current step's result and caption are kept, and no snapshot after step 0
        (a run that reports as it goes)."""
        self.scenario = scenario
        self.sim = Simulator(scenario.config, backend)
        self.operations: list[Operation] = list(scenario.operations)
        self._branch: int | object | None = _UNKNOWN  # branch_step, until the operations change
        self.snapshot_every = snapshot_every
        self.snapshot_data = snapshot_data
        self.history = history
        self.data_snapshots = 1  # the newest snapshots that keep their data
        if self.sim.runner.model.samples_from_logits and snapshot_data and history:
            self.snapshot_every = 1 if snapshot_every == SNAPSHOT_EVERY else snapshot_every
            self.data_snapshots = DATA_SNAPSHOTS_OF_A_REAL_MODEL
        self.sim.runner.keep_checkpoints(self.data_snapshots)
        self._snapshots = {0: self.sim.snapshot(with_data=False)}  # nothing to rebuild at step 0
        self._with_data: list[int] = []  # the steps whose snapshots keep their data, oldest taken first
        self._results: dict[int, StepResult] = {}
        self._undo: list[Edit] = []
        self._redo: list[Edit] = []
        self._captions: dict[int, str] = {}  # step -> what it did (core.captions), once played
        self._caption_log: tuple[str, ...] | None = None  # captions(), until something changes
        self._captions_changed: set[int] = set()  # steps whose caption changed since captions()
        # Asked between steps of a long replay: True calls it off (Interrupted). The app's
        # worker sets it so that closing the window never waits for a long seek.
        self.stop_requested: Callable[[], bool] = _never

    def _check_stop(self) -> None:
        if self.stop_requested():
            raise Interrupted(f"stopped at step {self.position}")

    def _take_snapshot(self):
        return self.sim.snapshot(with_data=self.snapshot_data)

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
            raise TimelineRangeError("already at the last step")
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
            raise TimelineRangeError("already at the start")
        self.seek(self.position - 1)
        return self.current

    def seek(self, step: int) -> None:
        """Go to ``step``. A step on the way that cannot be applied (an operation the pool
        cannot hold) stops the seek at the step before it, a whole state with its attention
        check as a seek there would give, and raises :class:`ScenarioError` naming it."""
        if not 0 <= step <= self.length:
            raise TimelineRangeError(f"step {step} is outside 0..{self.length}")
        try:
            self._replay_to(step)
        except PagesimError as exc:
            op = self.operations[self.position]
            self._settle()
            raise ScenarioError(
                self.scenario.source, f"{op.describe()}: {exc}", self.position + 1, _field_at_fault(op, exc)
            ) from exc

    def _settle(self) -> None:
        """A seek stopped short: the step it stopped on gets the attention check it skipped."""
        if self.position == 0 or self.sim.last_attention is not None:
            return
        cached = self._results.get(self.position)
        if cached is not None and cached.attention is not None:
            self.sim.last_attention = cached.attention
        else:
            self.sim.last_attention = self.sim.runner.attend(list(self.sim.sequences.values()))

    def _replay_to(self, step: int) -> None:
        if step < self.position:
            # Older snapshots keep no attention report: landing exactly on one, start from
            # the one before, so the target step's attention is recomputed.
            snaps = self._snapshots

            def checked(s: int) -> bool:
                """Its attention report is at hand (the snapshot's, or the step's cached one), and
                so are its detail events (what it wrote: a frame's step work is read off them)."""
                cached = self._results.get(s)
                if s == 0:
                    return True
                if cached is not None and cached.detail_dropped:
                    return False
                return snaps[s].last_attention is not None or (cached is not None and cached.attention is not None)

            base = max(s for s in snaps if s < step or (s == step and checked(s)))
            self.sim.restore(snaps[base])
            if self.sim.last_attention is None and base and (cached := self._results.get(base)) is not None:
                self.sim.last_attention = cached.attention
            self._drop_data_after(base)
        while self.position < step:
            self._check_stop()
            # Replayed steps skip attention: only the state matters on the way.
            last = self.position + 1 == step
            cached = self._results.get(self.position + 1)
            # The target step always ends with its attention check, computed once and cached.
            needs_attention = last and (cached is None or cached.attention is None)
            result = self.sim.apply(self.operations[self.position], attend=needs_attention)
            if cached is None or needs_attention:
                if cached is not None and cached.forwards:  # the same forwards, timed when first run: a
                    result = replace(result, forwards=cached.forwards)  # step shows one time, both ways
                self._record(result)
            else:
                if last:
                    self.sim.last_attention = cached.attention
                if step - self.position < self.data_snapshots:  # (the steps a step back may want)
                    self._snapshot_here()

    def push(self, op: Operation) -> StepResult:
        """Apply a user's operation at the current position; the later steps are set aside
        (:meth:`undo` brings them back). A refused operation raises and leaves the timeline
        as it was."""
        at = self.position
        if isinstance(op, Submit) and (reason := self.sim.scheduler.refusal(op)) is not None:
            # (a scenario may script a rejection; a user's own request is refused before it branches)
            raise InvalidOperationError(f"request {op.request} would be rejected at once: {reason}")
        scheduler = self.sim.scheduler
        if isinstance(op, Schedule) and not (scheduler.running or scheduler.waiting or scheduler.swapped):
            # (a scenario may script an idle step; a user's own would be a step that does nothing)
            raise InvalidOperationError(
                "the scheduler has no requests to run: submit one first (Add, as a request for the scheduler); "
                "your own sequences grow with Grow"
            )
        result = self.sim.apply(op)  # atomic: raises before any change
        self._undo.append(Edit(at, tuple(self.operations[at:]), (op,)))
        self._redo.clear()
        self._replace_from(at, [op])
        self._record(result)
        return result

    @property
    def can_undo(self) -> bool:
        return bool(self._undo)

    @property
    def can_redo(self) -> bool:
        return bool(self._redo)

    @property
    def branch_step(self) -> int | None:
        """The step after which the operations leave the scenario's script (None: they follow it)."""
        if self._branch is _UNKNOWN:  # the operations change only in _replace_from
            self._branch = self._find_branch()
        return self._branch

    def _find_branch(self) -> int | None:
        script = self.scenario.operations
        for index, (ours, theirs) in enumerate(zip(self.operations, script, strict=False)):
            if ours != theirs:
                return index
        return None if len(self.operations) == len(script) else min(len(self.operations), len(script))

    def undo(self) -> Edit:
        """Take back the newest user action: its scripted future returns, and the state is
        the one before the action."""
        if not self._undo:
            raise TimelineRangeError("nothing to undo")
        edit = self._undo.pop()
        self._replace_from(edit.at, list(edit.before))
        self.seek(edit.at)
        self._redo.append(edit)
        return edit

    def redo(self) -> StepResult:
        """Apply again the action :meth:`undo` took back."""
        if not self._redo:
            raise TimelineRangeError("nothing to redo")
        edit = self._redo.pop()
        self._replace_from(edit.at, list(edit.after))
        self.seek(edit.at)
        result = self.forward()
        self._undo.append(edit)
        return result

    def _replace_from(self, at: int, operations: list[Operation]) -> None:
        """Operations from index ``at`` on become ``operations``; what was computed past ``at``
        goes (the state itself is left to the caller)."""
        del self.operations[at:]
        self.operations.extend(operations)
        self._branch = _UNKNOWN
        self._snapshots = {k: v for k, v in self._snapshots.items() if k <= at}
        self._with_data = [k for k in self._with_data if k <= at]
        self._results = {k: v for k, v in self._results.items() if k <= at}
        self._captions = {k: v for k, v in self._captions.items() if k <= at}
        self._caption_log = None

    # -- captions ---------------------------------------------------------------------
    def note(self, step: int) -> str:
        """The scenario's narration of ``step``, while the timeline still follows its script there."""
        branch = self.branch_step
        return self.scenario.note(step - 1) if step >= 1 and (branch is None or step <= branch) else ""

    def caption(self, step: int) -> str:
        """What ``step`` did, in one sentence ("" if it has not been played yet)."""
        return self._captions.get(step, "")

    def captions(self) -> tuple[str, ...]:
        """One line per step of the timeline: its caption once played, else its operation."""
        log = self._caption_log
        if log is None or len(log) != self.length:
            log = tuple(self._caption_line(k) for k in range(1, self.length + 1))
        elif self._captions_changed:  # a step or a seek's replay changed some lines: those only
            lines = list(log)
            for step in self._captions_changed:
                if step <= self.length:
                    lines[step - 1] = self._caption_line(step)
            log = tuple(lines)
        self._captions_changed.clear()
        self._caption_log = log
        return log

    def _caption_line(self, step: int) -> str:
        """A played step's caption; else its operation and what the scenario's note says of it
        (so a learner can find "the swap step" before playing to it)."""
        if caption := self._captions.get(step):
            return caption
        note = self.note(step)
        return f"{self.operations[step - 1].describe()} (not played yet)" + (
            f": {first_sentence(note, 120)}" if note else ""
        )

    def run_to_end(self) -> list[StepResult]:
        out = []
        while not self.at_end:
            out.append(self.forward())
        return out

    def events_through_now(self) -> Iterator[StepResult]:
        """Every step's result up to the current one, with all its events (an old step's
        attention events are recomputed by a replay of the operations, on a scratch copy)."""
        if all((r := self._results.get(k)) is not None and not r.detail_dropped for k in range(1, self.position + 1)):
            yield from (self._results[k] for k in range(1, self.position + 1))
            return
        scenario = replace(self.scenario, operations=tuple(self.operations[: self.position]))
        replay = Timeline(scenario, self.sim.runner.backend, snapshot_data=False, history=False)
        while not replay.at_end:
            self._check_stop()
            yield replay.forward()

    def _record(self, result: StepResult) -> None:
        caption = step_caption(result, text_function(self.sim.runner.model))
        if not self.history:
            # A run that reports as it goes keeps nothing per step, and no snapshot past step
            # 0 (a seek, which such a run never makes, replays from the start).
            self._results, self._captions, self._caption_log = {result.step: result}, {result.step: caption}, None
            return
        if self._captions.get(result.step) != caption:
            self._captions[result.step] = caption
            self._captions_changed.add(result.step)  # captions() rewrites these lines only
        self._results[result.step] = result
        # Old steps keep their operation's events and metrics; their attention arrays and
        # detail events are recomputed if a seek lands there, so memory does not grow with
        # the steps played.
        old = self._results.get(result.step - KEEP_ATTENTION)
        if old is not None and not old.detail_dropped:
            kept = tuple(e for e in old.op_events if not e.detail)
            self._results[old.step] = replace(old, attention=None, op_events=kept, detail_dropped=True)
        self._snapshot_here()

    def _snapshot_here(self) -> None:
        """A snapshot of the current step, every ``snapshot_every`` steps. Only the newest ones
        taken keep the K/V arrays and the attention report (undo logs: the paged caches keep
        that many restorable); older ones rebuild them from the tokens when restored."""
        step = self.position
        if step % self.snapshot_every:
            return
        self._snapshots[step] = self._take_snapshot()
        if step in self._with_data:
            self._with_data.remove(step)
        self._with_data.append(step)
        for old in self._with_data[: -self.data_snapshots]:
            if old in self._snapshots:
                self._snapshots[old] = without_data(self._snapshots[old])
        del self._with_data[: -self.data_snapshots]
        self._thin_snapshots()

    def _drop_data_after(self, base: int) -> None:
        """A restore to ``base`` ended every checkpoint after it: their snapshots keep no data."""
        for k in [k for k in self._with_data if k > base]:
            if k in self._snapshots:
                self._snapshots[k] = without_data(self._snapshots[k])
            self._with_data.remove(k)

    def _thin_snapshots(self) -> None:
        """Keep at most MAX_SNAPSHOTS: drop the one (not the first or the newest) whose
        neighbours are closest, so they thin out evenly over a long run. Those that keep their
        data (the newest taken: a step back restores them) stay."""
        while len(self._snapshots) > MAX_SNAPSHOTS:
            steps = sorted(self._snapshots)
            kept = set(self._with_data)
            gaps = [(steps[i + 1] - steps[i - 1], steps[i]) for i in range(1, len(steps) - 1) if steps[i] not in kept]
            if not gaps:
                return
            del self._snapshots[min(gaps)[1]]
