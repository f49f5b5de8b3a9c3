"""What the study panels share: combo boxes of core's model-shape and GPU presets (each
entry shows the preset's own name, keeps its key, what core looks it up by, as item data,
and says where its figures come from in its tooltip), and their read-only result tables."""

from __future__ import annotations

from pagesim.core.studies.serving_time import GIB, GPUS, MODEL_SHAPES
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QComboBox, QHeaderView, QTableWidget, QTableWidgetItem


def _fill(box: QComboBox, entries: dict[str, tuple[str, str]], default: str) -> QComboBox:
    for key, (text, tip) in entries.items():
        box.addItem(text, key)
        box.setItemData(box.count() - 1, tip, Qt.ItemDataRole.ToolTipRole)
    box.setCurrentIndex(max(0, box.findData(default)))
    return box


def model_shape_box(default: str, tooltip: str) -> QComboBox:
    entries = {
        key: (shape.name, f"{shape.name}: {shape.params / 1e9:.1f} B parameters, {shape.source}")
        for key, shape in MODEL_SHAPES.items()
    }
    box = _fill(QComboBox(), entries, default)
    box.setToolTip(tooltip)
    return box


def gpu_box(default: str, tooltip: str) -> QComboBox:
    entries = {
        key: (spec.name, f"{spec.name}: {spec.memory_bytes / GIB:.0f} GiB, {spec.source}") for key, spec in GPUS.items()
    }
    box = _fill(QComboBox(), entries, default)
    box.setToolTip(tooltip)
    return box


def result_table(columns: list[tuple[str, str]] | tuple[tuple[str, str], ...], tooltip: str) -> QTableWidget:
    """A read-only table of whole rows, one line a row, its columns as wide as their contents;
    ``columns``: (header, what it means) each."""
    table = QTableWidget(0, len(columns))
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.verticalHeader().setVisible(False)
    for column, (name, tip) in enumerate(columns):
        item = QTableWidgetItem(name)
        item.setToolTip(tip)
        table.setHorizontalHeaderItem(column, item)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    table.verticalHeader().setDefaultSectionSize(table.fontMetrics().height() + 6)
    table.setToolTip(tooltip)
    return table
