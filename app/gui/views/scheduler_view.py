"""The scheduler on screen: its queues as lanes with the requests in them, and the CPU
swap pool's blocks as tiles (held by swapped-out sequences), the blocks a step moved lit."""

from __future__ import annotations

from pagesim.app.gui.palette import SequenceColours, Theme, ink_on
from pagesim.core.view_model import Frame
from PySide6.QtCore import QEvent, QPoint, QPointF, QRect, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

LANES = (
    ("waiting", "waiting: queued, no blocks yet"),
    ("running", "running: prefill or decode, blocks on the GPU"),
    ("swapped", "swapped: preempted, K/V in the CPU pool"),
    ("finished", "finished"),
)
V1_RUNNING = "running: prefill or decode, on the GPU"  # v1 runs a prompt's chunks from the running queue
V1_SWAPPED = "swapped: none, v1 recomputes instead"  # vLLM v1 never swaps a request out
V1_POOL = "No CPU swap pool: vLLM v1 preempts by recompute (the request waits again; its K/V is computed anew)"
LANE_H, CHIP_W, TILE = 24, 58, 16
POOL_CAPTION_TOP = 6 + len(LANES) * LANE_H + 8  # the CPU pool's caption, below the lanes
TILES_TOP = POOL_CAPTION_TOP + 20  # and its tiles below that


PHASE_TIPS = {
    "prefill": "prefill: its prompt (or several tokens at once) computed in one pass, all its tokens' K/V written",
    "decode": "decode: one new token per sequence, attending to the K/V already cached in its blocks",
}


class SchedulerView(QWidget):
    def __init__(self, colours: SequenceColours, theme: Theme, parent=None) -> None:
        super().__init__(parent)
        self.colours, self.theme = colours, theme
        self.frame: Frame | None = None
        self.moved_cpu: set[int] = set()  # CPU blocks this step swapped out or in
        self.chips: list[tuple[QRectF, str, str]] = []  # (chip, request, lane) as last painted
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setToolTip(
            "The scheduler's queues (vLLM's waiting, running and swapped), each request as a chip in its owner's "
            "colour, and the CPU swap pool: one tile per CPU block, coloured by the swapped request holding it"
        )

    def sizeHint(self) -> QSize:
        return QSize(600, len(LANES) * LANE_H + 80)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()

    def bind(self, controller) -> None:
        controller.frameChanged.connect(self.show_frame)

    def show_frame(self, frame: Frame) -> None:
        self.frame = frame
        self.moved_cpu = set(frame.cpu_moved)
        self.update()

    def cpu_tile_rect(self, block: int) -> QRectF:
        per_row = max(1, (self.width() - 12) // (TILE + 2))
        row, column = divmod(block, per_row)
        return QRectF(6 + column * (TILE + 2), TILES_TOP + row * (TILE + 2), TILE, TILE)

    def cpu_tile_rect_in(self, widget: QWidget, block: int) -> QRectF | None:
        """CPU block ``block``'s tile in ``widget``'s coordinates; None if it is not on screen."""
        if self.frame is None or not 0 <= block < self.frame.num_cpu_blocks:
            return None
        tile = self.cpu_tile_rect(block)
        if not self.visibleRegion().boundingRect().intersects(tile.toRect()):
            return None
        return tile.translated(QPointF(self.mapTo(widget, QPoint(0, 0))))

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        theme, frame = self.theme, self.frame
        self.chips = []
        painter.fillRect(self.rect(), QColor(theme.panel))
        if frame is None or frame.queues is None:
            painter.setPen(QColor(theme.muted))
            painter.drawText(
                self.rect().adjusted(8, 8, -8, -8),
                Qt.AlignmentFlag.AlignLeft | Qt.TextFlag.TextWordWrap,
                "This scenario does not use the scheduler (its steps add, grow, fork and free sequences directly). "
                "Open a preemption, beam-search or parallel-sampling example to see its queues here.",
            )
            painter.end()
            return
        label_w = max(painter.fontMetrics().horizontalAdvance(title) for _, title in LANES) + 14
        y = 6
        for key, title in self.lane_titles().items():
            painter.setPen(QColor(theme.muted))
            painter.drawText(QRect(6, y, label_w, LANE_H), Qt.AlignmentFlag.AlignVCenter, title)
            x = 6 + label_w
            requests = frame.queues.get(key, ())
            for index, request in enumerate(requests):
                progress = (frame.prefilling or {}).get(request) if key == "running" else None
                label = request if progress is None else f"{request} · prefilling {progress[0]}/{progress[1]}"
                # What this step computed for it (a v1 step's token budget says so already).
                work = frame.step_work if key == "running" and frame.token_budget is None else None
                phase = work.request_phase(request) if work is not None else None
                if phase is not None and progress is None:
                    label = f"{request} · {phase}"
                chip_w = max(CHIP_W, painter.fontMetrics().horizontalAdvance(label) + 16)
                if x + chip_w > self.width() - 6:
                    more = f"+{len(requests) - index}"
                    painter.drawText(QRect(x, y, 60, LANE_H), Qt.AlignmentFlag.AlignVCenter, more)
                    break
                chip = QRectF(x, y + 2, chip_w - 4, LANE_H - 4)
                colour = self.colours.of_request(request)
                painter.setPen(QPen(QColor(theme.block_border), 1))
                painter.setBrush(colour if key != "finished" else QColor(theme.free_block))
                painter.drawRoundedRect(chip, 6, 6)
                if key != "finished":  # an eighth request's hatch, as on its tiles in the pool
                    self._hatch(painter, request, chip, 6)
                text_colour = ink_on(colour) if key != "finished" else QColor(theme.muted)
                if progress is not None:  # the prompt not yet computed: the chip's right part, paled
                    self._pale_rest(painter, chip, progress[0] / max(1, progress[1]))
                    text_colour = theme.text
                painter.setPen(QColor(text_colour))
                painter.drawText(chip, Qt.AlignmentFlag.AlignCenter, label)
                self.chips.append((chip, request, key))
                x += chip_w
            y += LANE_H
        # The CPU swap pool.
        y = POOL_CAPTION_TOP
        holders = dict(frame.cpu_holders)
        painter.setPen(QColor(theme.muted))
        painter.drawText(QRect(6, y, self.width() - 12, 18), Qt.AlignmentFlag.AlignVCenter, self.pool_caption())
        for block in range(frame.num_cpu_blocks):
            tile = self.cpu_tile_rect(block)
            seqs = holders.get(block, ())
            fill = self.colours(seqs[0]) if seqs else QColor(theme.free_block)
            lit = block in self.moved_cpu
            painter.setPen(QPen(QColor(theme.highlight if lit else theme.block_border), 2.5 if lit else 1))
            painter.setBrush(fill)
            painter.drawRoundedRect(tile, 3, 3)
            if seqs:
                self._hatch(painter, seqs[0], tile, 3)
        painter.end()

    def _hatch(self, painter: QPainter, owner: str, rect: QRectF, radius: float) -> None:
        """The hatch of an eighth request or later over a rounded ``rect`` (nothing for the
        first seven): a chip or a CPU tile says whose it is as its GPU tiles do."""
        hatch = self.colours.hatch(owner, self.theme)
        if hatch is None:
            return
        painter.save()
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(hatch)
        painter.drawRoundedRect(rect, radius, radius)
        painter.restore()

    def lane_titles(self) -> dict[str, str]:
        """Each lane's title, in the words of the frame's scheduler (v1 runs prompt chunks from
        the running queue and never swaps)."""
        titles = dict(LANES)
        if self.frame is not None and self.frame.config.scheduler == "v1":
            titles |= {"running": V1_RUNNING, "swapped": V1_SWAPPED}
        return titles

    def pool_caption(self) -> str:
        frame = self.frame
        if frame is None:
            return ""
        if frame.config.scheduler == "v1":
            return V1_POOL
        used = len(dict(frame.cpu_holders))
        return f"CPU swap pool · {frame.num_cpu_blocks} blocks · {used} hold swapped-out K/V" + (
            "" if frame.num_cpu_blocks else " (none configured: preemption recomputes)"
        )

    def _pale_rest(self, painter: QPainter, chip: QRectF, done: float) -> None:
        rounded = QPainterPath()
        rounded.addRoundedRect(chip, 6, 6)
        rest = QPainterPath()
        rest.addRect(QRectF(chip.left() + chip.width() * done, chip.top(), chip.width() * (1 - done), chip.height()))
        pale = QColor(self.theme.panel)
        pale.setAlpha(170)
        painter.fillPath(rounded.intersected(rest), pale)

    def chip_tooltip(self, request: str, lane: str) -> str:
        progress = (self.frame.prefilling or {}).get(request) if self.frame is not None else None
        if lane == "running" and progress is not None:
            computed, total = progress
            return (
                f"{request}: running, prefilling: {computed} of its {total} tokens to compute are in the cache; "
                "the rest in the next steps' token budgets (chunked prefill)"
            )
        text = f"{request}: " + self.lane_titles()[lane]
        frame = self.frame
        work = frame.step_work if frame is not None and lane == "running" and frame.token_budget is None else None
        phase = work.request_phase(request) if work is not None else None
        if phase is not None:
            text += "\nThis step: " + PHASE_TIPS[phase]
        return text

    def event(self, event) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            pos = QPointF(event.pos())
            hit = next(((request, lane) for chip, request, lane in self.chips if chip.contains(pos)), None)
            QToolTip.showText(event.globalPos(), self.chip_tooltip(*hit) if hit else self.toolTip(), self)
            return True
        return super().event(event)
