"""A first-run path: a primer in three pictures (attention, why its keys and values are
cached, why the cache is paged), what pagesim shows, and the shipped scenarios in the order a
learner should take them, each openable from here. Shown at the first interactive start (and
from Help → Welcome)."""

from __future__ import annotations

from pagesim.app.gui.palette import OKABE_ITO
from pagesim.core.scenario import examples
from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QGridLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

# For a reader who has never seen the vLLM paper: one picture and one sentence each.
PRIMER = (
    (
        "attention",
        "1 · Attention",
        "To write the next word, the newest token's query is compared with the key of every earlier token, "
        "and their values are mixed by those weights.",
    ),
    (
        "cache",
        "2 · Why K/V are cached",
        "Earlier tokens' keys and values never change, so the server keeps them (the KV cache) and computes "
        "K and V for the one new token only.",
    ),
    (
        "paging",
        "3 · Why paging",
        "Reserving each request's longest possible length in one piece wastes most of it; vLLM cuts the "
        "cache into small blocks anywhere in one pool, found through a block table.",
    ),
)
WORDS = ("The", "cat", "sat", "on", "the")

INTRO = (
    "<p>A serving engine like vLLM keeps every sequence's keys and values (its <b>KV cache</b>) in fixed-size "
    "<b>blocks</b> of one shared pool, found through a per-sequence <b>block table</b> — like pages of virtual "
    "memory. pagesim shows the pool (centre), the tables (left) and, on every step, a real paged-attention "
    "kernel reading through the tables, checked against dense attention (the ✓ badge over the pool opens "
    "the check).</p>"
    "<p>Step with → (Space plays), go back with ←; A adds a sequence, G grows the selected one, F forks it. "
    "Above the pool, a few lines say what each step did. Start with these, in this order:</p>"
)


class PrimerPicture(QWidget):
    """One of the primer's three small drawings, in the window's palette."""

    def __init__(self, kind: str, parent=None) -> None:
        super().__init__(parent)
        self.kind = kind
        self.setMinimumSize(200, 104)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(250, 104)

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        palette = self.palette()
        self.ink = palette.color(QPalette.ColorRole.WindowText)
        self.muted = palette.color(QPalette.ColorRole.PlaceholderText)
        self.base = palette.color(QPalette.ColorRole.Base)
        painter.fillRect(self.rect(), self.base)
        getattr(self, f"_paint_{self.kind}")(painter, QRectF(self.rect()).adjusted(8, 6, -8, -6))
        painter.end()

    def _token(self, painter: QPainter, box: QRectF, word: str, fill: QColor, outline: QColor | None = None) -> None:
        painter.setPen(QPen(outline or self.muted, 1.5 if outline else 1))
        painter.setBrush(fill)
        painter.drawRoundedRect(box, 4, 4)
        painter.setPen(self.ink)
        painter.drawText(box, Qt.AlignmentFlag.AlignCenter, word)

    def _row(self, area: QRectF, count: int, y: float, height: float) -> list[QRectF]:
        width = min(40.0, (area.width() - (count - 1) * 5) / count)
        left = area.center().x() - (count * width + (count - 1) * 5) / 2
        return [QRectF(left + i * (width + 5), y, width, height) for i in range(count)]

    def _paint_attention(self, painter: QPainter, area: QRectF) -> None:
        """Earlier tokens in a row; arcs from the newest one to each, as thick as its weight."""
        boxes = self._row(area, len(WORDS) + 1, area.bottom() - 24, 22)
        weights = (0.15, 0.55, 0.25, 0.1, 0.35)
        query = QColor(OKABE_ITO[0])
        for box, word in zip(boxes, WORDS, strict=False):
            self._token(painter, box, word, QColor(self.base))
        self._token(painter, boxes[-1], "?", query.lighter(150) if self.base.lightness() > 128 else query, query)
        start = QPointF(boxes[-1].center().x(), boxes[-1].top())
        painter.setBrush(Qt.BrushStyle.NoBrush)
        for box, weight in zip(boxes, weights, strict=False):
            end = QPointF(box.center().x(), box.top())
            path = QPainterPath(start)
            height = 18 + (start.x() - end.x()) * 0.32
            path.cubicTo(start - QPointF(0, height), end - QPointF(0, height), end)
            painter.setPen(QPen(query, 1 + 6 * weight, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap))
            painter.drawPath(path)
        painter.setPen(self.muted)
        painter.drawText(area, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop, "weights")

    def _paint_cache(self, painter: QPainter, area: QRectF) -> None:
        """Each token's K and V under it: kept ones solid, the new token's being computed."""
        count = len(WORDS) + 1
        boxes = self._row(area.adjusted(18, 0, 0, 0), count, area.top() + 2, 20)  # room for "K", "V"
        key, value = QColor(OKABE_ITO[4]), QColor(OKABE_ITO[2])
        for i, box in enumerate(boxes):
            new = i == count - 1
            self._token(
                painter, box, "?" if new else WORDS[i], QColor(self.base), QColor(OKABE_ITO[0]) if new else None
            )
            for row, colour in enumerate((key, value)):
                cell = QRectF(box.left() + 3, box.bottom() + 6 + row * 16, box.width() - 6, 12)
                if new:  # being computed now: an outline only
                    painter.setPen(QPen(colour, 1.5, Qt.PenStyle.DashLine))
                    painter.setBrush(Qt.BrushStyle.NoBrush)
                else:
                    painter.setPen(Qt.PenStyle.NoPen)
                    painter.setBrush(colour)
                painter.drawRect(cell)
        for row, (name, colour) in enumerate((("K", key), ("V", value))):
            painter.setPen(colour)
            label = QRectF(boxes[0].left() - 18, boxes[0].bottom() + 6 + row * 16, 14, 12)
            painter.drawText(label, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, name)
        span = QRectF(boxes[0].left(), boxes[0].bottom() + 40, boxes[-2].right() - boxes[0].left(), 16)
        painter.setPen(self.muted)
        painter.drawText(span, Qt.AlignmentFlag.AlignCenter, "kept: KV cache")
        painter.drawText(QRectF(boxes[-1].left() - 10, span.top(), boxes[-1].width() + 20, 16),
                         Qt.AlignmentFlag.AlignCenter, "new")  # fmt: skip

    def _paint_paging(self, painter: QPainter, area: QRectF) -> None:
        """Left: one request's contiguous reservation, mostly empty. Right: small blocks of two
        requests scattered through a shared pool."""
        half = area.width() * 0.42
        a, b = QColor(OKABE_ITO[0]), QColor(OKABE_ITO[1])
        painter.setPen(self.muted)
        painter.drawText(QRectF(area.left(), area.top(), half, 14), Qt.AlignmentFlag.AlignLeft, "contiguous")
        for row, (colour, used) in enumerate(((a, 0.3), (b, 0.15))):
            bar = QRectF(area.left(), area.top() + 20 + row * 30, half, 20)
            painter.setPen(QPen(self.muted, 1))
            painter.setBrush(QBrush(self.muted, Qt.BrushStyle.BDiagPattern))  # reserved, never used
            painter.drawRect(bar)
            painter.fillRect(QRectF(bar.left(), bar.top(), bar.width() * used, bar.height()), colour)
        painter.setPen(self.muted)
        painter.drawText(QRectF(area.left(), area.bottom() - 14, half, 14), Qt.AlignmentFlag.AlignLeft, "wasted")
        pool = QRectF(area.left() + half + 16, area.top() + 16, area.width() - half - 16, area.height() - 16)
        painter.drawText(QRectF(pool.left(), area.top(), pool.width(), 14), Qt.AlignmentFlag.AlignLeft, "paged pool")
        columns, rows = 5, 3
        cell_w, cell_h = pool.width() / columns, pool.height() / rows
        owners = {1: a, 7: a, 12: a, 3: b, 9: b}
        for index in range(columns * rows):
            row, column = divmod(index, columns)
            block = QRectF(pool.left() + column * cell_w + 2, pool.top() + row * cell_h + 2, cell_w - 4, cell_h - 4)
            colour = owners.get(index)
            painter.setPen(QPen(self.muted, 1))
            painter.setBrush(colour if colour is not None else self.base)
            painter.drawRoundedRect(block, 3, 3)


class WelcomeDialog(QDialog):
    def __init__(self, open_example, parent=None, show_at_start: bool = True) -> None:
        """``open_example(name)`` opens a shipped scenario."""
        super().__init__(parent)
        self.setWindowTitle("Welcome to pagesim")
        self.open_example = open_example
        primer = QGridLayout()
        self.primer_pictures: list[PrimerPicture] = []
        self.primer_captions: list[QLabel] = []
        for column, (kind, title, sentence) in enumerate(PRIMER):
            heading = QLabel(f"<b>{title}</b>")
            picture = PrimerPicture(kind)
            caption = QLabel(sentence)
            caption.setWordWrap(True)
            caption.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
            primer.addWidget(heading, 0, column)
            primer.addWidget(picture, 1, column)
            primer.addWidget(caption, 2, column)
            self.primer_pictures.append(picture)
            self.primer_captions.append(caption)
        intro = QLabel(INTRO)
        intro.setWordWrap(True)
        self.list = QListWidget()
        for number, example in enumerate(examples(), start=1):
            item = QListWidgetItem(f"{number}. {example.title} — {example.summary()}")
            item.setData(Qt.ItemDataRole.UserRole, example.name)
            item.setToolTip(" ".join(example.description.split()))
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
        layout.addWidget(QLabel("<h3>Welcome to pagesim</h3>"))
        layout.addLayout(primer)
        layout.addWidget(intro)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.at_start)
        layout.addWidget(buttons)
        self.resize(860, 680)

    def accept(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            self.open_example(item.data(Qt.ItemDataRole.UserRole))
        super().accept()
