"""Which sequence the user is looking at, kept consistent with the frames that arrive."""

from __future__ import annotations

from pagesim.core.view_model import Frame


class Selection:
    """The selected sequence. A sequence the user just added is selected as soon as a
    frame shows it; a selection that disappears (freed, preempted) passes to the row that
    took its place (the next one, or the one before when it was last), then to the worker's
    focus, then to the first sequence."""

    def __init__(self) -> None:
        self.current: str | None = None
        self._expected: str | None = None
        self._order: list[str] = []  # the previous frame's sequences, in their rows' order

    def bind(self, controller) -> None:
        """Reconcile with each frame. Bind this before any view: they read ``current``."""
        controller.frameChanged.connect(self.reconcile)

    def expect(self, seq_id: str) -> None:
        """Select ``seq_id`` once a frame shows it (an operation that creates it is on its way)."""
        self._expected = seq_id

    def reset(self) -> None:
        self.current = self._expected = None
        self._order = []

    def reconcile(self, frame: Frame) -> str | None:
        live = {s.seq_id for s in frame.sequences}
        if self._expected in live:
            self.current = self._expected
        self._expected = None
        if self.current not in live:
            self.current = self._neighbour(live) or (
                frame.focus.seq_id if frame.focus else (frame.sequences[0].seq_id if live else None)
            )
        self._order = [s.seq_id for s in frame.sequences]
        return self.current

    def _neighbour(self, live: set[str]) -> str | None:
        """The row that took the vanished selection's place: the next one still live, else the one before."""
        if self.current not in self._order:
            return None
        at = self._order.index(self.current)
        after, before = self._order[at + 1 :], self._order[:at][::-1]
        return next((seq for seq in (*after, *before) if seq in live), None)

    def next_holder(self, holders: tuple[tuple[str, int], ...]) -> str | None:
        """Clicking a shared block cycles through the sequences that hold it."""
        seqs = [seq for seq, _ in holders]
        if not seqs:
            return None
        return seqs[(seqs.index(self.current) + 1) % len(seqs)] if self.current in seqs else seqs[0]
