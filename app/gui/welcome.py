"""A first-run path: what pagesim shows, and the shipped scenarios in the order a learner
should take them, each openable from here. Shown at the first interactive start (and
from Help → Welcome)."""

from __future__ import annotations

from pagesim.core.scenario import examples
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QVBoxLayout,
)

INTRO = (
    "<h3>Welcome to pagesim</h3>"
    "<p>A serving engine like vLLM keeps every sequence's keys and values (its <b>KV cache</b>) in fixed-size "
    "<b>blocks</b> of one shared pool, found through a per-sequence <b>block table</b> — like pages of virtual "
    "memory. pagesim shows the pool (centre), the tables (left) and, on every step, a real paged-attention "
    "kernel reading through the tables and checked against dense attention (right).</p>"
    "<p>Step with → (Space plays), go back with ←; A adds a sequence, G grows the selected one, F forks it. "
    "Under the pool, one sentence says what each step did. Start with these, in this order:</p>"
)


class WelcomeDialog(QDialog):
    def __init__(self, open_example, parent=None, show_at_start: bool = True) -> None:
        """``open_example(name)`` opens a shipped scenario."""
        super().__init__(parent)
        self.setWindowTitle("Welcome to pagesim")
        self.open_example = open_example
        intro = QLabel(INTRO)
        intro.setWordWrap(True)
        self.list = QListWidget()
        for number, (name, scenario) in enumerate(examples(), start=1):
            item = QListWidgetItem(f"{number}. {scenario.name} — {scenario.summary()}")
            item.setData(Qt.ItemDataRole.UserRole, name)
            item.setToolTip(" ".join(scenario.description.split()))
            self.list.addItem(item)
        self.list.setCurrentRow(0)
        # One line each, cut with "…" where the dialog is narrow; the tooltip has it all.
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.itemActivated.connect(lambda _: self.accept())
        self.at_start = QCheckBox("Show this at start")
        self.at_start.setChecked(show_at_start)
        buttons = QDialogButtonBox()
        self.open_button = buttons.addButton("Open", QDialogButtonBox.ButtonRole.AcceptRole)
        buttons.addButton("Close", QDialogButtonBox.ButtonRole.RejectRole)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.at_start)
        layout.addWidget(buttons)
        self.resize(820, 520)

    def accept(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            self.open_example(item.data(Qt.ItemDataRole.UserRole))
        super().accept()
