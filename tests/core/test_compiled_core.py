"""The compiled core: loaded only when built from exactly the sources there are, for this
Python, all modules or none; the sources alone still run every scenario as recorded."""

import json
import os
import shutil
from pathlib import Path

import pytest
from pagesim.core import compiled_core
from pagesim.core.compiled_core import COMPILED_MODULES, MANIFEST, manifest_for, why_not_compiled

from tests.on_the_sources import pytest_on_the_sources


@pytest.fixture
def built(tmp_path, monkeypatch):
    """A copy of the sources and a build of them (stand-in libraries: the checks read names
    and digests, never the code)."""
    monkeypatch.delenv(compiled_core.PURE_PYTHON_ENV, raising=False)
    root, lib = tmp_path / "tree", tmp_path / "lib"
    for folder in compiled_core.SOURCE_FOLDERS:
        shutil.copytree(compiled_core.PACKAGE_ROOT / folder, root / folder, ignore=shutil.ignore_patterns("*.pyc"))
    lib.mkdir()
    for name in compiled_core.built_files():
        (lib / name).write_bytes(b"")
    (lib / MANIFEST).write_text(json.dumps(manifest_for(root)))
    return root, lib


def test_a_build_of_exactly_these_sources_may_load(built):
    root, lib = built
    assert why_not_compiled(lib, root) is None


def test_an_edited_source_is_never_shadowed_by_its_stale_build(built):
    root, lib = built
    path = root / "core" / "block_manager.py"
    path.write_text(path.read_text() + "\n# an edit\n")
    assert why_not_compiled(lib, root) == "core/block_manager.py changed since it was compiled; make rebuilds it"


def test_a_change_to_a_module_the_compiled_ones_only_use_is_one_too(built):
    """Compiled code fixed the types of what it calls elsewhere (a prompt's tuple, a config
    field) when it was built: a source it was not compiled from counts as much."""
    root, lib = built
    (root / "core" / "scheduler.py").write_text("# another scheduler\n")
    assert why_not_compiled(lib, root).startswith("core/scheduler.py changed")
    (root / "core" / "scheduler.py").unlink()
    assert why_not_compiled(lib, root).startswith("core/scheduler.py changed")
    shutil.copy(compiled_core.PACKAGE_ROOT / "core" / "scheduler.py", root / "core" / "scheduler.py")
    assert why_not_compiled(lib, root) is None
    (root / "kernels" / "new_backend.py").write_text("")
    assert why_not_compiled(lib, root).startswith("kernels/new_backend.py changed")


def test_a_build_for_another_python_of_other_modules_or_half_a_build_is_not_loaded(built):
    root, lib = built
    manifest = json.loads((lib / MANIFEST).read_text())
    suffix = compiled_core.extension_suffix()
    (lib / MANIFEST).write_text(json.dumps(manifest | {"extension_suffix": ".cpython-399-x86_64-linux-gnu.so"}))
    assert "built for another Python (.cpython-399" in why_not_compiled(lib, root)
    (lib / MANIFEST).write_text(json.dumps(manifest | {"modules": ["blocks"]}))
    assert why_not_compiled(lib, root) == "built of other modules (blocks); make rebuilds it"
    (lib / MANIFEST).write_text(json.dumps(manifest))
    (lib / f"engine{suffix}").write_bytes(b"")  # (a module the build does not hold would shadow its source)
    assert why_not_compiled(lib, root).startswith(f"engine{suffix} in ")
    (lib / f"engine{suffix}").unlink()
    (lib / f"registry{suffix}").unlink()
    assert why_not_compiled(lib, root).startswith(f"registry{suffix} is missing")
    (lib / MANIFEST).unlink()  # (the build writes it last: a build that stopped has none)
    assert why_not_compiled(lib, root) == "not built; make builds it"
    for text in ("{", "[1, 2]", '{"extension_suffix": 1}', json.dumps(manifest | {"sources": [1]})):
        (lib / MANIFEST).write_text(text)
        assert why_not_compiled(lib, root).startswith("its manifest is unreadable"), text


def test_the_environment_variable_runs_the_sources(built, monkeypatch):
    sources, lib = built
    monkeypatch.setenv(compiled_core.PURE_PYTHON_ENV, "1")
    assert why_not_compiled(lib, sources) == "PAGESIM_PURE_PYTHON is set"


def test_the_modules_in_use_are_the_ones_the_status_names():
    """All compiled or all sources: compiled code reaches its group's classes directly. Under
    ``make test`` (and CI) the build is there, made just before, so the suite runs compiled."""
    import importlib

    modules = [importlib.import_module(f"pagesim.core.{name}") for name in COMPILED_MODULES]
    compiled = [Path(m.__file__).name.endswith(compiled_core.extension_suffix()) for m in modules]
    assert compiled == [compiled_core.status.active] * len(modules)
    if os.environ.get("PAGESIM_EXPECT_COMPILED") == "1":  # (make test: it built the core just before)
        assert compiled_core.status.active, f"the compiled core is not in use: {compiled_core.status.reason}"


@pytest.mark.timeout(600)
def test_the_sources_alone_replay_the_scheduler_scenarios_and_vllms_traces_as_recorded():
    """The fallback (a wheel install, an edited source, no compiler) is the same engine: the
    golden replay of the scheduler scenarios, and the shared vLLM traces, on the sources."""
    child = pytest_on_the_sources(
        [
            "-k",
            "v1 or preemption or prefix or stress",
            "tests/golden/test_golden_replay.py",
            "tests/core/test_vllm_traces.py",
        ],
        timeout=600,
    )
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
    assert " passed" in child.stdout and " failed" not in child.stdout
