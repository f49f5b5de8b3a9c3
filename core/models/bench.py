"""The real model's speed and memory: the paged engine (the Llama runner's forward, what its
``paged_seconds`` times: every layer's K/V written into its blocks, the paged decode or
prefill kernel through the block tables; the dense engine's check left out) against the
dense engine (the same weights, each sequence's K/V contiguous, torch's SDPA), timed
alternately in one process; model loads and the resident high-water mark in fresh
processes. ``pagesim bench --model`` prints and writes what these return.

Both engines start from the same context: one real prompt prefilled once by the paged
engine, its blocks copied to every other sequence's (each sequence's scattered over the
pool by a seeded permutation), the same K/V read back into every row of the dense batch.
A timed decode step writes the token after it (the same slot every repeat), so each
repeat does the same work."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numba
import numpy as np
import torch
from pagesim.core.config import CacheConfig
from pagesim.core.llama_runner import LlamaRunner
from pagesim.core.models.catalog import load_model
from pagesim.core.models.gguf_loader import CACHE_ENV, ModelFile
from pagesim.core.models.llama import DenseBatchKVCache, DenseKVCache, DenseLlamaEngine
from pagesim.core.models.threads import apply_chosen_threads, set_threads
from pagesim.core.sequence import Sequence
from pagesim.kernels.backend import Backend
from pagesim.kernels.cpu_backend import CpuBackend

DECODE_TARGET = 1.10  # paged decode step time / dense, at most
PREFILL_TARGET = 0.9  # paged prefill speed / dense, at least
PREFILL_TOKENS_PER_S = 400.0  # with bf16 weights, at least
FIRST_LOAD_TARGET_S = 10.0
CACHED_LOAD_TARGET_S = 2.0
RSS_HEADROOM_MB = 400.0  # peak RSS ≤ weights + KV cache + this

# A prompt's worth of real text, repeated to the context's length.
CONTEXT_TEXT = (
    "The PagedAttention algorithm stores the key and value cache of each sequence in fixed-size "
    "blocks that need not be contiguous in memory. A block table maps each sequence's logical "
    "blocks to physical ones, so memory is allocated on demand and shared between sequences that "
    "have a common prefix. During decoding, the kernel reads the keys and values of every block "
    "in the table and computes attention for the newest token of each sequence. "
)


@dataclass(frozen=True)
class ModelBenchPlan:
    batches: tuple[int, ...] = (8, 32)
    context: int = 512  # tokens each decode step attends to (the new one included)
    prefill_tokens: int = 512
    decode_repeats: int = 15
    prefill_repeats: int = 5
    thread_batch: int = 8
    thread_repeats: int = 9
    block_size: int = 16


QUICK_PLAN = ModelBenchPlan(
    batches=(2,), context=40, prefill_tokens=40, decode_repeats=2, prefill_repeats=1, thread_batch=2, thread_repeats=1
)


@dataclass(frozen=True)
class Timing:
    wall: float  # median seconds, wall clock (what the targets are stated in)
    cpu: float  # median CPU seconds of this process: what the work took whatever else ran


def alternated_medians(fns: list[Callable[[], object]], repeats: int, warmup: int = 1) -> list[Timing]:
    """Each function's medians, timed in turn (A, B, A, B: drift hits both alike). On a
    machine others share, wall time includes waiting for a core; CPU time does not."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    walls: list[list[float]] = [[] for _ in fns]
    cpus: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, wall, cpu in zip(fns, walls, cpus, strict=True):
            started, started_cpu = time.perf_counter(), time.process_time()
            fn()
            wall.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
    return [Timing(statistics.median(w), statistics.median(c)) for w, c in zip(walls, cpus, strict=True)]


def context_ids(file: ModelFile, count: int) -> list[int]:
    ids = file.tokenizer.encode(CONTEXT_TEXT)
    return (ids * (count // len(ids) + 1))[:count]


def paged_runner(file: ModelFile, backend: Backend, num_blocks: int, block_size: int) -> LlamaRunner:
    """The Llama runner over an fp32 pool of ``num_blocks``, its per-layer check off (the
    check is the dense engine's business, timed on its own)."""
    c = file.config
    config = CacheConfig(
        num_blocks, block_size, c.num_heads, c.head_dim, c.num_kv_heads, dtype="float32", model=str(file.path)
    )
    runner = LlamaRunner(config, backend, file)
    runner.check_layers = False
    return runner


def slots_of(table: list[int], positions, block_size: int) -> np.ndarray:
    return np.array([table[p // block_size] * block_size + p % block_size for p in positions], np.int64)


class PagedDecode:
    """``batch`` sequences that each hold the same ``context - 1`` tokens' K/V in their own
    scattered blocks (as if each had prefilled the prompt), and the decode step that adds
    one token to each (paged) — and, with ``dense``, the same step through the dense
    engine."""

    def __init__(self, file: ModelFile, backend: Backend, batch: int, context: int, block_size: int, dense: bool):
        rng = np.random.default_rng(batch)
        blocks_each = -(-context // block_size)
        self.runner = runner = paged_runner(file, backend, batch * blocks_each, block_size)
        self.llama = runner.llama
        self.held = held = context - 1
        ids = context_ids(file, held)
        tables = rng.permutation(batch * blocks_each).reshape(batch, blocks_each).tolist()
        self.seqs = [Sequence(f"s{b}", token_ids=ids, block_table=tables[b]) for b in range(batch)]
        for seq in self.seqs:
            runner.add_sequence(seq.seq_id)
            # The runner's own dense rows go: the paged forward never reads them, and this
            # benchmark's dense engine is its own (they would be 3 MB a sequence of waste).
            runner.reference.free(seq.seq_id)
        # The context: one paged prefill, its blocks copied to every other sequence's.
        first = self.seqs[0]
        runner._forward([(first, 0, ids)], slots_of(first.block_table, range(held), block_size), 0)
        for cache in runner.caches:
            for seq in self.seqs[1:]:
                for src, dst in zip(first.block_table, seq.block_table, strict=True):
                    cache.copy_block(src, dst)
        self.new_tokens = [ids[(7 * b) % held] for b in range(batch)]
        self.computed = [(seq, held, [t]) for seq, t in zip(self.seqs, self.new_tokens, strict=True)]
        self.slots = np.array([slots_of(s.block_table, [held], block_size)[0] for s in self.seqs], np.int64)
        self.dense_cache = None
        if dense:  # the same K/V, read back from the pool: (layers, kv heads, tokens, head dim)
            stored = [cache.read_sequence(first.block_table, held) for cache in runner.caches]
            keys = torch.stack([torch.from_numpy(k).transpose(0, 1) for k, _ in stored])
            values = torch.stack([torch.from_numpy(v).transpose(0, 1) for _, v in stored])
            self.dense_cache = DenseBatchKVCache(file.config, batch, capacity=context, device=self.llama.device)
            self.dense_cache.fill(keys, values)
        self.dense_logits: torch.Tensor | None = None

    def paged_step(self) -> None:
        self.runner._forward(self.computed, self.slots, 0)

    def dense_step(self) -> None:
        self.dense_cache.length = self.held
        ids = torch.tensor(self.new_tokens)
        positions = torch.full((len(self.new_tokens),), self.held)
        # (to the host, as the paged step's: on a GPU that also waits for the step to end)
        self.dense_logits = self.llama.logits(self.llama.forward(ids, positions, self.dense_cache)).cpu()

    def paged_logits(self) -> torch.Tensor:
        return torch.stack([self.runner.model.logits[s.seq_id] for s in self.seqs])

    @property
    def kv_cache_bytes(self) -> int:
        return sum(c.key_cache.nbytes + c.value_cache.nbytes for c in self.runner.caches)


def agreement(paged: torch.Tensor, dense: torch.Tensor) -> dict:
    return {
        "logits_max_abs_diff": float((paged - dense).abs().max()),
        "same_next_tokens": bool((paged.argmax(-1) == dense.argmax(-1)).all()),
    }


def bench_decode(file: ModelFile, backend: Backend, batch: int, plan: ModelBenchPlan) -> dict:
    step = PagedDecode(file, backend, batch, plan.context, plan.block_size, dense=True)
    paged, dense = alternated_medians([step.paged_step, step.dense_step], plan.decode_repeats)
    ratio = paged.wall / dense.wall
    return {
        "batch": batch,
        "context": plan.context,
        "paged_ms": paged.wall * 1e3,
        "dense_ms": dense.wall * 1e3,
        "paged_over_dense": ratio,
        "paged_cpu_ms": paged.cpu * 1e3,
        "dense_cpu_ms": dense.cpu * 1e3,
        "paged_over_dense_cpu": paged.cpu / dense.cpu,
        "paged_tokens_per_s": batch / paged.wall,
        "target": DECODE_TARGET,
        "meets_target": ratio <= DECODE_TARGET,
        "kv_cache_mb": step.kv_cache_bytes / 2**20,
        **agreement(step.paged_logits(), step.dense_logits),
    }


def bench_prefill(file: ModelFile, backend: Backend, plan: ModelBenchPlan) -> dict:
    tokens, bs = plan.prefill_tokens, plan.block_size
    blocks = -(-tokens // bs)
    runner = paged_runner(file, backend, blocks, bs)
    table = np.random.default_rng(0).permutation(blocks).tolist()
    seq = Sequence("p", block_table=table)
    runner.add_sequence("p")
    ids = context_ids(file, tokens)
    computed, slots = [(seq, 0, ids)], slots_of(table, range(tokens), bs)
    engine = DenseLlamaEngine(runner.llama)
    dense_cache = DenseKVCache(file.config, capacity=tokens, device=runner.llama.device)
    dense_logits = []

    def dense() -> None:
        dense_cache.length = 0
        dense_logits[:] = [engine.step(dense_cache, ids).cpu()]

    paged, dense = alternated_medians([lambda: runner._forward(computed, slots, 0), dense], plan.prefill_repeats)
    paged_rate, dense_rate = tokens / paged.wall, tokens / dense.wall
    return {
        "tokens": tokens,
        "paged_ms": paged.wall * 1e3,
        "dense_ms": dense.wall * 1e3,
        "paged_tokens_per_s": paged_rate,
        "dense_tokens_per_s": dense_rate,
        "paged_over_dense_speed": paged_rate / dense_rate,
        "paged_cpu_ms": paged.cpu * 1e3,
        "dense_cpu_ms": dense.cpu * 1e3,
        "paged_over_dense_speed_cpu": dense.cpu / paged.cpu,
        "target_speed_ratio": PREFILL_TARGET,
        "target_tokens_per_s": PREFILL_TOKENS_PER_S if file.dtype == "bfloat16" else None,
        "meets_target": paged_rate / dense_rate >= PREFILL_TARGET
        and (file.dtype != "bfloat16" or paged_rate >= PREFILL_TOKENS_PER_S),
        **agreement(runner.model.logits["p"][None], dense_logits[0][None]),
    }


class Burner:
    """A process that keeps one core busy (``while True: pass``) while it is open."""

    def __enter__(self) -> Burner:
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.2)  # let it start spinning
        return self

    def __exit__(self, *exc) -> None:
        self.process.kill()
        self.process.wait()


def bench_threads(file: ModelFile, backend: Backend, plan: ModelBenchPlan, counts=(1, 2)) -> list[dict]:
    """A paged decode step at each thread count (torch and Numba alike), with the machine
    as it is and with one core kept busy by another process. The counts alternate; after
    each switch one untimed step lets the pools settle."""
    step = PagedDecode(file, backend, plan.thread_batch, plan.context, plan.block_size, dense=False)

    def medians() -> list[float]:
        samples: list[list[float]] = [[] for _ in counts]
        for _ in range(plan.thread_repeats):
            for count, out in zip(counts, samples, strict=True):
                set_threads(count)
                step.paged_step()  # (untimed: the pools settle after a switch)
                started = time.perf_counter()
                step.paged_step()
                out.append(time.perf_counter() - started)
        return [statistics.median(s) for s in samples]

    rows = []
    for busy in (False, True):
        load = os.getloadavg()[0]
        if busy:
            with Burner():
                times = medians()
        else:
            times = medians()
        for count, seconds in zip(counts, times, strict=True):
            rows.append({"threads": count, "other_core_busy": busy, "load_average": load, "paged_ms": seconds * 1e3})
    return rows


LOAD_SCRIPT = """
import json, sys, time
started = time.perf_counter()
from pagesim.core.models import Llama
from pagesim.core.models.catalog import load_model
imported = time.perf_counter()
file = load_model(sys.argv[1], sys.argv[2])
Llama(file.config, file.weights)
done = time.perf_counter()
print(json.dumps({"import_s": imported - started, "load_s": done - imported, "cache_status": file.cache_status,
                  "seconds": file.seconds, "weights_mb": file.weight_bytes / 2**20}))
"""


def _run_json(code: str, args: list[str], env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the measuring process failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_load(model: str, dtype: str, cache_dir: str) -> dict:
    """A first load into the empty cache folder ``cache_dir``, then a cached one, each in a
    fresh process (the load: hash, read or map, the Llama built on the weights; the imports
    before it timed apart)."""
    env = os.environ | {CACHE_ENV: cache_dir}
    first = _run_json(LOAD_SCRIPT, [model, dtype], env)
    cached = _run_json(LOAD_SCRIPT, [model, dtype], env)
    return {
        "first": first,
        "cached": cached,
        "first_target_s": FIRST_LOAD_TARGET_S,
        "cached_target_s": CACHED_LOAD_TARGET_S,
        "meets_target": first["load_s"] <= FIRST_LOAD_TARGET_S and cached["load_s"] <= CACHED_LOAD_TARGET_S,
    }


RSS_SCRIPT = """
import json, sys
from pagesim.core.models.bench import ModelBenchPlan, rss_run
plan = ModelBenchPlan(**json.loads(sys.argv[3]))
print(json.dumps(rss_run(sys.argv[1], sys.argv[2], plan)))
"""


def peak_rss_bytes() -> int:
    """This process's resident high-water mark: Linux's VmHWM, which starts afresh at exec.
    (``getrusage``'s ru_maxrss does not: exec carries over the high-water mark of the address
    space it replaces, so a child of a 2 GB benchmark read 2 GB, whatever it used itself.)"""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # (no /proc: kilobytes on Linux)


def rss_run(model: str, dtype: str, plan: ModelBenchPlan) -> dict:
    """In a fresh process: load the model, decode steps of the largest batch at the context
    and one prefill through the paged engine alone; the resident high-water mark."""
    apply_chosen_threads()
    file = load_model(model, dtype)
    backend = CpuBackend()
    step = PagedDecode(file, backend, max(plan.batches), plan.context, plan.block_size, dense=False)
    for _ in range(3):
        step.paged_step()
    kv_bytes = step.kv_cache_bytes
    del step
    blocks = -(-plan.prefill_tokens // plan.block_size)
    runner = paged_runner(file, backend, blocks, plan.block_size)
    table = list(range(blocks))
    runner.add_sequence("p")
    ids = context_ids(file, plan.prefill_tokens)
    runner._forward([(Sequence("p", block_table=table), 0, ids)], slots_of(table, range(len(ids)), plan.block_size), 0)
    peak = peak_rss_bytes()
    weights = file.weight_bytes
    budget = weights + kv_bytes + RSS_HEADROOM_MB * 2**20
    return {
        "batch": max(plan.batches),
        "context": plan.context,
        "peak_rss_mb": peak / 2**20,
        "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # (inherits the parent's)
        "weights_mb": weights / 2**20,
        "kv_cache_mb": kv_bytes / 2**20,
        "headroom_mb": RSS_HEADROOM_MB,
        "budget_mb": budget / 2**20,
        "over_weights_and_kv_mb": (peak - weights - kv_bytes) / 2**20,
        "meets_target": peak <= budget,
    }


def bench_rss(model: str, dtype: str, plan: ModelBenchPlan, cache_dir: str | None = None) -> dict:
    env = os.environ if cache_dir is None else os.environ | {CACHE_ENV: cache_dir}
    return _run_json(RSS_SCRIPT, [model, dtype, json.dumps(asdict(plan))], env)


def run_model_bench(
    model: str,
    file: ModelFile,
    backend: Backend,
    plan: ModelBenchPlan,
    progress: Callable[[str, dict | list], None] = lambda name, row: None,
) -> dict:
    """Every measurement: loads (fresh processes, a temporary cache folder), thread counts,
    decode and prefill with the threads as they were, then peak RSS in a fresh process (last:
    the kernels are compiled and cached by then, as on every run but the first)."""
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="pagesim-model-cache-") as cache_dir:
        results["load"] = bench_load(model, file.dtype, cache_dir)
        progress("load", results["load"])
        torch_threads, numba_threads = torch.get_num_threads(), numba.get_num_threads()
        try:
            results["threads"] = bench_threads(file, backend, plan)
        finally:
            torch.set_num_threads(torch_threads)
            numba.set_num_threads(numba_threads)
        progress("threads", results["threads"])
        results["decode"] = []
        for batch in plan.batches:
            results["decode"].append(bench_decode(file, backend, batch, plan))
            progress("decode", results["decode"][-1])
        results["prefill"] = bench_prefill(file, backend, plan)
        progress("prefill", results["prefill"])
        results["rss"] = bench_rss(model, file.dtype, plan, cache_dir)
        progress("rss", results["rss"])
    return results
