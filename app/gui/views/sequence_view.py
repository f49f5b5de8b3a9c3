"""Sequences and their block tables: logical block index → physical block id."""

from __future__ import annotations

import math

from pagesim.app.gui.palette import SequenceColours, Theme, ink_on
from pagesim.core.view_model import Frame
from PySide6.QtCore import QEvent, QPoint, QRect, QRectF, QSignalBlocker, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFontMetricsF, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QAbstractItemView, QStyle, QStyledItemDelegate, QToolTip, QTreeWidget, QTreeWidgetItem

TABLE_COLUMN = 3
MAX_LINES = 4  # the selected row's table wraps onto at most this many lines, the others take one; the rest is counted
ENTRY_W, ENTRY_H = 34, 30


def _text_width(metrics: QFontMetricsF, text: str) -> int:
    """A text's width rounded up, as a cell's size hint counts it (a fractional advance
    rounded to nearest could leave a cell one pixel short, its text cut)."""
    return math.ceil(metrics.horizontalAdvance(text))


class BlockTableDelegate(QStyledItemDelegate):
    """Paints a block table as boxes: logical index on top, physical block id below."""

    def __init__(self, view: SequenceView) -> None:
        super().__init__(view)
        self.view = view

    def sizeHint(self, option, index) -> QSize:
        table = index.data(Qt.ItemDataRole.UserRole) or ()
        seq_id = index.data(Qt.ItemDataRole.UserRole + 1)
        per_line = self.view.entries_per_line(seq_id, len(table))
        lines = min(self.view.max_lines(seq_id), max(1, -(-len(table) // per_line)))
        return QSize(min(len(table), per_line) * (ENTRY_W + 3) + 6, lines * (ENTRY_H + 3) + 3)

    def paint(self, painter: QPainter, option, index) -> None:
        if option.state & QStyle.StateFlag.State_Selected:
            # A light wash, so the boxes stay readable on the selected row.
            wash = QColor(option.palette.highlight().color())
            wash.setAlpha(70)
            painter.fillRect(option.rect, wash)
        table = index.data(Qt.ItemDataRole.UserRole) or ()
        seq_id = index.data(Qt.ItemDataRole.UserRole + 1)
        refs = index.data(Qt.ItemDataRole.UserRole + 2) or ()
        theme: Theme = self.view.theme
        colour = self.view.colours(seq_id)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        small = painter.font()
        small.setPointSizeF(7.0)
        lookup = self.view.lookup
        per_line, head, tail = self.view.entries_shown(seq_id, len(table))
        if head + tail < len(table):  # the middle, counted in one box between the head and the tail
            line, column = divmod(head, per_line)
            box = QRectF(
                option.rect.x() + 3 + column * (ENTRY_W + 3), option.rect.y() + 3 + line * (ENTRY_H + 3),
                ENTRY_W, ENTRY_H,
            )  # fmt: skip
            painter.setPen(QColor(theme.muted))
            painter.setFont(small)
            painter.drawText(box, Qt.AlignmentFlag.AlignCenter, f"+{len(table) - head - tail}\nmore")
        for logical, position in shown_positions(len(table), head, tail):
            physical = table[logical]
            line, column = divmod(position, per_line)
            box = QRectF(
                option.rect.x() + 3 + column * (ENTRY_W + 3),
                option.rect.y() + 3 + line * (ENTRY_H + 3),
                ENTRY_W,
                ENTRY_H,
            )
            lit = lookup == (seq_id, logical)
            fill = QColor(colour)
            fill.setAlpha(255 if lit else 70)
            painter.setPen(QColor(theme.highlight) if lit else QColor(theme.block_border))
            painter.setBrush(fill)
            painter.drawRoundedRect(box, 3, 3)
            painter.setFont(small)
            ink = ink_on(fill) if lit else None  # (lit, the box is the owner's colour, solid)
            painter.setPen(ink or QColor(theme.muted))
            painter.drawText(box.adjusted(0, 1, 0, -ENTRY_H / 2), Qt.AlignmentFlag.AlignCenter, f"L{logical}")
            bold = painter.font()
            bold.setPointSizeF(8.5)
            bold.setBold(True)
            painter.setFont(bold)
            painter.setPen(ink or QColor(theme.text))
            shared = "*" if logical < len(refs) and refs[logical] > 1 else ""
            painter.drawText(
                box.adjusted(0, ENTRY_H / 2 - 2, 0, 0), Qt.AlignmentFlag.AlignCenter, f"{physical}{shared}"
            )
        painter.restore()


def box_position(logical: int, count: int, head: int, tail: int) -> int:
    """The box that shows entry ``logical`` of a table of ``count`` (``head`` shown first,
    ``tail`` last): its own, or the "+N more" box at position ``head`` that counts it."""
    if logical < head or head + tail >= count:
        return logical
    return head + 1 + logical - (count - tail) if logical >= count - tail else head


def shown_positions(count: int, head: int, tail: int) -> list[tuple[int, int]]:
    """(logical block, box position) of the entries with a box of their own: the first
    ``head``, then (after the "+N more" box at position ``head``) the last ``tail``."""
    logicals = range(count) if head + tail >= count else [*range(head), *range(count - tail, count)]
    return [(i, box_position(i, count, head, tail)) for i in logicals]


class SequenceView(QTreeWidget):
    """Selecting a sequence highlights its blocks in the pool and focuses the kernel panel."""

    sequenceSelected = Signal(str)
    contextMenuRequested = Signal(str, object)
    lookupChanged = Signal(str, int)  # seq, logical block lit in its table ("", -1: none)
    entryHovered = Signal(str, int, int, int)  # seq, logical block, physical block, -1 (-1s: none)

    def __init__(self, colours: SequenceColours, theme: Theme, parent=None) -> None:
        super().__init__(parent)
        self.colours = colours
        self.theme = theme
        self.lookup: tuple[str, int] | None = None  # the table entry an animation lights
        self.setColumnCount(4)
        self.setHeaderLabels(["Sequence", "Tokens", "Blocks", "Block table (L → #)"])
        self.headerItem().setToolTip(0, "Sequence name (a request's samples or beams are request/s0, /s1, …)")
        self.headerItem().setToolTip(
            TABLE_COLUMN,
            "Each box is one entry of the block table: L<i> is the logical block (tokens i·B … i·B+B−1), "
            "the number under it the physical block holding them. * marks a block shared with another sequence.",
        )
        self.setRootIsDecorated(False)
        self.setMinimumWidth(220)
        self.setUniformRowHeights(False)  # the selected row wraps its long table onto more lines
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setHorizontalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setItemDelegateForColumn(TABLE_COLUMN, BlockTableDelegate(self))
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.customContextMenuRequested.connect(self._context_menu)
        self.itemSelectionChanged.connect(self._selection_changed)
        self._rows: dict[str, QTreeWidgetItem] = {}
        self._right_pressed: QTreeWidgetItem | None = None  # the row a right-press was on
        self._phased: set[str] = set()  # rows whose Tokens cell says what the step computed
        self._tokens_margin: int | None = None
        self.headerItem().setToolTip(
            1,
            "Tokens it holds; then, in brackets, what this step computed for it (already counted): +N prefill "
            "(a prompt, or several tokens in one pass) or +1 decode (one new token)",
        )
        self._shown: dict[str, tuple] = {}  # per row: (tokens, table, ref counts) it shows
        self._updating = False
        self._hovered_entry: tuple[str, int] | None = None
        self._kept_in_view: str | None = None  # the selection last brought into view
        self._rows_changed = False  # the last frame added or removed rows (the selected one may have moved)
        self.viewport().setMouseTracking(True)  # hovering an entry lights its tile and line

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.viewport().update()

    @property
    def selected(self) -> str | None:
        items = self.selectedItems()
        return items[0].data(0, Qt.ItemDataRole.UserRole) if items else None

    def select(self, seq_id: str | None) -> None:
        item = self._rows.get(seq_id) if seq_id else None
        if item is None:
            self.clearSelection()
        else:
            self.setCurrentItem(item)

    def bind(self, controller, selection) -> None:
        """Follow the controller's frames, with ``selection``'s sequence selected (``selection``
        is reconciled with each frame before this view sees it)."""
        self._selection = selection
        controller.frameChanged.connect(self._on_frame)

    def _on_frame(self, frame: Frame) -> None:
        self.show_frame(frame)
        current = self._selection.current
        self.select(current)
        # A selection that moved (the selected sequence freed on the way) or a jump (a seek, an
        # undo): its row is brought into view once the rows are laid out.
        if current != self._kept_in_view or frame.touched_sequences is None or self._rows_changed:
            self._kept_in_view = current
            QTimer.singleShot(0, self, self._keep_selection_in_view)

    def show_frame(self, frame: Frame) -> None:
        self._updating = True
        try:
            live = {s.seq_id for s in frame.sequences}
            removed = False
            for seq_id in list(self._rows):
                if seq_id not in live:
                    self.takeTopLevelItem(self.indexOfTopLevelItem(self._rows.pop(seq_id)))
                    self._shown.pop(seq_id, None)
                    removed = True
            touched = frame.touched_sequences
            added = False
            for order, seq in enumerate(frame.sequences):
                item = self._rows.get(seq.seq_id)
                if item is None:
                    item = QTreeWidgetItem()
                    item.setData(0, Qt.ItemDataRole.UserRole, seq.seq_id)
                    item.setIcon(0, self._swatch(seq.seq_id))
                    self.insertTopLevelItem(order, item)
                    self._rows[seq.seq_id] = item
                    added = True
                elif touched is not None and seq.seq_id not in touched:
                    continue  # this step left the row as it was
                self._fill_row(item, seq, frame)
            self._rows_changed = added or removed
            if added or removed or touched is None:
                self._follow_order(frame)
            widened = self._show_phases(frame)
            if added or touched is None or widened:
                for column in range(3):
                    self.resizeColumnToContents(column)
        finally:
            self._updating = False

    def _follow_order(self, frame: Frame) -> None:
        """Rows in the frame's order: rows kept from another step (a jump back) stayed where
        they were, so the same step could list its sequences in another order."""
        wanted = [s.seq_id for s in frame.sequences]
        for index, seq_id in enumerate(wanted):
            item = self._rows[seq_id]
            at = self.indexOfTopLevelItem(item)
            if at != index:
                self.insertTopLevelItem(index, self.takeTopLevelItem(at))

    def _fill_row(self, item: QTreeWidgetItem, seq, frame: Frame) -> None:
        """Only what changed: each set is a dataChanged the view answers by asking the
        delegate for sizes (a decode step changes the token count, seldom the table)."""
        refs = tuple(frame.ref_counts[list(seq.block_table)].tolist())
        shown = self._shown.get(seq.seq_id)
        if shown is None:
            item.setText(0, seq.seq_id)
            item.setData(TABLE_COLUMN, Qt.ItemDataRole.UserRole + 1, seq.seq_id)

        def show_count() -> None:
            item.setText(1, str(seq.num_tokens))
            blocks, size = len(seq.block_table), frame.config.block_size
            item.setToolTip(0, f"{seq.seq_id}: {seq.num_tokens} tokens in {blocks} blocks of {size}")

        if shown is None:
            show_count()
        elif shown[0] != seq.num_tokens:
            # A new count never changes the row's height: repaint the cell instead of letting
            # the view re-measure the row (a dataChanged would, at many times the set's cost).
            with QSignalBlocker(self.model()):
                show_count()
            self._repaint_if_shown(item)
        if shown is None or shown[1] != seq.block_table:
            item.setText(2, str(len(seq.block_table)))
            item.setData(TABLE_COLUMN, Qt.ItemDataRole.UserRole, seq.block_table)
        if shown is None or shown[2] != refs:
            item.setData(TABLE_COLUMN, Qt.ItemDataRole.UserRole + 2, refs)
        self._shown[seq.seq_id] = (seq.num_tokens, seq.block_table, refs)

    def _show_phases(self, frame: Frame) -> bool:
        """Each row's Tokens cell says what this step did to it: "(+38 prefill)" or "(+1 decode)"
        (only rows the step or the last one computed). True: a cell needs a wider column."""
        work = {w.seq: w for w in frame.step_work.sequences} if frame.step_work is not None else {}
        phased = self._phased
        counts = {s.seq_id: s.num_tokens for s in frame.sequences} if work or phased else {}
        widened, metrics = False, QFontMetricsF(self.font())
        for seq_id in phased | work.keys():
            item = self._rows.get(seq_id)
            if item is None:
                continue
            done = work.get(seq_id)
            text = str(counts[seq_id])
            if done is not None:
                # (in brackets: the count already holds them, "17 +4" read as 21)
                text += f" (+{done.tokens} {done.kind})" if done.tokens else " (prefix hit)"
            with QSignalBlocker(self.model()):
                item.setText(1, text)
                item.setToolTip(1, f"This step: {done.describe()}" if done is not None else "Tokens it holds")
            self._repaint_if_shown(item)
            widened |= _text_width(metrics, text) + self._cell_margin(item, metrics) > self.columnWidth(1)
        self._phased = set(work)
        return widened

    def _cell_margin(self, item: QTreeWidgetItem, metrics: QFontMetricsF) -> int:
        """The Tokens cell's width beyond its text's, as the style sizes it (measured once: a
        guessed margin wider than the style's re-measured every row at every step)."""
        if self._tokens_margin is None:
            hint = self.sizeHintForIndex(self.indexFromItem(item, 1)).width()
            self._tokens_margin = hint - _text_width(metrics, item.text(1))
        return self._tokens_margin

    def _repaint_if_shown(self, item: QTreeWidgetItem) -> None:
        """Repaint a row if it is on screen. Finding a row's rectangle walks the rows above it
        (their heights differ), so rows scrolled out of view are not measured at all."""
        first = self.indexAt(QPoint(0, 0)).row()
        last = self.indexAt(QPoint(0, self.viewport().height() - 1)).row()
        row = self.indexOfTopLevelItem(item)
        if first >= 0 and first <= row and (last < 0 or row <= last):
            self.viewport().update(self.visualItemRect(item))

    def entry_rects(self, seq_id: str) -> list[tuple[int, QRect]]:
        """(logical block, its box in viewport coordinates) of a sequence's block table, as
        the delegate paints them."""
        grid = self._entry_grid(seq_id)
        if grid is None:
            return []
        return [(logical, self._grid_box(grid, position)) for logical, position in shown_positions(*grid[3:])]

    def more_tooltip(self, pos: QPoint) -> str | None:
        """What a "+N more" box under ``pos`` (viewport coordinates) stands for; None elsewhere."""
        item = self.itemAt(pos)
        if item is None:
            return None
        seq_id = item.data(0, Qt.ItemDataRole.UserRole)
        grid = self._entry_grid(seq_id)
        if grid is None:
            return None
        count, head, tail = grid[3:]
        if head + tail >= count or not self._grid_box(grid, head).contains(pos):
            return None
        table = item.data(TABLE_COLUMN, Qt.ItemDataRole.UserRole) or ()
        hidden = [f"L{logical}→#{table[logical]}" for logical in range(head, count - tail)]
        listed = ", ".join(hidden[:16]) + (f", … ({len(hidden)} in all)" if len(hidden) > 16 else "")
        return (
            f"{seq_id}'s table has {len(hidden)} more entries than fit here: {listed}. Widen this panel to see "
            "more, or hover a token of the token map to light its entry"
        )

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.scheduleDelayedItemsLayout()  # the tables fit the width: the rows' heights and boxes follow
        if event.size().height() < event.oldSize().height() or event.size().width() != event.oldSize().width():
            QTimer.singleShot(0, self, self._keep_selection_in_view)  # (once the rows are laid out again)

    def _keep_selection_in_view(self) -> None:
        """A smaller window must not leave the selected row (and its lines to the pool) out of sight."""
        item = self._rows.get(self.selected) if self.selected else None
        if item is not None:
            self.executeDelayedItemsLayout()
            self.scrollToItem(item, QAbstractItemView.ScrollHint.EnsureVisible)

    def viewportEvent(self, event) -> bool:
        if event.type() == QEvent.Type.ToolTip and (tip := self.more_tooltip(event.pos())) is not None:
            QToolTip.showText(event.globalPos(), tip, self.viewport())
            return True
        return super().viewportEvent(event)

    def entry_box(self, seq_id: str, logical: int) -> QRect | None:
        """The box that shows ``logical``: its own, or the "+N more" box that counts it."""
        grid = self._entry_grid(seq_id)
        if grid is None or not 0 <= logical < grid[3]:
            return None
        return self._grid_box(grid, box_position(logical, *grid[3:]))

    def _entry_grid(self, seq_id: str):
        """(x, y, entries per line, table length, entries shown first, entries shown last) of a
        sequence's table cell (see :meth:`entries_shown`)."""
        item = self._rows.get(seq_id)
        if item is None:
            return None
        cell = self.visualRect(self.indexFromItem(item, TABLE_COLUMN))
        table = item.data(TABLE_COLUMN, Qt.ItemDataRole.UserRole) or ()
        per_line, head, tail = self.entries_shown(seq_id, len(table))
        return cell.x() + 3, cell.y() + 3, per_line, len(table), head, tail

    @staticmethod
    def _grid_box(grid, i: int) -> QRect:
        x, y, per_line = grid[:3]
        return QRect(x + (i % per_line) * (ENTRY_W + 3), y + (i // per_line) * (ENTRY_H + 3), ENTRY_W, ENTRY_H)

    def entries_per_line(self, seq_id: str | None, count: int) -> int:
        """The boxes that fit the column's visible width: the selected sequence's table wraps
        onto :meth:`max_lines` lines of them, the others take one."""
        visible = self.viewport().width() - self.header().sectionPosition(TABLE_COLUMN) + self.horizontalOffset()
        return max(1, (visible - 6) // (ENTRY_W + 3))

    def max_lines(self, seq_id: str | None) -> int:
        """1, or for the selected sequence up to :data:`MAX_LINES`: as many as leave a line
        for every other row in sight (a short dock showed the selected row alone, the others
        scrolled away), and at most half the rows' room where they cannot all be seen anyway."""
        if seq_id is None or seq_id != self.selected:
            return 1
        line, row = ENTRY_H + 3, ENTRY_H + 6  # a line of boxes; a one-line row (its 3-px margin too)
        height = self.viewport().height() - 3
        others = self.topLevelItemCount() - 1
        # Every other row fits with at least one line for this one, or they scroll anyway: half the height.
        fits = others * row + line <= height
        lines = (height - others * row) // line if fits else height // 2 // line
        return max(1, min(MAX_LINES, lines))

    def entries_shown(self, seq_id: str | None, count: int) -> tuple[int, int, int]:
        """(boxes per line, entries shown first, entries shown last) of a table of ``count``
        entries: where they do not all fit, one box between the two counts the middle ("+N
        more"). The last entries stay in sight: where forks part (beams, samples) and where
        the next token is written."""
        per_line = self.entries_per_line(seq_id, count)
        room = per_line * self.max_lines(seq_id)
        if count <= room:
            return per_line, count, 0
        tail = min(2, room // 2)
        return per_line, room - 1 - tail, tail

    def set_lookup(self, lookup: tuple[str, int] | None) -> None:
        if lookup != self.lookup:
            self.lookup = lookup
            self.viewport().update()
            self.lookupChanged.emit(*(lookup or ("", -1)))

    def entry_at(self, pos: QPoint) -> tuple[str, int] | None:
        """(sequence, logical block) of the block-table box under ``pos`` (viewport coordinates)."""
        item = self.itemAt(pos)
        if item is None:
            return None
        seq_id = item.data(0, Qt.ItemDataRole.UserRole)
        return next(((seq_id, logical) for logical, box in self.entry_rects(seq_id) if box.contains(pos)), None)

    def mousePressEvent(self, event) -> None:
        # A right-press selects its row, and the rows re-layout (the old selection's table
        # folds): the menu that follows is for the row pressed, wherever it has moved to.
        if event.button() == Qt.MouseButton.RightButton:
            self._right_pressed = self.itemAt(event.position().toPoint())
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event) -> None:
        super().mouseMoveEvent(event)
        self._hover_entry(self.entry_at(event.position().toPoint()))

    def leaveEvent(self, event) -> None:
        super().leaveEvent(event)
        self._hover_entry(None)

    def _hover_entry(self, entry: tuple[str, int] | None) -> None:
        if entry == self._hovered_entry:
            return
        previous, self._hovered_entry = self._hovered_entry, entry
        if entry is None:
            self.entryHovered.emit(previous[0] if previous else "", -1, -1, -1)
            return
        seq_id, logical = entry
        table = self._rows[seq_id].data(TABLE_COLUMN, Qt.ItemDataRole.UserRole) or ()
        self.entryHovered.emit(seq_id, logical, table[logical], -1)

    def _swatch(self, seq_id: str) -> QIcon:
        """The sequence's colour, ringed dark then light: on a selected row of its own blue (or
        any other background) the swatch keeps its edge."""
        pixmap = QPixmap(12, 12)
        pixmap.fill(QColor(0, 0, 0, 170))
        painter = QPainter(pixmap)
        painter.fillRect(1, 1, 10, 10, QColor(255, 255, 255, 220))
        painter.fillRect(2, 2, 8, 8, self.colours(seq_id))
        if (hatch := self.colours.hatch(seq_id, self.theme)) is not None:  # an eighth request's, as on its tiles
            painter.fillRect(2, 2, 8, 8, hatch)
        painter.end()
        icon = QIcon(pixmap)
        icon.addPixmap(pixmap, QIcon.Mode.Selected)  # (not the style's tint of it)
        return icon

    def _selection_changed(self) -> None:
        self.scheduleDelayedItemsLayout()  # the selected row's height changes (its table wraps)
        if not self._updating:
            self.sequenceSelected.emit(self.selected or "")

    def _context_menu(self, pos) -> None:
        pressed, self._right_pressed = self._right_pressed, None
        item = pressed if pressed is not None and self.indexOfTopLevelItem(pressed) >= 0 else self.itemAt(pos)
        if item is not None:
            self.setCurrentItem(item)
            self.contextMenuRequested.emit(item.data(0, Qt.ItemDataRole.UserRole), self.viewport().mapToGlobal(pos))
