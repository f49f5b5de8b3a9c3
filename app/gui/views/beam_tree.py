"""Beam search as a tree: each step's kept beams as boxes of text (the token, whitespace
made visible) with their cumulative log-probability, linked to the beam they grew from. Live
beams in their request's colour, pruned branches faded (their blocks went back to the free
queue), the final hypotheses ranked in a list below. Drawn from the frame's ``beam_trees``."""

from __future__ import annotations

from pagesim.app.gui.palette import SequenceColours, Theme, readable_on
from pagesim.app.gui.views.tooltips import answer_tooltip
from pagesim.core.beam_tree import FINAL, LIVE, PRUNED, BeamNode, BeamTree
from pagesim.core.token_text import visible
from pagesim.core.view_model import Frame
from PySide6.QtCore import QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QScrollArea, QSizePolicy, QWidget

MARGIN, COL_GAP, ROW_H, BOX_H, TITLE_H, LINE_H = 8, 20, 32, 29, 22, 18
MAX_TEXT_W = 110  # a long token is elided in its box (whole in the tooltip)
EMPTY_TEXT = (
    "Beam search, as a tree, appears here for a scenario that runs it on a real model "
    "(File → Open scenario → beam_search)."
)
DEFAULT_TIP = (
    "Beam search as a tree: each column is a decode step, each box a beam the step kept (its newest token and "
    "its cumulative log-probability, the sum of its tokens' log-probabilities). Coloured: a live beam. Faded: a "
    "pruned beam, no longer among the best; its own blocks went back to the free queue. Hover a box for its text."
)


def node_tip(tree: BeamTree, node: BeamNode) -> str:
    if node.parent is None:
        return f"{tree.request}'s prompt ({tree.prompt_len} tokens): every beam starts from it and shares its blocks"
    state = {
        LIVE: f"live: {node.beam} carries it; its blocks are in the pool (click to select it)",
        FINAL: f"final hypothesis #{(node.rank or 0) + 1} of {len(tree.finals)}",
        PRUNED: f"pruned at step {node.pruned_at}: no longer among the best {tree.width}; the blocks only this "
        "branch held went back to the free queue"
        if node.pruned_at
        else "pruned: no longer among the best; its blocks were freed",
    }.get(node.state, "kept: a live beam or a final hypothesis grew from it (they share its blocks)")
    return (
        f"Step {node.step}, {node.beam}: “{visible(node.text)}” (token id {node.token})\n"
        f"cumulative log-probability {node.logprob:.3f}\n{state}\n"
        f"text so far: “{node.continuation}”"
    )


def layout_tree(tree: BeamTree) -> dict[int, int]:
    """A row per leaf, depth first: the surviving branch first (the trunk along the top row),
    then by score; a parent on its first child's row."""
    rows: dict[int, int] = {}
    children: dict[int, list[BeamNode]] = {}
    for node in tree.nodes:
        if node.parent is not None:
            children.setdefault(node.parent, []).append(node)
    next_row = 0
    stack = [(0, False)]
    while stack:
        index, done = stack.pop()
        kids = sorted(children.get(index, []), key=lambda n: (n.state == PRUNED, -n.logprob))
        if done or not kids:
            if kids:
                rows[index] = rows[kids[0].index]
            else:
                rows[index] = next_row
                next_row += 1
            continue
        stack.append((index, True))
        stack.extend((k.index, False) for k in reversed(kids))
    return rows


class BeamTreeCanvas(QWidget):
    beamClicked = Signal(str)  # a live beam's box clicked: its sequence, to select

    def __init__(self, colours: SequenceColours, theme: Theme, parent=None) -> None:
        super().__init__(parent)
        self.colours, self.theme = colours, theme
        self.trees: tuple[BeamTree, ...] = ()
        self.boxes: list[tuple[QRectF, BeamTree, BeamNode]] = []  # as last laid out
        self.finals: list[tuple[QRectF, str]] = []
        self.setToolTip(DEFAULT_TIP)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()

    def show_trees(self, trees: tuple[BeamTree, ...]) -> None:
        if trees == self.trees:
            return
        self.trees = trees
        self._layout()
        self.update()

    def box_of(self, beam: str) -> BeamNode | None:
        """The live node of ``beam`` (None: not live)."""
        for tree in self.trees:
            if beam in tree.live:
                return tree.nodes[tree.live[beam]]
        return None

    def _label(self, node: BeamNode, tree: BeamTree) -> str:
        if node.parent is None:
            return f"prompt ({tree.prompt_len} tokens)"
        return visible(node.text) or "∅"

    def _layout(self) -> None:
        self.boxes, self.finals = [], []
        metrics = self.fontMetrics()
        top, width = MARGIN, MARGIN
        for tree in self.trees:
            rows = layout_tree(tree)
            depth_w: dict[int, float] = {}
            for node in tree.nodes:
                # (a token's text is elided past MAX_TEXT_W; the prompt's box, which has no score, fits its label)
                text_w = metrics.horizontalAdvance(self._label(node, tree)) + 8 * (node.parent is None)
                if node.parent is not None:
                    text_w = min(MAX_TEXT_W, text_w)
                score_w = metrics.horizontalAdvance(f"b00 #0 {node.logprob:.2f}")
                depth_w[node.depth] = max(depth_w.get(node.depth, 0), text_w + 12, score_w + 12)
            lefts, x = {}, MARGIN
            for depth in sorted(depth_w):
                lefts[depth] = x
                x += depth_w[depth] + COL_GAP
            top += TITLE_H
            for node in tree.nodes:
                rect = QRectF(lefts[node.depth], top + rows[node.index] * ROW_H, depth_w[node.depth], BOX_H)
                self.boxes.append((rect, tree, node))
            top += (max(rows.values()) + 1) * ROW_H + 6
            for rank, index in enumerate(tree.finals):
                node = tree.nodes[index]
                line = f"#{rank + 1}  {_ranking(tree, rank, node)}  “{node.continuation}”"
                self.finals.append((QRectF(MARGIN, top, metrics.horizontalAdvance(line) + 8, LINE_H), line))
                top += LINE_H
            width = max(width, x)
            top += MARGIN
        lines = [r.right() for r, _ in self.finals]
        self.setMinimumSize(int(max([width, *lines]) + MARGIN), int(top + MARGIN))
        self.updateGeometry()

    def sizeHint(self) -> QSize:
        return self.minimumSize()

    def tooltip_at(self, pos: QPointF) -> str:
        for rect, tree, node in self.boxes:
            if rect.contains(pos):
                return node_tip(tree, node)
        for rect, line in self.finals:
            if rect.contains(pos):
                return (
                    f"{line}\nThe search is over: its hypotheses ranked by log-probability over their whole length, "
                    "prompt included (vLLM's length penalty 1), best first; these are the request's outputs, and "
                    "every beam's blocks are free."
                )
        return DEFAULT_TIP if self.trees else EMPTY_TEXT

    def event(self, event) -> bool:
        return answer_tooltip(self, event) or super().event(event)

    def mousePressEvent(self, event) -> None:
        """A live beam's box selects its sequence: its table row, its blocks in the pool."""
        pos = event.position()
        beam = next((n.beam for rect, _, n in self.boxes if n.state == LIVE and rect.contains(pos)), None)
        if beam is not None and event.button() == Qt.MouseButton.LeftButton:
            self.beamClicked.emit(beam)
            return
        super().mousePressEvent(event)

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        theme = self.theme
        painter.fillRect(self.rect(), QColor(theme.panel))
        if not self.trees:
            painter.setPen(QColor(theme.muted))
            painter.drawText(
                self.rect().adjusted(MARGIN, MARGIN, -MARGIN, -MARGIN), Qt.TextFlag.TextWordWrap, EMPTY_TEXT
            )
            painter.end()
            return
        by_node = {(id(tree), node.index): rect for rect, tree, node in self.boxes}
        titled = set()
        for rect, tree, node in self.boxes:
            if id(tree) not in titled:  # the tree's title over its first (prompt) box
                titled.add(id(tree))
                painter.setPen(QColor(theme.text))
                state = "finished: its hypotheses ranked below" if tree.finished else f"{len(tree.live)} live beams"
                title = (
                    f"{tree.request}: beam search, width {tree.width} · a column per step; under each token, its "
                    f"beam's total log-probability (nearer 0: likelier) · {state} · faded: pruned, blocks freed"
                )
                painter.drawText(
                    QRectF(MARGIN, rect.top() - TITLE_H, 4000, TITLE_H), Qt.AlignmentFlag.AlignVCenter, title
                )
            if node.parent is not None:
                self._edge(painter, by_node[(id(tree), node.parent)], rect, tree, node)
        for rect, tree, node in self.boxes:
            self._box(painter, rect, tree, node)
        painter.setPen(QColor(theme.text))
        for rect, line in self.finals:
            painter.drawText(rect, Qt.AlignmentFlag.AlignVCenter, line)
        painter.end()

    def _colour(self, tree: BeamTree, node: BeamNode) -> QColor:
        colour = readable_on(self.colours.of_request(tree.request), self.theme.panel)
        if node.state == PRUNED:
            colour = QColor(self.theme.muted)
            colour.setAlpha(110)
        elif node.state not in (LIVE, FINAL):
            colour = QColor(self.theme.text)
            colour.setAlpha(170)
        return colour

    def _edge(self, painter: QPainter, start: QRectF, end: QRectF, tree: BeamTree, node: BeamNode) -> None:
        path = QPainterPath(QPointF(start.right(), start.center().y()))
        mid = (start.right() + end.left()) / 2
        path.cubicTo(
            QPointF(mid, start.center().y()), QPointF(mid, end.center().y()), QPointF(end.left(), end.center().y())
        )
        pen = QPen(self._colour(tree, node), 2 if node.state != PRUNED else 1)
        if node.state == PRUNED:
            pen.setStyle(Qt.PenStyle.DashLine)
        painter.setPen(pen)
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawPath(path)

    def _box(self, painter: QPainter, rect: QRectF, tree: BeamTree, node: BeamNode) -> None:
        theme, colour = self.theme, self._colour(tree, node)
        fill = QColor(colour)
        fill.setAlpha(60 if node.state in (LIVE, FINAL) else 0)
        painter.setBrush(fill if fill.alpha() else QColor(theme.panel))
        painter.setPen(QPen(colour, 2 if node.state in (LIVE, FINAL) else 1))
        painter.drawRoundedRect(rect, 4, 4)
        text_colour = QColor(theme.text)
        if node.state == PRUNED:
            text_colour = QColor(theme.muted)
            text_colour.setAlpha(150)
        painter.setPen(text_colour)
        metrics = painter.fontMetrics()
        label = metrics.elidedText(self._label(node, tree), Qt.TextElideMode.ElideRight, int(rect.width()) - 6)
        if node.parent is None:  # the prompt: no score under it, its label in the middle
            painter.drawText(rect.adjusted(3, 1, -3, -1), Qt.AlignmentFlag.AlignCenter, label)
            return
        painter.drawText(rect.adjusted(3, 1, -3, -rect.height() / 2), Qt.AlignmentFlag.AlignCenter, label)
        small = QFont(painter.font())
        small.setPointSizeF(max(6.0, small.pointSizeF() * 0.85))
        painter.setFont(small)
        score = f"{node.logprob:.2f}" if node.rank is None else f"#{node.rank + 1} {node.logprob:.2f}"
        if node.state == LIVE:  # the sequence's row in the table: beam/b0 → b0
            score = f"{node.beam.rsplit('/', 1)[-1]} {score}"
        painter.setPen(QColor(theme.muted) if node.state != LIVE else text_colour)
        painter.drawText(rect.adjusted(3, rect.height() / 2, -3, -1), Qt.AlignmentFlag.AlignCenter, score)
        painter.setFont(QFont(self.font()))


FOLLOW_SLACK = 24  # px from the right edge that still counts as following the newest column


class BeamTreeView(QScrollArea):
    """The canvas in a scroll area (a long search is wide), bound to the frames."""

    def __init__(self, colours: SequenceColours, theme: Theme, parent=None) -> None:
        super().__init__(parent)
        self.canvas = BeamTreeCanvas(colours, theme)
        self.setWidget(self.canvas)
        self.setWidgetResizable(True)
        self.setToolTip(DEFAULT_TIP)
        # It follows the search as the Text tab follows the writing: the newest column in view
        # while the user has not scrolled away from it, the ranking once the search finishes.
        self._reveal: str | None = None  # "newest" or "ranking", applied as the canvas grows
        self._finished = False
        self.horizontalScrollBar().rangeChanged.connect(self._apply_reveal)
        self.verticalScrollBar().rangeChanged.connect(self._apply_reveal)

    def set_theme(self, theme: Theme) -> None:
        self.canvas.set_theme(theme)

    def bind(self, controller) -> None:
        controller.frameChanged.connect(self.show_frame)

    def show_frame(self, frame: Frame) -> None:
        across = self.horizontalScrollBar()
        following = across.value() >= across.maximum() - FOLLOW_SLACK
        self.canvas.show_trees(frame.beam_trees)
        finished = any(tree.finals for tree in frame.beam_trees)
        if finished and not self._finished:
            self._reveal = "ranking"
        elif not finished:
            self._reveal = "newest" if following else None
        self._finished = finished
        self._apply_reveal()

    def _apply_reveal(self) -> None:
        across, down = self.horizontalScrollBar(), self.verticalScrollBar()
        if self._reveal == "newest":
            across.setValue(across.maximum())
        elif self._reveal == "ranking":  # the hypotheses ranked, under the tree, from its left edge
            across.setValue(0)
            down.setValue(down.maximum())


def _ranking(tree, rank: int, node) -> str:
    """A final hypothesis's score as vLLM ranks it: its log-probability over its whole length,
    the prompt's tokens included (length penalty 1: a plain division), said as the sum it is."""
    score, length = tree.final_scores[rank], tree.prompt_len + node.depth
    if abs(node.logprob / max(length, 1) - score) <= 1e-9 * max(1.0, abs(score)):
        return f"{score:.3f} = {node.logprob:.2f} ÷ {length} tokens ({tree.prompt_len} prompt + {node.depth} written)"
    return f"{score:.3f} (log-probability {node.logprob:.2f} ÷ length^penalty)"
