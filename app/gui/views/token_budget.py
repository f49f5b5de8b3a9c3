"""The v1 scheduler's token budget on screen: one bar, the budget (max_num_batched_tokens)
as its full width, a segment per request for what it computed in the step — a decode token
(hatched) or a prefill chunk (solid) — and the part left unused. A tooltip per segment says
which chunk of whose prompt it was. A v0 scenario gets a sentence instead: v0 has no budget."""

from __future__ import annotations

from pagesim.app.gui.palette import SequenceColours, Theme, ink_on
from pagesim.app.gui.views.tooltips import answer_tooltip
from pagesim.core.token_budget import BudgetSegment
from pagesim.core.view_model import Frame
from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPen
from PySide6.QtWidgets import QSizePolicy, QVBoxLayout, QWidget

MARGIN, TITLE_H, BAR_H, SCALE_H = 6, 18, 24, 16
FULL_H, V0_H = TITLE_H + BAR_H + SCALE_H + 2 * MARGIN, TITLE_H + 2 * MARGIN
MIN_SEGMENT_W = 4.0  # a 1-token decode stays visible beside a 2,048-token budget
MAX_NAMED_W = 64.0  # and wide enough for its request's name while there is room, up to this
V0_LINE = "No token budget in vLLM v0: a step prefills whole prompts and decodes one token per sequence (hover: v1)."
V0_TEXT = (
    "Token budget: none in vLLM v0 (this scenario's scheduler). A v0 step prefills the whole prompt of each "
    "request it admits (admission is by free blocks) and decodes one token for every running sequence. "
    'With scheduler = "v1", every step spends one budget of max_num_batched_tokens, prefills in chunks, and '
    "this bar shows how."
)
DEFAULT_TIP = (
    "vLLM v1's token budget for this step: the full width is max_num_batched_tokens. Each running request's "
    "decode token comes first (hatched), then prefill chunks (solid) with what is left; a long prompt is "
    "prefilled over several steps. Hover a segment for its request and chunk."
)


def segment_widths(tokens: list[int], budget: int, width: float, named: float = MIN_SEGMENT_W) -> list[float]:
    """Widths proportional to the tokens, none under a minimum (``named``, wide enough for a
    name, while the minimums take at most a third of the bar); what the minimum adds is taken
    from the wider segments, so the unused part keeps its true width where it can."""
    least = min(named, max(MIN_SEGMENT_W, width / 3 / max(1, len(tokens))))
    raw = [width * t / max(budget, 1) for t in tokens]
    widths = [max(least, r) for r in raw]
    excess = sum(widths) - min(width, max(sum(raw), least * len(tokens)))
    slack = sum(w - least for w in widths)
    if excess > 0 and slack > 0:
        shrink = min(1.0, excess / slack)
        widths = [w - (w - least) * shrink for w in widths]
    return widths


class TokenBudgetBar(QWidget):
    def __init__(self, colours: SequenceColours, theme: Theme, parent=None) -> None:
        super().__init__(parent)
        self.colours, self.theme = colours, theme
        self.frame: Frame | None = None
        self.segments: list[tuple[QRectF, BudgetSegment]] = []  # as last laid out
        self.unused_rect: QRectF | None = None
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(FULL_H)
        self.setToolTip(DEFAULT_TIP)
        self.hide()  # until a scenario that schedules

    def sizeHint(self) -> QSize:
        return QSize(600, self.height())

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()

    def bind(self, controller) -> None:
        controller.frameChanged.connect(self.show_frame)

    def show_frame(self, frame: Frame) -> None:
        self.frame = frame
        self.setVisible(frame.queues is not None)  # no scheduler in the scenario: nothing to budget
        self.setFixedHeight(FULL_H if self.is_v1 else V0_H)  # v0: one line, the rest in its tooltip
        self._layout()
        self.update()

    # -- what is where -----------------------------------------------------------------
    @property
    def is_v1(self) -> bool:
        return self.frame is not None and self.frame.config.scheduler == "v1"

    def title(self) -> str:
        frame = self.frame
        if frame is None or not self.is_v1:
            return ""
        budget = frame.token_budget
        if budget is not None:
            return f"Token budget · step {frame.position}: {budget.summary()}"
        if frame.position == 0:
            why = "nothing yet"
        elif frame.label.startswith("schedule"):
            why = "nothing left to schedule"
        else:
            why = f"not a scheduling step ({frame.label})"
        return f"Token budget · step {frame.position}: {why} · max_num_batched_tokens = {self.budget}"

    @property
    def budget(self) -> int:
        return self.frame.config.max_num_batched_tokens

    @property
    def unused(self) -> int:
        budget = self.frame.token_budget
        return self.budget - (budget.used if budget is not None else 0)

    def bar_rect(self) -> QRectF:
        return QRectF(MARGIN, MARGIN + TITLE_H, max(1, self.width() - 2 * MARGIN), BAR_H)

    def _layout(self) -> None:
        self.segments, self.unused_rect = [], None
        if not self.is_v1:
            return
        bar = self.bar_rect()
        budget = self.frame.token_budget
        x = bar.left()
        if budget is not None and budget.segments:
            names = max(self.fontMetrics().horizontalAdvance(s.request) for s in budget.segments) + 8
            tokens = [s.tokens for s in budget.segments]
            widths = segment_widths(tokens, budget.budget, bar.width(), min(MAX_NAMED_W, names))
            for segment, width in zip(budget.segments, widths, strict=True):
                self.segments.append((QRectF(x, bar.top(), width, bar.height()), segment))
                x += width
        if x < bar.right() - 1:
            self.unused_rect = QRectF(x, bar.top(), bar.right() - x, bar.height())

    def resizeEvent(self, event) -> None:
        self._layout()
        super().resizeEvent(event)

    def tooltip_at(self, pos: QPointF) -> str:
        for rect, segment in self.segments:
            if rect.contains(pos):
                return segment.describe()
        if self.unused_rect is not None and self.unused_rect.contains(pos):
            return f"{self.unused} tokens of the budget unused this step (nothing more was waiting, or it did not fit)"
        return DEFAULT_TIP if self.is_v1 else V0_TEXT

    def event(self, event) -> bool:
        return answer_tooltip(self, event) or super().event(event)

    # -- painting ------------------------------------------------------------------------
    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        theme = self.theme
        painter.fillRect(self.rect(), QColor(theme.panel))
        if self.frame is None:
            painter.end()
            return
        if not self.is_v1:
            painter.setPen(QColor(theme.muted))
            line = self.rect().adjusted(MARGIN, 0, -MARGIN, 0)
            text = painter.fontMetrics().elidedText(V0_LINE, Qt.TextElideMode.ElideRight, line.width())
            painter.drawText(line, Qt.AlignmentFlag.AlignVCenter, text)
            painter.end()
            return
        metrics = painter.fontMetrics()
        painter.setPen(QColor(theme.text))
        title = QRectF(MARGIN, MARGIN, self.width() - 2 * MARGIN, TITLE_H)
        painter.drawText(
            title,
            Qt.AlignmentFlag.AlignVCenter,
            metrics.elidedText(self.title(), Qt.TextElideMode.ElideRight, int(title.width())),
        )
        bar = self.bar_rect()
        painter.setPen(QPen(QColor(theme.block_border), 1))
        painter.setBrush(QColor(theme.empty_slot))
        painter.drawRect(bar)
        for rect, segment in self.segments:
            colour = self.colours.of_request(segment.request)
            painter.setPen(QPen(QColor(theme.block_border), 1))
            if segment.kind == "decode":
                pale = QColor(colour)
                pale.setAlpha(110)
                painter.setBrush(pale)
                painter.drawRect(rect)
                painter.setBrush(QBrush(colour, Qt.BrushStyle.BDiagPattern))
                painter.drawRect(rect)
            else:
                painter.setBrush(colour)
                painter.drawRect(rect)
            self._label(painter, rect, segment)
        if self.unused_rect is not None and self.unused_rect.width() > 40:
            painter.setPen(QColor(theme.muted))
            text = metrics.elidedText(
                f"{self.unused} unused", Qt.TextElideMode.ElideRight, int(self.unused_rect.width()) - 4
            )
            painter.drawText(self.unused_rect, Qt.AlignmentFlag.AlignCenter, text)
        # The scale and the legend below the bar.
        below = QRectF(bar.left(), bar.bottom() + 1, bar.width(), SCALE_H)
        painter.setPen(QColor(theme.muted))
        painter.drawText(below, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, "0")
        painter.drawText(
            below,
            Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
            f"{self.budget} = max_num_batched_tokens",
        )
        legend = "solid: prefill chunk · hatched: decode (1 token)"
        painter.drawText(below, Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignVCenter, legend)
        painter.end()

    def _label(self, painter: QPainter, rect: QRectF, segment: BudgetSegment) -> None:
        metrics = painter.fontMetrics()
        if segment.kind == "decode":
            text = segment.request
        else:
            text = f"{segment.request} prefill {segment.tokens}"
            if segment.prefix_hit_tokens:  # tokens that cost no budget: said, not drawn
                text += f" (+{segment.prefix_hit_tokens} from the prefix cache)"
            if metrics.horizontalAdvance(text) > rect.width() - 6:
                text = f"{segment.request} prefill {segment.tokens}"
            if metrics.horizontalAdvance(text) > rect.width() - 6:
                text = f"{segment.request} {segment.tokens}"
        if metrics.horizontalAdvance(text) > rect.width() - 4:
            return
        decode = segment.kind == "decode"  # (over a pale hatch, the theme's text; on a solid chunk, its own ink)
        painter.setPen(QColor(self.theme.text) if decode else ink_on(self.colours.of_request(segment.request)))
        painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, text)


def scheduler_panel(budget_bar: TokenBudgetBar, scheduler_view: QWidget) -> QWidget:
    """The Scheduler dock's contents: the step's token budget over the queues."""
    panel = QWidget()
    layout = QVBoxLayout(panel)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.setSpacing(0)
    layout.addWidget(budget_bar)
    layout.addWidget(scheduler_view, 1)
    return panel
