"""Write the table of registers, shared memory and spills per kernel instantiation
(NVRTC → PTX → ptxas -v, for sm_80 and sm_90). No GPU needed.
Usage: python scripts/kernel_resources.py [--out docs/kernel-resources.md]"""

import argparse
import datetime as dt
import re
from pathlib import Path

from pagesim.kernels.cuda_build import (
    ARCHES,
    NUM_THREADS,
    PARTITION_SIZE,
    demangled,
    nvrtc_ptx,
    ptxas_usage,
    representative_instantiations,
)
from pagesim.kernels.occupancy import (
    A100,
    H200,
    KernelResources,
    bytes_in_flight_per_warp,
    dram_fraction,
    occupancy,
    plan_launch,
)

DEVICE_OF_ARCH = {"sm_80": A100, "sm_90": H200}
ITEMSIZE = {0: 4, 1: 2, 2: 2}  # storage kind -> bytes an element
_ATTENTION = re.compile(r"paged_attention_(v1|v2)<(\d+), (\d+), (\d+), (\d+)>")

REASONING = """## Occupancy, waves and bytes in flight

Per attention kernel, on the H200 for sm_90 and the A100 for sm_80 (`kernels/occupancy.py`,
unit-tested on these figures): resident blocks per SM from the registers above (allocated
per warp in units of 256) and the shared memory (+1 KB reserved a block), the warps that
makes, and what those warps have in flight. In `paged_attention.cu` each thread group
takes a batch of TOKENS_PER_ITER = 2 tokens per iteration and loads the head slices of K
and V of both (16 bytes a lane each, held raw until used) before it reduces any (dot
products, xor shuffles, one rescale for the batch): a warp has 2 × 2 × tokens_per_warp ×
head_dim × itemsize bytes in flight: 2 KB at the fp16 head dims that are powers of two
(8 to 256), less between them (1,088 B at 136, 1,280 B at 80 and 160). (The kernel's
earlier loop loaded one token's K, reduced it and only then loaded its V: 512 B a warp.)
Little's law says peak bandwidth × loaded latency must be in flight to stream at the peak:
with 650 ns (H200, HBM3e 4.8 TB/s) and 550 ns (A100 80 GB, HBM2e 2.04 TB/s), 23.6 KB and
10.4 KB per SM. **Estimated fraction of peak** = in flight / needed, at full occupancy and
at most 1; it ignores the reduction's gap between one batch's loads and the next, DRAM page
effects and the tail wave, so it is an upper bound. What it shows: the old kernel had about
enough bytes in flight on the H200 only at full occupancy (24 KB against 23.6 KB); the new
one has three times what is needed with fewer resident warps. What cost most was the launch
shape — the headline case (64 × 4096 × 32 heads, fp16) as vLLM's rule picks it is a v1
launch of 2048 blocks, 1.29 waves on 132 SMs with the old kernel's registers (its second
wave a quarter full); the occupancy model launches {headline} instead. Each lane reads a
block-table entry once per block it visits (its tokens run through each block in order).

**GQA.** A thread block attends HEADS = 1, 2 or 4 query heads of one KV group (the 4th
template argument; the largest that divides the group): each lane's K and V loads, and their
widening, serve every head of the block, which keeps a query, an accumulator and a softmax
state per head in registers. So the bytes in flight a warp are the same, and each of them
feeds HEADS heads: a group of 4 (32 query heads over 8 KV heads) reads each K/V row once
where it read it 4 times (3 of them from L2, when the group's blocks ran together), and
launches a quarter of the blocks: {gqa}. Not 8 heads a block: ptxas gives those ~240
registers (one block, 4 warps a SM, two thirds of the bytes the H200 needs in flight); a
group of 8 takes two blocks of 4, the second reading mostly from L2.
"""


def occupancy_section(usage_by_arch: dict) -> list[str]:
    by_name = {arch: {demangled(u.entry): u for u in usage} for arch, usage in usage_by_arch.items()}
    sm90 = by_name["sm_90"]

    def resources(name: str) -> KernelResources:
        return KernelResources(NUM_THREADS, sm90[name].registers, sm90[name].shared_bytes)

    def launch(heads: int) -> str:
        v1 = resources(f"paged_attention_v1<1, 128, 16, {heads}>")
        v2 = resources(f"paged_attention_v2<1, 128, 16, {heads}>")
        plan = plan_launch(64, 32, 4096, v1, v2, H200, PARTITION_SIZE, heads_per_block=heads)
        return f"{plan.variant} ({plan.grid_blocks} blocks in {plan.waves:.1f} waves, {plan.efficiency:.0%} busy)"

    gqa = f"the headline case with 8 KV heads is {launch(4)} on the H200"
    lines = [*REASONING.format(headline=launch(1), gqa=gqa).splitlines(), ""]
    for arch, names in by_name.items():
        device = DEVICE_OF_ARCH[arch]
        lines += [
            f"### {arch} on the {device.name}",
            "",
            "| kernel | blocks / SM (limit) | warps / SM | bytes a warp | in flight / SM | est. fraction of peak "
            "| heads a load serves |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, u in sorted(names.items()):
            match = _ATTENTION.fullmatch(name)
            if match is None:
                continue
            kind, head_dim, heads = int(match.group(2)), int(match.group(3)), int(match.group(5))
            resident = occupancy(KernelResources(NUM_THREADS, u.registers, u.shared_bytes), device)
            warps = resident.warps_per_sm(KernelResources(NUM_THREADS, u.registers, u.shared_bytes), device)
            per_warp = bytes_in_flight_per_warp(head_dim, ITEMSIZE[kind])
            fraction = dram_fraction(warps * per_warp, device)
            lines.append(
                f"| `{name}` | {resident.blocks_per_sm} ({resident.limited_by}) | {warps} | {per_warp} | "
                f"{warps * per_warp / 1024:.1f} KB | {fraction:.0%} | {heads} |"
            )
        lines.append("")
    return lines


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
    occupancy_rows = {}
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
        occupancy_rows[arch] = usage
    lines += occupancy_section(occupancy_rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
