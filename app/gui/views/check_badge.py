"""The kernel check folded to a badge: ✓ when this step's paged kernel gave what dense attention
gives for every sequence, ✗ when not. The Check panel is folded away by default, and whenever
the window narrows past ``FOLD_BELOW`` px, so that the pool gets its width; a click on the
badge opens it (another click folds it again)."""

from __future__ import annotations

from pagesim.app.gui.palette import Theme
from pagesim.core.view_model import Frame
from PySide6.QtCore import QEvent, QObject, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QAbstractButton, QDockWidget, QSizePolicy, QTabWidget, QWidget

FOLD_BELOW = 1400  # px of window width: narrower, the Check panel folds to its badge
OPEN_WIDTH = 420  # px: about the width the panel opens with
# Opened in a narrow window: the shares of its width the sequences' column and the panel take
# (at 1024 px: 307 and 317, leaving the pool about 380; a narrower column stacked its table's
# entries one per line, a row taller than the table).
NARROW_LEFT_SHARE, NARROW_CHECK_SHARE = 0.30, 0.31
TEXTS = {
    None: "· kernel check",
    True: "✓ kernel = dense",
    False: "✗ kernel ≠ dense",
}
TIPS = {
    None: "No attention ran at this step yet. Click to open the Check panel.",
    True: "Every sequence's paged-attention output matches dense attention on the same tokens, within the "
    "bound that rounding explains. The check runs after every step, also one that only moved blocks (a fork, a "
    "free): the kernel reads each live sequence's K/V through its block table as it is now. Click to open the "
    "Check panel (the numbers, per head).",
    False: "A sequence's paged-attention output differs from dense attention by more than rounding explains "
    "(now, or at an earlier engine step of this step's schedule). Click to open the Check panel.",
}


class CheckBadge(QAbstractButton):
    """Its size never changes with the verdict: a new verdict only repaints it."""

    def __init__(self, theme: Theme, parent=None) -> None:
        super().__init__(parent)
        self.theme = theme
        self.passed: bool | None = None
        self.setCheckable(True)  # checked while the panel is open
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        self.setObjectName("check-badge")
        self._show(None)

    def sizeHint(self) -> QSize:
        metrics = self.fontMetrics()
        width = max(metrics.horizontalAdvance(text + " ▸") for text in TEXTS.values())
        return QSize(width + 18, metrics.height() + 8)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()

    def bind(self, controller) -> None:
        controller.frameChanged.connect(self.show_frame)

    def show_frame(self, frame: Frame) -> None:
        passed = None if frame.attention is None else bool(frame.attention.passed)
        if frame.engine_steps_failed:  # (an earlier engine step of the op's schedule: ✗ all the same)
            passed = False
        if passed != self.passed:
            self._show(passed)

    def _show(self, passed: bool | None) -> None:
        self.passed = passed
        self.setText(TEXTS[passed])
        self.setToolTip(TIPS[passed])
        self.update()

    def paintEvent(self, event) -> None:
        theme = self.theme
        colour = QColor({None: theme.muted, True: theme.good, False: theme.bad}[self.passed])
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(self.rect()).adjusted(1, 1, -1, -1)
        fill = QColor(colour)
        fill.setAlpha(70 if self.isChecked() or self.underMouse() else 30)
        painter.setPen(QPen(colour, 1.5))
        painter.setBrush(fill)
        painter.drawRoundedRect(rect, rect.height() / 2, rect.height() / 2)
        painter.setPen(QColor(theme.text))
        arrow = " ▾" if self.isChecked() else " ▸"  # open, or opens on a click
        painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, self.text() + arrow)
        painter.end()

    def enterEvent(self, event) -> None:
        super().enterEvent(event)
        self.update()

    def leaveEvent(self, event) -> None:
        super().leaveEvent(event)
        self.update()


class CheckFold(QObject):
    """Whether the Check panel (the kernel dock) is open or folded to the badge."""

    def __init__(self, window: QWidget, dock: QDockWidget, tabs: QTabWidget, check: QWidget, badge: CheckBadge):
        super().__init__(window)
        self.window, self.dock, self.tabs, self.check, self.badge = window, dock, tabs, check, badge
        self._wide: bool | None = None  # the window's last side of FOLD_BELOW (None: not seen yet)
        self._left_width: int | None = None  # the sequences' column's width before a narrow open
        badge.clicked.connect(self._clicked)
        dock.visibilityChanged.connect(lambda _: self._follow_dock())
        window.installEventFilter(self)
        self.fold()

    @property
    def is_open(self) -> bool:
        return not self.dock.isHidden()

    def open(self) -> None:
        """The Check panel, in front. In a window narrower than FOLD_BELOW the sequences'
        column gives up width too: the panel alone took a third of 1024 px from the pool,
        whose tiles lost their numbers and its legend its words."""
        self.dock.show()
        self.dock.raise_()
        self.tabs.setCurrentWidget(self.check)
        self._follow_dock()
        width = self.window.width()
        left = getattr(self.window, "sequences_dock", None)
        docked = left is not None and left.isVisible() and not left.isFloating() and not self.dock.isFloating()
        if width < FOLD_BELOW and docked:
            if self._left_width is None:
                self._left_width = left.width()  # (given back when the panel folds)
            self.window.resizeDocks(
                [left, self.dock],
                [int(width * NARROW_LEFT_SHARE), int(width * NARROW_CHECK_SHARE)],
                Qt.Orientation.Horizontal,
            )

    def fold(self) -> None:
        self.dock.hide()
        self._follow_dock()
        left = getattr(self.window, "sequences_dock", None)
        if self._left_width is not None and left is not None and not left.isFloating():
            self.window.resizeDocks([left], [self._left_width], Qt.Orientation.Horizontal)
        self._left_width = None

    def _clicked(self) -> None:
        if self.is_open and self.tabs.currentWidget() is self.check:
            self.fold()
        else:
            self.open()

    def _follow_dock(self) -> None:
        self.badge.setChecked(self.is_open)
        self.badge.update()

    def _lay_out_folded(self) -> None:
        """A dock never shown has never been laid out: its word-wrapped labels count their
        lines at no width, so its minimum height is too large, and opening it grew the window
        by those pixels. Lay its contents out once, at the width it opens with."""
        self.dock.resize(self.dock.size().expandedTo(QSize(OPEN_WIDTH, 600)))
        for widget in reversed([self.dock, *self.dock.findChildren(QWidget)]):
            widget.updateGeometry()
            if widget.layout() is not None:
                widget.layout().invalidate()
                widget.layout().activate()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.window and event.type() == QEvent.Type.Show and not self.is_open:
            self._lay_out_folded()  # now that the window's style sheet has reached it
        if watched is self.window and event.type() == QEvent.Type.Resize:
            wide = event.size().width() >= FOLD_BELOW
            if not wide and self._wide is not False and self.is_open and not self.dock.isFloating():
                self.fold()  # narrowed past the threshold: the pool gets the width back
            self._wide = wide
        return False
