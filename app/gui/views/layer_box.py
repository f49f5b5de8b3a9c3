"""The layer menu of a real model's views (the Check panel, the walk-through): the step's
worst layer by default, or any one layer; hidden for the synthetic model, which attends once."""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox


class LayerBox(QComboBox):
    WORST = "worst layer"

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setToolTip(
            "Which layer's attention to show. Every step checks all layers' paged attention against dense "
            "attention; by default the one with the least margin to its rounding bound (the worst). "
            "Layers differ: early ones spread attention over the context, later ones peak on a few tokens "
            "and on the first (an attention sink)"
        )
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.setVisible(False)
        self._num_layers = 1

    def layer(self) -> int | None:
        """The chosen layer (None: the step's worst)."""
        return self.currentData()

    def set_layers(self, num_layers: int, worst: int | None) -> None:
        """Follow a frame: the model's layer count (items rebuilt only when it changes) and
        the step's worst layer, written into the first item."""
        if num_layers != self._num_layers:
            self._num_layers = num_layers
            chosen = self.layer()
            self.blockSignals(True)
            self.clear()
            self.addItem(self.WORST, None)
            for layer in range(num_layers):
                self.addItem(f"layer {layer}", layer)
            self.blockSignals(False)
            self.setVisible(num_layers > 1)
            if chosen is not None:  # back to the worst: the views that asked for a layer follow
                self.currentIndexChanged.emit(0)
        if num_layers > 1:
            text = self.WORST if worst is None else f"worst: layer {worst}"
            if self.itemText(0) != text:
                self.setItemText(0, text)
