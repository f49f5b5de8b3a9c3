"""Building the CUDA kernels: source, template instantiations, NVRTC and ptxas.

Everything here works without a GPU: NVRTC (through CuPy's low-level bindings) turns
the source into PTX and ``ptxas -v`` reports registers, shared memory and spills for a
real architecture. The CuPy backend compiles through the same names at run time.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pagesim.kernels.backend import BackendUnavailableError
from pagesim.kernels.dtypes import STORAGE_KINDS

SOURCE_NAME = "paged_attention.cu"
KINDS = STORAGE_KINDS
STORAGE_CTYPE = {0: "float", 1: "unsigned short", 2: "unsigned short"}
FAST_BLOCK_SIZES = (8, 16, 32, 64, 128, 256)  # compile-time block sizes; others run generic
# Query heads of one KV group a thread block attends together. Not 8: each head keeps its own
# query, accumulator and softmax state in registers, and 8 take ~240 a thread (ptxas, sm_90):
# one block a SM, a sixth of the warps that keep HBM busy. 4 take ~125: four blocks a SM.
HEADS_PER_BLOCK = (1, 2, 4)


def _source_constant(name: str) -> int:
    """A ``constexpr int`` of the .cu, so the launch code and the kernels share one definition."""
    text = (resources.files("pagesim.kernels") / SOURCE_NAME).read_text(encoding="utf-8")
    found = re.search(rf"constexpr int {name} = (\d+);", text)
    if found is None:
        raise RuntimeError(f"{SOURCE_NAME} defines no constexpr int {name}")
    return int(found.group(1))


PARTITION_SIZE = _source_constant("PARTITION_SIZE")  # tokens per v2 partition
NUM_THREADS = _source_constant("NUM_THREADS")  # threads per thread block
TOKENS_PER_ITER = _source_constant("TOKENS_PER_ITER")  # tokens a thread group loads before using any
PREFILL_MAX_QUERY_TILE = _source_constant("PREFILL_MAX_QUERY_TILE")
PREFILL_PAIR_ELEMS = _source_constant("PREFILL_PAIR_ELEMS")
OPTIONS = ("--std=c++17",)
ARCHES = ("sm_80", "sm_90")


def kernel_source() -> str:
    """The .cu text with a #line directive, so compiler errors name the real file."""
    text = (resources.files("pagesim.kernels") / SOURCE_NAME).read_text(encoding="utf-8")
    return f'#line 1 "{SOURCE_NAME}"\n{text}'


def template_block_size(block_size: int) -> int:
    return block_size if block_size in FAST_BLOCK_SIZES else 0


def heads_per_block(num_heads: int, num_kv_heads: int) -> int:
    """How many query heads of one KV group share a thread block (so share its K/V loads):
    the largest of HEADS_PER_BLOCK that divides the group. A group of 8 takes 4 (two blocks
    read each K/V row, the second mostly from L2), a group of 6 takes 2, plain multi-head
    attention 1."""
    group = num_heads // num_kv_heads if num_kv_heads else 1
    return max(h for h in HEADS_PER_BLOCK if group % h == 0)


def prefill_query_tile(head_dim: int, heads: int) -> int:
    """Query rows a prefill thread block attends (the .cu's ``prefill_query_tile``): up to
    PREFILL_MAX_QUERY_TILE, fewer for wide heads, so that the block's (row, head) pairs times
    head_dim stay within PREFILL_PAIR_ELEMS (its accumulators' registers and its queries' shared memory)."""
    return max(1, min(PREFILL_MAX_QUERY_TILE, PREFILL_PAIR_ELEMS // (head_dim * heads)))


class UnsupportedGeometryError(BackendUnavailableError, ValueError):
    """A geometry the CPU kernel runs and the CUDA kernels were not built for."""


def check_head_dim(head_dim: int) -> None:
    if head_dim % 8 or not 8 <= head_dim <= 256:
        raise UnsupportedGeometryError(
            f"the CUDA kernels take head_dim a multiple of 8 from 8 to 256; got {head_dim} "
            "(the CPU kernel takes any head_dim up to 256: --backend cpu)"
        )


@dataclass(frozen=True)
class Instantiation:
    kind: int
    head_dim: int
    block_size: int  # template value: 0 = read at run time
    heads: int = 1  # query heads a thread block attends (one of HEADS_PER_BLOCK)

    @property
    def names(self) -> dict[str, str]:
        k, d, b, h = self.kind, self.head_dim, self.block_size, self.heads
        ctype = STORAGE_CTYPE[k]
        return {
            "v1": f"pagesim::paged_attention_v1<{k}, {d}, {b}, {h}>",
            "v2": f"pagesim::paged_attention_v2<{k}, {d}, {b}, {h}>",
            "reduce": f"pagesim::paged_attention_v2_reduce<{d}>",
            "prefill": f"pagesim::paged_prefill<{k}, {d}, {h}>",
            "write": f"pagesim::reshape_and_cache<{ctype}>",
            "copy": f"pagesim::copy_blocks<{ctype}>",
        }

    @property
    def module_key(self) -> tuple[int, int]:
        """One compiled module per (dtype, head_dim) holds every block-size and heads variant."""
        return self.kind, self.head_dim

    def module_names(self) -> list[str]:
        names = {
            name
            for block_size in (0, *FAST_BLOCK_SIZES)
            for heads in HEADS_PER_BLOCK
            for name in Instantiation(self.kind, self.head_dim, block_size, heads).names.values()
        }
        return sorted(names)


def instantiation_for(dtype: str, head_dim: int, block_size: int, heads: int = 1) -> Instantiation:
    check_head_dim(head_dim)
    if heads not in HEADS_PER_BLOCK:
        raise ValueError(f"a thread block attends {', '.join(map(str, HEADS_PER_BLOCK))} heads; got {heads}")
    return Instantiation(KINDS[dtype], head_dim, template_block_size(block_size), heads)


def representative_instantiations() -> list[Instantiation]:
    """What the compile checks build: every dtype, small to large heads, fast and generic block
    sizes, one head a block; and every heads-per-block choice for the common head dims (4 heads
    of fp32 at head dim 256 hold the most registers)."""
    out = []
    for kind in KINDS.values():
        for head_dim in (8, 64, 128, 256):
            for block_size in (16, 0):
                out.append(Instantiation(kind, head_dim, block_size))
    out += [Instantiation(1, 24, 0), Instantiation(0, 96, 32), Instantiation(2, 80, 8), Instantiation(1, 128, 256)]
    for heads in HEADS_PER_BLOCK[1:]:
        out += [Instantiation(kind, d, 16, heads) for kind, d in ((1, 128), (2, 128), (1, 64), (0, 256))]
    return out


class CompileError(RuntimeError):
    pass


def nvrtc_ptx(names: list[str], arch: str = "compute_80") -> tuple[str, dict[str, str]]:
    """Compile the source with NVRTC (no GPU needed); returns PTX and the lowered names."""
    ptx, lowered = _nvrtc(names, arch, cubin=False)
    return ptx.decode() if isinstance(ptx, bytes) else ptx, lowered


def nvrtc_cubin(names: list[str], arch: str) -> tuple[bytes, dict[str, str]]:
    """Compile the source with NVRTC to machine code for ``arch`` (``sm_90``: no GPU needed);
    returns the cubin and the lowered names."""
    return _nvrtc(names, arch, cubin=True)


def _nvrtc(names: list[str], arch: str, cubin: bool) -> tuple[bytes | str, dict[str, str]]:
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(kernel_source(), SOURCE_NAME, [], [])
    try:
        for name in names:
            nvrtc.addNameExpression(prog, name)
        try:
            nvrtc.compileProgram(prog, [*OPTIONS, f"-arch={arch}"])
        except nvrtc.NVRTCError as exc:
            raise CompileError(f"NVRTC failed ({exc}):\n{nvrtc.getProgramLog(prog)}") from None
        binary = nvrtc.getCUBIN(prog) if cubin else nvrtc.getPTX(prog)
        lowered = {name: nvrtc.getLoweredName(prog, name) for name in names}
        return binary, lowered
    finally:
        nvrtc.destroyProgram(prog)


@dataclass(frozen=True)
class ResourceUsage:
    entry: str
    arch: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int


_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas(log: str) -> list[ResourceUsage]:
    out, entry, arch, frame = [], None, None, (0, 0, 0)
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry, arch, frame = m.group(1), m.group(2), (0, 0, 0)
        elif (m := _FRAME.search(line)) and entry:
            frame = tuple(int(g) for g in m.groups())
        elif (m := _USED.search(line)) and entry:
            out.append(ResourceUsage(entry, arch, int(m.group(1)), int(m.group(2) or 0), *frame))
            entry = None
    return out


class ToolMismatchError(CompileError):
    """A ptxas exists, but none of the NVRTC's CUDA major version that can read its PTX."""


_RELEASE = re.compile(r"release (\d+)\.(\d+)")


def nvrtc_version() -> tuple[int, int]:
    from cupy.cuda import nvrtc

    return tuple(nvrtc.getVersion())


def tool_version(path: str) -> tuple[int, int] | None:
    """``(major, minor)`` from ``TOOL --version``, or None if it does not say."""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = _RELEASE.search(done.stdout)
    return (int(found.group(1)), int(found.group(2))) if found else None


def ptxas_candidates() -> list[str]:
    """Every ptxas on this machine: PATH, CUDA_HOME, the toolkit's default place, and the
    pip wheels (CUDA 12: nvidia/cuda_nvcc/bin; CUDA 13: nvidia/cu13/bin)."""
    import os
    import site
    import sysconfig

    places = [shutil.which("ptxas")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            places.append(str(Path(home) / "bin" / "ptxas"))
    roots = [sysconfig.get_paths().get("purelib"), *site.getsitepackages()]
    for root in dict.fromkeys(r for r in roots if r):
        for sub in ("nvidia/cu13/bin", "nvidia/cu12/bin", "nvidia/cuda_nvcc/bin"):
            places.append(str(Path(root) / sub / "ptxas"))
    found = []
    for place in places:
        if place and Path(place).is_file() and os.access(place, os.X_OK):
            real = str(Path(place).resolve())
            if real not in found:
                found.append(real)
    return found


def find_ptxas(nvrtc: tuple[int, int] | None = None) -> str | None:
    """The ptxas that matches NVRTC: the same release if there is one, else the same major
    release at the same or a later minor (which reads older PTX). Raises
    :class:`ToolMismatchError` if only other releases exist; None if there is none at all."""
    candidates = ptxas_candidates()
    if not candidates:
        return None
    nvrtc = nvrtc or nvrtc_version()
    versions = {path: tool_version(path) for path in candidates}
    for path, version in versions.items():
        if version == nvrtc:
            return path
    for path, version in versions.items():
        if version and version[0] == nvrtc[0] and version[1] >= nvrtc[1]:
            return path
    seen = ", ".join(f"{p} ({'.'.join(map(str, v)) if v else 'unknown release'})" for p, v in versions.items())
    raise ToolMismatchError(
        f"NVRTC is CUDA {nvrtc[0]}.{nvrtc[1]} but no ptxas of that release was found (seen: {seen}); "
        f"pip install nvidia-cuda-nvcc-cu{nvrtc[0]} for a matching one"
    )


def ptxas_usage(ptx: str, arch: str) -> tuple[list[ResourceUsage], str]:
    """Assemble PTX for a real GPU (``sm_80``, ``sm_90``) and report what each kernel uses."""
    ptxas = find_ptxas()
    if ptxas is None:
        raise CompileError("ptxas not found: install the CUDA toolkit or pip install nvidia-cuda-nvcc-cu12")
    with tempfile.TemporaryDirectory() as folder:
        src = Path(folder) / "kernels.ptx"
        src.write_text(ptx, encoding="utf-8")
        done = subprocess.run(
            [ptxas, "-v", f"-arch={arch}", str(src), "-o", str(Path(folder) / "kernels.cubin")],
            capture_output=True,
            text=True,
        )
    if done.returncode:
        raise CompileError(f"ptxas -arch={arch} failed:\n{done.stderr}")
    return parse_ptxas(done.stderr), done.stderr


def nvcc_usage(instantiations: list[Instantiation], arch: str) -> tuple[list[ResourceUsage], str]:
    """The same source through nvcc (explicit instantiations), as a second compiler's check."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise CompileError("nvcc not found")
    lines = [kernel_source()]
    prefills = set()  # one prefill kernel serves every block size
    for inst in instantiations:
        t = STORAGE_CTYPE[inst.kind]
        n = inst.names
        lines.append(
            f"template __global__ void {n['v1']}(float*, const {t}*, const {t}*, const {t}*, const int*, "
            "const int*, float, int, int, int, int);"
        )
        lines.append(
            f"template __global__ void {n['v2']}(float*, float*, float*, const {t}*, const {t}*, const {t}*, "
            "const int*, const int*, float, int, int, int, int, int);"
        )
        if n["prefill"] not in prefills:
            prefills.add(n["prefill"])
            lines.append(
                f"template __global__ void {n['prefill']}(float*, const {t}*, const {t}*, const {t}*, const int*, "
                "const int*, const int*, const int*, const int*, float, int, int, int, int);"
            )
    with tempfile.TemporaryDirectory() as folder:
        src = Path(folder) / "instantiations.cu"
        src.write_text("\n".join(lines) + "\n", encoding="utf-8")
        done = subprocess.run(
            [nvcc, *OPTIONS, "-cubin", f"-arch={arch}", "-Xptxas", "-v", str(src), "-o", str(Path(folder) / "k.cubin")],
            capture_output=True,
            text=True,
        )
    if done.returncode:
        raise CompileError(f"nvcc -arch={arch} failed:\n{done.stderr}")
    return parse_ptxas(done.stderr), done.stderr


def demangled(entry: str) -> str:
    """A readable kernel name from a mangled one, e.g. ``paged_attention_v1<1, 128, 16, 4>``."""
    m = re.match(r"_ZN7pagesim\d+(\w+?)I(.*?)EEv", entry)
    if not m:
        return entry
    args = re.findall(r"Li(\d+)E|(t)E?|(f)E?", m.group(2) + "E")
    values = [a or ("unsigned short" if b else "float") for a, b, c in args for _ in [0] if a or b or c]
    return f"{m.group(1)}<{', '.join(values)}>"
