"""A one-line key to the pool's tiles: what free, cached, in use, shared and a copy-on-write
look like, vLLM v1's null block where the scheduler is v1's, and (once more than seven
requests have had a colour) what the hatch means.
Painted in the theme's own colours; it changes only with the theme, the width and the hatch."""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.app.gui.palette import OKABE_ITO, PATTERNS, SequenceColours, Theme, readable_on
from pagesim.app.gui.views.pool_view import NULL_BLOCK_ROLE
from pagesim.core.view_model import Frame
from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

SWATCH_W, SWATCH_H = 26, 14
SPACING, TEXT_GAP, ROW_GAP = 14, 5, 3
MAX_ROWS = 2  # more would push the pool down: narrower than that, swatches alone (their tooltips say)


@dataclass(frozen=True)
class LegendEntry:
    key: str
    label: str
    tip: str


ENTRIES = (
    LegendEntry("free", "free", "A free block: in the free queue, waiting to be allocated"),
    LegendEntry(
        "cached",
        "cached",
        "Free but cached (dashed): it still holds a full block of a prefix that a new prompt with the same "
        "tokens takes instead of computing them again; evicted when allocation reaches it",
    ),
    LegendEntry(
        "in use",
        "in use: owner's colour",
        "Held by a request's block table and drawn in that request's colour (each has its own: the colour "
        "names the owner, not the state); a filled cell holds one token's K/V",
    ),
    LegendEntry(
        "shared",
        "shared ×N",
        "Held by two or more block tables at once (ref count ×2, ×3 …): forks and cached prefixes share "
        "one copy, a band per holder",
    ),
    LegendEntry(
        "copy",
        "copy-on-write",
        "A sequence wrote into a shared, partly filled block: the arrow runs from the source block to its "
        "new private copy",
    ),
)
NULL = LegendEntry("null", "null block", f"Block 0, the null block: {NULL_BLOCK_ROLE}")
HATCH = LegendEntry(
    "hatch",
    "hatched: 8th+ owner",
    "There are seven colours: from the eighth owner on (a request, a sequence you added, a fork), colours "
    "come back lighter or darker with a hatch, so that two owners never look alike",
)


class PoolLegend(QWidget):
    def __init__(self, theme: Theme, colours: SequenceColours, parent=None) -> None:
        super().__init__(parent)
        self.theme, self.colours = theme, colours
        self.show_hatch = False
        self.show_null = False  # a v1 scheduler's pool: its block 0
        self.compact = False  # swatches without their words, in a narrow centre
        self._places: list[tuple[LegendEntry, QRectF, QPointF, str]] = []  # entry, swatch, text origin, words
        self._rows = 1
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.setToolTip("What the pool's tiles mean (hover an entry)")
        self._place()

    # -- what it shows -----------------------------------------------------------------
    def entries(self) -> tuple[LegendEntry, ...]:
        return ENTRIES + ((NULL,) if self.show_null else ()) + ((HATCH,) if self.show_hatch else ())

    def labels(self) -> list[str]:
        return [entry.label for entry in self.entries()]

    def bind(self, controller) -> None:
        controller.frameChanged.connect(self.show_frame)

    def show_frame(self, frame: Frame) -> None:
        """The hatch entry appears while an owner on screen carries a hatch, the null block's
        with a v1 scheduler's pool (cheap tests per frame)."""
        null = frame.config.scheduler == "v1"
        # (an owner on screen now: back at a step before the eighth request, no hatch is drawn)
        owners = [s.seq_id for s in frame.sequences]
        owners += [r for key, lane in (frame.queues or {}).items() if key != "finished" for r in lane]
        hatch = self.colours.hatched and any(self.colours.pattern(owner) is not None for owner in owners)
        if hatch != self.show_hatch or null != self.show_null:
            self.show_hatch, self.show_null = hatch, null
            self._place()
            self.update()

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()

    def swatch_rect(self, key: str) -> QRectF | None:
        return next((swatch for entry, swatch, _, _ in self._places if entry.key == key), None)

    # -- layout --------------------------------------------------------------------------
    def _row_height(self) -> int:
        return max(SWATCH_H, self.fontMetrics().height()) + ROW_GAP

    def _place(self) -> None:
        """Entries left to right, onto a second line where the width runs out (swatches alone
        where even two lines are too few); the height changes only when the number of lines does."""
        for compact in (False, True):
            places, rows = self._flow(compact)
            if rows <= MAX_ROWS:
                break
        self._places, self.compact = places, compact
        row_h = self._row_height()
        if rows != self._rows or self.height() != rows * row_h:
            self._rows = rows
            self.setFixedHeight(rows * row_h)

    def _flow(self, compact: bool) -> tuple[list, int]:
        metrics = self.fontMetrics()
        row_h, width = self._row_height(), max(1, self.width())
        x, row, places = 0.0, 0, []
        for entry in self.entries():
            words = "" if compact else entry.label
            span = SWATCH_W + (TEXT_GAP + metrics.horizontalAdvance(words) if words else 0)
            if x > 0 and x + span > width:
                x, row = 0.0, row + 1
            top = row * row_h + (row_h - ROW_GAP - SWATCH_H) / 2
            swatch = QRectF(x + 1, top, SWATCH_W, SWATCH_H)
            baseline = row * row_h + (row_h - ROW_GAP + metrics.ascent() - metrics.descent()) / 2
            places.append((entry, swatch, QPointF(x + SWATCH_W + TEXT_GAP, baseline), words))
            x += span + (SPACING if words else 6)
        return places, row + 1

    def sizeHint(self) -> QSize:
        return QSize(400, self._rows * self._row_height())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self._place()

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._place()

    def event(self, event) -> bool:
        if event.type() == QEvent.Type.ToolTip:  # each entry explains itself
            point = QPointF(event.pos())
            for entry, swatch, origin, words in self._places:
                text_end = origin.x() + self.fontMetrics().horizontalAdvance(words) if words else swatch.right()
                if QRectF(swatch.left(), swatch.top() - 3, text_end - swatch.left(), SWATCH_H + 6).contains(point):
                    QToolTip.showText(event.globalPos(), f"{entry.label}: {entry.tip}", self)
                    return True
        return super().event(event)

    # -- painting ------------------------------------------------------------------------
    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        for entry, swatch, origin, words in self._places:
            getattr(self, f"_paint_{entry.key.replace(' ', '_')}")(painter, swatch)
            if words:
                painter.setPen(QColor(self.theme.text))
                painter.drawText(origin, words)
        painter.end()

    def _tile(self, painter: QPainter, rect: QRectF, fill: QColor, border: QPen) -> None:
        painter.setPen(border)
        painter.setBrush(fill)
        painter.drawRoundedRect(rect, 3, 3)

    def _cells(self, painter: QPainter, rect: QRectF, colours: list[QColor], pattern=None) -> None:
        """Four slots along the tile's lower part, a band per colour (one per holder)."""
        painter.setPen(Qt.PenStyle.NoPen)
        area = rect.adjusted(3, 5, -3, -2.5)
        cell_w = area.width() / 4
        for i in range(4):
            cell = QRectF(area.x() + i * cell_w + 0.5, area.y(), cell_w - 1, area.height())
            band = cell.height() / len(colours)
            for j, colour in enumerate(colours):
                stripe = QRectF(cell.x(), cell.y() + j * band, cell.width(), band)
                painter.fillRect(stripe, colour)
                if pattern is not None:
                    painter.fillRect(stripe, QBrush(QColor(self.theme.window), pattern))

    def _owner_tile(self, painter: QPainter, rect: QRectF, colours: list[QColor], pattern=None) -> None:
        background = QColor(colours[0])
        background.setAlpha(60)
        self._tile(painter, rect, background, QPen(QColor(self.theme.block_border), 1))
        self._cells(painter, rect, colours, pattern)

    def _paint_free(self, painter: QPainter, rect: QRectF) -> None:
        self._tile(painter, rect, QColor(self.theme.free_block), QPen(QColor(self.theme.block_border), 1))
        self._cells(painter, rect, [QColor(self.theme.empty_slot)])

    def _paint_cached(self, painter: QPainter, rect: QRectF) -> None:
        dashed = QPen(QColor(self.theme.muted), 1.2, Qt.PenStyle.DashLine)
        self._tile(painter, rect, QColor(self.theme.free_block), dashed)
        self._cells(painter, rect, [QColor(self.theme.muted)])

    def _paint_in_use(self, painter: QPainter, rect: QRectF) -> None:
        self._owner_tile(painter, rect, [QColor(OKABE_ITO[1])])

    def _paint_shared(self, painter: QPainter, rect: QRectF) -> None:
        self._owner_tile(painter, rect, [QColor(OKABE_ITO[0]), QColor(OKABE_ITO[2])])

    def _paint_copy(self, painter: QPainter, rect: QRectF) -> None:
        """A small source tile, an arrow arching over to its copy."""
        colour = QColor(OKABE_ITO[0])
        half = (rect.width() - 6) / 2
        source = QRectF(rect.left(), rect.top() + 5, half, rect.height() - 5)
        copy = QRectF(rect.right() - half, rect.top() + 5, half, rect.height() - 5)
        for tile in (source, copy):
            background = QColor(colour)
            background.setAlpha(60)
            self._tile(painter, tile, background, QPen(QColor(self.theme.block_border), 1))
            painter.fillRect(tile.adjusted(2, 3, -2, -2), colour)
        arrow = QPainterPath(QPointF(source.center().x(), source.top()))
        tip = QPointF(copy.center().x(), copy.top())
        arrow.quadTo(QPointF(rect.center().x(), rect.top() - 4), tip)
        arrow.moveTo(tip)
        arrow.lineTo(tip + QPointF(-4, -2))
        arrow.moveTo(tip)
        arrow.lineTo(tip + QPointF(0, -4.5))
        painter.setPen(QPen(readable_on(colour, self.theme.window), 1.6))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawPath(arrow)

    def _paint_null(self, painter: QPainter, rect: QRectF) -> None:
        self._tile(painter, rect, QColor(self.theme.free_block), QPen(QColor(self.theme.block_border), 1))
        painter.fillRect(rect.adjusted(2, 2, -2, -2), QBrush(QColor(self.theme.muted), Qt.BrushStyle.BDiagPattern))

    def _paint_hatch(self, painter: QPainter, rect: QRectF) -> None:
        self._owner_tile(painter, rect, [QColor(OKABE_ITO[1]).lighter(130)], PATTERNS[1])
