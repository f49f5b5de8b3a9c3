"""``pagesim bench``: every case in one run, medians side by side, written to JSON."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numba
import numpy as np
import torch
from pagesim.app.options import add_bench_options, bench_json, say_unused_cuda_kernel, writable_problem
from pagesim.core import compiled_core
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.errors import PagesimError
from pagesim.core.models.bench import QUICK_PLAN, ModelBenchPlan, run_model_bench
from pagesim.core.models.catalog import load_model
from pagesim.core.models.precision import DTYPE_ENV, bf16_matmul_flags, describe_dtype, resolve_dtype
from pagesim.core.models.threads import apply_chosen_threads
from pagesim.core.operations import Add, Fork, Free, Grow, Schedule, Submit
from pagesim.core.scenario import Scenario, load_shipped
from pagesim.core.studies.workload import generate
from pagesim.core.timeline import Timeline
from pagesim.kernels.atomic_write import atomic_write
from pagesim.kernels.backend import Backend, default_scale
from pagesim.kernels.cpu_backend import CpuBackend
from pagesim.kernels.cuda_bench import run_cuda_benchmarks
from pagesim.kernels.dtypes import storage_dtype
from pagesim.kernels.reference import dense_attention_batched, paged_attention_reference
from pagesim.kernels.selection import select_backend

TARGET_OPS_SECONDS = 8.0  # 100k engine operations, one core (a margin for slower VMs under 10 s)
TARGET_SCHEDULER_SECONDS = 8.0  # 10k ShareGPT-like requests through the scheduler, one core (the same)


@dataclass(frozen=True)
class KernelCase:
    name: str
    batch: int
    context: int
    num_heads: int
    head_dim: int
    block_size: int
    num_kv_heads: int | None = None
    dtype: str = "float32"
    target: float = 1.25  # paged kernel time / SDPA on contiguous K/V, at most


def kernel_cases(quick: bool) -> list[KernelCase]:
    if quick:
        return [KernelCase("quick", 2, 128, 4, 64, 16)]
    return [
        KernelCase("large", 16, 2048, 8, 128, 16, target=1.10),
        KernelCase("large-bs1", 16, 2048, 8, 128, 1, target=1.6),
        KernelCase("large-bs64", 16, 2048, 8, 128, 64, target=1.25),
        KernelCase("small", 4, 256, 8, 64, 16, target=1.25),
    ]


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def interleaved_medians(fns: list[Callable[[], object]], repeats: int, warmup: int = 2) -> list[float]:
    """Median seconds of each function, timed round-robin."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, samples, strict=True):
            started = time.perf_counter()
            fn()
            out.append(time.perf_counter() - started)
    return [statistics.median(out) for out in samples]


VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile")


def cpu_vector_flags() -> list[str]:
    """The vector extensions the CPU reports (what the kernel's compiled loops can use)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next(line.split(":", 1)[1].split() for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return [flag for flag in VECTOR_FLAGS if flag in flags]


# (vendor, family, model) -> the core generation. The VMs' model names say only "AMD EPYC"
# or "Intel Xeon", while one generation runs this Python-bound code at 0.7 of another's speed.
CPU_GENERATIONS = {
    ("AuthenticAMD", 23, 1): "Zen",
    ("AuthenticAMD", 23, 49): "Zen 2",
    ("AuthenticAMD", 25, 1): "Zen 3",
    ("AuthenticAMD", 25, 17): "Zen 4",
    ("AuthenticAMD", 25, 160): "Zen 4c",
    ("AuthenticAMD", 26, 2): "Zen 5",
    ("AuthenticAMD", 26, 17): "Zen 5c",
    ("GenuineIntel", 6, 85): "Skylake / Cascade Lake",
    ("GenuineIntel", 6, 106): "Ice Lake",
    ("GenuineIntel", 6, 143): "Sapphire Rapids",
    ("GenuineIntel", 6, 207): "Emerald Rapids",
    ("GenuineIntel", 6, 173): "Granite Rapids",
}


def cpu_identity(cpuinfo: str) -> dict:
    """The CPU's model name and its core generation, read from the first processor of
    ``/proc/cpuinfo``'s text: ``{"cpu", "cpu_generation", "cpu_family", "cpu_model"}``
    (None where the text lacks a field; the generation from the family and model numbers,
    or ``"family F, model M"`` for one not in :data:`CPU_GENERATIONS`)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # (the first processor's block ends here)
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    try:
        family, model = int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        family = model = None
    generation = None
    if family is not None:
        known = CPU_GENERATIONS.get((fields.get("vendor_id", ""), family, model))
        generation = known or f"family {family}, model {model}"
    return {"cpu": fields.get("model name"), "cpu_generation": generation, "cpu_family": family, "cpu_model": model}


def describe_cpu(info: dict) -> str:
    """``"AMD EPYC (Zen 3)"``: the model name with its generation, when known."""
    generation = info.get("cpu_generation")
    return f"{info['cpu']} ({generation})" if generation else info["cpu"]


def describe_python(info: dict) -> str:
    """``"Python 3.11.2 (/usr/bin/python3.11) · core compiled (mypyc)"``: the version, the
    interpreter it ran on, and whether the engine's step path ran compiled."""
    interpreter = info.get("python_interpreter")
    core = info.get("engine_core")
    return (
        f"Python {info['python']}" + (f" ({interpreter})" if interpreter else "") + (f" · core {core}" if core else "")
    )


def machine_info(backend: Backend) -> dict:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            identity = cpu_identity(f.read())
    except OSError:
        identity = cpu_identity("")
    identity["cpu"] = identity["cpu"] or platform.processor() or platform.machine()
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **identity,
        "cpu_flags": cpu_vector_flags(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        # Which build: this Python-bound code took 13-16 % longer on pyenv's default build of
        # CPython 3.11 (no profile-guided optimisation, no LTO) than on Debian's.
        "python_interpreter": os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
        # The step path compiled (mypyc) or its sources, and why: about 0.7x a scheduler's time.
        "engine_core": compiled_core.status.describe(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numba_threads": numba.get_num_threads(),
        "backend": backend.name,
        "device": backend.device,
    }


def bench_kernel_case(case: KernelCase, backend: Backend, repeats: int, gather_repeats: int) -> dict:
    rng = np.random.default_rng(0)
    kv_heads = case.num_kv_heads or case.num_heads
    dtype = storage_dtype(case.dtype)
    blocks_per_seq = -(-case.context // case.block_size)
    num_blocks = case.batch * blocks_per_seq
    shape = (num_blocks, case.block_size, kv_heads, case.head_dim)
    key_cache = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    value_cache = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    query = rng.standard_normal((case.batch, case.num_heads, case.head_dim), dtype=np.float32).astype(dtype)
    # A scattered table: every sequence's blocks spread over the whole pool.
    block_tables = rng.permutation(num_blocks).astype(np.int32).reshape(case.batch, blocks_per_seq)
    context_lens = np.full(case.batch, case.context, dtype=np.int32)
    scale = default_scale(case.head_dim)

    kc, vc, q = backend.to_device(key_cache), backend.to_device(value_cache), backend.to_device(query)

    def contiguous(cache: np.ndarray) -> torch.Tensor:
        gathered = cache[block_tables].reshape(case.batch, -1, kv_heads, case.head_dim)[:, : case.context]
        return torch.from_numpy(np.ascontiguousarray(gathered.transpose(0, 2, 1, 3)))

    k_dense, v_dense, q_dense = contiguous(key_cache), contiguous(value_cache), torch.from_numpy(query)

    def paged() -> None:
        backend.paged_attention(q, kc, vc, block_tables, context_lens, scale)
        backend.synchronize()

    # The machine's streaming limit, measured beside: a numpy copy of the same K/V bytes.
    copy_src = np.concatenate([key_cache.reshape(-1), value_cache.reshape(-1)])
    copy_dst = np.empty_like(copy_src)

    # Interleaved, so all see the same machine: on a shared VM memory bandwidth drifts by
    # ±20 % over seconds, which back-to-back blocks of runs would turn into a bias.
    paged_s, dense_s, copy_s = interleaved_medians(
        [
            paged,
            lambda: dense_attention_batched(q_dense, k_dense, v_dense, scale),
            lambda: np.copyto(copy_dst, copy_src),
        ],
        repeats,
    )
    gather_s = median_seconds(
        lambda: paged_attention_reference(query, key_cache, value_cache, block_tables, context_lens, scale),
        gather_repeats,
        warmup=1,
    )
    out = backend.to_numpy(backend.paged_attention(q, kc, vc, block_tables, context_lens, scale))
    ref = dense_attention_batched(q_dense.float(), k_dense.float(), v_dense.float(), scale).numpy()
    kv_bytes = 2 * case.batch * case.context * kv_heads * case.head_dim * dtype.itemsize
    return {
        **case.__dict__,
        "paged_ms": paged_s * 1e3,
        "dense_sdpa_ms": dense_s * 1e3,
        "gather_reference_ms": gather_s * 1e3,
        "paged_over_dense": paged_s / dense_s,
        "gather_over_paged": gather_s / paged_s,
        "paged_gb_per_s": kv_bytes / paged_s / 1e9,
        # A copy moves each byte twice (read, write): STREAM's copy bandwidth counts both.
        "copy_gb_per_s": 2 * kv_bytes / copy_s / 1e9,
        "paged_over_copy_bandwidth": (kv_bytes / paged_s) / (2 * kv_bytes / copy_s),
        "max_abs_error": float(np.abs(out - ref).max()),
        "meets_dense_target": paged_s / dense_s <= case.target,
        "beats_gather": paged_s < gather_s,
    }


def random_operations(count: int, seed: int = 0):
    """A stream of mostly valid add/grow/fork/free operations over a changing set of sequences."""
    rng = random.Random(seed)
    live: list[str] = []
    serial = 0
    for _ in range(count):
        r = rng.random()
        if not live or (r < 0.08 and len(live) < 64):
            serial += 1
            name = f"s{serial}"
            live.append(name)
            yield Add(name, rng.randint(1, 64))
        elif r < 0.12:
            serial += 1
            name = f"s{serial}"
            live.append(name)
            yield Fork(rng.choice(live[:-1]) if len(live) > 1 else live[0], name)
        elif r < 0.20 or len(live) > 64:
            yield Free(live.pop(rng.randrange(len(live))))
        else:
            yield Grow(rng.choice(live), rng.choice((1, 1, 1, 1, 2, 8)))


def _apply_all(sim: Simulator, ops: list) -> int:
    """Apply ``ops`` without attention; returns how many were refused."""
    refused = 0
    for op in ops:
        try:
            sim.apply(op, attend=False)
        except PagesimError:
            refused += 1
    return refused


def _serve(sim: Simulator, specs: list) -> int:
    """Requests arriving as ``specs`` say, a scheduler step each 20 ms of their clock, until
    all are done; returns the steps."""
    scheduler = sim.scheduler
    clock, step_seconds, index, steps = 0.0, 0.02, 0, 0
    while index < len(specs) or scheduler.waiting or scheduler.running or scheduler.swapped:
        while index < len(specs) and specs[index].arrival <= clock:
            spec = specs[index]
            submit = Submit(spec.request_id, spec.output_len, prompt_len=spec.prompt_len, shared_prefix=64)
            sim.apply(submit, attend=False, record=False)
            index += 1
        sim.apply(Schedule(1), attend=False, record=False)
        steps += 1
        clock += step_seconds
    return steps


def bench_engine_ops(count: int) -> dict:
    config = CacheConfig(num_blocks=4096, block_size=16, num_heads=4, num_kv_heads=2, head_dim=32, seed=1)
    # A warm-up run first (another seed): the compiled kernels load from Numba's cache on
    # first use, a one-off of the process, not a cost of each operation (the rotary table's
    # first positions are filled by it too, as by any earlier run in the process).
    _apply_all(Simulator(config, select_backend("cpu")), list(random_operations(300, seed=1)))
    sim = Simulator(config, select_backend("cpu"))
    ops = list(random_operations(count))
    started = time.perf_counter()
    refused = _apply_all(sim, ops)
    seconds = time.perf_counter() - started
    return {
        "operations": count,
        "refused": refused,
        "seconds": seconds,
        "ops_per_second": count / seconds,
        "target_seconds": TARGET_OPS_SECONDS * count / 100_000,
        "meets_target": seconds <= TARGET_OPS_SECONDS * count / 100_000,
    }


def bench_scheduler(count: int, scheduler_version: str = "v0") -> dict:
    """A seeded ShareGPT-like workload (Poisson arrivals, a 64-token shared system prompt)
    through the scheduler (vLLM v0's, or ``"v1"``'s) with prefix caching, memory management
    only (no K/V, no attention)."""
    specs = generate("sharegpt", count, rate=40.0, seed=1, shared_prefix=64)
    config = CacheConfig(
        num_blocks=4096, block_size=16, num_heads=1, head_dim=8, prefix_caching=True, max_num_seqs=256,
        scheduler=scheduler_version,
    )  # fmt: skip
    # A warm-up run first (another workload): the token model's compiled sampler loads from
    # Numba's cache on first use, a one-off of the process, not a cost of each step.
    _serve(Simulator(config, kv_data=False), generate("sharegpt", 20, rate=40.0, seed=2, shared_prefix=64))
    sim = Simulator(config, kv_data=False)
    scheduler = sim.scheduler
    started = time.perf_counter()
    steps = _serve(sim, specs)
    seconds = time.perf_counter() - started
    metrics = sim.metrics()
    return {
        "scheduler": scheduler_version,
        "requests": count,
        "decode_tokens": sum(s.output_len for s in specs),
        "scheduler_steps": steps,
        "seconds": seconds,
        "finished": scheduler.stats.finished,
        "preemptions": scheduler.stats.preemptions,
        "prefix_hit_rate": metrics.prefix_hit_rate,
        "prefix_hit_blocks": metrics.prefix_hit_blocks,
        "target_seconds": TARGET_SCHEDULER_SECONDS * count / 10_000,
        "meets_target": seconds <= TARGET_SCHEDULER_SECONDS * count / 10_000,
    }


ONE_CORE_BENCHMARKS = ("engine", "v0", "v1")


def verdict(row: dict, key: str = "meets_target") -> str:
    """A benchmark row's verdict in words, as its ``key`` says (the exit status stays 0: a
    benchmark measures; a missed target is a finding, not a failure to run)."""
    return "met" if row[key] else "MISSED"


def one_core_run(name: str, quick: bool) -> dict:
    """One run of a one-core benchmark: the engine's operations, or a scheduler's requests
    (and whether the step path ran compiled)."""
    if name == "engine":
        row = bench_engine_ops(2_000 if quick else 100_000)
    else:
        row = bench_scheduler(200 if quick else 10_000, name)
    return row | {"engine_core": compiled_core.status.describe()}


def one_core_benchmarks(quick: bool, repeats: int = 1) -> tuple[dict, dict, dict]:
    """The engine and the two schedulers, each on one core (their targets are for one).
    ``repeats`` > 1: each runs that many times, in turn (engine, v0, v1, engine, …), each
    in a fresh process, and its row gives the median seconds and every run's: this VM's
    speed swings within minutes, and a target is judged by the median. With the compiled
    core in use, each run is paired with one on the sources, in alternating order: the row
    also gives their median and the ratio, measured side by side."""
    if repeats > 1:
        runs: dict[str, list[dict]] = {name: [] for name in ONE_CORE_BENCHMARKS}
        sources: dict[str, list[dict]] = {name: [] for name in ONE_CORE_BENCHMARKS}
        paired = compiled_core.status.active
        for round_index in range(repeats):
            for name in ONE_CORE_BENCHMARKS:
                order = (False, True) if round_index % 2 == 0 else (True, False)
                for pure in order if paired else (False,):
                    (sources if pure else runs)[name].append(_fresh_one_core_run(name, quick, pure))
        return tuple(_median_row(runs[name], sources[name]) for name in ONE_CORE_BENCHMARKS)
    numba.set_num_threads(1)  # pin both thread pools while they run
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return tuple(one_core_run(name, quick) for name in ONE_CORE_BENCHMARKS)
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        torch.set_num_threads(threads)


def _fresh_one_core_run(name: str, quick: bool, pure_python: bool = False) -> dict:
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    if pure_python:  # (the step path's sources, not its compiled modules)
        env[compiled_core.PURE_PYTHON_ENV] = "1"
    command = [sys.executable, "-m", "pagesim.app.benchmarks", "--one-core-run", name, *(["--quick"] if quick else [])]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the {name} benchmark's run failed: {done.stderr.strip()[-800:]}")
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as exc:
        raise RuntimeError(f"the {name} benchmark's run printed no result ({exc}): {done.stdout[-400:]!r}") from exc


def _median_row(rows: list[dict], on_sources: list[dict] | None = None) -> dict:
    """The runs' common row with the median seconds (and the target judged by it) and every
    run's; with runs ``on_sources`` beside them, their median and the ratio too."""
    seconds = [row["seconds"] for row in rows]
    median = statistics.median(seconds)
    row = {**rows[0], "seconds": median, "runs_seconds": seconds, "meets_target": median <= rows[0]["target_seconds"]}
    if "ops_per_second" in row:
        row["ops_per_second"] = row["operations"] / median
    if on_sources:
        pure = [r["seconds"] for r in on_sources]
        row |= {
            "pure_python_seconds": statistics.median(pure),
            "pure_python_runs_seconds": pure,
            "compiled_over_pure_python": median / statistics.median(pure),
        }
    return row


TARGET_MEMORY_RATIO = 3.0  # peak memory growth over the paged cache's own bytes
MEMORY_DRIFT_LIMIT = 0.25  # growth of the bookkeeping per token held, second quarter to second half


def _status_bytes(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rss_bytes() -> int:
    return _status_bytes("VmRSS")


def peak_rss_bytes() -> int:
    """The process's resident high-water mark (every transient counts, not just samples)."""
    return _status_bytes("VmHWM")


def resident_bytes(array: np.ndarray) -> int:
    """How many of ``array``'s bytes are in RAM (Linux ``mincore``): a zero-filled cache's
    pages become resident only when first written."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    start = array.ctypes.data // page * page
    pages = (array.ctypes.data + array.nbytes - start + page - 1) // page
    flags = (ctypes.c_ubyte * pages)()
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * page), flags) != 0:
        return array.nbytes  # unknown: count it all
    return min(array.nbytes, sum(f & 1 for f in flags) * page)


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # Linux: reset VmHWM to the current RSS


def _long_plus_short() -> Scenario:
    """One 32k-token sequence beside 40 short ones, then 320 decode steps among them."""
    config = CacheConfig(
        num_blocks=2560, block_size=16, num_heads=8, num_kv_heads=8, head_dim=64, dtype="float32",
        max_model_len=40_000,
    )  # fmt: skip
    ops: list = [Add("long", 32_768)] + [Add(f"short{i}", 64) for i in range(40)]
    ops += [Grow("long" if i % 8 == 0 else f"short{i % 40}", 1) for i in range(320)]
    return Scenario("long plus short", "", config, tuple(ops))


def memory_case(name: str, snapshot_data: bool) -> dict:
    """Run in a fresh process: the resident high-water mark over a warmed-up baseline
    (kernel compiled, torch started, the scenario's token-model weights built: fixed costs
    whatever the cache's size), and RSS sampled over the steps, against the paged cache's
    bytes."""
    import gc

    backend = CpuBackend()
    scenario = load_shipped("stress") if name == "stress" else _long_plus_short()
    # Load the kernels for this dtype (write, copy-on-write, attention), start torch and build
    # the token model's weights (shared by every model of this seed and shape) on a tiny
    # scenario of the same configuration.
    warm_ops = (Add("w", 40), Fork("w", "w2"), Grow("w", 1), Grow("w2", 30), Free("w"))
    Timeline(Scenario("warm-up", "", scenario.config, warm_ops), backend).run_to_end()
    gc.collect()
    baseline = rss_bytes()
    reset_peak_rss()
    # As `pagesim run` (no K/V in snapshots, no history) or the app (both).
    timeline = Timeline(scenario, backend, snapshot_data=snapshot_data, history=snapshot_data)
    samples = []  # (step, RSS growth, of which the state's bytes, tokens held)
    every = max(1, timeline.length // 40)
    sim = timeline.sim
    reference, pool = sim.runner.dense.reference, (sim.runner.cache.key_cache, sim.runner.cache.value_cache)
    while not timeline.at_end:
        timeline.forward()
        if timeline.position % every == 0 or timeline.at_end:
            resident = sum(resident_bytes(a) for a in pool)
            tokens = sum(s.num_tokens for s in (*sim.sequences.values(), *sim.swapped.values()))
            samples.append((timeline.position, rss_bytes() - baseline, reference.nbytes + resident, tokens))
    cache = sum(a.nbytes for a in pool)
    peak = peak_rss_bytes() - baseline
    # Flat: what the run holds beyond its state (the cache's pages once written, the dense
    # reference) is the bookkeeping of the tokens it holds (ids, tables, per-sequence
    # arrays): per token held, it must not grow with the steps played.
    per_token = [(step, (g - state) / max(tokens, 1)) for step, g, state, tokens in samples]
    half = [b for step, b in per_token if step > timeline.length // 2]
    quarter = [b for step, b in per_token if timeline.length // 4 < step <= timeline.length // 2]
    drift = statistics.median(half) / statistics.median(quarter) - 1 if quarter and half else 0.0
    return {
        "case": name,
        "snapshots_keep_kv": snapshot_data,
        "steps": timeline.length,
        "paged_cache_mb": round(cache / 2**20, 2),
        "dense_reference_mb": round(reference.nbytes / 2**20, 2),
        "peak_growth_mb": round(peak / 2**20, 2),
        "ratio": round(peak / cache, 2),
        # bytes beyond the state per token held: second quarter, second half (medians)
        "overhead_per_token": [round(statistics.median(quarter)), round(statistics.median(half))]
        if quarter and half
        else [],
        "second_half_drift": round(drift, 3),  # its relative growth
        "meets_target": peak / cache <= TARGET_MEMORY_RATIO and drift <= MEMORY_DRIFT_LIMIT,
        "curve_mb": [(step, round(g / 2**20, 1)) for step, g, _, _ in samples],
    }


def bench_memory(quick: bool) -> list[dict]:
    """Each case in its own process, so one's allocations do not count in the next."""
    rows = []
    for name in ("stress",) if quick else ("stress", "long+short"):
        for snapshot_data in (False,) if quick else (False, True):
            code = (
                "import json; from pagesim.app.benchmarks import memory_case; "
                f"print(json.dumps(memory_case({name!r}, {snapshot_data})))"
            )
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return rows


def write_results(path: Path, report: dict) -> None:
    """The results as JSON ('-': standard output), atomically (an old file is replaced
    whole or not at all)."""
    text = json.dumps(report, indent=2) + "\n"
    if str(path) == "-":
        sys.stdout.write(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text)
    print(f"wrote {path}")


def _print_model_row(name: str, row) -> None:
    if name == "load":
        first, cached = row["first"], row["cached"]
        print(
            f"load: first {first['load_s']:.2f} s (empty cache: {first['cache_status']}), cached "
            f"{cached['load_s']:.2f} s (imports before it: {cached['import_s']:.2f} s); targets ≤ "
            f"{row['first_target_s']:.0f} s and ≤ {row['cached_target_s']:.0f} s"
        )
    elif name == "rss":
        print(
            f"peak RSS: {row['peak_rss_mb']:.0f} MB with {row['weights_mb']:.0f} MB of weights and "
            f"{row['kv_cache_mb']:.0f} MB of KV cache ({row['batch']} × {row['context']} tokens): "
            f"{row['over_weights_and_kv_mb']:+.0f} MB beyond them, target ≤ +{row['headroom_mb']:.0f} MB"
        )
    elif name == "threads":
        for r in row:
            busy = "the other core busy" if r["other_core_busy"] else "as the machine is"
            print(
                f"threads: a paged decode step on {r['threads']} thread{'s' if r['threads'] > 1 else ''}, {busy} "
                f"(load {r['load_average']:.1f}): {r['paged_ms']:.1f} ms"
            )
    elif name == "decode":
        print(
            f"decode: {row['batch']} sequences at context {row['context']}: paged {row['paged_ms']:.1f} ms, dense "
            f"{row['dense_ms']:.1f} ms = {row['paged_over_dense']:.3f}× (CPU time {row['paged_over_dense_cpu']:.3f}×), "
            f"target ≤ {row['target']:.2f}×; logits within {row['logits_max_abs_diff']:.1e}"
            + ("" if row["same_next_tokens"] else ", DIFFERENT next tokens")
        )
    elif name == "prefill":
        target = row["target_tokens_per_s"]
        rate = f" and ≥ {target:.0f} tokens/s" if target else ""
        print(
            f"prefill: {row['tokens']} tokens: paged {row['paged_tokens_per_s']:.0f} tokens/s, dense "
            f"{row['dense_tokens_per_s']:.0f} = {row['paged_over_dense_speed']:.3f}× the speed (CPU time "
            f"{row['paged_over_dense_speed_cpu']:.3f}×), target ≥ {row['target_speed_ratio']:.1f}×{rate}; "
            f"logits within {row['logits_max_abs_diff']:.1e}"
        )


def run_model_benchmarks(args: argparse.Namespace, path: Path) -> int:
    """``pagesim bench --model``: the real model's loads, memory, threads, decode and prefill."""
    if args.backend == "cuda":
        print("error: --model runs on the CPU backend (its dense engine is torch on the CPU)", file=sys.stderr)
        return 2
    os.environ[DTYPE_ENV] = args.dtype  # the measuring processes load the same weights
    dtype, why = resolve_dtype(args.dtype)
    threads = apply_chosen_threads()
    load_before = os.getloadavg()
    file = load_model(args.model, dtype)
    backend = CpuBackend()
    info = machine_info(backend)
    model = {
        "name": file.config.name,
        "path": str(file.path),
        "dtype": dtype,
        "dtype_choice": args.dtype,
        "dtype_why": why,
        "bf16_matmul_flags": bf16_matmul_flags(),
        "threads": threads,
        "weights_mb": file.weight_bytes / 2**20,
    }
    print(
        f"pagesim bench --model · {describe_cpu(info)} · {info['cores']} cores · load average "
        f"{load_before[0]:.1f} · {describe_python(info)}"
    )
    print(f"{model['name']} · {describe_dtype(dtype)} ({why}) · {threads} · {backend.device}")
    plan = QUICK_PLAN if args.quick else ModelBenchPlan()
    results = run_model_bench(args.model, file, backend, plan, _print_model_row)
    targets_met = {
        "load": results["load"]["meets_target"],
        "rss": results["rss"]["meets_target"],
        "decode": all(r["meets_target"] for r in results["decode"]),
        "prefill": results["prefill"]["meets_target"],
    }
    report = {
        "machine": info | {"load_average_before": load_before, "load_average_after": os.getloadavg()},
        "model": model,
        "plan": asdict(plan),
        **results,
        "targets_met": targets_met,
        "quick": args.quick,
    }
    write_results(path, report)
    return 0


def run_benchmarks(args: argparse.Namespace) -> int:
    path = bench_json(args)
    # Checked before the minutes of measuring, not after.
    if reason := writable_problem(path, "--json"):
        print(f"error: {reason}", file=sys.stderr)
        return 2
    backend = None if args.model else select_backend(args.backend, args.cuda_kernel)
    if args.repeats > 1 and (backend is None or backend.name == "cuda"):
        print(
            "error: --repeats is for the engine and scheduler benchmarks, which run with the CPU backend",
            file=sys.stderr,
        )
        return 2
    if args.model:
        say_unused_cuda_kernel(args, select_backend("cpu"))  # (the real model's benchmark runs on the CPU)
        return run_model_benchmarks(args, path)
    if backend.name == "cuda":
        write_results(path, run_cuda_benchmarks(args, backend))
        return 0
    say_unused_cuda_kernel(args, backend)
    info = machine_info(backend)
    print(f"pagesim bench · {describe_cpu(info)} · {info['cores']} cores · {backend.device} · {describe_python(info)}")
    # (--quick too times 25: with 3, every sample paid the hand-over between Numba's and
    # torch's thread pools on 2 cores, 200× the kernel's time; its one case is tiny)
    repeats, gather_repeats = (25, 1) if args.quick else (25, 3)
    kernel_rows = []
    print(f"CPU flags: {' '.join(info['cpu_flags']) or 'unknown'}")
    print(
        f"{'case':<11} {'bs':>3} {'paged ms':>9} {'SDPA ms':>8} {'gather ms':>10} {'paged/SDPA':>10} {'GB/s':>6} "
        f"{'copy GB/s':>9} {'of copy':>7}  target"
    )
    for case in kernel_cases(args.quick):
        row = bench_kernel_case(case, backend, repeats, gather_repeats)
        kernel_rows.append(row)
        print(
            f"{case.name:<11} {case.block_size:>3} {row['paged_ms']:>9.2f} {row['dense_sdpa_ms']:>8.2f} "
            f"{row['gather_reference_ms']:>10.1f} {row['paged_over_dense']:>9.2f}× {row['paged_gb_per_s']:>6.1f} "
            f"{row['copy_gb_per_s']:>9.1f} {row['paged_over_copy_bandwidth']:>6.0%}  "
            f"≤ {case.target:.2f}×: {verdict(row, 'meets_dense_target')}"
        )
    try:
        engine, scheduler, scheduler_v1 = one_core_benchmarks(args.quick, args.repeats)
    except RuntimeError as exc:  # a fresh process's run failed: its error, not a traceback of ours
        print(f"error: {exc}", file=sys.stderr)
        return 1

    def runs(row: dict) -> str:
        if args.repeats == 1:
            return ""
        said = f" (the median of {', '.join(f'{t:.2f}' for t in row['runs_seconds'])}"
        if "pure_python_seconds" in row:
            said += f"; on the sources {row['pure_python_seconds']:.2f} s, {row['compiled_over_pure_python']:.2f}×"
        return said + ")"

    print(
        f"engine: {engine['operations']} random ops (no attention, one core) in {engine['seconds']:.2f} s"
        f"{runs(engine)} ({engine['ops_per_second']:.0f} ops/s; {engine['refused']} refused), "
        f"target ≤ {engine['target_seconds']:.2f} s: {verdict(engine)}"
    )
    for row in (scheduler, scheduler_v1):
        print(
            f"scheduler {row['scheduler']}: {row['requests']} ShareGPT-like requests with prefix caching (no "
            f"attention, one core) in {row['seconds']:.2f} s{runs(row)} ({row['scheduler_steps']} steps, "
            f"{row['preemptions']} preemptions, prefix hit rate {row['prefix_hit_rate']:.0%}), "
            f"target ≤ {row['target_seconds']:.2f} s: {verdict(row)}"
        )
    memory = bench_memory(args.quick)
    for row in memory:
        mode = "snapshots keep K/V (the app)" if row["snapshots_keep_kv"] else "no K/V in snapshots (pagesim run)"
        print(
            f"memory: {row['case']}, {mode}: peak growth {row['peak_growth_mb']:.1f} MB = {row['ratio']:.2f}× the "
            f"{row['paged_cache_mb']:.1f} MB paged cache over {row['steps']} steps (beyond the state "
            f"{row['overhead_per_token']} B per token held, second quarter → second half: "
            f"{row['second_half_drift']:+.0%}), target ≤ {TARGET_MEMORY_RATIO:.0f}× and ≤ {MEMORY_DRIFT_LIMIT:+.0%}: "
            f"{verdict(row)}"
        )
    report = {
        "machine": info,
        "kernel": kernel_rows,
        "engine": engine,
        "scheduler": scheduler,
        "scheduler_v1": scheduler_v1,
        "memory": memory,
        "quick": args.quick,
    }
    write_results(path, report)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m pagesim.app.benchmarks", description="pagesim bench without the CLI"
    )
    add_bench_options(parser)
    # (a fresh process's one run for --repeats: its row as one JSON line)
    parser.add_argument("--one-core-run", choices=ONE_CORE_BENCHMARKS, help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.one_core_run:
        print(json.dumps(one_core_run(parsed.one_core_run, parsed.quick)))
        sys.exit(0)
    sys.exit(run_benchmarks(parsed))
