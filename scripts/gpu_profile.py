"""Cases for Nsight Compute (the GPU check runs ``ncu`` over this): one launch each of the
decode kernels where the benchmark measures them — the multi-head headline case, a GQA
batch on each variant, and one long GQA sequence."""

from pagesim.kernels.backend import default_scale
from pagesim.kernels.cuda_backend import CudaBackend
from pagesim.kernels.cuda_bench import make_case, timed_launch

CASES = {  # name: (batch, context, query heads, KV heads, variant; None: what auto picks)
    "mha-headline": (64, 4096, 32, 32, None),
    "gqa-batch-v1": (64, 4096, 32, 8, "v1"),
    "gqa-batch-v2": (64, 4096, 32, 8, "v2"),
    "gqa-one-sequence": (1, 131072, 32, 8, None),
}


def main() -> None:
    import cupy

    backend = CudaBackend()
    for name, (batch, context, heads, kv_heads, variant) in CASES.items():
        q, kc, vc, scattered, _, lens = make_case(backend, batch, context, heads, kv_heads, 128, 16, "float16")
        timed_launch(backend, q, kc, vc, scattered, lens, default_scale(128), variant)()
        cupy.cuda.Device().synchronize()
        print(name, "launched", flush=True)


if __name__ == "__main__":
    main()
