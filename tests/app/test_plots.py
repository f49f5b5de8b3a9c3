"""The plots' titles and vertical axis labels, set through pyqtgraph's public API and Qt's
layout API. What they rely on of PlotItem (the title's cell above the view box, LabelItem
setting its minimum size in ``updateMin``, an axis label's font and rich text) is checked
here, so that a pyqtgraph release that changes it fails a test rather than a picture."""

import pyqtgraph as pg
import pytest
from pagesim.app.gui.palette import THEMES
from pagesim.app.gui.views.plots import MemoryPanel, Plot, _label_length, _style_plot, add_plot, set_side_label
from PySide6.QtCore import Qt

LONG_TITLE = "Scores · running max m (red, ▲ rescale) · sum ℓ (right), and then some more words"


def shown(qtbot, view, width, height):
    view.resize(width, height)
    view.show()
    qtbot.waitExposed(view)
    qtbot.wait(20)


def test_a_long_title_sits_above_the_view_box_and_does_not_widen_the_plot(qtbot):
    view = pg.GraphicsLayoutWidget()
    qtbot.addWidget(view)
    plot = add_plot(view, 0, 0)
    _style_plot(plot, THEMES["dark"], LONG_TITLE, "value", "token")
    shown(qtbot, view, 220, 150)
    box, title = plot.getViewBox().geometry(), plot.title_item.geometry()
    assert plot.title_item.isVisible() and title.height() == Plot.TITLE_HEIGHT
    assert (title.left(), title.width()) == (box.left(), box.width())  # centred over the view box
    assert title.bottom() <= box.top()
    # The text is wider than the plot, yet sets no minimum: the plot stays inside its widget.
    assert plot.title_item.itemRect().width() > box.width()
    assert plot.effectiveSizeHint(Qt.SizeHint.MinimumSize).width() < 100
    assert plot.geometry().right() <= view.width()
    # No title: no title row.
    plot.setTitle(None)
    qtbot.waitUntil(lambda: plot.getViewBox().geometry().top() < box.top())
    assert not plot.title_item.isVisible()


def test_the_plot_in_a_plot_widget_keeps_inside_it(qtbot):
    view = pg.PlotWidget(plotItem=Plot())
    qtbot.addWidget(view)
    plot = view.getPlotItem()
    plot.showAxis("right")
    _style_plot(plot, THEMES["light"], LONG_TITLE, "q·k·scale", "token")
    shown(qtbot, view, 240, 200)
    assert plot.geometry().width() <= view.width() + 0.5
    assert plot.getAxis("right").geometry().right() <= view.width() + 0.5


@pytest.mark.parametrize(("height", "expected"), [(500, "lane (warp, group)"), (100, "lane"), (45, "")])
def test_a_side_label_is_measured_as_its_axis_draws_it_and_cut_to_what_fits(qtbot, height, expected):
    view = pg.PlotWidget(plotItem=Plot())
    qtbot.addWidget(view)
    plot = view.getPlotItem()
    text, colour = "lane (warp, group)", "#8a8a8a"
    set_side_label(plot, "left", text, colour)
    shown(qtbot, view, 300, height)
    axis = plot.getAxis("left")
    assert axis.toolTip() == text
    shown_text = plot.shown_side_labels["left"]
    assert shown_text == expected  # the whole text, else the part before "(", else none
    assert axis.labelText == shown_text and axis.label.isVisible() == bool(shown_text)
    if shown_text:
        # The probe measures what the axis draws: same rich text, same font.
        assert axis.label.boundingRect().width() == pytest.approx(_label_length(shown_text, colour))
        assert axis.label.boundingRect().width() <= plot.getViewBox().height() + 0.5


def test_the_blocks_plot_on_a_short_axis_still_says_it_is_logarithmic(qtbot):
    # (cut to the part before "(", "blocks (log)" read "blocks" beside ticks 1, 10, 100)
    view = pg.PlotWidget(plotItem=Plot())
    qtbot.addWidget(view)
    plot = view.getPlotItem()
    set_side_label(plot, "left", "blocks (log)", "#8a8a8a", short="log")
    shown(qtbot, view, 300, 70)
    assert plot.shown_side_labels["left"] == "log"
    shown(qtbot, view, 300, 300)
    assert plot.shown_side_labels["left"] == "blocks (log)"
    panel = MemoryPanel(THEMES["dark"])
    qtbot.addWidget(panel)
    assert panel.blocks_plot.side_labels["left"][0] == ("blocks (log)", "log")


def test_a_title_too_wide_for_its_plot_gives_way_to_a_shorter_one(qtbot):
    # (centred, the walk-through's title was cut at both ends in a narrow dock: "ores · running max m")
    from pagesim.app.gui.views.walkthrough import WALK_TITLES

    view = pg.PlotWidget(plotItem=Plot())
    qtbot.addWidget(view)
    plot = view.getPlotItem()
    plot.set_fitting_title(WALK_TITLES, size="9pt")
    shown(qtbot, view, 280, 200)
    assert plot.title_item.text in WALK_TITLES[1:]
    assert plot.title_item.item.boundingRect().width() <= plot.width()
    shown(qtbot, view, 700, 200)
    assert plot.title_item.text == WALK_TITLES[0]


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_a_plot_titles_coloured_keys_read_as_text_on_its_background(qtbot, theme):
    # (the curves' orange and sky blue keys were pale on the light theme's white)
    import re

    from pagesim.app.gui.palette import TEXT_CONTRAST, contrast
    from PySide6.QtGui import QColor

    panel = MemoryPanel(THEMES[theme])
    qtbot.addWidget(panel)
    background = QColor(THEMES[theme].plot_background)
    for plot in (panel.blocks_plot, panel.util_plot):
        colours = re.findall(r"color:\s*(#[0-9A-Fa-f]{6})", plot.title_item.text)
        assert len(colours) >= 2, plot.title_item.text
        for colour in colours:
            assert contrast(QColor(colour), background) >= TEXT_CONTRAST, (theme, colour)
