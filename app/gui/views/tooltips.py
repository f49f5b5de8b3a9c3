"""Tooltips that depend on where the mouse is in a painted widget."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QPointF
from PySide6.QtWidgets import QToolTip, QWidget


def answer_tooltip(widget: QWidget, event: QEvent) -> bool:
    """Show ``widget.tooltip_at(position)`` for Qt's tooltip event (True: handled)."""
    if event.type() != QEvent.Type.ToolTip:
        return False
    QToolTip.showText(event.globalPos(), widget.tooltip_at(QPointF(event.pos())), widget)
    return True
