"""Loading a real model off the GUI thread, with a progress bar in the status bar.

Parsing a real-model scenario encodes its text prompts with the model's tokenizer, so the
model must be loaded first; the first load of a file dequantises its weights (seconds). The
window asks :meth:`ModelLoader.ensure` before it parses such a scenario: a model already in
memory goes on at once; another is loaded on a thread of its own while the window stays
usable (a synthetic scenario can be opened meanwhile), and the scenario opens when it is
ready — unless the user opened another scenario in between, which then stands.
"""

from __future__ import annotations

import contextlib
import threading

from pagesim.core.errors import PagesimError
from pagesim.core.models.catalog import is_loaded, load_model
from pagesim.core.models.gguf_loader import load_progress
from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QProgressBar, QStatusBar


class ModelLoader(QObject):
    progressed = Signal(int, str, float)  # load serial, what it does, fraction done
    finished = Signal(int, str)  # load serial, "" or why it failed
    loadingChanged = Signal(bool)

    def __init__(self, bar: QStatusBar, parent=None) -> None:
        super().__init__(parent)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMaximumWidth(420)
        self.progress.setTextVisible(True)
        self.progress.setToolTip(
            "The model loads on a thread of its own: the first load of a file dequantises its weights and caches "
            "them (later loads read the cache). The window stays usable meanwhile"
        )
        # In the status bar only while a model loads: even hidden there, it made the bar taller.
        self._bar = bar
        self.progress.setMaximumHeight(bar.fontMetrics().height() + 2)
        self._serial = 0  # the newest ensure(): an older one's continuation is dropped
        self._pending: dict[int, tuple[str, object, object]] = {}  # serial -> (name, then, failed)
        self._threads: list[threading.Thread] = []
        self.progressed.connect(self._show_progress, Qt.ConnectionType.QueuedConnection)
        self.finished.connect(self._finish, Qt.ConnectionType.QueuedConnection)

    @property
    def loading(self) -> bool:
        return bool(self._pending)

    def supersede(self) -> None:
        """Another scenario was opened: a load in progress goes on (it warms the cache) but
        opens nothing."""
        self._serial += 1

    def ensure(self, model: str | None, then, failed) -> bool:
        """Run ``then()`` once ``model`` is loaded (None: the synthetic model, at once);
        ``failed(message)`` if it cannot be. True if it ran at once."""
        self._serial += 1
        if model is None or is_loaded(model):
            then()
            return True
        serial = self._serial
        self.progress.setFormat(f"loading {model}…")
        self.progress.setValue(0)
        if not self.loading:
            self._bar.addPermanentWidget(self.progress)
            self.progress.show()
        self.loadingChanged.emit(True)
        self._pending[serial] = (model, then, failed)
        thread = threading.Thread(target=self._load, args=(serial, model), name="pagesim-model-load", daemon=True)
        self._threads.append(thread)
        thread.start()
        return False

    def _load(self, serial: int, model: str) -> None:
        """On the loader thread: signals reach the window through its event loop."""
        load_progress.set(lambda stage, fraction: self._emit(self.progressed, serial, stage, fraction))
        try:
            load_model(model)
        except PagesimError as exc:
            self._emit(self.finished, serial, str(exc) or type(exc).__name__)
            return
        except Exception as exc:  # reported, never lost on a thread nobody watches
            self._emit(self.finished, serial, f"internal error: {exc!r}")
            return
        self._emit(self.finished, serial, "")

    @staticmethod
    def _emit(signal, *args) -> None:
        """The window may have closed while the model loaded: then nobody listens."""
        with contextlib.suppress(RuntimeError):  # the QObject was deleted
            signal.emit(*args)

    def _show_progress(self, serial: int, stage: str, fraction: float) -> None:
        if serial in self._pending:
            name = self._pending[serial][0]
            self.progress.setFormat(f"{name}: {stage} · %p%")
            self.progress.setValue(int(fraction * 1000))

    def _finish(self, serial: int, error: str) -> None:
        model, then, failed = self._pending.pop(serial)
        if not self._pending:
            self._bar.removeWidget(self.progress)
            self.loadingChanged.emit(False)
        if serial != self._serial:
            return  # the user opened something else meanwhile
        if error:
            failed(f"could not load the model {model}: {error}")
        else:
            then()

    def wait(self, timeout: float = 60.0) -> None:
        """Until the loads started have ended (closing the window, tests)."""
        for thread in self._threads:
            thread.join(timeout)
        self._threads = [t for t in self._threads if t.is_alive()]
