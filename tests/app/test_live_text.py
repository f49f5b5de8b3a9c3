"""The per-step label: a new text repaints it and never re-lays out the window."""

from pagesim.app.gui.views.live_text import LiveText
from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QVBoxLayout, QWidget


class _LayoutRequests(QObject):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def eventFilter(self, obj, event) -> bool:
        if event.type() == QEvent.Type.LayoutRequest:
            self.count += 1
        return False


def _panel(qtbot, live):
    panel = QWidget()
    layout = QVBoxLayout(panel)
    layout.addWidget(live)
    panel.resize(300, 200)
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    return panel


def _layout_requests(qtbot, label, texts):
    """How many layout requests the texts caused, and the panel (it owns the label)."""
    panel = _panel(qtbot, label)
    qtbot.wait(20)  # the first layout settles
    requests = _LayoutRequests()
    panel.installEventFilter(requests)
    for text in texts:
        label.setText(text)
        qtbot.wait(1)
    panel.removeEventFilter(requests)
    return requests.count, panel


def test_a_new_text_asks_for_no_layout_where_a_label_asks_for_one_each_time(qtbot):
    from PySide6.QtWidgets import QLabel

    texts = [f"<b>{step}</b> blocks used · {step * 37} slots" + " more" * step for step in range(20)]
    live = LiveText(lines=2)
    height = live.height()
    requests, _panel_kept = _layout_requests(qtbot, live, texts)
    assert requests == 0 and live.height() == height
    assert live.text().startswith("<b>19</b>") and live.plain_text().startswith("19 blocks used")
    label = QLabel()
    label.setWordWrap(True)
    requests, _panel_kept = _layout_requests(qtbot, label, texts)
    assert requests >= 10  # what it replaces: a re-layout per step


def test_a_long_text_is_cut_at_a_whole_line_and_kept_whole_in_the_tooltip(qtbot):
    live = LiveText(lines=2)
    panel = _panel(qtbot, live)  # noqa: F841 (kept alive: it owns the label)
    live.setToolTip("What the numbers mean")
    live.setText("short")
    assert not live.is_cut and live.toolTip() == "What the numbers mean"
    long_text = " ".join(f"word{i}" for i in range(200))
    live.setText(long_text)
    assert live.is_cut
    assert long_text in live.toolTip() and live.toolTip().endswith("What the numbers mean")
    image = live.grab().toImage()
    assert not image.isNull()  # it paints (the cut branch) without error


def test_a_fixed_width_label_keeps_its_width(qtbot):
    live = LiveText(lines=1, width_chars=20)
    panel = _panel(qtbot, live)  # noqa: F841
    width = live.width()
    live.setText("step 1 / 376 · grow r1 by 1 · ✓ kernel = dense and a long tail")
    assert live.width() == width and live.is_cut


def test_it_grows_once_for_a_longer_text_and_fits_again_when_resized(qtbot):
    live = LiveText(lines=1, max_lines=3)
    panel = _panel(qtbot, live)
    line = live.fontMetrics().lineSpacing()
    live.setText("short")
    assert live.lines == 1
    live.setText("word " * 40)  # two or three lines at this width: it grows, once
    grown = live.lines
    assert grown > 1 and live.height() >= grown * line
    qtbot.wait(20)
    requests = _LayoutRequests()
    panel.installEventFilter(requests)
    for step in range(10):  # same length, new numbers: no growth, no layout
        live.setText(f"{step} " + "word " * 39)
        qtbot.wait(1)
    panel.removeEventFilter(requests)
    assert requests.count == 0 and live.lines == grown
    live.setText("short")
    assert live.lines == grown  # no shrinking while the text streams in…
    panel.resize(panel.width() + 40, panel.height())
    qtbot.waitUntil(lambda: live.lines == 1, timeout=1000)  # …only when its width changes
