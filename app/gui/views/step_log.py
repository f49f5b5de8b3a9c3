"""Every step in one line (what it did, in vLLM's words), synced with the timeline:
the current step is selected, and clicking a line seeks there."""

from __future__ import annotations

from pagesim.core.view_model import Frame
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QAbstractItemView, QListWidget, QListWidgetItem


class StepLog(QListWidget):
    seekRequested = Signal(int)  # the step to go to

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setWordWrap(False)
        # A long line ends in "…" at the log's width (its tooltip has it whole): a sideways scroll
        # bar cut lines without a mark and hid the current one behind it.
        self.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setUniformItemSizes(True)
        self.setToolTip("Every step of the timeline; click one to go there")
        self._lines: tuple[str, ...] = ()
        self._syncing = False
        self._pending: Frame | None = None  # the newest frame while the log is hidden
        self.itemClicked.connect(lambda item: self.seekRequested.emit(self.row(item) + 1))

    def bind(self, controller) -> None:
        """Follow the controller's frames; a click on a line seeks there."""
        controller.frameChanged.connect(self.show_frame)
        self.seekRequested.connect(controller.seek)

    def show_frame(self, frame: Frame) -> None:
        """Rewrite only the lines that changed, then select the current step. Off screen
        (behind another tab of its dock) the log waits: :meth:`catch_up` shows the newest
        frame when its tab comes up."""
        if self.visibleRegion().isEmpty():
            self._pending = frame
            return
        self._pending = None
        self._show(frame)

    def catch_up(self) -> None:
        if self._pending is not None:
            frame, self._pending = self._pending, None
            self._show(frame)

    def _show(self, frame: Frame) -> None:
        lines = frame.captions
        if lines is not self._lines:
            while self.count() > len(lines):
                self.takeItem(self.count() - 1)
            old, count = self._lines, self.count()
            # A step changes one line (its caption replaces "not played yet"): find it in one pass
            # (zip stops at the shorter: lines past it are added or were removed above).
            changed = [i for i, (was, now) in enumerate(zip(old, lines, strict=False)) if was != now]
            for index in [*changed, *range(min(len(old), len(lines)), len(lines))]:
                label = f"{index + 1} · {lines[index]}"
                if index >= count:
                    item = QListWidgetItem(label)
                    item.setToolTip(label)
                    self.addItem(item)
                    count += 1
                else:
                    self.item(index).setText(label)
                    self.item(index).setToolTip(label)
            self._lines = lines
        row = frame.position - 1
        if row != self.currentRow():
            self._syncing = True
            if row < 0:
                self.clearSelection()
                self.setCurrentRow(-1)
            else:
                self.setCurrentRow(row)
                self.scrollToItem(self.item(row), QAbstractItemView.ScrollHint.EnsureVisible)
            self._syncing = False
