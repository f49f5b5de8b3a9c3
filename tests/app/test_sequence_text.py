"""A real model's tokens as text in the window: the token map, a tile's tooltip, the text
view of the selected sequence, the captions, and Add with a typed prompt."""

import re

from pagesim.app.gui.views.sequence_text import BLOCK_MARK
from pagesim.core import events as ev
from pagesim.core.models.catalog import load_model
from pagesim.core.token_text import visible

from tests.app.conftest import wait_idle

STEPS = 3  # the tour's two prompts, then A's first generated token


def _at_step(qtbot, window, step):
    """The frame of ``step``, played (its events kept: the caption comes from them)."""
    window.actions.scrubber.setValue(step - 1)
    wait_idle(qtbot, window, timeout=60_000)
    window.controller.forward()
    return wait_idle(qtbot, window, timeout=60_000)


def test_a_real_models_tokens_show_their_text_in_the_map_the_pool_the_text_view_and_the_caption(make_window, qtbot):
    window = make_window("default", real=True)
    frame = _at_step(qtbot, window, STEPS)
    assert frame.has_text
    window.select_sequence("A")
    state = frame.sequence("A")
    assert state.pieces[:2] == ("The", " capital")  # the tour's first prompt
    # The token map draws each token's text, whitespace made visible.
    token_map = window.token_map
    assert token_map.pieces == state.pieces
    assert token_map.token_text(1) == "·capital"
    assert '" capital"' in token_map.describe(1)
    # A tile's tooltip lists the text in each of its slots.
    block = state.block_table[0]
    tip = window.pool_view.items[block].toolTip()
    assert 'slot 1: " capital"' in tip and 'slot 0: "The"' in tip
    # The text view: the sequence's text, a mark per block, what was written in bold.
    text_view = window.sequence_text
    tabs = window.tokens_and_text
    assert tabs.isTabVisible(tabs.indexOf(text_view))
    tabs.setCurrentWidget(text_view)
    assert text_view.isVisible()
    plain = text_view.plain_text()
    assert plain.count(BLOCK_MARK) == len(state.block_table)
    assert re.sub(BLOCK_MARK + r"#\d+(×\d+)?", "", plain).replace("↵\n", "\n") == "".join(state.pieces)
    assert "<b>" in text_view.browser.toHtml() or "font-weight" in text_view.browser.toHtml()
    # The caption says what was written, in words.
    written = [e for e in frame.events if isinstance(e, ev.TokenWritten) and e.seq == "A"]
    assert written
    said = "".join(state.pieces[e.position] for e in written)
    assert f'A wrote the K/V of "{said}" into block {written[0].block}, slot {written[0].slot}' in frame.caption
    assert visible(said) == token_map.token_text(written[0].position)


def test_the_text_view_hides_on_the_synthetic_model(make_window, qtbot):
    window = make_window("default")
    frame = _at_step(qtbot, window, 3)
    assert not frame.has_text and all(s.pieces is None for s in frame.sequences)
    assert not window.tokens_and_text.isTabVisible(window.tokens_and_text.indexOf(window.sequence_text))
    assert window.token_map.token_text(0) is None
    assert window.actions.prompt_spin_action.isVisible()


def test_add_with_a_typed_prompt_adds_a_sequence_whose_tokens_decode_to_it(make_window, qtbot):
    window = make_window("default", real=True)
    before = wait_idle(qtbot, window, timeout=60_000)
    assert not window.actions.prompt_spin_action.isVisible()  # a real model: Add asks for text
    window.add_sequence()
    dialog = window.add_dialog
    assert dialog.isVisible() and dialog.prompt.toolTip() and dialog.as_chat.toolTip()
    dialog.prompt.setPlainText("Paged memory is like a library")
    dialog.temperature.setValue(0.7)
    dialog.seed.setValue(3)
    dialog.max_tokens.setValue(5)
    dialog.buttons.button(dialog.buttons.StandardButton.Ok).click()
    qtbot.waitUntil(lambda: window.frame.position != before.position or window.last_error, timeout=60_000)
    assert window.last_error is None
    frame = wait_idle(qtbot, window, timeout=60_000)
    added = frame.operations[frame.position - 1]
    assert added.seq == dialog.seq and added.sampling.temperature == 0.7 and added.sampling.max_tokens == 5
    tokenizer = load_model("smollm2-135m").tokenizer
    assert tokenizer.decode(added.prompt, skip_special=True) == "Paged memory is like a library"
    assert "".join(frame.sequence(dialog.seq).pieces) == "Paged memory is like a library"
    assert window.selected_seq == dialog.seq


def test_the_text_view_follows_the_writing_unless_the_reader_scrolled_up(make_window, qtbot):
    """A chat template's prompt fills the view: the continuation, below it, is what a step
    changes, so the view shows the end; a reader who scrolled up in the same text stays."""
    window = make_window("parallel_sampling", real=True)
    window.resize(1024, 700)
    window.actions.scrubber.setValue(8)
    wait_idle(qtbot, window, timeout=60_000)
    window.tokens_and_text.setCurrentWidget(window.sequence_text)
    window.select_sequence("chat/s1")
    bar = window.sequence_text.browser.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(), timeout=5000)
    bar.setValue(0)  # the reader goes up to the prompt
    window.controller.forward()
    wait_idle(qtbot, window, timeout=60_000)
    assert bar.value() == 0
    bar.setValue(bar.maximum())  # back at the end: the next step's words come into view
    window.controller.forward()
    wait_idle(qtbot, window, timeout=60_000)
    qtbot.waitUntil(lambda: bar.value() == bar.maximum(), timeout=5000)


def test_the_token_map_scrolls_to_every_token_and_keeps_a_block_to_a_row(make_window, qtbot):
    """At the app's default size the newest tokens were cut off (no scroll bar), and a row of
    7 text cells never lined up with blocks of 8."""
    window = make_window("prefix_caching_v1", real=True)
    window.resize(1400, 860)
    _at_step(qtbot, window, 5)
    window.select_sequence("chat1")
    window.controller.forward()  # chat1 decodes a token
    wait_idle(qtbot, window, timeout=60_000)
    token_map = window.token_map
    size, count = window.frame.config.block_size, token_map.num_tokens
    assert token_map._columns() % size == 0  # whole blocks to a row
    assert token_map.height() >= token_map.heightForWidth(token_map.width())  # room for every token
    area = token_map.parentWidget().parentWidget()
    qtbot.waitUntil(lambda: area.verticalScrollBar().value() > 0 or area.verticalScrollBar().maximum() == 0)
    row = (count - 1) // token_map._columns()
    top = row * token_map.cell[1] - area.verticalScrollBar().value()
    assert 0 <= top < area.viewport().height()  # the newest token is in view


def test_a_block_wider_than_the_token_map_is_split_into_equal_rows(qtbot):
    """Blocks of 16 text cells on a narrow map were cut after 12: a block began mid-row."""
    from pagesim.app.gui.palette import THEMES
    from pagesim.app.gui.views.token_map import TokenMap

    token_map = TokenMap(next(iter(THEMES.values())))
    qtbot.addWidget(token_map)
    token_map.show_sequence("doc", [3, 5], 20, 16, pieces=tuple("x" * 20))
    for width in (380, 300, 200, 90):
        columns = token_map._columns(width)
        assert 16 % columns == 0 and columns * token_map.cell_at(width)[0] <= width
    assert token_map._columns(380) == 8
