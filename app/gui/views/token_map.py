"""The selected sequence token by token: where each token's K/V lives. Token t is in
logical block ⌊t/B⌋ at offset t mod B, which the block table maps to a physical block."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pagesim.app.gui.palette import Theme, ink_on
from pagesim.core.token_text import quoted, visible
from pagesim.core.view_model import Frame
from PySide6.QtCore import QEvent, QRect, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QLabel, QScrollArea, QSizePolicy, QToolTip, QWidget

CELL = 14
# A real model's tokens show their text: wider cells, a long token elided ("…"); narrower,
# down to the least, where that lets a whole block fit a row.
TEXT_CELL_W, TEXT_CELL_H, MIN_TEXT_CELL_W = 48, 18, 30
KV = "K\u2060/\u2060V"  # (word joiners: a narrow dock must not break it into "K/" and "V")
GENERIC_TIP = "The selected sequence's tokens: hover one to see where its K/V lives"


def _share_of_block(block_size: int, fits: int) -> int:
    """The most cells of a block a row of ``fits`` cells holds in equal shares (a divisor of
    the block size: each block starts a row), at least one."""
    return max(d for d in range(1, max(1, min(fits, block_size)) + 1) if block_size % d == 0)


class TokenMap(QWidget):
    """One cell per token, coloured by the physical block holding it. Hover a token for its
    path (token → logical block, offset → physical block, slot) and its attention weight;
    the window lights the slot's block in the pool and the entry in the block table."""

    tokenHovered = Signal(str, int, int, int)  # seq, logical block, physical block, slot (-1: none)
    tokenPointed = Signal(str, int)  # seq, token (-1: none): the attention plot rings its weight

    def __init__(self, theme: Theme, parent=None) -> None:
        super().__init__(parent)
        self.theme = theme
        self.seq_id: str | None = None
        self.block_table: list[int] = []
        self.num_tokens = 0
        self.block_size = 1
        self.weights: np.ndarray | None = None
        self.pieces: tuple[str, ...] | None = None  # each token's text (None: synthetic ids)
        self.hovered = -1
        self.colour = QColor(theme.muted)
        self.setMouseTracking(True)
        self.setToolTip(GENERIC_TIP)
        # A line above the map (the window places it) saying whose tokens these are.
        self.caption = QLabel()
        self.caption.setTextFormat(Qt.TextFormat.PlainText)  # (it names a sequence: text, never markup)
        self.caption.setWordWrap(True)
        # It may not widen the dock as the selection changes (the pool would jump).
        self.caption.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self._frame: Frame | None = None
        self._selection = self._colours = self._head = None

    def bind(self, controller, selection, colours, head: Callable[[], int]) -> None:
        """Follow the controller's frames, showing ``selection``'s sequence (reconciled with
        each frame first) with the attention weights of query head ``head()``."""
        self._selection, self._colours, self._head = selection, colours, head
        controller.frameChanged.connect(self.show_frame)

    def show_frame(self, frame: Frame) -> None:
        self._frame = frame
        self.refresh()

    def refresh(self) -> None:
        """Show the selected sequence of the newest frame (again after a new selection)."""
        frame = self._frame
        if frame is None:
            return
        seq_id = self._selection.current
        state = frame.sequence(seq_id) if seq_id else None
        if state is None:
            self.show_sequence(None, [], 0, frame.config.block_size)
            self.caption.setText("Tokens: select a sequence")
            return
        weights = None
        if frame.focus is not None and frame.focus.seq_id == state.seq_id:
            head = min(self._head(), frame.focus.weights.shape[0] - 1)
            weights = frame.focus.weights[head]
        size = frame.config.block_size
        self.show_sequence(
            state.seq_id, state.block_table, state.num_tokens, size, weights, self._colours(state.seq_id), state.pieces
        )
        self.caption.setText(
            f"Tokens of {state.seq_id}: {state.num_tokens}, a shade per block (hover one: where its {KV} lives)"
        )
        spaces = "\nEach cell shows its token's text: · a space, ↵ a newline" if state.pieces is not None else ""
        self.caption.setToolTip(
            f"token t lives in logical block ⌊t/{size}⌋ at offset t mod {size}; "
            f"the block table maps the logical block to a physical one{spaces}"
        )

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()

    def show_sequence(
        self, seq_id, block_table, num_tokens: int, block_size: int, weights=None, colour=None, pieces=None
    ) -> None:
        """``colour``: the sequence's own (as in the pool); its blocks alternate two shades of it.
        ``pieces``: each token's text, drawn in its cell (a real model's)."""
        colour = QColor(colour) if colour is not None else QColor(self.theme.muted)
        block_table = list(block_table)
        state = (seq_id, block_table, num_tokens, block_size, colour, pieces)
        shown = (self.seq_id, self.block_table, self.num_tokens, self.block_size, self.colour, self.pieces)
        same_weights = weights is self.weights or (
            weights is not None and self.weights is not None and np.array_equal(weights, self.weights)
        )
        if state == shown and same_weights:
            return  # most steps grow some other sequence: nothing to repaint
        grew = seq_id is not None and seq_id == self.seq_id and num_tokens > self.num_tokens
        self.colour, self.pieces = colour, pieces
        self.seq_id, self.block_table = seq_id, block_table
        self.num_tokens, self.block_size, self.weights = num_tokens, block_size, weights
        self._fit_height()
        self.updateGeometry()
        self.update()
        if grew:  # the newest tokens are the step's news: keep them in view
            QTimer.singleShot(0, self, self._show_newest)

    def _show_newest(self) -> None:
        area = self.parentWidget()
        while area is not None and not isinstance(area, QScrollArea):
            area = area.parentWidget()
        if area is not None and self.num_tokens:
            columns = self._columns()
            cell_w, cell_h = self.cell
            row, column = divmod(self.num_tokens - 1, columns)
            area.ensureVisible(column * cell_w, row * cell_h + cell_h // 2, 0, cell_h)

    def cell_at(self, width: int | None = None) -> tuple[int, int]:
        """A token's cell at ``width`` (the widget's own by default): (width, height)."""
        if self.pieces is None:
            return CELL, CELL
        width = self.width() if width is None else width
        size = max(1, self.block_size)
        if width >= TEXT_CELL_W * size:
            return TEXT_CELL_W, TEXT_CELL_H
        if width // size >= MIN_TEXT_CELL_W:  # a whole block to a row, in narrower cells
            return width // size, TEXT_CELL_H
        # An equal share of a block to a row (half, a quarter …), its cells as wide as the row allows.
        share = _share_of_block(size, width // MIN_TEXT_CELL_W)
        return max(MIN_TEXT_CELL_W, min(TEXT_CELL_W, width // share)), TEXT_CELL_H

    @property
    def cell(self) -> tuple[int, int]:
        return self.cell_at()

    def _columns(self, width: int | None = None) -> int:
        # Whole blocks per row, so a row break never splits a block; where one block is wider
        # than a row, an equal share of it (half, a quarter …), so that a block starts a row.
        width = self.width() if width is None else width
        cell_w, size = self.cell_at(width)[0], max(1, self.block_size)
        blocks = width // (cell_w * size)
        if blocks:
            return blocks * size
        return _share_of_block(size, width // cell_w)

    def sizeHint(self) -> QSize:
        return QSize(200, self.heightForWidth(max(200, self.width())))

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        cell_h = self.cell_at(width)[1]
        return max(cell_h, -(-self.num_tokens // self._columns(width)) * cell_h)

    def _fit_height(self) -> None:
        """At least the height every token needs at this width: the scroll area around the map
        (which sizes it to its viewport) then scrolls, instead of cutting the newest tokens off."""
        height = self.heightForWidth(self.width())
        if self.minimumHeight() != height:
            self.setMinimumHeight(height)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit_height()

    def token_at(self, x: int, y: int) -> int:
        columns = self._columns()
        cell_w, cell_h = self.cell
        t = (y // cell_h) * columns + x // cell_w
        return t if 0 <= x < columns * cell_w and 0 <= t < self.num_tokens else -1

    def token_text(self, t: int) -> str | None:
        """Token ``t``'s text as its cell shows it (whitespace visible), None without text."""
        return None if self.pieces is None or t >= len(self.pieces) else visible(self.pieces[t])

    def describe(self, t: int) -> str:
        bs = self.block_size
        logical, offset = divmod(t, bs)
        physical = self.block_table[logical]
        said = "" if self.pieces is None or t >= len(self.pieces) else f"{quoted(self.pieces[t])}: "
        text = (
            f"{said}token {t} → logical block {logical} (⌊{t}/{bs}⌋), offset {offset} ({t} mod {bs})\n"
            f"block table: L{logical} → physical block #{physical} · slot {offset} (flat slot {physical * bs + offset})"
        )
        if self.weights is not None and t < len(self.weights):
            text += f"\nattention weight of the newest token's query on it: {float(self.weights[t]):.4f}"
        return text

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        columns = self._columns()
        cell_w, cell_h = self.cell
        font = painter.font()
        font.setPointSizeF(6.5 if self.pieces is None else 8.0)
        painter.setFont(font)
        metrics = painter.fontMetrics()
        for t in range(self.num_tokens):
            row, column = divmod(t, columns)
            rect = QRect(column * cell_w, row * cell_h, cell_w - 1, cell_h - 1)
            colour = QColor(self.colour if (t // self.block_size) % 2 == 0 else self.colour.darker(160))
            if t == self.hovered:
                colour = QColor(self.theme.highlight)
            painter.fillRect(rect, colour)
            if (text := self.token_text(t)) is not None:
                ink = ink_on(colour)  # readable on its shade
                painter.setPen(ink)
                shown = metrics.elidedText(text, Qt.TextElideMode.ElideRight, cell_w - 4)
                painter.drawText(rect.adjusted(2, 0, -1, 0), int(Qt.AlignmentFlag.AlignVCenter), shown)
            if t % self.block_size == 0:  # a block starts: mark it
                painter.setPen(QColor(self.theme.text))
                painter.drawLine(rect.topLeft(), rect.bottomLeft())
        painter.end()

    def mouseMoveEvent(self, event) -> None:
        t = self.token_at(int(event.position().x()), int(event.position().y()))
        if t != self.hovered:
            self.hovered = t
            self.update()
            self.tokenPointed.emit(self.seq_id or "", t)
            if t < 0:
                self.tokenHovered.emit(self.seq_id or "", -1, -1, -1)
            else:
                logical = t // self.block_size
                self.tokenHovered.emit(self.seq_id or "", logical, self.block_table[logical], t % self.block_size)
        if t >= 0:
            QToolTip.showText(event.globalPosition().toPoint(), self.describe(t), self)

    def event(self, event) -> bool:
        """Qt's own tooltip event comes ~0.7 s after the mouse stops: over a token it must show
        that token's path (it showed the widget's generic tip over the path instead)."""
        if event.type() == QEvent.Type.ToolTip:
            t = self.token_at(event.pos().x(), event.pos().y())
            QToolTip.showText(event.globalPos(), self.describe(t) if t >= 0 else GENERIC_TIP, self)
            return True
        return super().event(event)

    def leaveEvent(self, event) -> None:
        self.hovered = -1
        self.update()
        self.tokenHovered.emit(self.seq_id or "", -1, -1, -1)
        self.tokenPointed.emit(self.seq_id or "", -1)
