"""A word-wrapped label that keeps to a number of lines and ends with "…" where the text
goes on (the whole text in its tooltip), instead of being cut mid-line."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QLabel, QSizePolicy


class ElidedLabel(QLabel):
    def __init__(self, max_lines: int = 3, parent=None) -> None:
        super().__init__(parent)
        self.max_lines = max_lines
        self.full_text = ""
        self.setWordWrap(True)
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

    def fits(self, text: str) -> bool:
        rect = self.contentsRect().adjusted(0, 0, 0, 100_000)
        height = self.fontMetrics().boundingRect(rect, int(Qt.TextFlag.TextWordWrap), text).height()
        return height <= self.contentsRect().height()

    def _fit(self) -> None:
        text = self.full_text
        if not text or self.contentsRect().width() <= 0 or self.fits(text):
            self.setText(text)
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
