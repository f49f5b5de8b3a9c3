"""The CUDA kernels compile without a GPU: NVRTC to PTX, ptxas to sm_80/sm_90 cubins."""

import shutil

import numpy as np
import pytest
from pagesim.kernels import cuda_build
from pagesim.kernels.cuda_backend import choose_variant
from pagesim.kernels.cuda_build import (
    ARCHES,
    CompileError,
    Instantiation,
    ToolMismatchError,
    instantiation_for,
    nvcc_usage,
    nvrtc_ptx,
    ptxas_usage,
    representative_instantiations,
)


@pytest.fixture(scope="module")
def nvrtc_build():
    insts = representative_instantiations()
    names = sorted({name for inst in insts for name in inst.names.values()})
    ptx, lowered = nvrtc_ptx(names)
    return insts, names, ptx, lowered


@pytest.mark.parametrize("arch", ARCHES)
def test_every_kernel_assembles_for_a_real_gpu(nvrtc_build, arch, capsys):
    _, names, ptx, lowered = nvrtc_build
    try:
        usage, _ = ptxas_usage(ptx, arch)
    except ToolMismatchError as exc:
        pytest.skip(str(exc))
    entries = {u.entry: u for u in usage}
    missing = [name for name in names if lowered[name] not in entries]
    assert not missing, f"not in the {arch} cubin: {missing}"
    for u in usage:
        assert u.registers <= 128, f"{cuda_build.demangled(u.entry)} uses {u.registers} registers"
        assert u.shared_bytes <= 48 * 1024
    # The fast paths the benchmark targets must not spill, with one head a block or a GQA group's 2 or 4.
    for inst in [Instantiation(kind, d, 16, heads) for kind, d in ((1, 128), (2, 128), (1, 64)) for heads in (1, 2, 4)]:
        for role in ("v1", "v2", "prefill"):
            u = entries[lowered[inst.names[role]]]
            assert u.spill_stores == u.spill_loads == 0, f"{inst.names[role]} spills on {arch}"
    with capsys.disabled():
        print(
            f"\n{arch}: {len(usage)} kernels, max {max(u.registers for u in usage)} registers, "
            f"{sum(u.spill_stores for u in usage)} bytes of spill stores in total"
        )


def test_nvcc_builds_the_same_source():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed; the NVRTC checks above cover the same source")
    insts = representative_instantiations()[:6]
    usage, _ = nvcc_usage(insts, "sm_90")
    assert len(usage) == 2 * len(insts) + len({inst.names["prefill"] for inst in insts})  # v1, v2; prefill


def test_a_compile_error_names_the_source_file(monkeypatch):
    source = cuda_build.kernel_source()
    broken = source.replace("constexpr int WARP = 32;", "constexpr int WARP = 32 oops;")
    monkeypatch.setattr(cuda_build, "kernel_source", lambda: broken)
    with pytest.raises(CompileError, match=r"paged_attention\.cu\(\d+\)"):
        nvrtc_ptx(["pagesim::paged_attention_v1<0, 8, 0>"])


def test_block_sizes_map_to_fast_paths_or_the_generic_kernel():
    assert instantiation_for("float16", 128, 16) == Instantiation(1, 128, 16)
    assert instantiation_for("bfloat16", 64, 3) == Instantiation(2, 64, 0)
    assert instantiation_for("float32", 8, 1) == Instantiation(0, 8, 0)
    with pytest.raises(ValueError, match="multiple of 8"):
        instantiation_for("float16", 12, 16)


def test_a_head_dim_the_cuda_kernels_lack_is_a_clear_refusal_not_a_traceback(capsys):
    # (head_dim 7 runs on the CPU kernel; the CUDA backend allocating its cache raised a bare
    # ValueError that the command line printed as a traceback)
    from pagesim.app.cli import main
    from pagesim.kernels.backend import BackendUnavailableError
    from pagesim.kernels.cuda_backend import CudaBackend

    backend = CudaBackend.__new__(CudaBackend)  # (no device: the check comes before any)
    with pytest.raises(BackendUnavailableError, match=r"head_dim a multiple of 8 .* got 7 .*--backend cpu"):
        backend.allocate_cache(4, 16, 2, 7, np.float32)

    def refuse(*args, **kwargs):
        cuda_build.check_head_dim(7)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("pagesim.app.cli.select_backend", refuse)
        assert main(["run", "seed_demo", "--quiet"]) == 2
    assert "got 7 (the CPU kernel takes any head_dim" in capsys.readouterr().err


@pytest.mark.parametrize(
    "max_context, seqs, heads, expected",
    [(512, 1, 8, "v1"), (4096, 64, 32, "v1"), (4096, 4, 8, "v2"), (8192, 64, 32, "v1"), (8193, 64, 32, "v2")],
)
def test_v1_v2_selection_follows_vllms_rule(max_context, seqs, heads, expected):
    assert choose_variant(max_context, seqs, heads) == expected


@pytest.mark.parametrize("dtype, head_dim", [("float16", 128), ("bfloat16", 64), ("float32", 256)])
def test_the_backends_own_module_compiles(dtype, head_dim):
    """Exactly what CudaBackend asks NVRTC for: one module, every block-size and heads-per-block variant."""
    inst = instantiation_for(dtype, head_dim, 16)
    names = inst.module_names()
    variants = (1 + len(cuda_build.FAST_BLOCK_SIZES)) * len(cuda_build.HEADS_PER_BLOCK)
    # v1 and v2 per variant, prefill per heads-per-block (its block size is read at run time), reduce, write, copy
    assert len(names) == 2 * variants + len(cuda_build.HEADS_PER_BLOCK) + 3
    ptx, lowered = nvrtc_ptx(names)
    assert set(lowered) == set(names) and all(lowered[n] in ptx for n in names)


def test_prefill_query_tiles_keep_a_thread_blocks_pairs_within_its_budget():
    from pagesim.kernels.cuda_build import PREFILL_MAX_QUERY_TILE, PREFILL_PAIR_ELEMS, prefill_query_tile

    assert prefill_query_tile(64, 1) == PREFILL_MAX_QUERY_TILE
    for head_dim in (8, 24, 64, 128, 200, 256):
        for heads in cuda_build.HEADS_PER_BLOCK:
            tile = prefill_query_tile(head_dim, heads)
            assert 1 <= tile <= PREFILL_MAX_QUERY_TILE
            assert tile * heads * head_dim <= PREFILL_PAIR_ELEMS or tile == 1


def test_ptxas_is_chosen_to_match_nvrtc(monkeypatch):
    paths = {"/a/ptxas": (13, 0), "/b/ptxas": (12, 9), "/c/ptxas": (12, 4)}
    monkeypatch.setattr(cuda_build, "ptxas_candidates", lambda: list(paths))
    monkeypatch.setattr(cuda_build, "tool_version", paths.get)
    assert cuda_build.find_ptxas((12, 9)) == "/b/ptxas"
    assert cuda_build.find_ptxas((12, 6)) == "/b/ptxas"  # same major, newer minor reads older PTX
    assert cuda_build.find_ptxas((13, 0)) == "/a/ptxas"
    with pytest.raises(ToolMismatchError, match=r"NVRTC is CUDA 13\.2"):
        cuda_build.find_ptxas((13, 2))
    monkeypatch.setattr(cuda_build, "ptxas_candidates", lambda: [])
    assert cuda_build.find_ptxas((12, 9)) is None


def test_the_wheel_layouts_are_searched(monkeypatch, tmp_path):
    import site

    for sub in ("nvidia/cu13/bin", "nvidia/cuda_nvcc/bin"):
        tool = tmp_path / sub / "ptxas"
        tool.parent.mkdir(parents=True)
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(tmp_path)])
    found = cuda_build.ptxas_candidates()
    assert str(tmp_path / "nvidia/cu13/bin/ptxas") in found
    assert str(tmp_path / "nvidia/cuda_nvcc/bin/ptxas") in found


def test_to_device_passes_device_arrays_through_and_uploads_host_ones():
    """CudaBackend.to_device with a stand-in for CuPy: a device array is used as it is
    (made contiguous), a host array is uploaded, bf16 as its 16-bit patterns."""
    from contextlib import nullcontext

    import ml_dtypes
    import numpy as np
    from pagesim.kernels.cuda_backend import CudaBackend

    class DeviceArray(np.ndarray):
        pass

    class FakeCupy:
        ndarray = DeviceArray

        @staticmethod
        def ascontiguousarray(a):
            return np.ascontiguousarray(a).view(DeviceArray)

        @staticmethod
        def asarray(a):
            return np.array(a).view(DeviceArray)

    backend = CudaBackend.__new__(CudaBackend)
    backend.xp, backend._device = FakeCupy, nullcontext()
    on_device = np.arange(12, dtype=np.float32).reshape(3, 4).view(DeviceArray)[:, ::2]
    out = backend.to_device(on_device)
    assert isinstance(out, DeviceArray) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, on_device)
    host = np.ones((2, 2), ml_dtypes.bfloat16)
    uploaded = backend.to_device(host)
    assert isinstance(uploaded, DeviceArray) and uploaded.dtype == np.uint16
