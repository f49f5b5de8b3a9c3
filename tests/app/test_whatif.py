"""The what-if and latency panels: replays of the current scenario on the worker thread,
side by side with the original, and its serving time on a preset model and GPU. The
scenarios (tests/app/study_scenarios.py) run the synthetic model: the studies replay memory only."""

import threading
import time

import pytest
from pagesim.core.scenario import load_shipped, parse_scenario, shipped_scenarios
from pagesim.core.studies import sweep as sweep_module
from pagesim.core.studies.serving_time import GPUS, MODEL_SHAPES
from pagesim.core.studies.sweep import Hardware, SweepResult, VariantResult
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QLabel

from tests.app.conftest import wait_idle
from tests.app.study_scenarios import BY_HAND, REQUESTS, V1_REQUESTS, ToyWindows


@pytest.fixture
def toy(qtbot, settings):
    windows = ToyWindows(qtbot, settings)
    yield windows
    windows.close()


def run_whatif(window, qtbot, knob: str, values: str):
    panel = window.studies.whatif
    panel.knob_box.setCurrentText(knob)
    panel.values_edit.setText(values)
    with qtbot.waitSignal(window.controller.sweepReady, timeout=30_000):
        panel.run_button.click()
    wait_idle(qtbot, window)
    return panel


def test_whatif_shows_block_size_variants_beside_the_original(toy, qtbot):
    window = toy(BY_HAND)
    window.studies.actions["whatif"].trigger()  # Studies → What-if replays brings it to the front
    assert window.studies.whatif_dock.isVisible()
    panel = run_whatif(window, qtbot, "block_size", "2,8")
    assert panel.table.rowCount() == 3 and len(panel.curves) == 3
    assert [panel.cell(r, "variant") for r in range(3)] == ["original", "block_size=2", "block_size=8"]
    assert [panel.cell(r, "status") for r in range(3)] == ["ok", "ok", "ok"]
    # The same memory in blocks of another size: smaller blocks, more of them.
    assert [panel.cell(r, "pool") for r in range(3)] == ["24 × 4", "48 × 2", "12 × 8"]
    original, small, large = (int(panel.cell(r, "peak blocks")) for r in range(3))
    assert small > original > large
    # Memory is compared in token slots: blocks × tokens per block, in the column and the curves.
    slots = [int(panel.cell(r, "peak slots").replace(",", "")) for r in range(3)]
    assert slots == [original * 4, small * 2, large * 8]
    assert [max(curve.getData()[1]) for curve in panel.curves] == slots
    axis = panel.plot.getAxis("bottom")
    assert all(float(value).is_integer() for _, values in axis.tickValues(0, 5, 400) for value in values)
    assert panel.progress.value() == panel.progress.maximum() == 3
    assert panel.run_button.isEnabled() and not panel.cancel_button.isEnabled()
    assert panel.cell(0, "TTFT ms") == "—"  # sequences by hand: no request to time
    assert "Llama-3-8B on H200" in panel.status.full_text


def test_a_refused_variant_says_why_in_its_row_and_the_others_run(toy, qtbot):
    window = toy(REQUESTS)
    panel = window.studies.whatif
    panel.knob_box.setCurrentText("preemption")
    panel.values_edit.setText("recompute,swap")
    panel.add_setting()
    panel.knob_box.setCurrentText("scheduler")
    panel.values_edit.setText("v0,v1")
    panel.add_setting()
    assert panel.grid_label.full_text == "grid: preemption=recompute,swap × scheduler=v0,v1"
    with qtbot.waitSignal(window.controller.sweepReady, timeout=30_000):
        panel.run_button.click()
    wait_idle(qtbot, window)
    rows = {panel.cell(r, "variant"): r for r in range(panel.table.rowCount())}
    assert len(rows) == 5
    refused = rows["preemption=swap scheduler=v1"]
    assert panel.cell(refused, "status") == "cannot run"
    assert "v1" in panel.cell(refused, "pool") and "no swap" in panel.cell(refused, "pool")  # why, in its row
    assert panel.table.columnSpan(refused, 2) == panel.table.columnCount() - 2
    swapped = rows["preemption=swap scheduler=v0"]
    assert panel.cell(swapped, "status") == "ok" and panel.cell(swapped, "finished") == "3"
    # Swapping preempts less than recomputing here (1 against the original's 3), and is timed.
    assert int(panel.cell(swapped, "preemptions")) < int(panel.cell(0, "preemptions"))
    assert float(panel.cell(swapped, "TTFT ms")) > 0
    assert "1 could not run" in panel.status.full_text


def test_a_bad_value_is_one_line_and_nothing_runs(toy, qtbot):
    window = toy(BY_HAND)
    panel = window.studies.whatif
    panel.knob_box.setCurrentText("watermark")
    panel.values_edit.setText("2")
    panel.run_button.click()
    assert "watermark: bad value '2'" in panel.status.full_text
    assert window.controller.pending == 0 and panel.table.rowCount() == 0


LONG_GRID = ",".join(str(n) for n in range(30, 230))  # 200 variants: seconds of replays


def test_cancel_stops_the_whatif_and_the_rows_so_far_stay(toy, qtbot, monkeypatch):
    clicked = threading.Event()
    replay = sweep_module.run_variant
    calls = []

    def held(*args):  # variants after the first wait for the click: the sweep cannot end before it
        calls.append(args)
        result = replay(*args)
        if len(calls) > 1:
            clicked.wait(30)
        return result

    monkeypatch.setattr(sweep_module, "run_variant", held)
    window = toy(REQUESTS)
    panel = window.studies.whatif
    panel.knob_box.setCurrentText("num_blocks")
    panel.values_edit.setText(LONG_GRID)
    with qtbot.waitSignal(window.controller.sweepProgress, timeout=30_000):
        panel.run_button.click()
    assert panel.progress.maximum() == 201 and not panel.run_button.isEnabled()
    with qtbot.waitSignal(window.controller.sweepCancelled, timeout=30_000) as blocker:
        panel.cancel_button.click()
        clicked.set()
    wait_idle(qtbot, window)
    done = blocker.args[0]
    assert 1 <= done < 201 and panel.table.rowCount() == done
    assert "cancelled after" in panel.status.full_text and panel.run_button.isEnabled()


def test_closing_the_window_does_not_wait_for_a_whatif(toy, qtbot):
    window = toy(REQUESTS)
    panel = window.studies.whatif
    panel.knob_box.setCurrentText("num_blocks")
    panel.values_edit.setText(LONG_GRID)
    with qtbot.waitSignal(window.controller.sweepProgress, timeout=30_000):
        panel.run_button.click()
    started = time.perf_counter()
    window.close()
    assert time.perf_counter() - started < 1.0  # the variant in progress, then it stops


def test_another_scenario_clears_the_whatif(toy, qtbot):
    window = toy(BY_HAND)
    panel = run_whatif(window, qtbot, "block_size", "8")
    assert panel.table.rowCount() == 2
    window.load(parse_scenario(REQUESTS))
    wait_idle(qtbot, window)
    assert panel.table.rowCount() == 0 and panel.curves == [] and panel.result is None


def test_latency_panel_shows_a_v1_scenario_on_the_h200(toy, qtbot):
    window = toy(V1_REQUESTS)
    assert window.frame.config.scheduler == "v1"
    panel = window.studies.latency
    window.studies.actions["latency"].trigger()
    assert panel.gpu_box.currentText() == "H200"
    with qtbot.waitSignal(window.controller.latencyReady, timeout=30_000) as blocker:
        panel.run_button.click()
    wait_idle(qtbot, window)
    study = blocker.args[0]
    assert study.gpu == "H200" and study.summary.requests >= 3
    assert panel.table.rowCount() == len(study.requests)
    ttfts = [float(panel.table.item(r, 3).text()) for r in range(panel.table.rowCount())]
    assert all(t > 0 for t in ttfts)
    assert "tokens/s" in panel.figures.text() and "TTFT" in panel.figures.text()
    assert "H200" in panel.summary.full_text and "24 blocks of 4 tokens" in panel.summary.full_text
    # (the scheduler's steps, not the timeline's: "15 steps" read as a miscount of a 16-step scenario)
    assert f"finished in {study.steps} scheduler steps" in panel.summary.full_text
    # Another GPU: the shown result follows it, slower on an A100's bandwidth.
    with qtbot.waitSignal(window.controller.latencyReady, timeout=30_000) as slower:
        panel.gpu_box.setCurrentIndex(panel.gpu_box.findData("a100-40gb"))
    wait_idle(qtbot, window)
    assert slower.args[0].summary.ttft["mean"] > study.summary.ttft["mean"]


def test_latency_of_a_scenario_without_requests_says_so(toy, qtbot):
    window = toy(BY_HAND)
    panel = window.studies.latency
    with qtbot.waitSignal(window.controller.latencyReady, timeout=30_000):
        panel.run_button.click()
    wait_idle(qtbot, window)
    assert panel.table.rowCount() == 0 and "submits no requests" in panel.summary.full_text


def _cut_labels(widget) -> list[str]:
    """Visible labels of ``widget`` cut without "…" and a tooltip, by Qt's font metrics."""
    out = []
    for label in widget.findChildren(QLabel):
        if not label.isVisible() or not label.text():
            continue
        text = label.text()
        if "<" in text:  # rich text: measure what is shown
            doc = QTextDocument()
            doc.setHtml(text)
            text = doc.toPlainText()
        rect, metrics = label.contentsRect(), label.fontMetrics()
        if label.wordWrap():
            need = metrics.boundingRect(rect.adjusted(0, 0, 0, 100_000), int(Qt.TextFlag.TextWordWrap), text).height()
            cut = need > rect.height() + 2
        else:
            cut = metrics.horizontalAdvance(text) > rect.width() + 1
        if cut and not (text.rstrip().endswith("…") and label.toolTip()):
            out.append(text[:50])
    return out


def test_the_study_panels_cut_nothing_at_1024_by_700(toy, qtbot):
    window = toy(REQUESTS)
    window.resize(1024, 700)
    panel = window.studies.whatif
    for knob, values in (("block_size", "1,2,8,16"), ("max_num_seqs", "1,2"), ("prefix_caching", "true,false")):
        panel.knob_box.setCurrentText(knob)
        panel.values_edit.setText(values)
        panel.add_setting()
    window.studies.show_panel("whatif")
    with qtbot.waitSignal(window.controller.sweepReady, timeout=60_000):
        panel.run_button.click()
    wait_idle(qtbot, window)
    qtbot.wait(50)
    assert panel.isVisible() and panel.table.rowCount() == 17
    assert _cut_labels(panel) == []
    assert panel.grid_label.toolTip() == panel.grid_label.full_text  # the whole grid, if it is cut
    window.studies.show_panel("latency")
    with qtbot.waitSignal(window.controller.latencyReady, timeout=30_000):
        window.studies.latency.run_button.click()
    wait_idle(qtbot, window)
    qtbot.wait(50)
    assert window.studies.latency.plots.isVisible() and _cut_labels(window.studies.latency) == []


def test_a_scenario_that_cannot_be_replayed_says_so_once(toy):
    panel = toy(BY_HAND).studies.whatif
    why = "a real model needs its K/V: memory-only runs use the synthetic model"
    variants = [VariantResult(label, {}, "cannot run", why) for label in ("original", "block_size=8")]
    hardware = Hardware(MODEL_SHAPES["llama-3-8b"], GPUS["h200"])
    panel.show_result(SweepResult("real", hardware, [("block_size", (8,))], variants))
    assert panel.status.full_text == f"✗ the scenario itself cannot be replayed: {why}"
    assert panel.run_button.isEnabled()


SHIPPED_V1 = sorted(name for name in shipped_scenarios() if load_shipped(name).config.scheduler == "v1")


def test_latency_of_a_shipped_v1_scenario_on_the_h200(make_window, qtbot):
    assert set(SHIPPED_V1) == {"prefix_caching_v1", "preemption_v1"}
    window = make_window("prefix_caching_v1", real=True)
    panel = window.studies.latency
    with qtbot.waitSignal(window.controller.latencyReady, timeout=60_000) as blocker:
        panel.run_button.click()
    wait_idle(qtbot, window)
    study = blocker.args[0]
    assert study.gpu == "H200" and study.summary.requests > 0 and study.summary.throughput > 0
    assert panel.table.rowCount() == len(study.requests) > 0
    assert "TTFT" in panel.figures.text() and "H200" in panel.summary.full_text
    if window.frame.config.model != "synthetic":  # replayed on the synthetic model in its place, and said
        assert "is played by the synthetic model here" in panel.summary.full_text


def test_the_latency_panel_shows_a_v1_requests_samples_as_one_row(make_window, qtbot):
    """v1 runs n samples as child requests: the panel showed r3's as one row of 16 outputs while
    its throughput counted both samples; now the row says 16 × 2, as the command line does."""
    window = make_window("preemption_v1", real=True)
    panel = window.studies.latency
    with qtbot.waitSignal(window.controller.latencyReady, timeout=60_000) as blocker:
        panel.run_button.click()
    wait_idle(qtbot, window)
    study = blocker.args[0]
    names = [panel.table.item(row, 0).text() for row in range(panel.table.rowCount())]
    assert names == [r.request for r in study.requests] and not any("/" in name for name in names)
    sampled = [r for r in study.requests if r.samples > 1]
    assert sampled
    row = names.index(sampled[0].request)
    assert panel.table.item(row, 5).text() == f"{sampled[0].output_tokens} × {sampled[0].samples}"


def test_the_suggested_values_follow_another_scenario_unless_the_user_typed_some(make_window, qtbot):
    """After opening a scenario with blocks of 16, the tour's suggestion "4,16" stayed: a variant
    that re-ran the original's own block size."""
    window = make_window("default")
    panel = window.studies.whatif
    panel.knob_box.setCurrentText("block_size")
    before = window.frame.config.block_size
    window.load(load_shipped("long_context"))
    wait_idle(qtbot, window)
    size = window.frame.config.block_size
    assert size != before and panel.values_edit.text() == f"{size // 2},{size * 2}"
    panel.values_edit.setText("2,32")  # the user's own values stay
    window.load(load_shipped("default"))
    wait_idle(qtbot, window)
    assert panel.values_edit.text() == "2,32"


OUTGROWS = (
    'name = "outgrows"\nnum_blocks = 4\nblock_size = 4\nnum_heads = 1\nhead_dim = 8\nwatermark = 0.0\n'
    "max_num_seqs = 1\n"
    '[[steps]]\nop = "submit"\nrequest = "a"\ntokens = 4\noutput = 3\n'
    '[[steps]]\nop = "submit"\nrequest = "b"\ntokens = 4\noutput = 30\n'
    '[[steps]]\nop = "schedule"\nsteps = 2\n'
)


def test_latency_panel_tells_an_aborted_request_apart_and_leaves_its_tokens_out(toy, qtbot):
    """v0 admits b, whose output outgrows the pool: the tab counted its tokens as throughput
    and said nothing of it but 'finished' counts."""
    window = toy(OUTGROWS)
    panel = window.studies.latency
    window.studies.actions["latency"].trigger()
    with qtbot.waitSignal(window.controller.latencyReady, timeout=30_000) as blocker:
        panel.run_button.click()
    wait_idle(qtbot, window)
    study = blocker.args[0]
    assert [r.state for r in study.requests] == ["finished", "aborted"]
    assert "1 aborted after running" in panel.summary.full_text
    assert "tokens/s of finished requests" in panel.figures.text()
    assert f"({study.summary.discarded_tokens:,} tokens of unfinished ones not counted)" in panel.figures.text()
    assert study.summary.discarded_tokens > 0
