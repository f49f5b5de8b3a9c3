"""Paged-attention kernels and the backends that launch them.

``kernels`` knows nothing about the simulator: it takes a physical KV cache, block
tables and context lengths, exactly as a serving engine hands them to its kernel.
"""

from kernels.backend import (
    Backend,
    BackendUnavailableError,
    KernelInputError,
    available_backends,
    select_backend,
)

__all__ = [
    "Backend",
    "BackendUnavailableError",
    "KernelInputError",
    "available_backends",
    "select_backend",
]
