"""A word-wrapped label that keeps to a number of lines and ends with "…" where the text
goes on (the whole text in its tooltip), instead of being cut mid-line."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import QLabel, QSizePolicy


class ElidedLabel(QLabel):
    clicked = Signal()  # (a holder may show a cut text whole on a click)

    def __init__(self, max_lines: int = 3, parent=None, separator: str | None = None) -> None:
        super().__init__(parent)
        self.max_lines = max_lines
        # A text of parts ("a · b · c"): where it does not fit, whole parts go from the end
        # first, not half a part ("… · 9 …" said nothing of "9 heads × head dim 64").
        self.separator = separator
        self.full_text = ""
        self.opens_on_click = False  # a holder shows the whole text on a click (``clicked``)
        self.setWordWrap(True)
        self.setTextFormat(Qt.TextFormat.PlainText)  # (a scenario's name or description is text, never markup)
        self.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self._fit_height()

    def set_max_lines(self, max_lines: int) -> None:
        if max_lines != self.max_lines:
            self.max_lines = max_lines
            self._fit_height()
            self._fit()

    def _fit_height(self) -> None:
        self.setFixedHeight(self.max_lines * self.fontMetrics().lineSpacing() + 4)

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):  # a stylesheet's font size
            self._fit_height()
            self._fit()

    def set_full_text(self, text: str) -> None:
        text = " ".join(text.split())
        if text == self.full_text:  # set on every frame: fitting again costs font measuring
            return
        self.full_text = text
        self.setToolTip(self.full_text)
        self._fit()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit()

    def mouseReleaseEvent(self, event) -> None:
        super().mouseReleaseEvent(event)
        if event.button() == Qt.MouseButton.LeftButton and self.rect().contains(event.position().toPoint()):
            self.clicked.emit()

    def setText(self, text: str) -> None:
        super().setText(text)
        if self.opens_on_click:  # (the pointer says so only where there is more to show)
            self.setCursor(Qt.CursorShape.PointingHandCursor if self.elided else Qt.CursorShape.ArrowCursor)

    @property
    def elided(self) -> bool:
        return self.text() != self.full_text

    def fits(self, text: str) -> bool:
        rect = self.contentsRect().adjusted(0, 0, 0, 100_000)
        height = self.fontMetrics().boundingRect(rect, int(Qt.TextFlag.TextWordWrap), text).height()
        return height <= self.contentsRect().height()

    def _fit(self) -> None:
        text = self.full_text
        if not text or self.contentsRect().width() <= 0 or self.fits(text):
            self.setText(text)
            return
        if self.separator and self.separator in text:
            parts = text.split(self.separator)
            for count in range(len(parts) - 1, 0, -1):
                shown = self.separator.join(parts[:count]) + self.separator + "…"
                if self.fits(shown):
                    self.setText(shown)
                    return
        words = text.split(" ")
        lo, hi = 0, len(words)  # the most words that fit with "…" after them
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.fits(" ".join(words[:mid]) + " …"):
                lo = mid
            else:
                hi = mid - 1
        self.setText(" ".join(words[:lo]).rstrip(",;:") + " …")
