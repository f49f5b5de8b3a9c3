"""The CUDA backend (CuPy). Its kernels arrive with the GPU-path issue; until then it
reports itself unavailable so ``auto`` falls back to the CPU kernel."""

from __future__ import annotations


def unavailable_reason() -> str | None:
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'pagesim[cuda]')"
    try:
        if not cupy.cuda.is_available():
            return "CuPy sees no CUDA device"
    except Exception as exc:  # the driver can fail in many ways; say how
        return f"CUDA runtime error: {exc}"
    return "the CUDA paged-attention kernels are not built yet"


class CudaBackend:  # pragma: no cover - replaced by the GPU-path issue
    def __init__(self) -> None:
        raise NotImplementedError(unavailable_reason())
