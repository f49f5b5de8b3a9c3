"""pagesim installs as one package, ``pagesim``: its subpackages are the top-level folders, so a
user's own ``core/`` or the PyPI package ``kernels`` never shadows ours."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            str(ROOT),
            "-w",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("pagesim-*.whl")
    with zipfile.ZipFile(path) as archive:
        yield archive


def test_the_wheel_holds_pagesim_alone(wheel):
    names = wheel.namelist()
    top = {name.split("/")[0] for name in names}
    (info,) = {t for t in top if t.endswith(".dist-info")}
    assert top - {info} == {"pagesim"}
    assert wheel.read(f"{info}/top_level.txt").decode().split() == ["pagesim"]
    subpackages = {name.split("/")[1] for name in names if name.startswith("pagesim/")}
    assert subpackages == {"app", "core", "kernels", "assets"}


def test_the_wheel_ships_the_kernel_source_and_the_scenarios(wheel):
    names = set(wheel.namelist())
    assert "pagesim/kernels/paged_attention.cu" in names
    assert "pagesim/assets/scenarios/default.toml" in names
    assert "pagesim/app/cli.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "pagesim = pagesim.app:main" in wheel.read(entry_points).decode()


def test_a_users_own_core_folder_does_not_shadow_the_engine(tmp_path):
    for name in ("core", "kernels", "app"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise ImportError('the user folder was imported')\n")
    code = (
        "import pagesim.core.engine, pagesim.kernels.cpu_backend, pagesim.app.report; "
        "print(pagesim.core.engine.__file__)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert tmp_path not in Path(out.stdout.strip()).resolve().parents
