"""The CUDA backend's automatic choice goes through the occupancy model, with the compiled
kernel's own registers and shared memory and the device's attributes (here stand-ins for
what CuPy reports: no GPU is needed to check the wiring)."""

from types import SimpleNamespace

from kernels.cuda_backend import CudaBackend
from kernels.cuda_build import instantiation_for


def backend_with(attributes: dict, registers: dict) -> CudaBackend:
    backend = object.__new__(CudaBackend)  # no device: only what launch_plan reads
    backend._device_name, backend._limits, backend.variant = "stand-in H200", None, "auto"
    backend._device = SimpleNamespace(attributes=attributes)
    inst = instantiation_for("float16", 128, 16)
    functions = {inst.names[k]: SimpleNamespace(num_regs=r, shared_size_bytes=2080) for k, r in registers.items()}
    backend._module_for = lambda cache: (inst, SimpleNamespace(get_function=functions.__getitem__))
    return backend


def test_auto_plans_from_the_device_attributes_and_the_compiled_registers():
    h200 = {"MultiProcessorCount": 132, "MaxRegistersPerMultiprocessor": 65536}
    backend = backend_with(h200, {"v1": 40, "v2": 44})
    cache = SimpleNamespace(dtype="float16")
    plan = backend.launch_plan(cache, 64, 32, 4096)
    assert backend.device_limits().sm_count == 132
    assert plan.variant == "v2" and plan.blocks_per_sm == 10  # v2's 44 registers: 10 blocks a SM
    # On a device with an eighth of the SMs v1 alone fills 10.7 waves: v1, no reduce.
    big = backend_with({**h200, "MultiProcessorCount": 16}, {"v1": 40, "v2": 44})
    assert big.launch_plan(cache, 64, 32, 4096).variant == "v1"
