"""Rich text that changes on every step, without re-laying out the window.

A QLabel's ``setText`` calls ``updateGeometry``, and a layout that re-activates passes it
up (``QLayout::activate`` ends in the parent's ``updateGeometry``), so one changed number
in a dock re-lays out the whole main window, every step. This widget keeps its height
while the text changes: it grows (up to ``max_lines``) only when a text needs more lines
than it has, and fits itself again when its width changes; a new text of the same height
only repaints it. Text beyond ``max_lines`` is cut at a whole line with "…", and is whole
in the tooltip.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QEvent, QRectF, QSize, Qt
from PySide6.QtGui import QAbstractTextDocumentLayout, QPainter, QPalette, QTextDocument
from PySide6.QtWidgets import QSizePolicy, QWidget

ELLIPSIS = " …"


class LiveText(QWidget):
    def __init__(self, lines: int = 1, max_lines: int | None = None, width_chars: int | None = None, parent=None):
        """At least ``lines`` high, at most ``max_lines``; ``width_chars``: a fixed width
        of that many average characters (a toolbar's label), else as wide as the layout gives."""
        super().__init__(parent)
        self.min_lines = self.lines = lines
        self.max_lines = max(lines, max_lines or lines)
        self.width_chars = width_chars
        self._html = ""
        self._base_tooltip = ""
        self._doc = QTextDocument(self)  # owned by the widget: gone with it, before the app
        self._doc.setDocumentMargin(0)
        self._doc.setUndoRedoEnabled(False)
        self._cut = False
        horizontal = QSizePolicy.Policy.Fixed if width_chars else QSizePolicy.Policy.Ignored
        self.setSizePolicy(horizontal, QSizePolicy.Policy.Fixed)
        self._fit_size()

    # -- the QLabel calls the views use ----------------------------------------------------
    def setText(self, html: str) -> None:  # Qt's name: it stands in for a QLabel
        if html == self._html:
            return
        self._html = html
        self._doc.setHtml(html)
        self._doc.setDefaultFont(self.font())
        self._relayout(shrink=False)  # growing re-lays out once; shrinking waits for a resize
        self.update()

    def text(self) -> str:
        return self._html

    def fit_to_text(self) -> None:
        """Shrink (or grow) to the lines the current text needs: a new start, not every step."""
        self._relayout(shrink=True)

    def plain_text(self) -> str:
        return self._doc.toPlainText()

    def setToolTip(self, text: str) -> None:
        """The explanation shown on hover; the whole text is added to it when cut."""
        self._base_tooltip = text
        self._show_tooltip()

    @property
    def is_cut(self) -> bool:
        return self._cut

    # -- size and layout ---------------------------------------------------------------------
    def _fit_size(self) -> None:
        metrics = self.fontMetrics()
        self.setFixedHeight(self.lines * metrics.lineSpacing() + 2)
        if self.width_chars:
            self.setFixedWidth(self.width_chars * metrics.averageCharWidth())

    def sizeHint(self) -> QSize:
        chars = self.width_chars or 10
        return QSize(chars * self.fontMetrics().averageCharWidth(), self.height())

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._fit_size()
            self._doc.setDefaultFont(self.font())
            self._relayout(shrink=True)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self._relayout(shrink=True)

    def _relayout(self, shrink: bool) -> None:
        self._doc.setTextWidth(max(1, self.width()))
        line = self.fontMetrics().lineSpacing()
        needed = min(self.max_lines, max(self.min_lines, math.ceil((self._doc.size().height() - 1) / line)))
        if needed > self.lines or (shrink and needed < self.lines):
            self.lines = needed
            self._fit_size()
        self._cut = self._doc.size().height() > self.height() + 1
        self._show_tooltip()

    def _show_tooltip(self) -> None:
        whole = self.plain_text() if self._cut else ""
        tip = "\n\n".join(t for t in (whole, self._base_tooltip) if t)
        super().setToolTip(tip)

    # -- painting --------------------------------------------------------------------------------
    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        context = QAbstractTextDocumentLayout.PaintContext()
        context.palette.setColor(QPalette.ColorRole.Text, self.palette().color(QPalette.ColorRole.WindowText))
        if not self._cut:
            self._doc.documentLayout().draw(painter, context)
            return
        metrics = self.fontMetrics()
        if self.max_lines == 1 and "<" not in self._html:  # one plain line: Qt's own elision
            painter.setPen(self.palette().color(QPalette.ColorRole.WindowText))
            elided = metrics.elidedText(self.plain_text(), Qt.TextElideMode.ElideRight, self.width())
            painter.drawText(self.rect(), int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter), elided)
            return
        # Cut: the whole lines that fit, then "…" over the end of the last one.
        line = metrics.lineSpacing()
        shown = max(1, int(self.height() // line)) * line
        context.clip = QRectF(0, 0, self.width(), shown)
        painter.setClipRect(context.clip)
        self._doc.documentLayout().draw(painter, context)
        ellipsis = metrics.horizontalAdvance(ELLIPSIS) + 2
        corner = QRectF(self.width() - ellipsis, shown - line, ellipsis, line)
        painter.fillRect(corner, self.palette().color(QPalette.ColorRole.Window))
        painter.setPen(self.palette().color(QPalette.ColorRole.WindowText))
        painter.drawText(corner, int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop), ELLIPSIS)
