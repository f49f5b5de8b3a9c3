"""What the step computed, as one bar: a segment per sequence — its prefill (solid: many
tokens in one pass), its one decode token (hatched, as in v1's token budget) — and the
prompt tokens a prefix-cache hit let it skip (an empty, dashed segment: not computed). The
bar's width is the step's tokens. A v1 schedule step shows its token budget instead (in the
Scheduler tab), so this bar says so in one line."""

from __future__ import annotations

from pagesim.app.gui.palette import SequenceColours, Theme, ink_on
from pagesim.app.gui.views.token_budget import segment_widths
from pagesim.app.gui.views.tooltips import answer_tooltip
from pagesim.core.step_work import DECODE, SequenceWork, StepWork
from pagesim.core.view_model import Frame
from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

MARGIN, TITLE_H, BAR_H = 2, 15, 12  # compact: at 1024 × 700 every pixel of height is the pool's
HEIGHT = TITLE_H + BAR_H + 2 * MARGIN + 2
DEFAULT_TIP = (
    "What this step computed. Prefill (solid): a new prompt, or several tokens at once, computed in one pass, "
    "every token attending to the ones before it. Decode (hatched): one new token per running sequence, attending "
    "to the K/V already cached in its blocks. Skipped (dashed, empty): prompt tokens found in the prefix cache, "
    "whose K/V is already in the pool, so they are not computed again. Hover a segment for its sequence."
)
V1_LINE = "This v1 step's tokens: see the token budget in the Scheduler tab."


class StepWorkBar(QWidget):
    def __init__(self, colours: SequenceColours, theme: Theme, parent=None) -> None:
        super().__init__(parent)
        self.colours, self.theme = colours, theme
        self.frame: Frame | None = None
        self.segments: list[tuple[QRectF, SequenceWork, bool]] = []  # (rect, work, the skipped part)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(HEIGHT)
        self.setToolTip(DEFAULT_TIP)

    def sizeHint(self) -> QSize:
        return QSize(300, HEIGHT)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()

    def bind(self, controller) -> None:
        controller.frameChanged.connect(self.show_frame)

    @property
    def work(self) -> StepWork | None:
        frame = self.frame
        return None if frame is None or frame.token_budget is not None else frame.step_work

    def show_frame(self, frame: Frame) -> None:
        self.frame = frame
        self._layout()
        self.update()

    def title(self) -> str:
        frame = self.frame
        if frame is None:
            return ""
        if frame.token_budget is not None:
            return V1_LINE
        work = self.work
        if work is None:
            if not frame.position:
                return "No step yet: each step's bar shows the tokens it computes, prefill or decode"
            checked = (
                "; the kernel still read every live sequence's K/V through its block table, checked against dense"
                if frame.attention is not None
                else ""
            )
            return f"Step {frame.position}: no token computed{checked}"
        timing = work.timing()
        return f"Step {frame.position} · {work.summary()}" + (f" · {timing}" if timing else "")

    def bar_rect(self) -> QRectF:
        return QRectF(MARGIN, MARGIN + TITLE_H, max(1, self.width() - 2 * MARGIN), BAR_H)

    def _layout(self) -> None:
        self.segments = []
        work = self.work
        if work is None or not work.total:
            return
        parts = []  # (work, skipped): a prefix hit's skipped tokens just before what it computed
        for w in work.sequences:
            if w.cached:
                parts.append((w, True))
            if w.tokens:
                parts.append((w, False))
        tokens = [w.cached if skipped else w.tokens for w, skipped in parts]
        bar = self.bar_rect()
        x = bar.left()
        scale = max(sum(tokens), work.longest)  # a decode's one token looks as small as it is
        for (w, skipped), width in zip(parts, segment_widths(tokens, scale, bar.width()), strict=True):
            self.segments.append((QRectF(x, bar.top(), width, bar.height()), w, skipped))
            x += width

    def resizeEvent(self, event) -> None:
        self._layout()
        super().resizeEvent(event)

    def scale_labels(self) -> tuple[str, ...]:
        """What the bar's empty end says its full width is, longest first (the first that fits is
        drawn): without it a bar read as a budget being filled."""
        if self.work is None or not self.segments:
            return ()
        longest = self.work.longest
        return (f"full width: {longest} tokens, the longest context", f"of {longest} tokens")

    def tooltip_at(self, pos: QPointF) -> str:
        for rect, work, skipped in self.segments:
            if rect.contains(pos):
                if skipped:
                    return (
                        f"{work.seq}: {work.cached} prompt tokens skipped — a prefix-cache hit: blocks holding the "
                        "same tokens were already in the pool, so their K/V is reused, not computed"
                    )
                return work.describe()
        scale = ""
        if self.work is not None:
            scale = f"\n\nThe bar's full width: {self.work.longest} tokens, the longest sequence's context."
        return f"{self.title()}{scale}\n\n{DEFAULT_TIP}"

    def event(self, event) -> bool:
        return answer_tooltip(self, event) or super().event(event)

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        theme = self.theme
        painter.fillRect(self.rect(), QColor(theme.panel))
        metrics = painter.fontMetrics()
        painter.setPen(QColor(theme.text if self.work is not None else theme.muted))
        title = QRectF(MARGIN, MARGIN, self.width() - 2 * MARGIN, TITLE_H)
        text = metrics.elidedText(self.title(), Qt.TextElideMode.ElideRight, int(title.width()))
        painter.drawText(title, Qt.AlignmentFlag.AlignVCenter, text)
        if self.segments:  # the scale: the longest context, for a decode's one token to look small
            painter.setPen(QPen(QColor(theme.block_border), 1))
            painter.setBrush(QColor(theme.empty_slot))
            painter.drawRect(self.bar_rect())
        for rect, work, skipped in self.segments:
            colour = self.colours(work.seq)
            if skipped:
                pen = QPen(QColor(theme.muted), 1, Qt.PenStyle.DashLine)
                painter.setPen(pen)
                painter.setBrush(Qt.BrushStyle.NoBrush)
                painter.drawRect(rect.adjusted(0.5, 0.5, -0.5, -0.5))
                label, label_colour = f"{work.cached} skipped", QColor(theme.muted)
            elif work.kind == DECODE:
                pale = QColor(colour)
                pale.setAlpha(110)
                painter.setPen(QPen(QColor(theme.block_border), 1))
                painter.setBrush(pale)
                painter.drawRect(rect)
                painter.setBrush(QBrush(colour, Qt.BrushStyle.BDiagPattern))
                painter.drawRect(rect)
                label, label_colour = work.seq.rsplit("/", 1)[-1], QColor(theme.text)
            else:
                painter.setPen(QPen(QColor(theme.block_border), 1))
                painter.setBrush(colour)
                painter.drawRect(rect)
                label, label_colour = f"{work.seq} prefill {work.tokens}", ink_on(colour)
                if metrics.horizontalAdvance(label) > rect.width() - 6:
                    label = str(work.tokens)
            if metrics.horizontalAdvance(label) <= rect.width() - 4:
                painter.setPen(label_colour)
                painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, label)
        if self.segments:  # the scale, in the bar's empty end where it fits
            bar, used = self.bar_rect(), self.segments[-1][0].right()
            free = QRectF(used + 6, bar.top(), bar.right() - used - 12, bar.height())
            fitting = [t for t in self.scale_labels() if metrics.horizontalAdvance(t) <= free.width()]
            if fitting:
                painter.setPen(QColor(theme.muted))
                painter.drawText(free, Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignRight, fitting[0])
        painter.end()
