"""The compiled core: loaded only when built from exactly the sources there are, for this
Python, all modules or none; the sources alone still run every scenario as recorded."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pagesim.core import compiled_core
from pagesim.core.compiled_core import COMPILED_MODULES, GROUP, MANIFEST, manifest_for, why_not_compiled

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def built(tmp_path, monkeypatch):
    """A copy of the compiled modules' sources and a build of them (stand-in libraries: the
    checks read names and digests, never the code)."""
    monkeypatch.delenv(compiled_core.PURE_PYTHON_ENV, raising=False)
    sources, lib = tmp_path / "core", tmp_path / "lib"
    sources.mkdir()
    lib.mkdir()
    for name in COMPILED_MODULES:
        shutil.copy(compiled_core.SOURCE_DIR / f"{name}.py", sources / f"{name}.py")
    suffix = compiled_core.extension_suffix()
    for name in (*COMPILED_MODULES, f"{GROUP}__mypyc"):
        (lib / f"{name}{suffix}").write_bytes(b"")
    (lib / MANIFEST).write_text(json.dumps(manifest_for(sources)))
    return sources, lib


def test_a_build_of_exactly_these_sources_may_load(built):
    sources, lib = built
    assert why_not_compiled(lib, sources) is None


def test_an_edited_source_is_never_shadowed_by_its_stale_build(built):
    sources, lib = built
    path = sources / "block_manager.py"
    path.write_text(path.read_text() + "\n# an edit\n")
    assert why_not_compiled(lib, sources) == "core/block_manager.py changed since it was compiled; make rebuilds it"


def test_a_build_for_another_python_or_half_a_build_is_not_loaded(built):
    sources, lib = built
    manifest = json.loads((lib / MANIFEST).read_text())
    (lib / MANIFEST).write_text(json.dumps(manifest | {"extension_suffix": ".cpython-399-x86_64-linux-gnu.so"}))
    assert "built for another Python (.cpython-399" in why_not_compiled(lib, sources)
    (lib / MANIFEST).write_text(json.dumps(manifest))
    (lib / f"registry{compiled_core.extension_suffix()}").unlink()
    assert why_not_compiled(lib, sources).startswith(f"registry{compiled_core.extension_suffix()} is missing")
    (lib / MANIFEST).unlink()  # (the build writes it last: a build that stopped has none)
    assert why_not_compiled(lib, sources) == "not built; make builds it"
    (lib / MANIFEST).write_text("{")
    assert why_not_compiled(lib, sources).startswith("its manifest is unreadable")


def test_the_environment_variable_runs_the_sources(built, monkeypatch):
    sources, lib = built
    monkeypatch.setenv(compiled_core.PURE_PYTHON_ENV, "1")
    assert why_not_compiled(lib, sources) == "PAGESIM_PURE_PYTHON is set"


def test_the_modules_in_use_are_the_ones_the_status_names():
    """All compiled or all sources: compiled code reaches its group's classes directly. Under
    ``make test`` the build is there (make builds it first), so the suite runs compiled."""
    import importlib

    modules = [importlib.import_module(f"pagesim.core.{name}") for name in COMPILED_MODULES]
    compiled = [Path(m.__file__).name.endswith(compiled_core.extension_suffix()) for m in modules]
    assert compiled == [compiled_core.status.active] * len(modules)
    if os.environ.get(compiled_core.PURE_PYTHON_ENV, "") in ("", "0"):
        assert compiled_core.status.active, f"the compiled core is not in use: {compiled_core.status.reason}"


def test_the_sources_alone_replay_every_v1_and_memory_only_scenario_as_recorded():
    """The fallback (a wheel install, an edited source, no compiler) is the same engine: the
    golden replay of the scheduler scenarios, and the shared vLLM traces, on the sources."""
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "v1 or preemption or prefix or stress",
         "tests/golden/test_golden_replay.py", "tests/core/test_vllm_traces.py"],
        env={**os.environ, compiled_core.PURE_PYTHON_ENV: "1"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
    assert " passed" in child.stdout and " failed" not in child.stdout
