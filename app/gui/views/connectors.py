"""Lines from the selected sequence's block-table entries to the pool tiles they name, in
the manner of the vLLM paper's figures 6–8: drawn over the whole window (the table and the
pool live in different panels), never catching the mouse. A short table gets a line per
entry; past a handful they cross into a tangle, so a long one shows only the line of the
entry being looked up (the hovered token or entry, the walk-through's or animation's lookup)."""

from __future__ import annotations

from pagesim.app.gui.palette import Theme, readable_on
from pagesim.app.gui.views.pool_view import PoolView
from pagesim.app.gui.views.sequence_view import SequenceView
from pagesim.core.view_model import Frame
from PySide6.QtCore import QEvent, QObject, QPoint, QPointF, QRect, Qt, QTimer
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen, QPixmap, QRegion
from PySide6.QtWidgets import QWidget

LINES_ALL_MAX = 6  # entries: up to a handful, a line each; beyond, only the looked-up entry's


OVER_TEXT_ALPHA = 0.25  # a line's strength where it crosses text: there, the text comes first
ARRIVAL = QRect(-22, -9, 26, 18)  # around a line's end, at its tile's left edge: drawn at full strength


class TableToPoolLines(QWidget):
    """Qt repaints this see-through, window-wide widget wherever anything under it repaints
    (the pool every step): so the lines are drawn once into a pixmap when they change, and
    a repaint only copies the part of it asked for."""

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
        self._key: tuple = ()  # what the pixmap shows
        self._pixmap: QPixmap | None = None
        self._origin = QPoint()  # where the pixmap's top-left sits in this widget
        self._frame: Frame | None = None
        self._selection = None
        # Widgets of text the lines may cross (the narration, the pool's caption and legend):
        # over them the lines are drawn faint, so the text stays readable and the lines whole.
        self.text_widgets: list[QWidget] = []
        for view in (sequence_view, pool_view):
            for bar in (view.verticalScrollBar(), view.horizontalScrollBar()):
                bar.valueChanged.connect(self.refresh)
                bar.rangeChanged.connect(self.refresh)
            view.viewport().installEventFilter(self)  # a panel resized or moved
        pool_view.transformed.connect(self.refresh)
        # A column fitted to its contents (a row added or gone: an undo) moves the entries
        # without resizing the viewport.
        sequence_view.header().sectionResized.connect(self.refresh)
        sequence_view.lookupChanged.connect(self._on_lookup)
        window.installEventFilter(self)
        # Raising a tabbed dock (the Latency tab, say) restacks the central widget over its
        # siblings: the pool then hid the lines' ends. Every sibling's restack is watched.
        self._siblings: list[QWidget] = []
        self._raise_due = False
        for child in window.children():
            self._watch_sibling(child)
        self.hide()  # shown, over just the lines' bounds, while there are lines

    def _raise_over_siblings(self) -> None:
        self._raise_due = False
        self.raise_()  # (its ZOrderChange goes to this widget alone: no loop)

    def _watch_sibling(self, child: QObject) -> None:
        if child is not self and child.isWidgetType() and child not in self._siblings:
            self._siblings.append(child)
            child.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if watched is self.parentWidget():
            if kind == QEvent.Type.Resize:
                self.refresh()
            elif kind == QEvent.Type.ChildPolished:  # (at ChildAdded a child is half-built: not touched then)
                self._watch_sibling(event.child())
        elif watched in self._siblings:
            if kind == QEvent.Type.ZOrderChange and self.isVisible() and not self._raise_due:
                # After the sibling's own handling: a dock brings its tab to the front only
                # if it is still the window's topmost child when it sees the event.
                self._raise_due = True
                QTimer.singleShot(0, self, self._raise_over_siblings)
        elif kind in (QEvent.Type.Resize, QEvent.Type.Move, QEvent.Type.Show, QEvent.Type.Hide):
            self.refresh()
        return False

    def set_text_widgets(self, widgets: list[QWidget]) -> None:
        """The widgets of text the lines may cross: drawn faint over them, and redrawn when
        one moves, resizes, shows or hides (the narration grows and shrinks with each step)."""
        self.text_widgets = list(widgets)
        for widget in self.text_widgets:
            widget.installEventFilter(self)

    def bind(self, controller, selection, colours, theme: Theme) -> None:
        """Follow the controller's frames: lines for ``selection``'s sequence (reconciled
        with each frame first)."""
        self._selection, self._colours, self.theme = selection, colours, theme
        controller.frameChanged.connect(self._on_frame)

    def _on_frame(self, frame: Frame) -> None:
        self._frame = frame
        self.show_selected()

    def _on_lookup(self, seq_id: str, logical: int) -> None:
        if self._selection is None:
            return
        if seq_id == self._selection.current or logical < 0:
            self.show_selected(logical if logical >= 0 else None)

    def show_selected(self, lit: int | None = None) -> None:
        """Lines for the selected sequence (none when nothing is selected); ``lit``: a logical
        block to draw bold (by default the one its table lights)."""
        frame, seq_id = self._frame, self._selection.current
        lookup = self.sequence_view.lookup
        if lit is None and lookup is not None and lookup[0] == seq_id:
            lit = lookup[1]
        state = frame.sequence(seq_id) if frame is not None and seq_id else None
        if state is None:
            self.show_sequence(None, (), QColor(self.theme.text))
        else:
            self.show_sequence(state.seq_id, state.block_table, self._colours(state.seq_id), lit)

    def set_enabled(self, enabled: bool) -> None:
        self.enabled = enabled
        self.refresh()

    def show_sequence(self, seq_id: str | None, table, colour: QColor, lit: int | None = None) -> None:
        """``colour``: the owner's, made to stand out from the theme's background."""
        colour = readable_on(colour, self.theme.window)
        state = (seq_id, tuple(table), colour.name(), lit)
        if state == (self.seq_id, self.table, self.colour.name(), self.lit):
            return
        self.seq_id, self.table, self.colour, self.lit = seq_id, tuple(table), QColor(colour), lit
        self.raise_()
        self.refresh()

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        if self._frame is not None:
            self.show_selected()

    def segments(self) -> list[tuple[int, QPointF, QPointF]]:
        """(logical block, start on its table entry, end on its pool tile) in this widget's
        coordinates, for the entries and tiles both on screen: every entry's for a short
        table, the lit entry's alone for a long one."""
        window = self.parentWidget()
        if not self.enabled or self.seq_id is None or not self.table:
            return []
        few = len(self.table) <= LINES_ALL_MAX
        if not few and (self.lit is None or not 0 <= self.lit < len(self.table)):
            return []
        table_port, pool_port = self.sequence_view.viewport(), self.pool_view.viewport()
        for port in (table_port, pool_port):
            if not port.isVisible() or not window.isAncestorOf(port):  # hidden, or in a floating panel
                return []
        table_at, pool_at = table_port.mapTo(window, QPoint(0, 0)), pool_port.mapTo(window, QPoint(0, 0))
        table_clip, pool_clip = QRect(table_at, table_port.size()), QRect(pool_at, pool_port.size())
        out = []
        if few:
            entries = self.sequence_view.entry_rects(self.seq_id)
            lit = self.lit
            if lit is not None and 0 <= lit < len(self.table) and all(logical != lit for logical, _ in entries):
                box = self.sequence_view.entry_box(self.seq_id, lit)  # (hidden: from the "+N more" box)
                entries = entries + ([] if box is None else [(lit, box)])
        else:  # the lit entry's box, or the "+N more" box that counts it
            box = self.sequence_view.entry_box(self.seq_id, self.lit)
            entries = [] if box is None else [(self.lit, box)]
        for logical, entry in entries:
            if logical >= len(self.table):
                break
            start = QPoint(entry.center().x(), entry.bottom()) + table_at
            if not table_clip.contains(start):
                continue
            tile = self.pool_view.tile_rect(self.table[logical])
            if tile is None:
                continue
            end = QPoint(tile.left() + 2, tile.center().y()) + pool_at  # its left edge
            if pool_clip.contains(end):
                out.append((logical, QPointF(start), QPointF(end)))
        return out

    def _text_rects(self) -> list[QRect]:
        """Where the text widgets lie, in this widget's coordinates (its parent's)."""
        window = self.parentWidget()
        return [
            QRect(widget.mapTo(window, QPoint(0, 0)), widget.size())
            for widget in self.text_widgets
            if widget.isVisible() and window.isAncestorOf(widget)
        ]

    def _rows_below(self, segments) -> list[QRect]:
        """The table under the selected row's entries: the lines leave it across the other
        rows' entries, which they struck through (B's line over A2's "0*")."""
        port = self.sequence_view.viewport()
        at = port.mapTo(self.parentWidget(), QPoint(0, 0))
        top = int(max(start.y() for _, start, _ in segments)) + 4
        bottom = at.y() + port.height()
        return [QRect(at.x(), top, port.width(), bottom - top)] if bottom > top else []

    def _pool_rect(self) -> list[QRect]:
        """The pool: a line to a far tile crosses nearer ones (and their ×N badges) on its way;
        it is drawn faint there but for its arrival (see ARRIVAL)."""
        port = self.pool_view.viewport()
        return [QRect(port.mapTo(self.parentWidget(), QPoint(0, 0)), port.size())]

    def refresh(self, *_) -> None:
        """Redraw the lines into the pixmap if they changed, and repaint where they were and are."""
        segments = self.segments()
        text = self._text_rects() + self._rows_below(segments) + self._pool_rect() if segments else []
        key = (
            tuple((logical, s.toTuple(), e.toTuple()) for logical, s, e in segments),
            self.colour.name(),
            self.lit,
            tuple(r.getRect() for r in text),
        )
        if key == self._key:
            return
        self._key = key
        self._pixmap = None
        paths = []
        for logical, start, end in segments:
            path = QPainterPath(start)  # down out of the table row, then across into the tile's left side
            bend = max(40.0, abs(end.x() - start.x()) * 0.45)
            path.cubicTo(QPointF(start.x(), start.y() + 40), QPointF(end.x() - bend, end.y()), end)
            paths.append((logical == self.lit, path, start, end))
        if paths:
            bounds = paths[0][1].boundingRect()
            for _, path, _, _ in paths[1:]:
                bounds = bounds.united(path.boundingRect())
            area = bounds.adjusted(-4, -4, 4, 4).toAlignedRect()
            ratio = self.devicePixelRatioF()
            self._pixmap = QPixmap(area.size() * ratio)
            self._pixmap.setDevicePixelRatio(ratio)
            self._pixmap.fill(Qt.GlobalColor.transparent)
            self._origin = area.topLeft()
            painter = QPainter(self._pixmap)
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            painter.translate(-QPointF(self._origin))
            over_text = QRegion()
            for rect in text:
                over_text += QRegion(rect)
            for _, _, _, end in paths:  # each line reaches its own tile at full strength
                over_text -= QRegion(ARRIVAL.translated(end.toPoint()))
            clear = QRegion(area) - over_text
            for clip, alpha in ((clear, 1.0), (over_text, OVER_TEXT_ALPHA)):
                if clip.isEmpty():
                    continue
                painter.setClipRegion(clip)
                faint, bold = QColor(self.colour), QColor(self.colour)
                faint.setAlphaF(170 / 255 * alpha)
                bold.setAlphaF(alpha)
                for lit, path, start, end in paths:
                    painter.setPen(QPen(bold if lit else faint, 2.6 if lit else 1.4))
                    painter.setBrush(Qt.BrushStyle.NoBrush)
                    painter.drawPath(path)
                    painter.setBrush(bold if lit else faint)
                    painter.drawEllipse(start, 2.0, 2.0)
                    painter.drawEllipse(end, 2.5, 2.5)
            painter.end()
        if self._pixmap is None:
            self.hide()
            return
        # Only the lines' own rectangle: Qt repaints this see-through widget wherever
        # something under it repaints, so it must cover no more than it draws on.
        self.setGeometry(QRect(self._origin, self._pixmap.size() / self._pixmap.devicePixelRatio()))
        self.raise_()
        self.show()
        self.update()

    def paintEvent(self, event) -> None:
        if self._pixmap is None:
            return
        ratio = self._pixmap.devicePixelRatio()
        painter = QPainter(self)
        for dirty in event.region():  # only what is being repainted under us
            painter.drawPixmap(dirty, self._pixmap, QRect(dirty.topLeft() * ratio, dirty.size() * ratio))
        painter.end()
