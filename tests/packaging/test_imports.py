"""No function-level import hides an edge that an import contract (pyproject.toml) is about:
every import across its packages and layers, and of Qt, sits at the top of its module,
except the few the CLI keeps lazy on purpose (each with its reason beside it)."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# (file, module): lazy so that a command loads only what it needs (Qt, torch).
KEPT_LAZY = {
    # the pagesim command's entry: a Ctrl-C while the command line's modules load is one line.
    ("app/__init__.py", "pagesim.app.cli"),
    ("app/cli.py", "pagesim.app.benchmarks"),
    ("app/cli.py", "pagesim.app.generate"),
    ("app/cli.py", "pagesim.app.gui.main"),
    ("app/cli.py", "pagesim.app.gui.bench"),
    # attach --tokenizer: reading a model file's tokenizer loads the GGUF reader and torch.
    ("app/kv_attach.py", "pagesim.core.models.catalog"),
    # the output guard finds the bundled model's file only when a command names that model.
    ("app/cli.py", "pagesim.core.models.gguf_loader"),
}


ENGINE_LAYERS = {"engine", "scheduler", "registry", "block_manager", "model_runner"}


def _unit(dotted: str) -> str:
    """The part of pagesim an import contract in pyproject.toml names for module ``dotted``
    (``core.engine``, ``app.gui.views.plots``, ...): imports inside one unit are free."""
    parts = dotted.split(".")
    if parts[0] == "app":
        return "app.gui" if parts[1:2] == ["gui"] else ".".join(parts[:2])
    if parts[0] == "core":
        if parts[1:2] == ["studies"]:
            return "core.studies"
        return f"core.{parts[1]}" if parts[1:2] and parts[1] in ENGINE_LAYERS else "core"
    return parts[0]


def _lazy_imports(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = set(map(id, tree.body))
    for node in ast.walk(tree):
        if id(node) in top:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def test_no_lazy_import_crosses_a_contracts_boundary():
    found = set()
    for package in ("core", "kernels", "app"):
        for path in (ROOT / package).rglob("*.py"):
            source = _unit(".".join(path.relative_to(ROOT).with_suffix("").parts))
            for module in _lazy_imports(path):
                qt = module.startswith(("PySide6", "pyqtgraph", "shiboken6"))
                crossing = module.startswith("pagesim.") and _unit(module.removeprefix("pagesim.")) != source
                if qt or crossing:
                    found.add((str(path.relative_to(ROOT)), module))
    assert found == KEPT_LAZY


def test_the_occupancy_model_does_not_load_the_teaching_trace():
    code = "import sys, pagesim.kernels.occupancy; print('pagesim.kernels.trace' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_app_opens_its_window_without_waiting_for_torch_or_numba():
    """torch takes over a second to import, Numba a third of one: the command line and the
    app's window load without them (a real model, attention and sampling import torch when
    they first run; the CPU kernel imports Numba on the simulation's thread)."""
    code = "import sys, pagesim.app.cli, pagesim.app.gui.main; print('torch' in sys.modules, 'numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"
