"""Storage dtypes of the KV cache and their comparison tolerances."""

from __future__ import annotations

import ml_dtypes
import numpy as np

# Name -> NumPy dtype used to hold the cache on the host. NumPy has no bfloat16;
# ml_dtypes supplies one that torch and CuPy can view bit-for-bit as uint16.
STORAGE_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}

# The storage kind code both kernels take (the CPU kernel's `kind`, the CUDA templates' KIND).
STORAGE_KINDS: dict[str, int] = {"float32": 0, "float16": 1, "bfloat16": 2}

# Max abs error allowed between the paged kernel (fp32 accumulation) and dense
# attention computed in fp32 on the same stored K/V. Both read identical rounded
# inputs, so the gap is accumulation order only; the wider bounds for half types
# cover the rounding of the output-sized intermediates on the GPU path.
TOLERANCES: dict[str, float] = {
    "float32": 1e-5,
    "float16": 1e-3,
    "bfloat16": 1e-2,
}


def storage_dtype(name: str) -> np.dtype:
    try:
        return STORAGE_DTYPES[name]
    except KeyError:
        known = ", ".join(STORAGE_DTYPES)
        raise ValueError(f"unknown KV-cache dtype {name!r}; expected one of {known}") from None


def dtype_name(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    for name, candidate in STORAGE_DTYPES.items():
        if candidate == dtype:
            return name
    known = ", ".join(STORAGE_DTYPES)
    raise ValueError(f"unsupported KV-cache dtype {dtype}; expected one of {known}")


def tolerance(name: str) -> float:
    storage_dtype(name)
    return TOLERANCES[name]
