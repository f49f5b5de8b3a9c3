"""The compiled CUDA modules are kept on disk: one NVRTC compile per machine, not per process
(CuPy recompiles every process when kernels are named by their template expressions)."""

import json

import pytest
from pagesim.kernels import cuda_backend
from pagesim.kernels.cuda_backend import cached_module_file, device_target, module_cache_key
from pagesim.kernels.cuda_build import CompileError, instantiation_for

SMALLEST = instantiation_for("float32", 8, 16)  # the quickest module to compile


@pytest.fixture
def compiles(monkeypatch):
    """Counts NVRTC compiles (each still runs)."""
    calls = []
    real = cuda_backend.nvrtc_cubin

    def counted(names, target):
        calls.append(target)
        return real(names, target)

    monkeypatch.setattr(cuda_backend, "nvrtc_cubin", counted)
    return calls


def test_a_module_is_compiled_once_then_read_from_the_cache(tmp_path, compiles):
    path, lowered = cached_module_file(SMALLEST, "sm_90", tmp_path)
    assert compiles == ["sm_90"]
    assert path.read_bytes()[:4] == b"\x7fELF", "a cubin is an ELF file"
    assert set(lowered) == set(SMALLEST.module_names())
    assert all(name.startswith("_Z") for name in lowered.values()), "lowered names are mangled C++ names"

    again, lowered_again = cached_module_file(SMALLEST, "sm_90", tmp_path)
    assert compiles == ["sm_90"], "the second load compiled again"
    assert (again, lowered_again) == (path, lowered)

    path.write_bytes(path.read_bytes()[:100])  # cut short, as by a kill mid-write of an older version
    cached_module_file(SMALLEST, "sm_90", tmp_path)
    assert compiles == ["sm_90", "sm_90"], "a damaged cubin was trusted"
    entry = json.loads(path.with_suffix(".json").read_text())
    assert entry["lowered"] == lowered


def test_the_key_names_what_the_module_depends_on():
    other_dtype = instantiation_for("float16", 8, 16)
    other_dim = instantiation_for("float32", 16, 16)
    keys = {
        module_cache_key(SMALLEST, "sm_90"),
        module_cache_key(SMALLEST, "sm_80"),
        module_cache_key(other_dtype, "sm_90"),
        module_cache_key(other_dim, "sm_90"),
    }
    assert len(keys) == 4
    assert module_cache_key(instantiation_for("float32", 8, 64), "sm_90") == module_cache_key(SMALLEST, "sm_90"), (
        "one module holds every block size"
    )


def test_an_unwritable_cache_folder_still_gives_a_module(tmp_path, compiles):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would be")
    path, _ = cached_module_file(SMALLEST, "sm_90", blocked / "cuda")
    assert path.exists() and path.read_bytes()[:4] == b"\x7fELF"
    assert compiles == ["sm_90"]


def test_an_entry_naming_other_kernels_is_compiled_again(tmp_path, compiles):
    path, lowered = cached_module_file(SMALLEST, "sm_90", tmp_path)
    entry_path = path.with_suffix(".json")
    entry = json.loads(entry_path.read_text())
    entry["lowered"] = dict(list(lowered.items())[:3])  # the hash still matches the cubin
    entry_path.write_text(json.dumps(entry))
    _, again = cached_module_file(SMALLEST, "sm_90", tmp_path)
    assert compiles == ["sm_90", "sm_90"] and again == lowered


def test_a_gpu_newer_than_nvrtc_gets_ptx_for_the_newest_architecture_it_knows(tmp_path, monkeypatch):
    from cupy.cuda import nvrtc

    monkeypatch.setattr(nvrtc, "getSupportedArchs", lambda: (75, 80, 86, 90))
    assert device_target("90") == "sm_90"
    assert device_target(86) == "sm_86"
    assert device_target("120") == "compute_90"  # the driver compiles it for the GPU when loading
    with pytest.raises(CompileError, match=r"compiles for compute capability 7\.5 and newer; the GPU is 7\.0"):
        device_target("70")
    path, lowered = cached_module_file(SMALLEST, "compute_90", tmp_path)
    assert path.suffix == ".ptx" and b".target sm_90" in path.read_bytes()
    assert set(lowered) == set(SMALLEST.module_names())
