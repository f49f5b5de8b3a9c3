"""Grow on a real model streams its tokens into the text view while the step runs on the
worker: each token's text arrives as it is written, before the step's frame."""

from tests.app.conftest import wait_idle


def test_a_grow_streams_each_token_before_its_frame(make_window, qtbot):
    window = make_window("default", real=True)
    window.actions.scrubber.setValue(3)
    before = wait_idle(qtbot, window, timeout=60_000)
    window.select_sequence("A")
    window.tokens_and_text.setCurrentWidget(window.sequence_text)
    start = before.sequence("A").num_tokens
    streamed, frames_seen = [], []
    window.controller.frameChanged.connect(lambda f: frames_seen.append(f.position))

    def on_token(seq, piece, count):
        streamed.append((seq, piece, count, len(frames_seen)))
        assert window.sequence_text.plain_text().endswith(piece.replace("\n", "↵\n"))  # shown as it comes

    window.controller.tokenStreamed.connect(on_token)
    window.grow_selected(4)
    qtbot.waitUntil(lambda: bool(frames_seen), timeout=60_000)
    frame = wait_idle(qtbot, window, timeout=60_000)
    state = frame.sequence("A")
    assert [count for _, _, count, _ in streamed] == list(range(start + 1, state.num_tokens + 1))
    assert all(seq == "A" and frames == 0 for seq, _, _, frames in streamed)  # all before the frame
    assert "".join(p for _, p, _, _ in streamed) == "".join(state.pieces[start:])
    assert "writing…" not in window.sequence_text.caption.text()  # the frame's caption again


def test_nothing_streams_while_seeking(make_window, qtbot):
    window = make_window("default", real=True)
    streamed = []
    window.controller.tokenStreamed.connect(lambda *args: streamed.append(args))
    window.actions.scrubber.setValue(8)  # several grows replayed on the way
    wait_idle(qtbot, window, timeout=60_000)
    assert streamed == []
