"""The Check panel and the walk-through pick a real model's layer: the step's worst by
default, any other from their menu; the synthetic model has no layer menu."""

from tests.app.conftest import wait_idle

STEP = 5  # the tour: A's ninth token, a decode step


def _at_step(qtbot, window, step):
    window.actions.scrubber.setValue(step)
    return wait_idle(qtbot, window, timeout=60_000)


def test_the_check_panel_shows_the_worst_layer_then_the_one_chosen(make_window, qtbot):
    window = make_window("default", real=True)
    window.check_fold.open()
    frame = _at_step(qtbot, window, STEP)
    panel = window.kernel_panel
    box = panel.layer_box
    assert box.isVisible() and box.count() == 31 and box.layer() is None
    worst = frame.worst_layer
    assert worst is not None and box.itemText(0) == f"worst: layer {worst}"
    assert frame.focus.layer == worst
    assert f"layer {worst} of 30 (the step's worst)" in panel.verdict.text()
    # A short context's weights are labelled by the tokens' text.
    levels = panel.weights_plot.getAxis("bottom")._tickLevels  # (every k-th first, the rest where room allows)
    ticks = sorted(tick for level in levels for tick in level)
    assert [label for _, label in ticks[:2]] == ["The", "·capi…"] and len(ticks) == frame.focus.context_len
    box.setCurrentIndex(1)  # layer 0
    frame = wait_idle(qtbot, window, timeout=60_000)
    assert frame.focus.layer == 0 and frame.focus.gathered
    assert "layer 0 of 30" in panel.verdict.text() and "gathered through the block table" in panel.verdict.text()
    # The choice holds as the steps go on.
    window.controller.forward()
    frame = wait_idle(qtbot, window, timeout=60_000)
    assert frame.position == STEP + 1 and frame.focus.layer == 0


def test_the_walk_through_replays_the_chosen_layer(make_window, qtbot):
    window = make_window("default", real=True)
    frame = _at_step(qtbot, window, STEP)
    with qtbot.waitSignal(window.controller.traceReady, timeout=60_000) as blocker:
        window.show_walkthrough()
    assert blocker.args[0].layer == frame.worst_layer
    panel = window.walkthrough
    assert panel.layer_box.isVisible()
    with qtbot.waitSignal(window.controller.traceReady, timeout=60_000) as blocker:
        panel.layer_box.setCurrentIndex(4)  # layer 3
    walk = blocker.args[0]
    assert walk.layer == 3 and walk.num_layers == 30
    assert panel.layer_box.currentText() == "layer 3"


def test_the_synthetic_model_has_no_layer_menu(make_window, qtbot):
    window = make_window("seed_demo")
    window.check_fold.open()
    window.show_walkthrough()
    _at_step(qtbot, window, 3)
    assert window.frame.num_layers == 1 and window.frame.focus.layer == 0
    assert not window.kernel_panel.layer_box.isVisible() and not window.walkthrough.layer_box.isVisible()
    assert "layer" not in window.kernel_panel.verdict.text()
