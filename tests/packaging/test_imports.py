"""No function-level import hides an edge between pagesim's packages from the import
contracts' readers: every import of pagesim or Qt sits at the top of its module, except
the few the CLI keeps lazy on purpose (each with its reason beside it)."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# (file, module): lazy so that a command loads only what it needs (Qt, torch).
KEPT_LAZY = {
    ("app/cli.py", "pagesim.app.benchmarks"),
    ("app/cli.py", "pagesim.app.gui.main"),
    ("app/cli.py", "pagesim.app.gui.bench"),
}


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


def test_no_lazy_import_crosses_pagesims_packages():
    found = set()
    for package in ("core", "kernels", "app"):
        for path in (ROOT / package).rglob("*.py"):
            for module in _lazy_imports(path):
                if module.startswith(("pagesim.", "PySide6", "pyqtgraph")):
                    found.add((str(path.relative_to(ROOT)), module))
    assert found == KEPT_LAZY


def test_the_occupancy_model_does_not_load_the_teaching_trace():
    code = "import sys, pagesim.kernels.occupancy; print('pagesim.kernels.trace' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
