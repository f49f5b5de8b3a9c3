"""Write the table of registers, shared memory and spills per kernel instantiation
(NVRTC → PTX → ptxas -v, for sm_80 and sm_90). No GPU needed.
Usage: python scripts/kernel_resources.py [--out docs/kernel-resources.md]"""

import argparse
import datetime as dt
from pathlib import Path

from kernels.cuda_build import ARCHES, demangled, nvrtc_ptx, ptxas_usage, representative_instantiations


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("docs/kernel-resources.md"))
    args = parser.parse_args()
    names = sorted({n for inst in representative_instantiations() for n in inst.names.values()})
    ptx, _ = nvrtc_ptx(names)
    lines = [
        "# CUDA kernel resources",
        "",
        f"NVRTC → PTX → `ptxas -v`, {dt.date.today().isoformat()}, no GPU needed "
        "(`python scripts/kernel_resources.py`). Template arguments: storage kind (0 float32, 1 float16, "
        "2 bfloat16), head dim, block size (0 = read at run time). 128 threads per block.",
        "",
    ]
    for arch in ARCHES:
        usage, _ = ptxas_usage(ptx, arch)
        lines += [
            f"## {arch}",
            "",
            "| kernel | registers | shared memory (B) | stack (B) | spill stores / loads (B) |",
            "|---|---:|---:|---:|---:|",
        ]
        for u in sorted(usage, key=lambda u: demangled(u.entry)):
            lines.append(
                f"| `{demangled(u.entry)}` | {u.registers} | {u.shared_bytes} | {u.stack_bytes} | "
                f"{u.spill_stores} / {u.spill_loads} |"
            )
        lines.append("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
