"""Run a quick subset of the emulated kernels from a sanitizer build (AddressSanitizer +
UndefinedBehaviorSanitizer), in a process of its own with the ASan runtime preloaded.

    python -m tests.cuda_emulation.sanitized_run LIBRARY

Exits non-zero, with the sanitizer's report on stderr, on any out-of-bounds access or
misaligned 16-byte load; prints one line per case and 'N passed, 0 failed' otherwise.
Every input is a NumPy buffer of its exact size, so ASan's redzones sit right past it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tests.cuda_emulation.cases import make_case, make_prefill_case, mismatches, prefill_mismatches
from tests.cuda_emulation.emulator import EmulatedCudaBackend, EmulatedModule, EmulationError

# (dtype, head_dim, block_size, context lengths, (num_heads, num_kv_heads)): fast and
# generic block sizes, the partition edges, a head dim whose slices do not fill a
# power-of-two thread group, and thread blocks of 1, 2 and 8 query heads.
SUBSET = [
    ("float32", 64, 16, [1, 16, 17, 513], (4, 2)),
    ("float16", 64, 3, [1, 3, 4, 512], (4, 2)),
    ("bfloat16", 24, 16, [1, 7, 600], (4, 2)),
    ("float16", 24, 7, [1, 7, 8, 511], (4, 2)),
    ("float16", 64, 16, [1, 17, 600], (8, 1)),
    ("bfloat16", 64, 5, [5, 513], (2, 2)),
]

# The prefill kernel: (dtype, head_dim, block_size, (context_len, q_len) per sequence, heads):
# decodes, a whole prompt over several query and KV tiles, a chunk starting mid-block after a
# cached prefix, a chunk crossing a query tile; thread blocks of 1 (GQA 3), 2 and 4 query heads.
PREFILL_SUBSET = [
    ("float16", 64, 16, [(1, 1), (17, 1), (40, 40), (61, 37), (130, 17)], (9, 3)),
    ("bfloat16", 24, 3, [(2, 2), (4, 1), (40, 40), (41, 37)], (8, 2)),
    ("float32", 128, 7, [(7, 1), (33, 33), (47, 37)], (4, 2)),
]


def module_names() -> list[str]:
    """The kernels SUBSET and PREFILL_SUBSET launch (a sanitized build of every variant takes minutes)."""
    from pagesim.kernels.cuda_build import heads_per_block, instantiation_for

    names = set()
    for dtype, head_dim, block_size, _, (num_heads, num_kv_heads) in SUBSET + PREFILL_SUBSET:
        inst = instantiation_for(dtype, head_dim, block_size, heads_per_block(num_heads, num_kv_heads))
        names.update(inst.names.values())
    return sorted(names)


def main(library: str) -> int:
    """Run SUBSET from ``library`` (an emulated module holding at least :func:`module_names`)."""
    backend = EmulatedCudaBackend(EmulatedModule(Path(library)))
    problems = []
    count = 0
    for dtype, head_dim, block_size, lens, (num_heads, num_kv_heads) in SUBSET:
        for variant in ("v1", "v2"):
            rng = np.random.default_rng([head_dim, block_size])
            case = make_case(
                rng, context_lens=lens, block_size=block_size, num_heads=num_heads, num_kv_heads=num_kv_heads,
                head_dim=head_dim, dtype=dtype, spare=0,
            )  # fmt: skip
            dev = [backend.to_device(a) for a in (case.query, case.key_cache, case.value_cache)]
            label = f"{variant} {dtype} d={head_dim} bs={block_size} heads={num_heads}/{num_kv_heads}"
            try:
                got = backend.paged_attention_device(*dev, case.block_tables, case.context_lens, case.scale, variant)
                found = mismatches(got, case, label)
            except EmulationError as exc:
                found = [f"{label}: emulation error: {exc}"]
            problems += found
            count += 1
            print(f"{label}: {'ok' if not found else found[0]}", flush=True)
        kc, vc = backend.to_device(case.key_cache), backend.to_device(case.value_cache)
        slots = np.array([0, -1, kc.shape[0] * block_size - 1], np.int64)
        keys = np.zeros((3, *kc.shape[2:]), case.key_cache.dtype)
        backend.write_kv(kc, vc, slots, keys, keys)
        backend.copy_blocks(kc, vc, np.array([[0, kc.shape[0] - 1]]))
    for dtype, head_dim, block_size, seqs, (num_heads, num_kv_heads) in PREFILL_SUBSET:
        rng = np.random.default_rng([head_dim, block_size, 1])
        case = make_prefill_case(
            rng, seqs=seqs, block_size=block_size, num_heads=num_heads, num_kv_heads=num_kv_heads,
            head_dim=head_dim, dtype=dtype, spare=0,
        )  # fmt: skip
        q, kc, vc = (backend.to_device(a) for a in (case.query, case.key_cache, case.value_cache))
        label = f"prefill {dtype} d={head_dim} bs={block_size} heads={num_heads}/{num_kv_heads}"
        try:
            got = backend.paged_prefill_device(q, kc, vc, *case.args[3:], case.scale)
            found = prefill_mismatches(got, case, label)
        except EmulationError as exc:
            found = [f"{label}: emulation error: {exc}"]
        problems += found
        count += 1
        print(f"{label}: {'ok' if not found else found[0]}", flush=True)
    failed = len(problems)
    print(f"{count - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
