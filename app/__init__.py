"""The pagesim desktop app (PySide6 + pyqtgraph). Views and a controller only:
it turns user actions into operations and animates the events the core returns."""
