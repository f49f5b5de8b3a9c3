"""File → Attach to vLLM…: the dialog checks the endpoint, the window follows a publisher in
a subprocess (vLLM's wire format written by hand) without blocking the GUI thread, draws its
prefix tree, and stops receiving on Detach and on close."""

import subprocess
import sys

from pagesim.app.gui.attach import HINT_AFTER_S
from pagesim.app.kv_attach import DEFAULT_ENDPOINT
from PySide6.QtWidgets import QDialog

from tests.cli.test_kv_events_zmq import PUBLISHER, free_port


def rows(tree):
    """Every item of the tree as (depth, hashes, blocks, tokens), depth first."""
    out = []

    def walk(item, depth):
        out.append((depth, item.text(0), item.text(1), item.text(2)))
        for i in range(item.childCount()):
            walk(item.child(i), depth + 1)

    for i in range(tree.topLevelItemCount()):
        walk(tree.topLevelItem(i), 0)
    return out


def test_the_window_shows_the_published_prefix_tree_and_detaches(window, qtbot, tmp_path):
    script = tmp_path / "publisher.py"
    script.write_text(PUBLISHER)
    port, replay = free_port(), free_port()
    publisher = subprocess.Popen([sys.executable, str(script), str(port), str(replay), "0.5"])
    try:
        view = window.kv_attach.attach(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}")
        assert view.receiver.isRunning()
        if view.view.batches == 0:
            assert view.status_label.text().startswith(f"Waiting for events from tcp://127.0.0.1:{port}")
        qtbot.waitUntil(lambda: view.view.events >= 4, timeout=20_000)
        view.refresh()
        # Block 101 → 102 stored, 203 under 101, then 102 removed and 304 under 203: one chain.
        assert rows(view.tree) == [(0, "00000065…00000130", "3 blocks", "1 2 3 4 9 9 9 9 4 4 4 4")]
        assert "3 batches, 4 events · stored 4, removed 1 · cached 3 blocks" in view.status_label.text()
        assert view.hit_rate_label.text() == "Implied prefix-hit rate 20.0%: 4 of 20 tokens reused"
        assert list(view.cached_curve.getData()[1]) == [2, 3, 3]
        view.detach_button.click()
        assert not view.receiver.isRunning() and view.status_label.text().startswith("Detached · 3 batches")
        assert rows(view.tree)[0][1] == "00000065…00000130"  # the picture stays
        view.close()
        assert window.kv_attach.windows == [] or not window.kv_attach.windows[0].isVisible()
    finally:
        publisher.wait(timeout=30)


def test_the_dialog_names_a_bad_endpoint_and_attaches_to_a_good_one(window, qtbot, monkeypatch):
    action = window.actions.attach_action
    assert action.text() == "Attach to vLLM…" and action.shortcut().toString() == "Ctrl+Shift+A"
    dialog = window.kv_attach.open_dialog()
    assert dialog.endpoint.text() == DEFAULT_ENDPOINT and dialog.isVisible()
    dialog.endpoint.setText("tcp://*:5557")
    dialog.attach_button.click()
    assert "the address a server binds" in dialog.error_label.text() and window.kv_attach.windows == []
    port = free_port()  # nobody publishes there
    dialog.endpoint.setText(f"tcp://127.0.0.1:{port}")
    dialog.tokenizer.setCurrentText("bogus")  # (no model at all: said in the dialog, not after attaching)
    dialog.attach_button.click()
    assert "tokenizer 'bogus' is not a model" in dialog.error_label.text() and window.kv_attach.windows == []
    dialog.tokenizer.setCurrentText("/nonexistent/model.gguf")
    dialog.attach_button.click()
    assert dialog.result() == QDialog.DialogCode.Accepted
    (view,) = window.kv_attach.windows
    assert view.status_label.text().startswith(f"Waiting for events from tcp://127.0.0.1:{port}")
    qtbot.waitUntil(lambda: "could not load the tokenizer" in view.source_label.text(), timeout=20_000)
    # Waiting long, the status says what a server needs to publish.
    monkeypatch.setattr(view, "_started", view._started - HINT_AFTER_S)
    view.refresh()
    assert "--kv-events-config" in view.status_label.text()
    assert window.settings.value("attach/endpoint") == f"tcp://127.0.0.1:{port}"
    window.close()  # closing the main window stops the receiver
    assert not view.receiver.isRunning()
