"""The physical KV-cache pool: one item per block, its slots filling token by token."""

from __future__ import annotations

import html
import math

from pagesim.app.gui.palette import SequenceColours, Theme, readable_on
from pagesim.core.block_manager import NULL_BLOCK
from pagesim.core.events import plural
from pagesim.core.token_text import quoted
from pagesim.core.view_model import Frame
from PySide6.QtCore import QPoint, QPointF, QRectF, QSizeF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetricsF, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import (
    QGraphicsItem,
    QGraphicsPathItem,
    QGraphicsRectItem,
    QGraphicsScene,
    QGraphicsSimpleTextItem,
    QGraphicsView,
    QLabel,
    QMenu,
    QStyleOptionGraphicsItem,
    QWidget,
)

NULL_BLOCK_ROLE = (
    "vLLM v1 takes it when the pool is made and never gives it to a request (its block tables point at it "
    "where they hold no block), so the scheduler has one block fewer to give than the pool has"
)


BLOCK_W, BLOCK_H, GAP = 60.0, 38.0, 8.0
SLOTS_PER_ROW = 16
SLOTS_AREA = (BLOCK_W - 8) * (BLOCK_H - 20)  # a tile's slot grid, in pixels at zoom 1 (see slot_rect)
SLOTS_DETAIL = 0.62  # below this zoom the header's id would be under ~8 px: a compact tile instead
MIN_LABEL_PX = 7.0  # an id smaller than this on screen is noise: below, a tile is its fill bar
COMPACT_ID_DETAIL = MIN_LABEL_PX / (BLOCK_H * 0.5)  # where half a tile's height reaches that


def label_pixel_size(detail: float, compact: bool) -> float:
    """A tile's id font size in scene units at zoom ``detail``: about 8.5–9 px on screen,
    within the 14-unit header of a full tile or half a compact tile's height."""
    if compact:
        return min(BLOCK_H * 0.5, 9.0 / detail)
    return min(13.5, max(10.0, 8.5 / detail))


class BlockItem(QGraphicsItem):
    def __init__(self, view: PoolView, block_id: int) -> None:
        super().__init__()
        self.view = view
        self.block_id = block_id
        self.ref_count = 0
        self.fill = 0
        self.holders: tuple[tuple[str, int], ...] = ()
        self.cached = False
        self.null = False  # vLLM v1's null block: held from the start, never a request's
        self.selected_seq = False
        self.glow: QColor | None = None  # an animation's highlight; never model state
        self.glow_strength = 0.0
        self.glow_slot = -1  # the one slot a lookup or a hovered token points at
        self.refused: QColor | None = None  # a refused allocation: this free block was not enough
        self.setAcceptHoverEvents(True)
        # Thousands of blocks: repaint a block only when it changes, blit it otherwise.
        self.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)

    def boundingRect(self) -> QRectF:
        return QRectF(-2, -2, BLOCK_W + 4, BLOCK_H + 4)

    def set_state(
        self, ref_count: int, fill: int, holders, selected: bool, cached: bool = False, null: bool = False
    ) -> bool:
        state = (ref_count, fill, holders, selected, cached, null)
        if state == (self.ref_count, self.fill, self.holders, self.selected_seq, self.cached, self.null):
            return False
        self.ref_count, self.fill, self.holders, self.selected_seq, self.cached, self.null = state
        self.setToolTip(self.describe())
        self.update()
        return True

    def set_glow(self, colour: QColor | None, strength: float = 1.0, slot: int = -1) -> None:
        """Outline the block (an animation, a lookup); ``slot`` ≥ 0 also rings that one slot."""
        self.glow, self.glow_strength, self.glow_slot = colour, strength, slot
        if colour is not None:
            self.view._glowing.add(self)  # so clearing visits these, not every block
        self.update()

    def describe(self) -> str:
        bs = self.view.block_size
        if self.null:
            return f"Physical block {self.block_id}: the null block\n{NULL_BLOCK_ROLE}"
        if self.ref_count == 0 and self.cached:
            return (
                f"Physical block {self.block_id}\nfree but cached: it still holds {self.fill}/{bs} tokens of a "
                "prefix that a new prompt can reuse without computing them;\nevicted when allocation reaches it "
                "at the head of the (least recently used) free queue"
            )
        if self.ref_count == 0:
            return f"Physical block {self.block_id}\nfree (in the free queue)\n0/{bs} slots hold tokens"
        last = max(0, self.fill - 1)
        owners = ", ".join(
            f"{seq} (logical block {index}: tokens {index * bs}–{index * bs + last})" for seq, index in self.holders
        )
        shared = ""
        if self.ref_count > 1:  # only a partly filled block is written again: only it is ever copied
            shared = (
                " — shared: whichever holder writes into it next gets its own copy first (copy-on-write)"
                if self.fill < bs
                else " — shared, read-only: it is full, so nobody writes into it again and it is never copied"
            )
        if self.cached:
            shared += "\nin the prefix cache (full block, hashed with its prefix)"
        texts = self.view.slot_texts(self.block_id)
        said = "".join(f"\n  slot {i}: {quoted(text)}" for i, text in enumerate(texts or ()))
        return (
            f"Physical block {self.block_id}\nref count {self.ref_count}{shared}\n"
            f"held by {owners}\n{self.fill}/{bs} slots hold tokens{':' if said else ''}{said}"
        )

    def paint(self, painter: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        theme: Theme = self.view.theme
        colours = [self.view.colours(seq) for seq, _ in self.holders]
        rect = QRectF(0, 0, BLOCK_W, BLOCK_H)
        detail = option.levelOfDetailFromTransform(painter.worldTransform())
        border = QColor(theme.text) if self.selected_seq else QColor(theme.block_border)
        painter.setPen(QPen(border, 2.0 if self.selected_seq else 1.0))
        background = QColor(theme.free_block)
        if colours:
            background = QColor(colours[0])
            background.setAlpha(60)
        painter.setBrush(background)
        if self.cached and not colours:  # free but still holding a reusable prefix
            painter.setPen(QPen(QColor(theme.muted), 1.2, Qt.PenStyle.DashLine))
        painter.drawRoundedRect(rect, 4, 4)
        bs = self.view.block_size
        if self.null:
            self._paint_null(painter, theme, detail, rect)
        elif not self.shows_slots(detail):  # a fill bar and the id
            if colours and self.fill:
                top = 2.0 if detail < COMPACT_ID_DETAIL else BLOCK_H * 0.62
                bar = QRectF(2, top, (BLOCK_W - 4) * self.fill / bs, BLOCK_H - 2 - top)
                band = bar.height() / len(colours)  # a shared block: a band per holder, as its slots show
                for i, (colour, (seq, _)) in enumerate(zip(colours, self.holders, strict=True)):
                    stripe = QRectF(bar.x(), bar.y() + i * band, bar.width(), band)
                    painter.fillRect(stripe, colour)
                    if (hatch := self.view.colours.hatch(seq, theme)) is not None:
                        painter.fillRect(stripe, hatch)
            if detail >= COMPACT_ID_DETAIL:
                self._paint_compact_id(painter, theme, detail)
        else:
            self._paint_slots(painter, theme, colours, bs)
            self._paint_labels(painter, theme, detail)
        if self.refused is not None:
            painter.setPen(QPen(self.refused, 3.0, Qt.PenStyle.DashLine))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(rect.adjusted(1, 1, -1, -1), 4, 4)
        if self.glow is not None and self.glow_strength > 0:
            glow = QColor(self.glow)
            glow.setAlphaF(min(1.0, self.glow_strength))
            painter.setPen(QPen(glow, 4.0))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(rect.adjusted(-1, -1, 1, 1), 5, 5)
            if 0 <= self.glow_slot < bs and detail >= 0.35:
                painter.setPen(QPen(glow, 2.5))
                painter.drawRect(self.slot_rect(self.glow_slot, bs).adjusted(-1.5, -1.5, 1.5, 1.5))

    def _paint_null(self, painter: QPainter, theme: Theme, detail: float, rect: QRectF) -> None:
        """Hatched in the muted colour, with "null" where slots would be: no request's, ever."""
        painter.fillRect(rect.adjusted(2, 2, -2, -2), QBrush(QColor(theme.muted), Qt.BrushStyle.BDiagPattern))
        compact = detail < SLOTS_DETAIL
        if compact and detail < COMPACT_ID_DETAIL:
            return
        font, metrics = self.view.sized_font(label_pixel_size(detail, compact=compact))
        painter.setFont(font)
        painter.setPen(QColor(theme.text))
        text = "null" if compact else f"#{self.block_id} null"
        area = QRectF(2, 0, BLOCK_W - 4, BLOCK_H * 0.62) if compact else QRectF(4, 0, BLOCK_W - 8, 15)
        if metrics.horizontalAdvance(text) <= area.width():
            painter.fillRect(
                QRectF(area.x(), area.y() + 1, metrics.horizontalAdvance(text) + 4, area.height() - 2),
                QColor(theme.free_block),
            )
            painter.drawText(
                area.adjusted(2, 0, 0, 0), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, text
            )

    def shows_slots(self, detail: float) -> bool:
        """Whether the tile draws its slots at this zoom: not where it is too small for them
        and a header, nor where each would be under a pixel (a block of 10^7 slots, each a
        rectangle, took a minute a paint)."""
        return detail >= SLOTS_DETAIL and self.view.block_size <= SLOTS_AREA * detail * detail

    @staticmethod
    def slot_rect(slot: int, bs: int) -> QRectF:
        """Where slot ``slot`` of a block of ``bs`` slots is drawn, in the item's coordinates."""
        per_row = min(bs, SLOTS_PER_ROW)
        rows = math.ceil(bs / per_row)
        area = QRectF(4, 16, BLOCK_W - 8, BLOCK_H - 20)
        cell_w, cell_h = area.width() / per_row, area.height() / rows
        r, c = divmod(slot, per_row)
        return QRectF(area.x() + c * cell_w + 0.5, area.y() + r * cell_h + 0.5, cell_w - 1, cell_h - 1)

    def _paint_slots(self, painter: QPainter, theme: Theme, colours: list[QColor], bs: int) -> None:
        painter.setPen(Qt.PenStyle.NoPen)
        patterns = [self.view.colours.pattern(seq) for seq, _ in self.holders]
        for slot in range(bs):
            cell = self.slot_rect(slot, bs)
            if slot < self.fill and colours:
                # A shared block shows every holder as a band: one copy, many tables.
                band = cell.height() / len(colours)
                for i, colour in enumerate(colours):
                    stripe = QRectF(cell.x(), cell.y() + i * band, cell.width(), band)
                    painter.fillRect(stripe, colour)
                    if patterns[i] is not None:
                        painter.fillRect(stripe, QBrush(QColor(theme.window), patterns[i]))
            elif slot < self.fill and self.cached:
                painter.fillRect(cell, QColor(theme.muted))  # cached tokens nobody holds
            else:
                painter.fillRect(cell, QColor(theme.empty_slot))

    def _paint_labels(self, painter: QPainter, theme: Theme, detail: float) -> None:
        font, metrics = self.view.sized_font(label_pixel_size(detail, compact=False))
        painter.setPen(QColor(theme.text if self.ref_count else theme.muted))
        painter.setFont(font)
        painter.drawText(QRectF(4, 0, BLOCK_W - 8, 15), Qt.AlignmentFlag.AlignLeft, f"#{self.block_id}")
        if self.ref_count > 1:
            text = f"×{self.ref_count}"
            width = metrics.horizontalAdvance(text) + 6
            badge = QRectF(BLOCK_W - 2 - width, 1.5, width, min(14.0, metrics.height()))
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(theme.text))
            painter.drawRoundedRect(badge, 6, 6)
            painter.setPen(QColor(theme.window))
            painter.drawText(badge, Qt.AlignmentFlag.AlignCenter, text)

    def compact_label(self, metrics, width: float) -> str:
        """A small tile's label, the first of these that fits ``width``: "#5 ×3", "5 ×3",
        "5×3" (a thin space, then none), "#5", "5" (none: ""). The sharing goes last: a pool
        of small tiles showed no sharing at all where "#" alone had taken the room of "×3",
        nor on two-digit ids where the space had."""
        block, refs = self.block_id, self.ref_count
        shared = [f"#{block} ×{refs}", f"{block} ×{refs}", f"{block}\u2009×{refs}", f"{block}×{refs}"]
        for text in [*(shared if self.ref_count > 1 else []), f"#{self.block_id}", str(self.block_id)]:
            if metrics.horizontalAdvance(text) <= width:
                return text
        return ""

    def _paint_compact_id(self, painter: QPainter, theme: Theme, detail: float) -> None:
        """The block id over the upper part of a small tile, in a font sized to stay about
        9 px tall on screen (see :meth:`compact_label`)."""
        font, metrics = self.view.sized_font(label_pixel_size(detail, compact=True))
        painter.setFont(font)
        painter.setPen(QColor(theme.text if self.ref_count else theme.muted))
        area = QRectF(2, 0, BLOCK_W - 4, BLOCK_H * 0.62)
        if text := self.compact_label(metrics, area.width()):
            painter.drawText(area, Qt.AlignmentFlag.AlignCenter, text)

    def mousePressEvent(self, event) -> None:
        self.view.blockClicked.emit(self.block_id)
        event.accept()

    def contextMenuEvent(self, event) -> None:
        self.view.blockContextMenu.emit(self.block_id, event.screenPos())
        event.accept()


class PoolView(QGraphicsView):
    """Zoom with the wheel, pan by dragging; double-click fits the whole pool."""

    blockClicked = Signal(int)
    blockContextMenu = Signal(int, object)
    transformed = Signal()  # zoomed or fitted: whatever is drawn over the tiles must follow

    def __init__(self, colours: SequenceColours, theme: Theme, parent=None) -> None:
        super().__init__(parent)
        self.colours = colours
        self.theme = theme
        self.block_size = 1
        self.items: list[BlockItem] = []
        self.columns = 0  # tiles per row, chosen for the viewport's shape
        self.selected_seq: str | None = None
        self.label_font = QFont()
        self.label_font.setPointSizeF(7.5)
        self._sized_fonts: dict[int, tuple[QFont, QFontMetricsF]] = {}
        self.setScene(QGraphicsScene(self))
        self.setRenderHints(QPainter.RenderHint.Antialiasing | QPainter.RenderHint.TextAntialiasing)
        self.setDragMode(QGraphicsView.DragMode.ScrollHandDrag)
        self.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
        self.setViewportUpdateMode(QGraphicsView.ViewportUpdateMode.SmartViewportUpdate)
        self.setToolTip("")
        self._user_zoomed = False
        self._shown: Frame | None = None  # the frame the items show
        self._overlays: list[QGraphicsItem] = []
        self._lasting_arrows: list[tuple] = []  # copy arrows drawn again when the grid is re-laid out
        self._glowing: set[BlockItem] = set()
        self.refusal: tuple[int, int] | None = None  # (needed, free) while a refusal is shown
        self.refusal_banner = QLabel(self.viewport())
        self.refusal_banner.setWordWrap(True)
        self.refusal_banner.hide()
        self.menu = QMenu(self)

    # -- content --------------------------------------------------------------------
    def sized_font(self, pixel_size: float) -> tuple[QFont, QFontMetricsF]:
        """A font of about ``pixel_size`` scene units, and its metrics (cached per size)."""
        size = max(4, round(pixel_size))
        if size not in self._sized_fonts:
            font = QFont(self.label_font)
            font.setPixelSize(size)
            self._sized_fonts[size] = (font, QFontMetricsF(font))
        return self._sized_fonts[size]

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.setBackgroundBrush(QColor(theme.window))
        for item in self.items:
            item.update()

    def layout_pool(self, num_blocks: int, block_size: int) -> None:
        scene = self.scene()
        self._lasting_arrows = []  # (another pool: its blocks are not these)
        self.clear_overlays()
        for item in self.items:
            scene.removeItem(item)
        self.block_size = block_size
        self._shown = None
        self.items = []
        for block in range(num_blocks):
            item = BlockItem(self, block)
            scene.addItem(item)
            self.items.append(item)
        self.columns = 0
        self._arrange(self.best_columns())
        self._user_zoomed = False
        self.fit()

    def best_columns(self) -> int:
        """The number of columns whose grid shows the tiles largest in the viewport: a wide,
        short pool panel gets long rows, a tall one short rows. The current grid stays unless
        another shows the tiles a tenth larger: a narration a line taller must not move
        thousands of tiles (a 4096-block pool takes ~40 ms to rearrange)."""
        count = len(self.items)
        if count == 0:
            return 1
        width, height = max(1, self.viewport().width()), max(1, self.viewport().height())

        def scale(columns: int) -> float:
            rows = math.ceil(count / columns)
            return min(width / (columns * (BLOCK_W + GAP) + GAP), height / (rows * (BLOCK_H + GAP) + GAP))

        # The best grid is near the square root of the tiles per row / per column that fit:
        # search around it (a 4096-block pool would otherwise try 4096 grids per resize).
        guess = math.sqrt(count * (width / (BLOCK_W + GAP)) / (height / (BLOCK_H + GAP)))
        best, best_scale = 1, 0.0
        for columns in range(max(1, int(guess / 2)), min(count, int(guess * 2) + 2) + 1):
            if columns > 1 and math.ceil(count / (columns - 1)) == math.ceil(count / columns):
                continue  # the same rows with fewer columns fits at least as well
            if scale(columns) > best_scale:
                best, best_scale = columns, scale(columns)
        if 0 < self.columns <= count and best_scale < 1.1 * scale(self.columns):
            return self.columns
        return best

    def _arrange(self, columns: int) -> None:
        """Place the tiles ``columns`` to a row (block ids row by row, as memory addresses)."""
        if columns == self.columns:
            return
        self.columns = columns
        for block, item in enumerate(self.items):
            row, col = divmod(block, columns)
            item.setPos(col * (BLOCK_W + GAP), row * (BLOCK_H + GAP))
        rows = math.ceil(len(self.items) / columns)
        self.scene().setSceneRect(QRectF(-GAP, -GAP, columns * (BLOCK_W + GAP) + GAP, rows * (BLOCK_H + GAP) + GAP))
        for overlay in self._overlays:  # arrows and labels were placed for the old grid
            self.scene().removeItem(overlay)
        self._overlays.clear()
        for src, dst, colour, labelled in self._lasting_arrows:  # (a copy stays marked until the next step)
            self.add_copy_arrow(src, dst, colour, labelled)

    def bind(self, controller, selection) -> None:
        """Follow the controller's frames, ``selection``'s blocks highlighted (``selection`` is
        reconciled with each frame before this view sees it)."""
        self._selection = selection
        controller.frameChanged.connect(self._on_frame)

    def _on_frame(self, frame: Frame) -> None:
        self.clear_refusal()  # an action went through: the refusal is history
        self.show_frame(frame, self._selection.current)

    def show_frame(self, frame: Frame, selected_seq: str | None) -> int:
        """Bring every block item to the frame's state; returns how many changed."""
        if len(self.items) != frame.config.num_blocks or self.block_size != frame.config.block_size:
            self.layout_pool(frame.config.num_blocks, frame.config.block_size)
        full = frame.touched_blocks is None or selected_seq != self.selected_seq or self._shown is None
        self.selected_seq = selected_seq
        self._shown = frame
        blocks = range(len(self.items)) if full else frame.touched_blocks
        holders, ref_counts, fills = frame.holders, frame.ref_counts, frame.block_fill
        changed = 0
        null = NULL_BLOCK if frame.config.scheduler == "v1" else None
        for block in blocks:
            owners = holders.get(block, ())
            selected = selected_seq is not None and any(seq == selected_seq for seq, _ in owners)
            cached = block in frame.cached_blocks
            item = self.items[block]
            changed += item.set_state(
                int(ref_counts[block]), int(fills[block]), owners, selected, cached, block == null
            )
        return changed

    def slot_texts(self, block: int) -> tuple[str, ...] | None:
        """The text in each filled slot of ``block`` in the frame shown (a real model's)."""
        return None if self._shown is None else self._shown.slot_texts(block)

    def tile_rect(self, block: int):
        """The block's tile in viewport coordinates, or None if there is no such block."""
        if not 0 <= block < len(self.items):
            return None
        return self.mapFromScene(self.items[block].sceneBoundingRect()).boundingRect()

    def tile_rect_in(self, widget: QWidget, block: int) -> QRectF | None:
        """The block's tile in ``widget``'s coordinates; None if it is scrolled out of sight."""
        rect = self.tile_rect(block)
        if rect is None or not self.viewport().rect().intersects(rect):
            return None
        return QRectF(rect.translated(self.viewport().mapTo(widget, QPoint(0, 0))))

    # -- overlays for animations ------------------------------------------------------
    def add_copy_arrow(self, src: int, dst: int, colour: QColor, labelled: bool = True) -> QGraphicsPathItem:
        colour = readable_on(colour, self.theme.window)
        a = self.items[src].sceneBoundingRect().center()
        b = self.items[dst].sceneBoundingRect().center()
        path = QPainterPath(a)
        # Over the tiles, not through them: the arc's top clears the higher tile's top edge,
        # higher for neighbours so the arrow is never a tiny hook.
        top = min(a.y(), b.y()) - BLOCK_H * (1.1 if abs(a.x() - b.x()) < 2 * BLOCK_W else 0.8)
        mid = QPointF((a.x() + b.x()) / 2, top)
        path.quadTo(mid, b)
        direction = b - mid
        length = math.hypot(direction.x(), direction.y()) or 1.0
        ux, uy = direction.x() / length, direction.y() / length
        for side in (1, -1):
            path.moveTo(b)
            path.lineTo(b - QPointF(10 * ux - 5 * side * uy, 10 * uy + 5 * side * ux))
        overlay = QGraphicsPathItem(path)
        overlay.setPen(QPen(colour, 3.0, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap))
        overlay.setBrush(QBrush(Qt.BrushStyle.NoBrush))
        overlay.setZValue(10)
        overlay.setToolTip(f"copy-on-write: block #{src} copied into #{dst}")
        self.scene().addItem(overlay)
        self._overlays.append(overlay)
        if labelled:
            self.add_block_label(dst, f"copy of #{src}", colour)  # inside the copy: no other tile covered
        return overlay

    def add_block_label(self, block: int, text: str, colour: QColor) -> QGraphicsSimpleTextItem | None:
        """A short label inside a block's own tile, over its slots, for the length of an
        animation beat ("L1 → #3"): never over a neighbour. None where the tile is too small
        on screen for it to be read."""
        if not 0 <= block < len(self.items):
            return None
        tile = QRectF(self.items[block].pos(), QSizeF(BLOCK_W, BLOCK_H))
        area = tile.adjusted(2, 14, -2, -2)
        size = 12.0
        font, metrics = self.sized_font(size)
        while size > 5 and metrics.horizontalAdvance(text) > area.width() - 4:
            size -= 1
            font, metrics = self.sized_font(size)
        if size * self.transform().m11() < MIN_LABEL_PX:
            return None
        bold = QFont(font)
        bold.setBold(True)
        label = QGraphicsSimpleTextItem(text)
        label.setFont(bold)
        label.setBrush(QBrush(readable_on(colour, self.theme.window, 4.5)))
        label.setZValue(12)
        box = label.boundingRect()
        width, height = min(box.width(), area.width()), min(box.height(), area.height())
        label.setPos(area.center().x() - width / 2, area.center().y() - height / 2)
        plate = QGraphicsRectItem(QRectF(label.pos(), QSizeF(width, height)).adjusted(-1.5, 0, 1.5, 0) & area)
        backing = QColor(self.theme.window)
        backing.setAlpha(225)
        plate.setBrush(backing)
        plate.setPen(Qt.PenStyle.NoPen)
        plate.setZValue(11)
        for overlay in (plate, label):
            self.scene().addItem(overlay)
            self._overlays.append(overlay)
        return label

    def show_refusal(self, needed: int, free: int, message: str) -> None:
        """An operation needed more blocks than the free queue has: outline every free block
        and say how many were missing, until :meth:`clear_refusal` (the next action)."""
        colour = QColor(self.theme.bad)
        for item in self.items:
            if item.ref_count == 0 and item.refused is None:
                item.refused = colour
                item.update()
        short = needed - free
        self.refusal_banner.setText(
            f"<b>Refused:</b> needs {plural(needed, 'free block')}, the free queue has {free} "
            f"(outlined) — {short} short.<br><span style='font-size:small'>{html.escape(message)}</span>"
        )
        self.refusal_banner.setStyleSheet(
            f"QLabel {{ background: {self.theme.window}; color: {self.theme.bad}; border: 1px solid {self.theme.bad};"
            " padding: 4px; }"
        )
        self.refusal_banner.setMaximumWidth(max(200, self.viewport().width() - 12))
        self.refusal_banner.adjustSize()
        self.refusal_banner.move(6, 6)
        self.refusal_banner.show()
        self.refusal = (needed, free)

    def clear_refusal(self) -> None:
        if self.refusal is None:
            return
        self.refusal = None
        self.refusal_banner.hide()
        for item in self.items:
            if item.refused is not None:
                item.refused = None
                item.update()

    def set_lasting_arrows(self, arrows: list[tuple]) -> None:
        """Copy arrows ((source, copy, colour, labelled)) that outlive a re-layout of the grid."""
        self._lasting_arrows = [a for a in arrows if max(a[0], a[1]) < len(self.items)]

    def clear_overlays(self) -> None:
        for overlay in self._overlays:
            self.scene().removeItem(overlay)
        self._overlays.clear()
        for item in self._glowing:
            item.set_glow(None)
        self._glowing.clear()

    # -- navigation -----------------------------------------------------------------
    def fit(self) -> None:
        self.fitInView(self.scene().sceneRect(), Qt.AspectRatioMode.KeepAspectRatio)
        # Never blow small pools up past 2.5× (labels would turn cartoonish).
        if self.transform().m11() > 2.5:
            self.resetTransform()
            self.scale(2.5, 2.5)
        self.transformed.emit()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if not self._user_zoomed:
            self._arrange(self.best_columns())
            self.fit()

    def wheelEvent(self, event) -> None:
        factor = 1.15 if event.angleDelta().y() > 0 else 1 / 1.15
        self.zoom(factor, under_mouse=True)

    def mouseDoubleClickEvent(self, event) -> None:
        self._user_zoomed = False
        self.fit()

    def zoom(self, factor: float, under_mouse: bool = False) -> None:
        """Zoom by ``factor``: about the cursor for the wheel; from the keys or the toolbar,
        about the selected sequence's blocks (else the view's centre)."""
        self.scale(factor, factor)
        self._user_zoomed = True
        if not under_mouse:
            blocks = [item for item in self.items if item.selected_seq]
            if blocks:
                area = blocks[0].sceneBoundingRect()
                for item in blocks[1:]:
                    area = area.united(item.sceneBoundingRect())
                self.centerOn(area.center())
        self.transformed.emit()
