"""The selected sequence as text: its prompt, then what the model wrote, each block's run of
text tinted as its physical block is in the pool, a mark where each block starts.

Only a real model's tokens have text; on the synthetic model (hashed ids) its tab hides.
"""

from __future__ import annotations

from html import escape

from pagesim.app.gui.palette import Theme
from pagesim.app.gui.views.live_text import LiveText
from pagesim.core.token_text import divergence, visible
from pagesim.core.view_model import Frame, SequenceState
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QSizePolicy, QTabWidget, QTextBrowser, QVBoxLayout, QWidget

MAX_PARTINGS = 2  # sequences named in the parting note (the most blocks shared first)
BLOCK_MARK = "▏"  # starts each block's run: "▏#5"
TINT = 0.35  # how much of the block's colour shows behind its text
TIP = (
    "The selected sequence's text: the prompt, then (bold) what the model wrote. Each run after a "
    f"{BLOCK_MARK}#n mark is the tokens of physical block n, tinted like that block in the pool (↵: a newline token); "
    "a block shared with another sequence is underlined and its mark says how many hold it (×2: ref count 2)"
)


def _mix(colour: QColor, background: QColor, amount: float) -> str:
    """``colour`` laid over ``background`` at ``amount`` opacity, as #rrggbb for rich text."""
    mixed = QColor.fromRgbF(
        *(c * amount + b * (1 - amount) for c, b in zip(colour.getRgbF()[:3], background.getRgbF()[:3], strict=True))
    )
    return mixed.name()


class SequenceText(QWidget):
    def __init__(self, colours, theme: Theme, parent=None) -> None:
        super().__init__(parent)
        self.colours, self.theme = colours, theme
        self.caption = LiveText(lines=1, max_lines=2)  # changes every step: repainted, not re-laid out
        self.caption.setText("Text")
        self.caption.setToolTip(TIP)
        # Where the selected sequence parts from those it shares blocks with (a fork, beams,
        # a cached prefix): the shared blocks, then the first token whose text differs.
        self.parting = LiveText(lines=1, max_lines=3)
        self.parting.setToolTip(
            "Sequences that hold the same physical blocks at the start of their tables (a fork, parallel samples, "
            "beams, a cached prompt) share those blocks' K/V. The first token one of them writes into a shared "
            "block gets it its own copy (copy-on-write); from the first token whose text differs, the two "
            "continuations are each their own"
        )
        self.parting.setVisible(False)
        self.browser = QTextBrowser()
        self.browser.setToolTip(TIP)
        self.browser.setOpenLinks(False)
        self.browser.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Expanding)
        self.browser.setMinimumHeight(48)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.caption)
        layout.addWidget(self.parting)
        layout.addWidget(self.browser, 1)
        self._frame: Frame | None = None
        self._selection = None
        self._shown: tuple | None = None  # what the browser shows: redrawn only when it changes
        self.tabs: QTabWidget | None = None  # the tabs it shares with the token map

    def bind(self, controller, selection) -> None:
        self._selection = selection
        controller.frameChanged.connect(self.show_frame)
        controller.tokenStreamed.connect(self.stream)

    def stream(self, seq_id: str, piece: str, count: int) -> None:
        """A token the model just wrote, while its grow goes on: appended to the selected
        sequence's text at once (the step's frame then draws it in its block)."""
        if self._selection is None or seq_id != self._selection.current or self._shown is None:
            return
        self._shown = ("streaming", seq_id, count)  # the next frame redraws the whole text
        cursor = self.browser.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        text = escape(piece).replace("\n", "↵<br>")
        cursor.insertHtml(f'<b style="color:{self.theme.highlight}">{text}</b>')
        self.browser.setTextCursor(cursor)
        self.browser.ensureCursorVisible()
        self.caption.setText(f"Text of {escape(seq_id)}: writing… <b>{count} tokens</b>")

    def show_frame(self, frame: Frame) -> None:
        self._frame = frame
        index = self.tabs.indexOf(self) if self.tabs is not None else -1
        if index >= 0 and self.tabs.isTabVisible(index) != frame.has_text:
            self.tabs.setTabVisible(index, frame.has_text)
        if frame.has_text:
            self.refresh()

    def set_theme(self, theme: Theme) -> None:
        self.theme, self._shown = theme, None
        self.refresh()

    def refresh(self) -> None:
        """Show the selected sequence of the newest frame (again after a new selection)."""
        frame = self._frame
        if frame is None or not frame.has_text or self._selection is None:
            return
        state = frame.sequence(self._selection.current) if self._selection.current else None
        if state is None or state.pieces is None:
            self._show(("none",), "Text: select a sequence", "")
            self.parting.setVisible(False)  # (it spoke of the sequence shown before, maybe another scenario's)
            return
        shared = tuple(int(frame.ref_counts[b]) for b in state.block_table)
        owners = tuple(frame.holders.get(b, ((state.seq_id, 0),))[0][0] for b in state.block_table)
        key = (state, shared, owners, frame.config.block_size, self.theme.name)
        if state.num_tokens < state.prompt_len:  # a chunked prefill under way
            caption = (
                f"Text of {escape(state.seq_id)}: {state.num_tokens} of its {state.prompt_len} prompt tokens so far"
            )
        else:
            written = state.num_tokens - state.prompt_len
            caption = f"Text of {escape(state.seq_id)}: {state.prompt_len}-token prompt + <b>{written} written</b>"
        self._show(key, caption, self._html(state, frame.config.block_size, shared, owners))
        self._show_parting(frame, state)

    def _show_parting(self, frame: Frame, state: SequenceState) -> None:
        partings = []
        for other in frame.sequences:
            if other.seq_id == state.seq_id or other.pieces is None:
                continue
            parted = divergence(
                state.seq_id, state.pieces, state.block_table, other.seq_id, other.pieces, other.block_table
            )
            if parted is not None:
                partings.append(parted)
        partings.sort(key=lambda p: -p.shared_blocks)
        lines = []
        for parted in partings[:MAX_PARTINGS]:
            blocks = f"{parted.shared_blocks} block" + ("s" if parted.shared_blocks > 1 else "")
            other = escape(parted.other)
            line = f"Shares its first {blocks} with <b>{other}</b>"
            if parted.first_difference is None:
                theirs = len(frame.sequence(parted.other).pieces)
                if theirs == state.num_tokens:
                    line += ", the same text so far"
                elif theirs < state.num_tokens:
                    line += f"; {other}'s {theirs} tokens begin its text"
                else:
                    line += f"; its text begins {other}'s"
            else:
                mine, theirs = (escape(visible(t)) for t in (parted.own_text, parted.other_text))
                line += (
                    f"; parts at token {parted.first_difference}: {escape(state.seq_id)} “{mine}…” · "
                    f"{escape(parted.other)} “{theirs}…”"
                )
            lines.append(line)
        if len(partings) > MAX_PARTINGS:
            lines.append(f"… and {len(partings) - MAX_PARTINGS} more")
        self.parting.setVisible(bool(lines))
        if lines:
            self.parting.setText("<br>".join(lines))

    def _show(self, key: tuple, caption: str, html: str) -> None:
        if key == self._shown:
            return
        # Follow the writing (a chat template's prompt fills the view: the continuation was
        # below it), unless the reader scrolled up in this same sequence's text.
        bar = self.browser.verticalScrollBar()
        shown_seq = _seq_of(self._shown)
        follow = shown_seq is None or shown_seq != _seq_of(key) or bar.value() >= bar.maximum() - 4
        self._shown = key
        self.caption.setText(caption)
        self.browser.setHtml(html)
        if follow:
            bar.setValue(bar.maximum())

    def _html(self, state: SequenceState, block_size: int, ref_counts, owners) -> str:
        background = QColor(self.theme.window)
        runs = []
        for logical, block in enumerate(state.block_table):
            start = logical * block_size
            colour = QColor(self.colours(owners[logical]))
            if logical % 2:
                colour = colour.darker(140)
            tint = _mix(colour, background, TINT)
            is_shared = ref_counts[logical] > 1
            mark = f"{BLOCK_MARK}#{block}" + (f"×{ref_counts[logical]}" if is_shared else "")
            runs.append(f'<span style="color:{self.theme.muted}; font-size:small">{escape(mark)}</span>')
            style = f"background-color:{tint};" + (" text-decoration:underline;" if is_shared else "")
            text = ""
            for t in range(start, min(start + block_size, state.num_tokens)):
                piece = escape(state.pieces[t])
                text += f"<b>{piece}</b>" if t >= state.prompt_len else piece
            runs.append(f'<span style="{style}">{text}</span>')
        body = "".join(runs).replace("\n", "↵<br>")  # the newline is a token too: shown where it is
        return f'<div style="white-space:pre-wrap; color:{self.theme.text}">{body}</div>'

    def plain_text(self) -> str:
        return self.browser.toPlainText()


def _seq_of(key: tuple | None) -> str | None:
    """The sequence a shown key is of: (state, …), ("streaming", seq, count), ("none",) or None."""
    if not key or key[0] == "none":
        return None
    return key[1] if key[0] == "streaming" else key[0].seq_id


class TokensAndText(QTabWidget):
    """The token map (its caption above it) and, on a real model, the text view: two tabs
    under the sequences, so the sequence table keeps its height in a small window."""

    def __init__(self, token_caption: QWidget, token_scroll: QWidget, text_view: SequenceText, parent=None) -> None:
        super().__init__(parent)
        self.setDocumentMode(True)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Expanding)
        tokens = QWidget()
        layout = QVBoxLayout(tokens)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(token_caption)
        layout.addWidget(token_scroll, 1)
        self.addTab(tokens, "Tokens")
        self.setTabToolTip(0, "The selected sequence token by token: where each token's K/V lives")
        self.addTab(text_view, "Text")
        self.setTabToolTip(1, "The selected sequence as text, each block's run tinted like its block (a real model's)")
        self.setTabVisible(1, False)  # until a frame has text
        text_view.tabs = self
