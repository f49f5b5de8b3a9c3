"""Errors a user can cause. Every one is raised before any state changes."""

from __future__ import annotations


class PagesimError(Exception):
    """Base class: a request the engine refused, state untouched."""


class UnknownSequenceError(PagesimError, KeyError):
    def __init__(self, seq_id: str, known: list[str]) -> None:
        listing = ", ".join(known) if known else "none"
        super().__init__(f"unknown sequence {seq_id!r} (live sequences: {listing})")
        self.seq_id = seq_id

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class DuplicateSequenceError(PagesimError):
    def __init__(self, seq_id: str, why: str = "") -> None:
        super().__init__(f"the name {seq_id!r} is taken: {why}" if why else f"sequence {seq_id!r} already exists")
        self.seq_id = seq_id


class PoolExhaustedError(PagesimError):
    def __init__(self, needed: int, free: int, what: str) -> None:
        super().__init__(
            f"KV-cache pool exhausted: {what} needs {needed} free block{'' if needed == 1 else 's'}, {free} free"
        )
        self.needed = needed
        self.free = free


class InvalidPlacementError(PagesimError):
    """An explicit physical placement that names bad, busy or repeated blocks."""


class InvalidOperationError(PagesimError):
    """An operation whose own fields make no sense (e.g. zero tokens). ``field`` names the
    one at fault, in the scenario files' vocabulary (``tokens``, ``output``, ``as``, …)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class OutOfMemoryError(PagesimError):
    """A configuration whose caches would not fit in the memory there is."""


class ScenarioError(PagesimError):
    def __init__(self, source: str, message: str, step: int | None = None, field: str | None = None) -> None:
        where = source
        if step is not None:
            where += f", step {step}"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {message}")
        self.source = source
        self.step = step
        self.field = field


class Interrupted(Exception):
    """Long work (a seek, a replay) stopped because its owner asked: the app is closing."""


class TimelineRangeError(PagesimError, IndexError):
    """A step outside the timeline, or nothing to undo or redo."""


class InvalidStudyError(PagesimError, ValueError):
    """A serving study's workload or pool that cannot be replayed (core.studies)."""
