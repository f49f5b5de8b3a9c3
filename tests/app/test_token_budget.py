"""The Scheduler dock's token budget: v1's step drawn against max_num_batched_tokens, a
segment per request with its tooltip, and partially prefilled requests in the lanes."""

from pathlib import Path

from pagesim.app.gui.views.token_budget import V0_H, V0_TEXT, segment_widths
from pagesim.core.scenario import load_scenario
from PySide6.QtCore import QPointF

from tests.app.conftest import wait_idle
from tests.scenarios import synthetic, token_model

CHUNKED = Path(__file__).resolve().parent / "scenarios" / "chunked_prefill_v1.toml"


def open_at(qtbot, settings, scenario, step):
    from pagesim.app.gui.main_window import MainWindow

    window = MainWindow("cpu", settings=settings, speed=0.0)
    qtbot.addWidget(window)
    window.resize(1024, 700)
    window.show()
    window.load(scenario)
    wait_idle(qtbot, window)
    window.controller.seek(step)
    qtbot.waitUntil(lambda: window.frame.position == step and window.controller.pending == 0, timeout=20_000)
    return window


def test_a_v1_step_shows_decodes_and_a_prefill_chunk_against_the_budget(qtbot, settings):
    window = open_at(qtbot, settings, load_scenario(CHUNKED), 5)
    try:
        bar = window.token_budget
        assert bar.isVisible() and bar.is_v1
        assert "2 decode + 62 prefill = 64 of 64 tokens" in bar.title()
        laid_out = [(s.request, s.kind, s.tokens) for _, s in bar.segments]
        assert laid_out == [("r1", "decode", 1), ("r2", "decode", 1), ("r3", "prefill", 62)]
        (r1, _), (r2, _), (r3, _) = bar.segments
        whole = bar.bar_rect()
        # The budget is the full width: the three tile it left to right, the long chunk widest.
        assert r1.left() == whole.left() and r2.left() == r1.right() and r3.left() == r2.right()
        assert abs(r3.right() - whole.right()) < 1 and bar.unused_rect is None
        assert r3.width() > 10 * r1.width() > 0
        assert bar.tooltip_at(r3.center()).startswith("r3: prefill chunk of 62 tokens (62/150 of its prompt)")
        assert bar.tooltip_at(r1.center()).startswith("r1: decode of 1 token")
        # The lanes: r3 is running, and says how far its prefill has come.
        lanes = window.scheduler_view
        lanes.repaint()
        chips = {request: (chip, lane) for chip, request, lane in lanes.chips}
        assert chips["r3"][1] == "running" and chips["r3"][0].width() > chips["r1"][0].width()
        assert "prefilling: 62 of its 150 tokens" in lanes.chip_tooltip("r3", "running")
        assert lanes.chip_tooltip("r1", "running") == "r1: running: prefill or decode, on the GPU"
        # v1 never swaps: its swapped lane and the CPU pool's caption say so, in v0's words nowhere.
        assert lanes.lane_titles()["swapped"] == "swapped: none, v1 recomputes instead"
        assert lanes.pool_caption().startswith("No CPU swap pool: vLLM v1 preempts by recompute")

        window.controller.seek(8)  # r3's last chunk and r4's admission leave 20 tokens unused
        qtbot.waitUntil(lambda: window.frame.position == 8 and window.controller.pending == 0, timeout=20_000)
        assert [s.request for _, s in bar.segments] == ["r1", "r2", "r3", "r4"]
        assert bar.tooltip_at(bar.unused_rect.center()).startswith("20 tokens of the budget unused")
        assert "32 tokens came from the prefix cache" in bar.tooltip_at(bar.segments[3][0].center())
        lanes.repaint()
        assert all(lane != "running" or "prefilling" not in lanes.chip_tooltip(r, lane) for _, r, lane in lanes.chips)

        window.controller.seek(4)  # a submit: no scheduling, so no segments
        qtbot.waitUntil(lambda: window.frame.position == 4 and window.controller.pending == 0, timeout=20_000)
        assert bar.segments == [] and "not a scheduling step" in bar.title()
    finally:
        window.close()


def test_v0_says_it_has_no_budget_and_a_scenario_without_a_scheduler_hides_it(qtbot, settings):
    window = open_at(qtbot, settings, load_scenario(token_model("preemption_recompute")), 4)
    try:
        bar = window.token_budget
        assert bar.isVisible() and not bar.is_v1 and bar.segments == [] and bar.height() == V0_H
        assert bar.tooltip_at(QPointF(5, 5)) == V0_TEXT
        window.load(load_scenario(synthetic("default")))
        qtbot.waitUntil(lambda: window.frame.queues is None and window.controller.pending == 0, timeout=20_000)
        assert not bar.isVisible()
    finally:
        window.close()


def test_segment_widths_keep_small_decodes_visible_and_the_whole_in_the_budget():
    widths = segment_widths([1, 1, 2046], 2048, 600.0)
    assert min(widths) >= 4 and abs(sum(widths) - 600) < 1e-6
    named = segment_widths([1, 1, 2046], 2048, 600.0, named=40.0)
    assert named[:2] == [40.0, 40.0] and abs(sum(named) - 600) < 1e-6
    assert segment_widths([512], 2048, 800.0) == [200.0]  # unused three quarters keep their width
    many = segment_widths([1] * 300, 2048, 600.0)
    assert all(w >= 4 for w in many)
