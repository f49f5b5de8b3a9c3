"""The scheduling step's modules compiled to C by mypyc, loaded in place of their sources.

A scheduler step is per-block and per-request bookkeeping in plain Python; its cost is the
interpreter's, spread over these modules (no single function dominates a profile). mypyc
compiles them, unchanged, from their type annotations: the v1 scheduler benchmark takes
about 0.7x the time. ``make`` builds them into ``build/compiled-core/``
(``scripts/build_compiled_core.py``), beside the sources, which stay the reference.

They are loaded only when every source is byte for byte the one compiled, for this
Python; otherwise the sources run and :data:`status` says why. An edited source is never
shadowed by a stale build, and the modules load all or none: compiled code reaches the
classes of the others in the group directly. ``PAGESIM_PURE_PYTHON=1`` runs the sources
(a profiler sees into them; compiled code gives it no Python frames).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# In dependency order; the modules one step of either scheduler spends its time in.
COMPILED_MODULES = ("sequence", "blocks", "prefix_cache", "block_manager", "registry", "scheduler_v1")
GROUP = "pagesim_core"  # mypyc's shared library of the group: pagesim_core__mypyc
PURE_PYTHON_ENV = "PAGESIM_PURE_PYTHON"
MANIFEST = "manifest.json"
SOURCE_DIR = Path(__file__).resolve().parent
LIB_DIR = SOURCE_DIR.parent / "build" / "compiled-core" / "lib"


@dataclass(frozen=True)
class CompiledCoreStatus:
    active: bool
    reason: str | None = None  # why the sources run instead, when they do

    def describe(self) -> str:
        return "compiled (mypyc)" if self.active else f"pure Python ({self.reason})"


status = CompiledCoreStatus(False, "not loaded yet")


def source_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def extension_suffix() -> str:
    return sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def manifest_for(source_dir: Path = SOURCE_DIR) -> dict:
    """What a build of the current sources records: this Python's extension suffix and
    each compiled module's source digest."""
    return {
        "extension_suffix": extension_suffix(),
        "group": GROUP,
        "sources": {name: source_digest(source_dir / f"{name}.py") for name in COMPILED_MODULES},
    }


def why_not_compiled(lib_dir: Path = LIB_DIR, source_dir: Path = SOURCE_DIR) -> str | None:
    """Why the compiled modules in ``lib_dir`` must not stand in for the sources in
    ``source_dir``, or None when they may."""
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return f"{PURE_PYTHON_ENV} is set"
    try:
        built = json.loads((lib_dir / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "not built; make builds it"
    except (OSError, ValueError) as exc:
        return f"its manifest is unreadable ({exc}); make rebuilds it"
    suffix = extension_suffix()
    if built.get("extension_suffix") != suffix:
        return f"built for another Python ({built.get('extension_suffix')}, this one takes {suffix}); make rebuilds it"
    digests = built.get("sources", {})
    for name in COMPILED_MODULES:
        if digests.get(name) != source_digest(source_dir / f"{name}.py"):
            return f"core/{name}.py changed since it was compiled; make rebuilds it"
    missing = [f for f in (*COMPILED_MODULES, f"{GROUP}__mypyc") if not (lib_dir / f"{f}{suffix}").is_file()]
    if missing:
        return f"{missing[0]}{suffix} is missing from {lib_dir}; make rebuilds it"
    return None


def load(package_path: list[str], lib_dir: Path = LIB_DIR) -> CompiledCoreStatus:
    """Put the compiled modules ahead of the sources on ``package_path`` (the core package's
    ``__path__``, before any of them is imported) when :func:`why_not_compiled` allows."""
    global status
    reason = why_not_compiled(lib_dir)
    if reason is None:
        # The group's shared library is imported by name from each module's stub: it is
        # loaded here, under that name, rather than put on sys.path.
        name = f"{GROUP}__mypyc"
        spec = importlib.util.spec_from_file_location(name, lib_dir / f"{name}{extension_suffix()}")
        if spec is None or spec.loader is None:
            reason = f"{name} cannot be loaded from {lib_dir}"
        else:
            try:
                group = importlib.util.module_from_spec(spec)
                sys.modules[name] = group
                spec.loader.exec_module(group)
            except (ImportError, OSError) as exc:  # (a library this system cannot link, say)
                sys.modules.pop(name, None)
                reason = f"{name} failed to load: {exc}"
            else:
                package_path.insert(0, str(lib_dir))
    status = CompiledCoreStatus(reason is None, reason)
    return status
