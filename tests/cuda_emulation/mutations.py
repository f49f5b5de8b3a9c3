"""Proof that the emulated checks can fail: plant typical kernel bugs in the real
paged_attention.cu one at a time and show that each is caught, and how.

    python -m tests.cuda_emulation.mutations [--out docs/kernel-verification.md]

Each mutant is built twice (optimised, and with AddressSanitizer + UBSan) and runs the
sanitizer subset (``sanitized_run``) in a process of its own, so a crash is a finding and
not the end of the check. Exit status 1 if any mutant survives.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pagesim.kernels import cuda_build

from tests.cuda_emulation import emulator, sanitized_run


@dataclass(frozen=True)
class Mutation:
    name: str
    before: str
    after: str
    count: int = 1  # how many occurrences the replacement must change


_SCORE_SHUFFLE = (
    "        for (int mask = G::GROUP / 2; mask > 0; mask /= 2) s[h][j] += __shfl_xor_sync(FULL_MASK, s[h][j], mask);"
)
MUTATIONS = [
    Mutation(
        "`continue` before the score shuffle (masked lanes skip it)",
        _SCORE_SHUFFLE,
        "        if (!valid[j]) continue;\n" + _SCORE_SHUFFLE,
    ),
    Mutation(
        "`__syncthreads` inside a branch (only warp 0 waits)",
        "  __syncthreads();\n  // Thread d",
        "  if (warp == 0) __syncthreads();\n  // Thread d",
    ),
    Mutation(
        "missing −inf guard when merging two empty states",
        "  if (m_new == negative_infinity()) return;  // both empty\n",
        "",
    ),
    Mutation(
        "wrong GQA head mapping (head % num_kv_heads)",
        "const int kv_head = first_head / (num_heads / num_kv_heads);",
        "const int kv_head = first_head % num_kv_heads;",
        count=2,
    ),
    Mutation(
        "v2 reduce without its exp-sum weighting",
        "a += partial_out[(row * max_partitions + p) * HEAD_DIM + d] * sums[p] * __expf(maxes[p] - global_max);",
        "a += partial_out[(row * max_partitions + p) * HEAD_DIM + d] * __expf(maxes[p] - global_max);",
    ),
    Mutation(
        "reading one block past the table",
        "block_table[logical]",
        "block_table[logical + 1]",
    ),
    Mutation(
        "misaligned 16-byte vector load of the query (one element off)",
        "load_vec<KIND>(q_ptr + h * HEAD_DIM + chunk * G::VEC, q[h] + c * G::VEC);",
        "load_vec<KIND>(q_ptr + h * HEAD_DIM + chunk * G::VEC + 1, q[h] + c * G::VEC);",
    ),
    Mutation(
        "softmax rescale dropped (old accumulator not multiplied by exp(m_old − m_new))",
        "for (int i = 0; i < G::ELEMS; ++i) acc[h][i] *= correction;",
        "for (int i = 0; i < G::ELEMS; ++i) acc[h][i] *= 1.f;",
    ),
    Mutation(
        "a batch's second token loaded but never accumulated",
        "      if (!valid[j]) break;",
        "      if (!valid[j] || j > 0) break;",
    ),
    Mutation(
        "every head of a GQA thread block reads the first head's query",
        "load_vec<KIND>(q_ptr + h * HEAD_DIM + chunk * G::VEC, q[h] + c * G::VEC);",
        "load_vec<KIND>(q_ptr + chunk * G::VEC, q[h] + c * G::VEC);",
    ),
    Mutation(
        "every head of a GQA thread block writes the first head's output row",
        "out[h * out_stride + dim] = a * inv_total;",
        "out[dim] = a * inv_total;",
    ),
    Mutation(
        "v2's per-head max and sum written a partition apart instead of a row apart",
        "      out_max[h * stat_stride] = global_max;\n      out_sum[h * stat_stride] = total;",
        "      out_max[h] = global_max;\n      out_sum[h] = total;",
    ),
    # The prefill kernel.
    Mutation(
        "prefill: causal mask off by one (each row also sees the next position)",
        "first_pos + pair / HEADS + 1 - kv0",
        "first_pos + pair / HEADS + 2 - kv0",
        count=3,
    ),
    Mutation(
        "prefill: query rows placed from position 0 (the cached prefix before a chunk ignored)",
        "const int first_pos = context_lens[seq] - (q_end - q_begin) + (row0 - q_begin);",
        "const int first_pos = row0 - q_begin;",
    ),
    Mutation(
        "prefill: wrong GQA head mapping (head % num_kv_heads)",
        "const int kv_head = first_head / group;",
        "const int kv_head = first_head % num_kv_heads;",
    ),
    Mutation(
        "prefill: softmax rescale dropped (accumulators not multiplied by exp(m_old − m_new))",
        "float a = acc[k] * s_correction[pair];",
        "float a = acc[k];",
    ),
    Mutation(
        "prefill: no barrier between loading a K/V tile and scoring it",
        "    __syncthreads();  // the tile's K/V (and, the first time, the queries and states) are in place\n",
        "",
    ),
    Mutation(
        "prefill: a sequence's last query tile taken as full (rows past its queries)",
        "const int rows = min_int(QUERY_TILE, q_end - row0);",
        "const int rows = QUERY_TILE;",
    ),
    Mutation(
        "prefill: every head of a GQA thread block reads the first head's query",
        "load_vec<KIND>(query + (static_cast<long long>(row0 + i) * num_heads + first_head + h) * HEAD_DIM",
        "load_vec<KIND>(query + (static_cast<long long>(row0 + i) * num_heads + first_head) * HEAD_DIM",
    ),
]


def mutate(source: str, mutation: Mutation) -> str:
    if not mutation.before:
        return source
    found = source.count(mutation.before)
    if found != mutation.count:
        raise SystemExit(f"mutation {mutation.name!r}: expected {mutation.count} match(es), found {found}")
    return source.replace(mutation.before, mutation.after)


def asan_runtime() -> str | None:
    """AddressSanitizer's runtime library, to preload into a Python that loads a sanitized build."""
    compiler = emulator.find_compiler()
    if compiler is None:
        return None
    found = subprocess.run([compiler, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else None


def run_subset(library, sanitize: bool) -> tuple[int, str]:
    """Run ``sanitized_run`` on ``library`` in a fresh process: (exit status, its output)."""
    env = dict(os.environ)
    if sanitize:
        env |= {
            "LD_PRELOAD": asan_runtime() or "",
            "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=0",
        }
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.cuda_emulation.sanitized_run", str(library)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        return -1, "timed out (a hang the emulation did not report)"
    return done.returncode, done.stdout + done.stderr


def verdict(rc: int, output: str) -> str:
    """How a run caught the bug, or '' if it passed."""
    if m := re.search(r"(heap-buffer-overflow|stack-buffer-overflow|global-buffer-overflow|SEGV)[^\n]*", output):
        return f"ASan: {m.group(1)}"
    if m := re.search(r"runtime error: ([^\n]*)", output):
        text = m.group(1)
        return "UBSan: " + ("misaligned 16-byte load" if "misaligned" in text else text[:80])
    if m := re.search(r"emulation error: .*?: block \([^)]*\): ([^:;]*)", output):
        return f"emulation: {m.group(1).strip()}"
    if "non-finite output" in output:
        return "numerics: NaN in the output"
    if "rows off" in output:
        m = re.search(r"error (\S+) > tolerance (\S+)", output)
        return f"numerics: error {m.group(1)} > bound {m.group(2)}" if m else "numerics: outside the bound"
    if rc < 0 or rc > 128:
        return f"crash (signal {abs(rc) if rc < 0 else rc - 128})"
    return "" if rc == 0 else f"failed (exit {rc})"


def check(mutation: Mutation, sanitize_too: bool = True) -> dict:
    source = mutate(cuda_build.kernel_source(), mutation)
    names = sanitized_run.module_names()
    row = {"mutation": mutation.name}
    for label, sanitize in (("optimised", False), ("sanitized", True))[: 2 if sanitize_too else 1]:
        try:
            library = emulator.build(source=source, names=names, sanitize=sanitize)
        except emulator.EmulationError as exc:
            row[label] = f"does not compile: {str(exc).splitlines()[1][:80]}"
            continue
        row[label] = verdict(*run_subset(library, sanitize)) or "not caught"
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the Markdown table here")
    args = parser.parse_args()
    baseline = check(Mutation("none (the kernel as shipped)", "", "", count=0))
    with ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
        rows = list(pool.map(check, MUTATIONS))
    lines = ["| planted bug | optimised build | ASan + UBSan build |", "|---|---|---|"]
    for row in [baseline, *rows]:
        lines.append(f"| {row['mutation']} | {row['optimised']} | {row['sanitized']} |")
    table = "\n".join(lines)
    print(table)
    survivors = [r["mutation"] for r in rows if r["optimised"] == r["sanitized"] == "not caught"]
    clean = baseline["optimised"] == baseline["sanitized"] == "not caught"
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(table + "\n")
    if not clean:
        print("the unmutated kernel fails the subset", file=sys.stderr)
    if survivors:
        print(f"survived: {survivors}", file=sys.stderr)
    caught = len(rows) - len(survivors)
    print(f"mutations: {caught} passed, {len(survivors)} failed")
    return 0 if clean and not survivors else 1


if __name__ == "__main__":
    sys.exit(main())
