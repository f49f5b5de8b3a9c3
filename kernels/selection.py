"""Which backend runs the kernel: CUDA when CuPy sees a device, else the compiled CPU
kernel, or the one asked for by name. Kept apart from the interface in
``kernels.backend`` so that the concrete backends import the interface, never the reverse."""

from __future__ import annotations

from pagesim.kernels import cuda_backend
from pagesim.kernels.backend import Backend, BackendUnavailableError


def available_backends() -> dict[str, str]:
    """Backend name -> why it is or is not usable here."""
    reason = cuda_backend.unavailable_reason()
    return {"cpu": "available", "cuda": "available" if reason is None else reason}


def select_backend(name: str = "auto", cuda_variant: str = "auto") -> Backend:
    """``auto`` picks CUDA when CuPy sees a device, else the compiled CPU kernel.
    ``cuda_variant`` forces the CUDA kernel (v1, v2) instead of vLLM's selection rule."""
    # (imported here: Numba takes a third of a second to load, and a window paints first)
    from pagesim.kernels.cpu_backend import CpuBackend

    if name == "cpu":
        return CpuBackend()
    if name in ("cuda", "auto"):
        reason = cuda_backend.unavailable_reason()
        if reason is None:
            return cuda_backend.CudaBackend(variant=cuda_variant)
        if name == "cuda":
            raise BackendUnavailableError(f"--backend cuda is not usable here: {reason}")
        return CpuBackend()
    raise BackendUnavailableError(f"unknown backend {name!r}; expected auto, cpu or cuda")
