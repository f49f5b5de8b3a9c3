"""The scheduling step's modules compiled to C by mypyc, loaded in place of their sources.

A scheduler step is per-block and per-request bookkeeping in plain Python; its cost is the
interpreter's, spread over these modules (no single function dominates a profile). mypyc
compiles them from their type annotations: the v1 scheduler benchmark takes about 0.75x
the time. ``make`` builds them into ``build/compiled-core/``
(``scripts/build_compiled_core.py``), beside the sources, which stay the reference.

They are loaded only when every source of ``core/`` and ``kernels/`` is byte for byte the
one they were compiled against, for this Python; otherwise the sources run and
:data:`status` says why. An edited source is never shadowed by a stale build, and the
modules load all or none: compiled code reaches the classes of the others in the group
directly. ``PAGESIM_PURE_PYTHON=1`` runs the sources
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
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

# In dependency order; the modules one step of either scheduler spends its time in.
COMPILED_MODULES = ("sequence", "blocks", "prefix_cache", "block_manager", "registry", "scheduler_v1")
GROUP = "pagesim_core"  # mypyc's shared library of the group: pagesim_core__mypyc
PURE_PYTHON_ENV = "PAGESIM_PURE_PYTHON"
MANIFEST = "manifest.json"
SOURCE_DIR = Path(__file__).resolve().parent
PACKAGE_ROOT = SOURCE_DIR.parent  # the folders installed as pagesim.core and pagesim.kernels
LIB_DIR = PACKAGE_ROOT / "build" / "compiled-core" / "lib"
# Whose sources a build must match: compiled code also fixed, when it was built, the types of
# whatever it calls or reads in the other modules (a field's, a function's result), so every
# source of the engine and its kernels is one it was built against.
SOURCE_FOLDERS = ("core", "kernels")


@dataclass(frozen=True)
class CompiledCoreStatus:
    active: bool
    reason: str | None = None  # why the sources run instead, when they do

    def describe(self) -> str:
        return "compiled (mypyc)" if self.active else f"pure Python ({self.reason})"


status = CompiledCoreStatus(False, "not loaded yet")


def extension_suffix() -> str:
    return sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def source_digests(root: Path = PACKAGE_ROOT) -> dict[str, str]:
    """SHA-256 of every source the build depends on, by its path under ``root``."""
    paths = sorted(p for folder in SOURCE_FOLDERS for p in (root / folder).rglob("*.py"))
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def manifest_for(root: Path = PACKAGE_ROOT) -> dict:
    """What a build of the sources under ``root`` records: this Python's extension suffix,
    the modules compiled and every source's digest."""
    return {
        "extension_suffix": extension_suffix(),
        "modules": list(COMPILED_MODULES),
        "sources": source_digests(root),
    }


def built_files() -> set[str]:
    suffix = extension_suffix()
    return {f"{name}{suffix}" for name in (*COMPILED_MODULES, f"{GROUP}__mypyc")}


def why_not_compiled(lib_dir: Path = LIB_DIR, root: Path = PACKAGE_ROOT, honour_env: bool = True) -> str | None:
    """Why the build in ``lib_dir`` must not stand in for the sources under ``root``, or
    None when it may (``honour_env=False``: whether it is up to date, whatever the
    environment asks)."""
    if honour_env and os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return f"{PURE_PYTHON_ENV} is set"
    try:
        built = json.loads((lib_dir / MANIFEST).read_text(encoding="utf-8"))
        suffix, modules, digests = built["extension_suffix"], built["modules"], dict(built["sources"])
    except FileNotFoundError:
        return "not built; make builds it"
    except (OSError, ValueError, TypeError, KeyError) as exc:  # (JSON of another shape too)
        return f"its manifest is unreadable ({type(exc).__name__}: {exc}); make rebuilds it"
    if suffix != extension_suffix():
        return f"built for another Python ({suffix}, this one takes {extension_suffix()}); make rebuilds it"
    if modules != list(COMPILED_MODULES):
        return f"built of other modules ({', '.join(map(str, modules))}); make rebuilds it"
    now = source_digests(root)
    changed = sorted(set(now) ^ set(digests)) or [path for path in now if now[path] != digests[path]]
    if changed:
        return f"{changed[0]} changed since it was compiled; make rebuilds it"
    # Every extension module there would be found first: exactly the build's must be there.
    there = {p.name for p in lib_dir.iterdir() if p.name.endswith(tuple(EXTENSION_SUFFIXES))}
    if missing := sorted(built_files() - there):
        return f"{missing[0]} is missing from {lib_dir}; make rebuilds it"
    if stray := sorted(there - built_files()):
        return f"{stray[0]} in {lib_dir} is not of this build; make rebuilds it"
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
