"""Storage dtypes of the KV cache and their comparison tolerances."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np


def bfloat16() -> np.dtype:
    """NumPy has no bfloat16; ml_dtypes supplies one that torch and CuPy can view bit for
    bit as uint16. Its import is slow, so it happens when a bfloat16 cache is first
    made, not when the app starts (the first frame of a float32 scenario never needs it)."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def is_bfloat16(dtype) -> bool:
    """Without importing ml_dtypes: a bfloat16 array exists only once it is imported."""
    return np.dtype(dtype).name == "bfloat16" and np.dtype(dtype) == bfloat16()


class _StorageDtypes(Mapping[str, np.dtype]):
    """Name -> NumPy dtype used to hold the cache on the host (bfloat16 resolved on first use)."""

    _NAMES = ("float32", "float16", "bfloat16")

    def __getitem__(self, name: str) -> np.dtype:
        if name == "float32":
            return np.dtype(np.float32)
        if name == "float16":
            return np.dtype(np.float16)
        if name == "bfloat16":
            return bfloat16()
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._NAMES)

    def __len__(self) -> int:
        return len(self._NAMES)

    def __contains__(self, name: object) -> bool:
        return name in self._NAMES


STORAGE_DTYPES: Mapping[str, np.dtype] = _StorageDtypes()

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
    for name in ("float32", "float16"):
        if STORAGE_DTYPES[name] == dtype:
            return name
    if is_bfloat16(dtype):
        return "bfloat16"
    known = ", ".join(STORAGE_DTYPES)
    raise ValueError(f"unsupported KV-cache dtype {dtype}; expected one of {known}")


def tolerance(name: str) -> float:
    storage_dtype(name)
    return TOLERANCES[name]
