"""Python's cyclic garbage collector runs on whichever thread happens to allocate when a
collection is due. If that is the simulation worker and the garbage holds Qt widgets (a
window dropped in a reference cycle), their C++ destructors run off the GUI thread and can
deadlock against it (the GUI thread holds the GIL and waits for a Qt lock; the worker holds
the lock and waits for the GIL). So while a window lives, automatic collection is off and a
timer on the GUI thread collects instead (the pattern PyQt applications use)."""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

CHECK_MS = 250


def _collect_due() -> None:
    """Collect the generations whose thresholds were passed, as automatic GC would — a young
    collection is quick; a full one only as often as it would happen anyway."""
    counts, thresholds = gc.get_count(), gc.get_threshold()
    if counts[0] > thresholds[0]:
        gc.collect(0)
        if counts[1] > thresholds[1]:
            gc.collect(1)
            if counts[2] > thresholds[2]:
                gc.collect(2)


_holders = 0
_timer: QTimer | None = None


def acquire(parent: QObject) -> None:
    """A window opens: collect on the GUI thread only (idempotent across windows)."""
    global _holders, _timer
    _holders += 1
    if _holders == 1:
        gc.disable()
        _timer = QTimer()
        _timer.setObjectName("pagesim-gc")
        _timer.timeout.connect(_collect_due)
        _timer.start(CHECK_MS)


def release() -> None:
    """A window closed (its worker thread already joined): the last one restores automatic GC."""
    global _holders, _timer
    _holders = max(0, _holders - 1)
    if _holders == 0:
        if _timer is not None:
            _timer.stop()
            _timer.deleteLater()
            _timer = None
        gc.collect()
        gc.enable()
