"""The CUDA backend's automatic choice goes through the occupancy model, with the compiled
kernel's own registers and shared memory and the device's attributes (here stand-ins for
what CuPy reports: no GPU is needed to check the wiring)."""

from types import SimpleNamespace

from pagesim.kernels.cuda_backend import CudaBackend
from pagesim.kernels.cuda_build import instantiation_for


def backend_with(attributes: dict, registers: dict) -> CudaBackend:
    """``registers``: {(variant, heads per block): registers}; the module holds just those."""
    backend = object.__new__(CudaBackend)  # no device: only what launch_plan reads
    backend._device_name, backend._limits, backend.variant = "stand-in H200", None, "auto"
    backend._device = SimpleNamespace(attributes=attributes)
    functions = {
        instantiation_for("float16", 128, 16, heads).names[variant]: SimpleNamespace(num_regs=r, shared_size_bytes=2080)
        for (variant, heads), r in registers.items()
    }
    backend._module_for = lambda cache, heads=1: (
        instantiation_for("float16", 128, 16, heads),
        SimpleNamespace(get_function=functions.__getitem__),
    )
    return backend


def cache_with(num_kv_heads: int):
    return SimpleNamespace(dtype="float16", shape=(1000, 16, num_kv_heads, 128))


def test_auto_plans_from_the_device_attributes_and_the_compiled_registers():
    h200 = {"MultiProcessorCount": 132, "MaxRegistersPerMultiprocessor": 65536}
    backend = backend_with(h200, {("v1", 1): 40, ("v2", 1): 44})
    cache = cache_with(32)
    plan = backend.launch_plan(cache, 64, 32, 4096)
    assert backend.device_limits().sm_count == 132
    assert plan.variant == "v2" and plan.blocks_per_sm == 10  # v2's 44 registers: 10 blocks a SM
    # On a device with an eighth of the SMs v1 alone fills 10.7 waves: v1, no reduce.
    big = backend_with({**h200, "MultiProcessorCount": 16}, {("v1", 1): 40, ("v2", 1): 44})
    assert big.launch_plan(cache, 64, 32, 4096).variant == "v1"


def test_a_gqa_launch_is_planned_with_the_heads_per_block_kernels_and_grid():
    """32 query heads over 8 KV heads: thread blocks of 4 heads, a quarter of the grid, and
    the registers of the 4-head kernels (asking for the 1-head ones would fail here)."""
    h200 = {"MultiProcessorCount": 132, "MaxRegistersPerMultiprocessor": 65536}
    backend = backend_with(h200, {("v1", 4): 125, ("v2", 4): 122})
    plan = backend.launch_plan(cache_with(8), 64, 32, 4096)
    assert plan.variant == "v2" and plan.blocks_per_sm == 4 and plan.partitions == 8
    assert plan.grid_blocks == 32 // 4 * 64 * 8
