"""Animations driven by the core's events. They only light things up: never the model."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from pagesim.core import events as ev
from pagesim.core.view_model import Frame
from PySide6.QtCore import QEasingCurve, QObject, QVariantAnimation
from PySide6.QtGui import QColor

LIVE_ANIMATIONS: weakref.WeakSet[QVariantAnimation] = weakref.WeakSet()

# At speed 1: the block changes, a pause, then the kernel's lookups one by one.
CHANGE_MS = 450
PAUSE_MS = 150
LOOKUP_MS = 180
LOOKUPS_MAX_MS = 1800
SWAP_MS = 700  # a swap's tiles crossing from one pool to the other


@dataclass
class Beat:
    duration: float
    glows: dict[int, QColor] = field(default_factory=dict)  # block -> colour
    arrows: list[tuple[int, int, QColor]] = field(default_factory=list)  # CoW src -> dst
    lookup: tuple[str, int] | None = None  # (seq, logical index) lit in the table
    # Swaps drawn as moves between the pools: (GPU block, CPU block, out of the GPU, colour).
    swaps: list[tuple[int, int, bool, QColor]] = field(default_factory=list)


def beats_for(
    frame: Frame,
    focus_seq: str | None,
    colour_of,
    freed_colour: QColor,
    speed: float,
    hit_colour: QColor | None = None,
    evicted_colour: QColor | None = None,
) -> list[Beat]:
    if frame.events is None:
        return []
    if speed <= 0:  # instant: nothing moves, but a copy-on-write stays marked (a beat of no length)
        copies = [(e.src, e.dst, colour_of(e.seq)) for e in frame.events if isinstance(e, ev.BlockCopied)]
        return [Beat(0.0, arrows=copies)] if copies else []
    scale = 1.0 / speed
    change = Beat(CHANGE_MS * scale)
    moves = Beat(SWAP_MS * scale)
    cpu_holders = dict(frame.cpu_holders)
    lookups: list[tuple[int, int]] = []  # (logical index, physical block) in access order
    for event in frame.events:
        if isinstance(event, ev.BlockAllocated | ev.BlockShared):
            change.glows[event.block] = colour_of(event.seq)
        elif isinstance(event, ev.BlockFreed | ev.BlockReleased):
            change.glows[event.block] = freed_colour
        elif isinstance(event, ev.BlockReused):  # a prefix-cache hit
            change.glows[event.block] = hit_colour or colour_of(event.seq)
        elif isinstance(event, ev.BlockSwappedOut):  # preemption by swap: off the GPU
            change.glows[event.block] = evicted_colour or freed_colour
            owners = cpu_holders.get(event.cpu_block, ())
            colour = colour_of(owners[0]) if owners else evicted_colour or freed_colour
            moves.swaps.append((event.block, event.cpu_block, True, colour))
        elif isinstance(event, ev.BlockSwappedIn):
            change.glows[event.block] = hit_colour or freed_colour
            owners = frame.holders.get(event.block, ())
            colour = colour_of(owners[0][0]) if owners else hit_colour or freed_colour
            moves.swaps.append((event.block, event.cpu_block, False, colour))
        elif isinstance(event, ev.BlockEvicted):
            change.glows[event.block] = evicted_colour or freed_colour
        elif isinstance(event, ev.BlockCopied):
            change.arrows.append((event.src, event.dst, colour_of(event.seq)))
            change.glows[event.dst] = colour_of(event.seq)
    read = frame.step_lookup(focus_seq)  # the kernel's walk through the selected table
    if read is not None:
        lookups = list(enumerate(read))
    beats = [moves] if moves.swaps else []  # the move first, then the pool's new state glows
    if change.glows or change.arrows:
        beats += [change, Beat(PAUSE_MS * scale)]
    if lookups:
        each = min(LOOKUP_MS, LOOKUPS_MAX_MS / len(lookups)) * scale
        colour = colour_of(focus_seq)
        beats += [Beat(each, {block: colour}, lookup=(focus_seq, index)) for index, block in lookups]
    return beats


class AnimationDirector(QObject):
    """Plays a list of beats on the pool and sequence views; a new frame cuts it short."""

    def __init__(self, pool_view, sequence_view, parent=None, scheduler_view=None, swap_flight=None) -> None:
        super().__init__(parent)
        self.pool_view = pool_view
        self.sequence_view = sequence_view
        self.scheduler_view = scheduler_view  # where the CPU pool's tiles are, for swaps
        self.swap_flight = swap_flight
        self.beats: list[Beat] = []
        self._copies: list = []  # this frame's copy-on-write arrows: (source, copy, colour)
        self._current = -1
        self._animation = QVariantAnimation(self)
        self._animation.setStartValue(0.0)
        self._animation.setEndValue(1.0)
        self._animation.setEasingCurve(QEasingCurve.Type.Linear)
        self._animation.valueChanged.connect(self._on_value)
        self._animation.finished.connect(self._finish)
        LIVE_ANIMATIONS.add(self._animation)

    @property
    def running(self) -> bool:
        return self._animation.state() == QVariantAnimation.State.Running

    def play(self, beats: list[Beat], keep_copies: bool = False) -> None:
        """Play ``beats``; ``keep_copies``: the same step shown again (another sequence
        selected), whose copy-on-write stays marked though its frame carries no events."""
        copies = self._copies if keep_copies else [arrow for beat in beats for arrow in beat.arrows]
        self._copies = []  # (the last frame's copies go with it)
        self.stop()
        self.beats = beats
        # A copy-on-write stays marked (its arrow, "copy of #n") until the next step: the
        # beats after it, and the rest, show it too; at the instant speed it is all there is.
        self._copies = copies
        total = sum(b.duration for b in beats)
        if total <= 0:
            self._show_copies(self._copies)
            return
        self._animation.setDuration(max(1, int(total)))
        self._animation.start()

    def stop(self) -> None:
        if self.running:
            self._animation.stop()
        self._finish()

    def _on_value(self, value: float) -> None:
        if not self.beats:
            return
        t = value * sum(b.duration for b in self.beats)
        index, start = 0, 0.0
        while index < len(self.beats) - 1 and t >= start + self.beats[index].duration:
            start += self.beats[index].duration
            index += 1
        beat = self.beats[index]
        progress = (t - start) / beat.duration if beat.duration else 1.0
        if index != self._current:
            self.pool_view.clear_overlays()
            so_far = [arrow for earlier in self.beats[: index + 1] for arrow in earlier.arrows]
            self._show_copies(so_far, labelled=beat.lookup is None)  # (a lookup labels its own tiles)
            self.sequence_view.set_lookup(beat.lookup)
            if self.swap_flight is not None:
                self.swap_flight.start(self._flights(beat))
            if beat.lookup is not None:  # say what is read: logical block → physical block
                for block, colour in beat.glows.items():
                    self.pool_view.add_block_label(block, f"L{beat.lookup[1]} → #{block}", colour)
            self._current = index
        if beat.swaps and self.swap_flight is not None:
            self.swap_flight.set_progress(progress)
        # Glows swell then fade within their beat.
        strength = 1.0 - abs(2.0 * progress - 1.0) * 0.6
        for block, colour in beat.glows.items():
            if block < len(self.pool_view.items):
                self.pool_view.items[block].set_glow(colour, strength)

    def _flights(self, beat: Beat) -> list:
        """Window rectangles each swapped tile flies between; none where either pool is out
        of sight (the scheduler dock closed or behind another tab)."""
        if not beat.swaps or self.scheduler_view is None or not self.scheduler_view.isVisible():
            return []
        window = self.swap_flight.parentWidget()
        flights = []
        for block, cpu_block, out, colour in beat.swaps:
            gpu = self.pool_view.tile_rect_in(window, block)
            cpu = self.scheduler_view.cpu_tile_rect_in(window, cpu_block)
            if gpu is None or cpu is None:
                continue
            src, dst = (gpu, cpu) if out else (cpu, gpu)
            flights.append((src, dst, colour, f"#{block}"))  # the GPU block it leaves or lands in
        return flights

    def _show_copies(self, arrows, labelled: bool = True) -> None:
        for src, dst, colour in arrows:
            self.pool_view.add_copy_arrow(src, dst, colour, labelled=labelled)
        self.pool_view.set_lasting_arrows([(src, dst, colour, labelled) for src, dst, colour in arrows])

    def _finish(self) -> None:
        self._current = -1
        self.beats = []
        if self.swap_flight is not None:
            self.swap_flight.stop()
        self.pool_view.clear_overlays()
        self._show_copies(self._copies)
        self.sequence_view.set_lookup(None)
