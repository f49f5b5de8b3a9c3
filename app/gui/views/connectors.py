"""Lines from the selected sequence's block-table entries to the pool tiles they name, in
the manner of the vLLM paper's figures 6–8: drawn over the whole window (the table and the
pool live in different panels), never catching the mouse."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QPoint, QPointF, QRect, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QWidget

from app.gui.views.pool_view import PoolView
from app.gui.views.sequence_view import SequenceView


class TableToPoolLines(QWidget):
    def __init__(self, window: QWidget, sequence_view: SequenceView, pool_view: PoolView) -> None:
        super().__init__(window)
        self.setObjectName("table-to-pool-lines")
        self.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        self.setAttribute(Qt.WidgetAttribute.WA_NoSystemBackground)
        self.sequence_view, self.pool_view = sequence_view, pool_view
        self.seq_id: str | None = None
        self.table: tuple[int, ...] = ()
        self.colour = QColor("white")
        self.lit: int | None = None  # a logical block to draw bold (the walk-through's lookup)
        self.enabled = True
        for view in (sequence_view, pool_view):
            for bar in (view.verticalScrollBar(), view.horizontalScrollBar()):
                bar.valueChanged.connect(self.update)
                bar.rangeChanged.connect(self.update)
        pool_view.transformed.connect(self.update)
        window.installEventFilter(self)
        self.setGeometry(window.rect())

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Resize:
            self.setGeometry(watched.rect())
            self.raise_()
        return False

    def set_enabled(self, enabled: bool) -> None:
        self.enabled = enabled
        self.update()

    def show_sequence(self, seq_id: str | None, table, colour: QColor, lit: int | None = None) -> None:
        state = (seq_id, tuple(table), colour.name(), lit)
        if state == (self.seq_id, self.table, self.colour.name(), self.lit):
            return
        self.seq_id, self.table, self.colour, self.lit = seq_id, tuple(table), QColor(colour), lit
        self.raise_()
        self.update()

    def segments(self) -> list[tuple[int, QPointF, QPointF]]:
        """(logical block, start on its table entry, end on its pool tile) in this widget's
        coordinates, for the entries and tiles both on screen."""
        window = self.parentWidget()
        table_port, pool_port = self.sequence_view.viewport(), self.pool_view.viewport()
        if not self.enabled or self.seq_id is None or not self.table:
            return []
        for port in (table_port, pool_port):
            if not port.isVisible() or not window.isAncestorOf(port):  # hidden, or in a floating panel
                return []
        table_clip = QRect(table_port.mapTo(window, table_port.rect().topLeft()), table_port.size())
        pool_clip = QRect(pool_port.mapTo(window, pool_port.rect().topLeft()), pool_port.size())
        out = []
        for logical, entry in self.sequence_view.entry_rects(self.seq_id):
            if logical >= len(self.table):
                break
            start = table_port.mapTo(window, QPoint(entry.center().x(), entry.bottom()))
            tile = self.pool_view.tile_rect(self.table[logical])
            if tile is None:
                continue
            end = pool_port.mapTo(window, QPoint(tile.left() + 2, tile.center().y()))  # its left edge
            if table_clip.contains(start) and pool_clip.contains(end):
                out.append((logical, QPointF(start), QPointF(end)))
        return out

    def paintEvent(self, event) -> None:
        segments = self.segments()
        if not segments:
            return
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        faint, bold = QColor(self.colour), QColor(self.colour)
        faint.setAlpha(120)
        for logical, start, end in segments:
            lit = logical == self.lit
            painter.setPen(QPen(bold if lit else faint, 2.6 if lit else 1.2))
            path = QPainterPath(start)  # down out of the table row, then across into the tile's left side
            bend = max(40.0, abs(end.x() - start.x()) * 0.45)
            path.cubicTo(QPointF(start.x(), start.y() + 40), QPointF(end.x() - bend, end.y()), end)
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawPath(path)
            painter.setBrush(bold if lit else faint)
            painter.drawEllipse(start, 2.0, 2.0)
            painter.drawEllipse(end, 2.5, 2.5)
        painter.end()
