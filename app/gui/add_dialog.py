"""Sequence → Add on a real model: a prompt typed as text (or as a chat user message), how
the model should pick its next tokens, and whether it is a sequence the user grows or a
request the scheduler runs (n parallel samples, or a beam search). The worker encodes the
text with the model's tokenizer (``core.token_text.prompt_ids``); this dialog only collects
what was typed."""

from __future__ import annotations

import itertools

from pagesim.core.sampling import SamplingParams
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
)

DEFAULT_PROMPT = "The capital of France is"
NO_LIMIT = "no limit"
AS_SEQUENCE, AS_REQUEST = "sequence", "request"
HINTS = {
    AS_SEQUENCE: "Then Grow (G) writes the model's next tokens one by one.",
    AS_REQUEST: "The request waits in the scheduler's queue: Schedule (S) runs one step of the scheduler "
    "(admission and prefill, then one token per running sequence).",
}


SAME_SAMPLES = (
    "Samples at temperature 0 (greedy) would all be the same text: raise the temperature for n > 1, or take one sample"
)


class AddPromptDialog(QDialog):
    def __init__(self, seq: str, parent=None, as_request: bool = False) -> None:
        """``as_request``: offer a request first (the scenario runs a scheduler)."""
        super().__init__(parent)
        self.seq = seq
        self.setWindowTitle(f"Add {seq}")
        self.prompt = QPlainTextEdit(DEFAULT_PROMPT)
        self.prompt.setTabChangesFocus(True)  # Tab moves on to the next field
        self.prompt.installEventFilter(self)  # Enter adds, Shift+Enter breaks the line
        self.prompt.setToolTip(
            "The prompt, as plain text: the model's tokenizer turns it into token ids. "
            "Enter adds it; Shift+Enter starts a new line"
        )
        self.prompt.setMinimumWidth(360)
        self.prompt.setFixedHeight(self.fontMetrics().lineSpacing() * 5)
        self.as_chat = QCheckBox("as a chat user message")
        self.as_chat.setToolTip(
            "Wrap the text in the model's chat template (its system prompt, your message as the user's "
            "turn, then the assistant's turn begins): the reply is an answer, not a continuation"
        )
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.1)
        self.temperature.setDecimals(2)
        self.temperature.setSpecialValueText("0 (greedy)")
        self.temperature.setToolTip("0: always the most likely token (greedy); higher: more varied draws")
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.seed.setToolTip("The draws' seed (with a temperature above 0): the same seed writes the same text")
        self.seed.setEnabled(False)  # greedy picks need no seed
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(0, 100_000)
        self.max_tokens.setSpecialValueText(NO_LIMIT)
        self.max_tokens.setToolTip(
            "The sequence finishes after this many generated tokens (or at the end-of-sequence token)"
        )
        self.kind = QComboBox()
        self.kind.addItem("a sequence you grow", AS_SEQUENCE)
        self.kind.addItem("a request for the scheduler", AS_REQUEST)
        self.kind.setCurrentIndex(self.kind.findData(AS_REQUEST if as_request else AS_SEQUENCE))
        self.kind.setToolTip(
            "A sequence: Grow writes its tokens when you ask. A request: the scheduler admits it, prefills its "
            "prompt and decodes it step by step (Schedule), as n parallel samples or a beam search"
        )
        self.samples = QSpinBox()
        self.samples.setRange(1, 8)
        self.samples.setToolTip(
            "Parallel samples (vLLM's n): one prompt, n continuations sharing the prompt's blocks until each "
            "writes its own token (copy-on-write). With temperature 0 they are all the same"
        )
        self.beam_width = QSpinBox()
        self.beam_width.setRange(0, 8)
        self.beam_width.setSpecialValueText("off")
        self.beam_width.setToolTip(
            "Beam search: keep the width most likely continuations by cumulative log-probability; beams fork "
            "and are dropped each step (greedy scoring: no temperature, no n)"
        )
        self.output_len = QSpinBox()
        self.output_len.setRange(1, 4096)
        self.output_len.setValue(16)
        self.output_len.setToolTip("Tokens the request generates (it finishes earlier at the end-of-sequence token)")
        self.beam_width.valueChanged.connect(lambda _: self._follow_choices())
        self.temperature.valueChanged.connect(lambda _: self._follow_choices())
        self.samples.valueChanged.connect(lambda _: self._follow_choices())
        self.kind.currentIndexChanged.connect(lambda _: self._follow_choices())
        form = QFormLayout()
        self.form = form
        form.addRow("Prompt", self.prompt)
        form.addRow("", self.as_chat)
        form.addRow("Add as", self.kind)
        form.addRow("Temperature", self.temperature)
        form.addRow("Seed", self.seed)
        form.addRow("Max tokens", self.max_tokens)
        form.addRow("Samples (n)", self.samples)
        form.addRow("Beam width", self.beam_width)
        form.addRow("Output tokens", self.output_len)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Add")
        buttons.button(QDialogButtonBox.StandardButton.Ok).setToolTip("Add the sequence: its prompt is written")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.buttons = buttons
        hint = QLabel(HINTS[AS_SEQUENCE])
        hint.setWordWrap(True)
        self.hint = hint
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(hint)
        layout.addWidget(buttons)
        order = (
            self.prompt, self.as_chat, self.kind, self.temperature, self.seed, self.max_tokens, self.samples,
            self.beam_width, self.output_len,
        )  # fmt: skip
        for first, second in itertools.pairwise(order):
            QDialog.setTabOrder(first, second)
        self._follow_choices()
        self.prompt.setFocus()
        self.prompt.selectAll()

    def eventFilter(self, watched, event) -> bool:
        if (
            watched is self.prompt
            and event.type() == QEvent.Type.KeyPress
            and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
            and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
            if ok.isEnabled():
                ok.click()
            return True  # (a newline typed by accident would become part of the prompt)
        return super().eventFilter(watched, event)

    @property
    def as_request(self) -> bool:
        return self.kind.currentData() == AS_REQUEST

    def _follow_choices(self) -> None:
        """Show the fields of the kind chosen; beams take no temperature and no n (a request
        refuses them), so choosing beams sets those aside."""
        request = self.as_request
        self.form.setRowVisible(self.max_tokens, not request)
        for field in (self.samples, self.beam_width, self.output_len):
            self.form.setRowVisible(field, request)
        beams = request and self.beam_width.value() > 0
        if beams:
            self.temperature.setValue(0.0)
            self.samples.setValue(1)
        self.temperature.setEnabled(not beams)
        self.samples.setEnabled(not beams)
        self.seed.setEnabled(not beams and self.temperature.value() > 0)
        # n greedy samples would be one text n times over (vLLM refuses them too)
        same = request and self.samples.value() > 1 and self.temperature.value() == 0
        self.hint.setText(SAME_SAMPLES if same else HINTS[self.kind.currentData()])
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        ok.setEnabled(not same)
        ok.setText("Submit" if request else "Add")
        self.adjustSize()  # rows came or went: the dialog fits them (squeezed, they overlapped)

    @property
    def text(self) -> str:
        return self.prompt.toPlainText()

    def sampling(self) -> SamplingParams | None:
        """None when greedy with no limit (as a scenario's plain ``add``); a request's length
        is its own (``output_len``), not the sampling's."""
        temperature = self.temperature.value()
        limit = None if self.as_request else self.max_tokens.value() or None
        if temperature == 0 and limit is None:
            return None
        return SamplingParams(temperature=temperature, seed=self.seed.value(), max_tokens=limit)
