"""File → Attach to vLLM…: a live view of a vLLM server's prefix cache, from the KV events it
publishes over ZeroMQ (or ``pagesim run --kv-events``'s). The subscriber, the decoding and the
prefix tree are :mod:`pagesim.app.kv_attach`'s, as ``pagesim attach`` uses them; here a
thread receives (the GUI thread never waits on the socket) and hands decoded batches over by
queued signals, and the window draws the tree, the counters and the batches over time."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pyqtgraph as pg
from pagesim.app.gui.controller import LIVE_THREADS, LIVE_TIMERS
from pagesim.app.gui.palette import Theme
from pagesim.app.kv_attach import (
    DEFAULT_ENDPOINT,
    HINT_AFTER_S,
    SERVER_FLAGS,
    SILENT_HINT,
    AttachError,
    PrefixCacheView,
    Subscriber,
    endpoint_problem,
    load_tokenizer,
)
from pagesim.core.errors import PagesimError
from pagesim.core.language_model import real_model_problem
from PySide6.QtCore import Qt, QThread, QTimer, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

POLL_MS = 100  # the receiver's wait on the socket: the longest a detach waits for it
REFRESH_MS = 250  # the tree is redrawn at most this often (a busy server sends many batches a second)
MAX_TREE_ITEMS = 2000
TEXT_WIDTH = 160  # characters of a run's tokens in the tree (the whole in its tooltip)
PLOTTED_BATCHES = 2000
HIT_RATE_TIP = (
    "The hit rate the events imply: a store that branches off a cached prefix counts that prefix as reused; one "
    "that extends a leaf is the same request going on. A request that reuses a whole cached chain stores nothing, "
    "so it is missed: a lower bound."
)


class KVEventReceiver(QThread):
    """Owns the subscriber (ZeroMQ sockets stay on one thread): connects, loads the tokenizer
    if one is named, then receives until :meth:`stop`."""

    received = Signal(list, int, int, int)  # [(seq, ts, events)] in order; messages, events and batches missed so far
    tokenizerLoaded = Signal(object)  # the decode function
    tokenizerFailed = Signal(str)
    failed = Signal(str)

    def __init__(self, endpoint: str, replay: str | None, topic: str, tokenizer: str | None, parent=None) -> None:
        super().__init__(parent)
        self.endpoint, self.replay, self.topic, self.tokenizer = endpoint, replay, topic, tokenizer
        self._stopping = threading.Event()
        self.setObjectName("pagesim-kv-attach")
        LIVE_THREADS.add(self)

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        try:
            subscriber = Subscriber(self.endpoint, self.replay, self.topic)
        except AttachError as exc:
            self.failed.emit(str(exc))
            return
        try:
            if self.tokenizer:  # (batches queue up on the socket meanwhile)
                try:
                    self.tokenizerLoaded.emit(load_tokenizer(self.tokenizer))
                except (PagesimError, OSError, ValueError) as exc:
                    self.tokenizerFailed.emit(f"could not load the tokenizer of {self.tokenizer}: {exc}")
            skipped = 0
            while not self._stopping.is_set():
                batches = subscriber.batches(POLL_MS)
                if batches or subscriber.skipped != skipped:  # (garbage alone is news too)
                    skipped = subscriber.skipped
                    self.received.emit(batches, subscriber.skipped, subscriber.bad_events, subscriber.missed)
        except AttachError as exc:
            self.failed.emit(str(exc))
        finally:
            subscriber.close()


class AttachWindow(QWidget):
    """A window of its own: the server's cached prefixes as a tree, its counters and hit
    rate, and stored/removed blocks per batch; Detach stops receiving and keeps the picture."""

    def __init__(
        self, endpoint: str, replay: str | None, topic: str, tokenizer: str | None, theme: Theme, parent=None
    ) -> None:
        super().__init__(parent, Qt.WindowType.Window)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.setWindowTitle(f"vLLM prefix cache — {endpoint}")
        self.resize(900, 640)
        self.endpoint, self.theme = endpoint, theme
        self.view = PrefixCacheView()
        self.decode = None
        self.problem: str | None = None  # why receiving stopped, when it failed
        self.detached = False
        self._dirty = False
        self._started = time.monotonic()
        self._build(endpoint, replay, topic, tokenizer)
        self.refresh_timer = QTimer(self)
        self.refresh_timer.setObjectName("pagesim-kv-attach-refresh")
        LIVE_TIMERS.add(self.refresh_timer)
        self.refresh_timer.timeout.connect(self.refresh)
        self.refresh_timer.start(REFRESH_MS)
        self.receiver = KVEventReceiver(endpoint, replay, topic, tokenizer, self)
        self.receiver.received.connect(self._on_batches)
        self.receiver.tokenizerLoaded.connect(self._on_tokenizer)
        self.receiver.tokenizerFailed.connect(self._on_tokenizer_failed)
        self.receiver.failed.connect(self._on_failed)
        self.receiver.start()
        self.refresh()

    def _build(self, endpoint: str, replay: str | None, topic: str, tokenizer: str | None) -> None:
        layout = QVBoxLayout(self)
        source = f"Attached to {endpoint}" + (f" · replay {replay}" if replay else "")
        source += f" · topic {topic!r}" if topic else ""
        source += f" · tokens decoded with {tokenizer}" if tokenizer else " · tokens as ids (no tokenizer)"
        self.source_label = QLabel(source)
        self.source_label.setWordWrap(True)
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)
        self.status_label.setToolTip("Batches and events received, blocks stored and removed, blocks cached now")
        self.hit_rate_label = QLabel()
        bold = QFont(self.hit_rate_label.font())
        bold.setBold(True)
        self.hit_rate_label.setFont(bold)
        self.hit_rate_label.setToolTip(HIT_RATE_TIP)
        self.tree_caption = QLabel("Cached prefixes: none yet")
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["Prefix (block hashes)", "Blocks", "Tokens"])
        self.tree.setToolTip(
            "The cached blocks as a tree of prefixes: each block under its parent's hash, a run of blocks with one "
            "child each on one line. ×2: the same prefix cached twice."
        )
        self.tree.setUniformRowHeights(True)
        self.tree.setColumnWidth(0, 200)
        self.tree.setColumnWidth(1, 90)
        self.plot = pg.PlotWidget()
        self.plot.setBackground(self.theme.plot_background)
        self.plot.setLabel("bottom", "batch (sequence number)")
        self.plot.setLabel("left", "blocks")
        self.plot.addLegend(offset=(-10, 5))  # top right: the first batches' bars are at the left
        self.plot.setToolTip("Per batch: blocks stored (up) and removed (down); the line: blocks cached after it")
        self.stored_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=self.theme.good, name="stored")
        self.removed_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=self.theme.bad, name="removed")
        self.plot.addItem(self.stored_bars)
        self.plot.addItem(self.removed_bars)
        self.cached_curve = self.plot.plot([], [], pen=pg.mkPen("#56B4E9", width=2), name="cached")
        tree_panel = QWidget()
        tree_layout = QVBoxLayout(tree_panel)
        tree_layout.setContentsMargins(0, 0, 0, 0)
        tree_layout.addWidget(self.tree_caption)
        tree_layout.addWidget(self.tree, 1)
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(tree_panel)
        splitter.addWidget(self.plot)
        splitter.setSizes([420, 180])
        self.detach_button = QPushButton("Detach")
        self.detach_button.setToolTip("Stop receiving; the picture stays as it is")
        self.detach_button.clicked.connect(self.detach)
        close_button = QPushButton("Close")
        close_button.clicked.connect(self.close)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.detach_button)
        buttons.addWidget(close_button)
        for widget in (self.source_label, self.status_label, self.hit_rate_label):
            layout.addWidget(widget)
        layout.addWidget(splitter, 1)
        layout.addLayout(buttons)

    # -- from the receiver ----------------------------------------------------------------
    def _on_batches(self, batches: list, skipped: int = 0, bad_events: int = 0, missed: int = 0) -> None:
        for seq, ts, events in batches:
            self.view.apply(seq, ts, events)
        self.view.skipped_messages, self.view.bad_events, self.view.missed_batches = skipped, bad_events, missed
        self._dirty = True

    def _on_tokenizer(self, decode) -> None:
        self.decode = decode
        self._dirty = True

    def _on_tokenizer_failed(self, message: str) -> None:
        self.source_label.setText(self.source_label.text() + f" — {message}; showing token ids")

    def _on_failed(self, message: str) -> None:
        self.problem = message
        self.detach_button.setEnabled(False)
        self.refresh()

    # -- the picture --------------------------------------------------------------------
    def status_text(self) -> str:
        if self.problem is not None:
            return f"Not attached: {self.problem}"
        if self.view.batches == 0 and self.view.skipped_messages:
            return f"Nothing readable from {self.endpoint}: " + "; ".join(self.view.problems())
        if self.view.batches == 0:
            waited = time.monotonic() - self._started
            if self.detached:
                return f"Detached after {waited:.0f} s: nothing came from {self.endpoint}."
            text = f"Waiting for events from {self.endpoint}… ({waited:.0f} s)"
            if waited >= HINT_AFTER_S:
                text += f". Nothing yet: {SILENT_HINT}."
            return text
        prefix = "Detached · " if self.detached else ""
        problems = self.view.problems()
        return prefix + self.view.status() + ("".join(f" · {p}" for p in problems) if problems else "")

    def hit_rate_text(self) -> str:
        view = self.view
        if view.hit_rate is None:
            return "Implied prefix-hit rate: n/a (no block stored yet)"
        total = view.reused_tokens + view.computed_tokens
        return f"Implied prefix-hit rate {view.hit_rate:.1%}: {view.reused_tokens} of {total} tokens reused"

    def refresh(self) -> None:
        self.status_label.setText(self.status_text())
        self.hit_rate_label.setText(self.hit_rate_text())
        if not self._dirty:
            return
        self._dirty = False
        self._fill_tree()
        self._plot_history()

    def _fill_tree(self) -> None:
        scroll = self.tree.verticalScrollBar().value()
        self.tree.clear()
        parents: list[QTreeWidgetItem] = []
        runs = list(itertools.islice(self.view.runs(), MAX_TREE_ITEMS + 1))
        for run in runs[:MAX_TREE_ITEMS]:
            label = run.label + (" (parent evicted)" if run.orphan else "")
            item = QTreeWidgetItem([label, run.blocks, run.text(self.decode, TEXT_WIDTH)])
            item.setToolTip(0, " → ".join(map(str, run.hashes)))
            item.setToolTip(2, run.text(self.decode))
            del parents[run.depth :]
            if parents:
                parents[-1].addChild(item)
            else:
                self.tree.addTopLevelItem(item)
            parents.append(item)
        if len(runs) > MAX_TREE_ITEMS:
            more = f"… {len(self.view.nodes)} cached blocks in all"
            self.tree.addTopLevelItem(QTreeWidgetItem([more, "", ""]))
        roots = sum(run.depth == 0 for run in runs)
        self.tree_caption.setText(
            f"Cached prefixes: {self.view.cached_blocks} blocks in {len(runs)} line{'s' * (len(runs) != 1)} "
            f"from {roots} root{'s' * (roots != 1)} · a line is a run of blocks with one child each; where lines "
            "branch, requests shared the prefix above"
        )
        self.tree.expandAll()
        self.tree.verticalScrollBar().setValue(scroll)

    def _plot_history(self) -> None:
        history = list(self.view.history)[-PLOTTED_BATCHES:]
        if not history:
            return
        seqs, _, stored, removed, cached = (np.array(column, dtype=float) for column in zip(*history, strict=True))
        self.stored_bars.setOpts(x=seqs, height=stored)
        self.removed_bars.setOpts(x=seqs, height=-removed)
        self.cached_curve.setData(seqs, cached)
        # Batches are whole numbers: a tick per batch while there are few (else pyqtgraph's own).
        few = seqs[-1] - seqs[0] <= 10
        self.plot.getAxis("bottom").setTickSpacing(*((1, 1) if few else (None, None)))

    # -- detach and close -----------------------------------------------------------------
    def detach(self) -> None:
        """Stop receiving (the thread ends within a poll); the picture stays."""
        if self.receiver.isRunning():
            self.receiver.stop()
            self.receiver.wait()
        self.detached = True
        self.detach_button.setEnabled(False)
        self.refresh()

    def closeEvent(self, event) -> None:
        self.detach()
        self.refresh_timer.stop()
        super().closeEvent(event)


class AttachDialog(QDialog):
    """Where to attach: the endpoint (and, optionally, the replay endpoint, a topic, a tokenizer)."""

    def __init__(self, settings, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Attach to vLLM")
        self.settings = settings
        intro = QLabel(
            "Follow a vLLM server's prefix cache live from its KV events (ZeroMQ). Start the server with "
            f"--enable-prefix-caching {SERVER_FLAGS}; or publish a scenario's with "
            "pagesim run SCENARIO --kv-events tcp://127.0.0.1:5557."
        )
        intro.setWordWrap(True)
        intro.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.endpoint = QLineEdit(self._remembered("endpoint", DEFAULT_ENDPOINT))
        self.endpoint.setToolTip(
            "The server's KV-event endpoint as seen from here: tcp://HOST:PORT. A server that binds tcp://*:5557 "
            "on this machine is tcp://127.0.0.1:5557."
        )
        self.replay = QLineEdit(self._remembered("replay", ""))
        self.replay.setPlaceholderText("none (e.g. tcp://127.0.0.1:5558)")
        self.replay.setToolTip("The server's replay endpoint: batches missed in a gap are asked for again")
        self.topic = QLineEdit(self._remembered("topic", ""))
        self.topic.setPlaceholderText("every topic")
        self.topic.setToolTip("The topic to subscribe to (vLLM's --kv-events-config topic)")
        self.tokenizer = QComboBox()
        self.tokenizer.setEditable(True)
        self.tokenizer.addItems(["", "smollm2-135m"])
        self.tokenizer.setCurrentText(self._remembered("tokenizer", ""))
        self.tokenizer.lineEdit().setPlaceholderText("none: token ids")
        self.tokenizer.setToolTip(
            "Decode the cached tokens with this model's tokenizer: smollm2-135m or a path to a .gguf file"
        )
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #d55e00;")
        form = QFormLayout()
        form.addRow("KV-event endpoint", self.endpoint)
        form.addRow("Replay endpoint", self.replay)
        form.addRow("Topic", self.topic)
        form.addRow("Tokenizer", self.tokenizer)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.attach_button = buttons.addButton("Attach", QDialogButtonBox.ButtonRole.AcceptRole)
        self.attach_button.setDefault(True)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(form)
        layout.addWidget(self.error_label)
        layout.addWidget(buttons)
        self.resize(560, self.sizeHint().height())

    def _remembered(self, key: str, default: str) -> str:
        value = self.settings.value(f"attach/{key}", default)
        return value if isinstance(value, str) else default

    def choice(self) -> tuple[str, str | None, str, str | None]:
        """(endpoint, replay or None, topic, tokenizer or None)."""
        replay, tokenizer = self.replay.text().strip(), self.tokenizer.currentText().strip()
        return self.endpoint.text().strip(), replay or None, self.topic.text(), tokenizer or None

    def problem(self) -> str | None:
        endpoint, replay, _, tokenizer = self.choice()
        found = endpoint_problem(endpoint) or (replay and endpoint_problem(replay, "replay endpoint"))
        if not found and tokenizer:
            found = real_model_problem(tokenizer, "tokenizer")
        return found or None

    def accept(self) -> None:
        if problem := self.problem():
            self.error_label.setText(problem)
            return
        endpoint, replay, topic, tokenizer = self.choice()
        for key, value in (("endpoint", endpoint), ("replay", replay), ("topic", topic), ("tokenizer", tokenizer)):
            self.settings.setValue(f"attach/{key}", value or "")
        super().accept()


class KVAttach:
    """The main window's attach windows: opened from the dialog, closed with the window."""

    def __init__(self, window) -> None:
        self.window = window
        self.windows: list[AttachWindow] = []

    def open_dialog(self) -> AttachDialog:
        dialog = AttachDialog(self.window.settings, self.window)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self.attach(*dialog.choice()))
        dialog.open()  # window-modal, returns at once
        return dialog

    def attach(self, endpoint: str, replay: str | None = None, topic: str = "", tokenizer: str | None = None):
        view = AttachWindow(endpoint, replay, topic, tokenizer, self.window.theme, self.window)
        view.destroyed.connect(lambda _=None, v=view: self.windows.remove(v) if v in self.windows else None)
        self.windows.append(view)
        view.show()
        return view

    def close_all(self) -> None:
        for view in list(self.windows):
            view.close()
