"""Compile the scheduling step's modules with mypyc into build/compiled-core/lib/ (see
core/compiled_core.py, which loads them only while their sources are the ones compiled).

    python scripts/build_compiled_core.py     # what make runs; a no-op when up to date

The sources are staged as the package they are installed as (pagesim.core, beside
pagesim.kernels for the types they import), so mypyc names the modules pagesim.core.*.
The manifest is written last: a build that fails or stops halfway is never loaded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "core"))  # (compiled_core alone, without importing pagesim.core)
import compiled_core  # noqa: E402

OUT = compiled_core.LIB_DIR
WORK = OUT.parent / "work"
# Imports beyond the group are read for their types, not compiled, and not checked here;
# the numerical libraries' (none of which the group calls in a hot path) are not read at all:
# torch's types alone took mypy a minute and a half.
MYPY_CONFIG = """\
[mypy]
follow_imports = silent
ignore_missing_imports = True
[mypy-numpy.*,numba.*,torch.*,cupy.*,cupyx.*,ml_dtypes.*,gguf.*,tokenizers.*,jinja2.*,matplotlib.*,msgspec.*,zmq.*]
follow_imports = skip
"""


def up_to_date() -> bool:
    try:
        built = json.loads((OUT / compiled_core.MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    suffix = compiled_core.extension_suffix()
    names = (*compiled_core.COMPILED_MODULES, f"{compiled_core.GROUP}__mypyc")
    return built == compiled_core.manifest_for() and all((OUT / f"{name}{suffix}").is_file() for name in names)


def build() -> None:
    from mypyc.build import mypycify  # (the build's own dependency: pip install mypy)
    from setuptools import setup

    shutil.rmtree(WORK, ignore_errors=True)
    staged = WORK / "src" / "pagesim"
    for package in ("core", "kernels"):
        shutil.copytree(ROOT / package, staged / package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (staged / "__init__.py").touch()  # (staging only: mypyc names modules by their packages)
    manifest = compiled_core.manifest_for()  # (digests of what is staged, before it compiles)
    os.chdir(WORK / "src")
    config = WORK / "mypy.ini"
    config.write_text(MYPY_CONFIG, encoding="utf-8")
    extensions = mypycify(
        ["--config-file", str(config)] + [f"pagesim/core/{name}.py" for name in compiled_core.COMPILED_MODULES],
        opt_level="3",
        group_name=compiled_core.GROUP,
        target_dir=str(WORK / "c"),
    )
    setup(
        name="pagesim-compiled-core",
        ext_modules=extensions,
        script_args=["build_ext", "--build-lib", str(WORK / "lib"), "--build-temp", str(WORK / "temp"), "-q"],
    )
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    suffix = compiled_core.extension_suffix()
    for library in (WORK / "lib").rglob(f"*{suffix}"):
        shutil.copy2(library, OUT / library.name)
    (OUT / compiled_core.MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    shutil.rmtree(WORK, ignore_errors=True)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--build-here":
        build()
        return 0
    if up_to_date():
        print(f"compiled core: up to date in {OUT.relative_to(ROOT)}")
        return 0
    # (mypyc and the compiler print every command: kept in a log, shown if the build fails)
    started, log = time.perf_counter(), OUT.parent / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as out:
        done = subprocess.run([sys.executable, __file__, "--build-here"], stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        print(log.read_text(encoding="utf-8")[-6000:], file=sys.stderr)
        print(f"compiled core: the build failed (log: {log}); the sources run instead", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - started
    print(f"compiled core: {len(compiled_core.COMPILED_MODULES)} modules built in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
