"""Compile the scheduling step's modules with mypyc into build/compiled-core/lib/ (see
core/compiled_core.py, which loads them only while the sources are the ones compiled).

    python scripts/build_compiled_core.py     # what make runs; a no-op when up to date

The sources are copied first and compiled as the package they are installed as
(pagesim.core, beside pagesim.kernels for the types they import), so mypyc names the
modules pagesim.core.*; the manifest records the digests of that copy. A build goes to a
folder of its own and replaces the old one whole, its manifest written last: a build that
fails or stops halfway is never loaded, and two at once do not mix.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (core/compiled_core.py alone, by its path: importing pagesim.core would load the old build)
_spec = importlib.util.spec_from_file_location("pagesim_compiled_core", ROOT / "core" / "compiled_core.py")
compiled_core = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # (a dataclass looks itself up)
_spec.loader.exec_module(compiled_core)

OUT = compiled_core.LIB_DIR
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


def build(work: Path) -> None:
    from mypyc.build import mypycify  # (the build's own dependency: mypy, in the dev extra)
    from setuptools import setup

    staged = work / "src" / "pagesim"
    for folder in compiled_core.SOURCE_FOLDERS:
        shutil.copytree(ROOT / folder, staged / folder, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    manifest = compiled_core.manifest_for(staged)  # (of the copy compiled, not of the tree since)
    (staged / "__init__.py").touch()  # (the copy only: mypyc names modules by their packages)
    os.chdir(work / "src")  # (mypyc takes the sources' paths relative to here)
    config = work / "mypy.ini"
    config.write_text(MYPY_CONFIG, encoding="utf-8")
    sources = [f"pagesim/core/{name}.py" for name in compiled_core.COMPILED_MODULES]
    extensions = mypycify(["--config-file", str(config), *sources], group_name=compiled_core.GROUP)
    setup(
        name="pagesim-compiled-core",
        ext_modules=extensions,
        script_args=["build_ext", "--build-lib", str(work / "lib"), "--build-temp", str(work / "temp"), "-q"],
    )
    done = work / "done"
    done.mkdir()
    for library in (work / "lib").rglob(f"*{compiled_core.extension_suffix()}"):
        shutil.copy2(library, done / library.name)
    (done / compiled_core.MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    old = work / "old"
    if OUT.exists():
        OUT.rename(old)
    done.rename(OUT)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--build-in":
        build(Path(sys.argv[2]))
        return 0
    if compiled_core.why_not_compiled(honour_env=False) is None:
        print(f"compiled core: up to date in {OUT.relative_to(ROOT)}")
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="work-", dir=OUT.parent))
    # (mypyc and the compiler print every command: kept in a log, shown if the build fails)
    started, log = time.perf_counter(), OUT.parent / "build.log"
    try:
        with log.open("w", encoding="utf-8") as out:
            command = [sys.executable, __file__, "--build-in", str(work)]
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if done.returncode != 0:
        print(log.read_text(encoding="utf-8")[-3000:], file=sys.stderr)
        print(f"compiled core: the build failed (log: {log}); the sources run instead", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - started
    print(f"compiled core: {len(compiled_core.COMPILED_MODULES)} modules built in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
