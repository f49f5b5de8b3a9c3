"""Sequence → Add on a real model: a prompt typed as text (or as a chat user message) and
how the model should pick its next tokens. The worker encodes the text with the model's
tokenizer (``core.token_text.prompt_ids``); this dialog only collects what was typed."""

from __future__ import annotations

from pagesim.core.sampling import SamplingParams
from PySide6.QtWidgets import (
    QCheckBox,
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


class AddPromptDialog(QDialog):
    def __init__(self, seq: str, parent=None) -> None:
        super().__init__(parent)
        self.seq = seq
        self.setWindowTitle(f"Add {seq}")
        self.prompt = QPlainTextEdit(DEFAULT_PROMPT)
        self.prompt.setTabChangesFocus(True)  # Tab moves on to the next field
        self.prompt.setToolTip("The prompt, as plain text: the model's tokenizer turns it into token ids")
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
        self.temperature.valueChanged.connect(lambda t: self.seed.setEnabled(t > 0))
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(0, 100_000)
        self.max_tokens.setSpecialValueText(NO_LIMIT)
        self.max_tokens.setToolTip(
            "The sequence finishes after this many generated tokens (or at the end-of-sequence token)"
        )
        form = QFormLayout()
        form.addRow("Prompt", self.prompt)
        form.addRow("", self.as_chat)
        form.addRow("Temperature", self.temperature)
        form.addRow("Seed", self.seed)
        form.addRow("Max tokens", self.max_tokens)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Add")
        buttons.button(QDialogButtonBox.StandardButton.Ok).setToolTip("Add the sequence: its prompt is written")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.buttons = buttons
        hint = QLabel("Then Grow (G) writes the model's next tokens one by one.")
        hint.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(hint)
        layout.addWidget(buttons)
        for first, second in zip(
            (self.prompt, self.as_chat, self.temperature, self.seed),
            (self.as_chat, self.temperature, self.seed, self.max_tokens),
            strict=True,
        ):
            QDialog.setTabOrder(first, second)
        self.prompt.setFocus()
        self.prompt.selectAll()

    @property
    def text(self) -> str:
        return self.prompt.toPlainText()

    def sampling(self) -> SamplingParams | None:
        """None when greedy with no limit (as a scenario's plain ``add``)."""
        temperature, limit = self.temperature.value(), self.max_tokens.value() or None
        if temperature == 0 and limit is None:
            return None
        return SamplingParams(temperature=temperature, seed=self.seed.value(), max_tokens=limit)
