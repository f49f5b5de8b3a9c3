"""pagesim's cache folder on the user's machine: dequantised models, compiled CUDA modules."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "PAGESIM_CACHE_DIR"


def cache_root() -> Path:
    """``$PAGESIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/pagesim``, else ``~/.cache/pagesim``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pagesim"
