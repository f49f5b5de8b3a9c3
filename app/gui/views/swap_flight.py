"""A swap drawn as a move: tiles fly from the GPU pool to the CPU pool (swap out) or back
(swap in), across the docks, over everything and transparent to the mouse. Shown only while a
swap's beat plays, so it costs nothing on other steps."""

from __future__ import annotations

from PySide6.QtCore import QEasingCurve, QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QWidget


class SwapFlight(QWidget):
    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        self.setAttribute(Qt.WidgetAttribute.WA_NoSystemBackground)
        self.flights: list[tuple[QRectF, QRectF, QColor, str]] = []  # from, to, colour, label
        self.progress = 0.0
        self._ease = QEasingCurve(QEasingCurve.Type.InOutCubic)
        self.hide()

    def start(self, flights: list[tuple[QRectF, QRectF, QColor, str]]) -> None:
        self.flights = flights
        self.progress = 0.0
        if not flights:
            self.hide()
            return
        self.setGeometry(self.parentWidget().rect())
        self.raise_()
        self.show()
        self.update()

    def set_progress(self, progress: float) -> None:
        if self.flights:
            self.progress = min(1.0, max(0.0, progress))
            self.update()

    def stop(self) -> None:
        self.flights = []
        self.hide()

    def tile_at(self, index: int) -> QRectF:
        """Where flight ``index``'s tile is now (window coordinates)."""
        src, dst, _, _ = self.flights[index]
        t = self._ease.valueForProgress(self.progress)
        centre = QPointF(src.center() * (1 - t) + dst.center() * t)
        width = src.width() * (1 - t) + dst.width() * t
        height = src.height() * (1 - t) + dst.height() * t
        return QRectF(centre.x() - width / 2, centre.y() - height / 2, width, height)

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        for index, (src, dst, colour, label) in enumerate(self.flights):
            trail = QColor(colour)
            trail.setAlpha(90)
            painter.setPen(QPen(trail, 1.5, Qt.PenStyle.DashLine))
            painter.drawLine(src.center(), dst.center())
            tile = self.tile_at(index)
            painter.setPen(QPen(QColor("#000000"), 1))
            painter.setBrush(colour)
            painter.drawRoundedRect(tile, 3, 3)
            if label and tile.width() >= 22:
                painter.setPen(QColor("#000000"))
                painter.drawText(tile, Qt.AlignmentFlag.AlignCenter, label)
        painter.end()
