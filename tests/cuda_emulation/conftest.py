import pytest

from tests.cuda_emulation import emulator


@pytest.fixture(scope="session")
def emulated_library():
    if emulator.find_compiler() is None:
        pytest.skip("needs a C++20 compiler (g++ ≥ 10 or clang++ ≥ 10) to build the CUDA emulation")
    return emulator.build()


@pytest.fixture(scope="session")
def emulated_module(emulated_library):
    return emulator.EmulatedModule(emulated_library)


@pytest.fixture(scope="session")
def emulated_backend(emulated_module):
    return emulator.EmulatedCudaBackend(emulated_module)
