"""Where KV-cache memory goes: the paged allocator against contiguous ones.

The vLLM paper (Kwon et al., SOSP 2023, §2.3 and Fig. 2) splits the KV memory of a
serving system into token states (KV of tokens that exist), reservation (slots held for
tokens a request will generate later), internal fragmentation (slots held that it will
never use) and external fragmentation (free memory cut into holes too small to place
the next request). It compares vLLM's paging with Orca under three reservation rules:

- Orca-Max: every request reserves the model's max length;
- Orca-Pow2: the prompt plus the next power of two of its output length;
- Orca-Oracle: exactly its final length (it knows the future).

This module replays one workload through a first-come-first-served batch scheduler for
each allocator — contiguous ones place each reservation first-fit in a linear address
space, the paged one takes whole blocks on demand — and accounts every slot at every
step. Shares are of the whole pool, averaged over the steps where a request was waiting
(under load: the pool, or the cap on running requests, held it back), as in the paper's
measurement under load.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field, replace

from pagesim.core.checks import is_count
from pagesim.core.errors import InvalidStudyError
from pagesim.core.studies.serving_time import GIB, GpuSpec, ModelShape, pool_blocks
from pagesim.core.studies.workload import RequestSpec, generate

ALLOCATORS = ("paged", "orca-oracle", "orca-pow2", "orca-max")
CATEGORIES = ("token_states", "reservation", "internal_fragmentation", "external_fragmentation", "free")
# Short names for tables and legends.
CATEGORY_LABELS = {
    "token_states": "tokens",
    "reservation": "reserved",
    "internal_fragmentation": "internal frag.",
    "external_fragmentation": "external frag.",
    "free": "free",
}


STEP_SECONDS = 0.02  # one decode iteration of a mid-sized model
MAX_STEPS = 2_000_000  # a replay longer than this would take minutes: refused up front


def steps_bound(workload: list[RequestSpec]) -> int:
    """An upper bound on the steps a replay of ``workload`` takes on a pool that holds each
    request: the steps until the last arrival, plus two per token to decode and per request
    (a step with a request running decodes at least one token, unless it preempted them
    all, and then the next one does)."""
    last = max((s.arrival for s in workload), default=0.0)
    return int(last / STEP_SECONDS) + 1 + 2 * sum(s.output_len + 1 for s in workload)


class ReplayTooLongError(InvalidStudyError):
    """A workload whose replay would take too many steps; ``cause``: "arrivals" (spread
    over too long a time) or "outputs" (too many tokens to decode)."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


def check_bounded(workload: list[RequestSpec]) -> None:
    """Refuse a workload whose replay would take more than :data:`MAX_STEPS` steps (a
    vanishing arrival rate spreads a few requests over years of simulated time; many long
    outputs take as long to decode), naming whichever of the two it is."""
    bound = steps_bound(workload)
    if bound <= MAX_STEPS:
        return
    last = max(s.arrival for s in workload)
    arriving = int(last / STEP_SECONDS) + 1
    if arriving >= bound - arriving:
        raise ReplayTooLongError(
            f"the requests arrive over {last:.3g} s: about {bound:.3g} steps of {STEP_SECONDS * 1e3:.0f} ms to "
            f"replay (at most {MAX_STEPS:,}); raise the arrival rate or send fewer requests",
            "arrivals",
        )
    tokens = sum(s.output_len for s in workload)
    raise ReplayTooLongError(
        f"{len(workload):,} requests decode {tokens:,} tokens: up to about {bound:.3g} steps to replay (at most "
        f"{MAX_STEPS:,}); send fewer requests or shorter outputs",
        "outputs",
    )


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def reservation(allocator: str, spec: RequestSpec, max_len: int) -> int:
    final = spec.prompt_len + spec.output_len
    if allocator == "orca-max":
        return max_len
    if allocator == "orca-pow2":
        return min(max_len, spec.prompt_len + next_pow2(spec.output_len))
    return final  # orca-oracle


class FirstFit:
    """A linear address space with first-fit placement; freed ranges merge with neighbours."""

    def __init__(self, size: int) -> None:
        self.starts, self.sizes = [0], [size]  # free holes, sorted by start

    def allocate(self, size: int) -> int | None:
        for i, hole in enumerate(self.sizes):
            if hole >= size:
                start = self.starts[i]
                if hole == size:
                    del self.starts[i], self.sizes[i]
                else:
                    self.starts[i] += size
                    self.sizes[i] -= size
                return start
        return None

    def free(self, start: int, size: int) -> None:
        i = bisect.bisect(self.starts, start)
        self.starts.insert(i, start)
        self.sizes.insert(i, size)
        if i + 1 < len(self.starts) and self.starts[i] + self.sizes[i] == self.starts[i + 1]:
            self.sizes[i] += self.sizes.pop(i + 1)
            self.starts.pop(i + 1)
        if i > 0 and self.starts[i - 1] + self.sizes[i - 1] == self.starts[i]:
            self.sizes[i - 1] += self.sizes.pop(i)
            self.starts.pop(i)

    @property
    def largest_hole(self) -> int:
        return max(self.sizes, default=0)


@dataclass
class WasteReport:
    allocator: str
    pool_slots: int
    steps: int = 0  # all simulated steps
    loaded_steps: int = 0  # steps with a request waiting: what the shares average over
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    finished: int = 0
    peak_batch: int = 0
    per_step: list[dict[str, int]] = field(default_factory=list)

    @property
    def shares(self) -> dict[str, float]:
        if not self.loaded_steps:
            return dict.fromkeys(CATEGORIES, 0.0)
        return {k: v / (self.loaded_steps * self.pool_slots) for k, v in self.totals.items()}

    @property
    def token_share_of_allocated(self) -> float:
        """Token states as a share of the memory the allocator handed out (excluding free)."""
        allocated = sum(v for k, v in self.totals.items() if k not in ("free", "external_fragmentation"))
        return self.totals["token_states"] / allocated if allocated else 0.0

    def as_dict(self) -> dict:
        return {
            "allocator": self.allocator,
            "pool_slots": self.pool_slots,
            "steps": self.steps,
            "loaded_steps": self.loaded_steps,
            "finished": self.finished,
            "peak_batch": self.peak_batch,
            # (no loaded step: no average to give; null, as the table's "—", not a share of 0)
            "shares": self.shares if self.loaded_steps else dict.fromkeys(CATEGORIES),
            "token_share_of_allocated": self.token_share_of_allocated if self.loaded_steps else None,
        }


def simulate(
    allocator: str,
    workload: list[RequestSpec],
    pool_slots: int,
    *,
    block_size: int = 16,
    max_len: int = 2048,
    max_batch: int = 256,
    keep_steps: bool = False,
) -> WasteReport:
    """Replay ``workload`` (all arrivals honoured, one decode token per running request per
    step) through ``allocator`` and account each slot of a ``pool_slots`` pool."""
    if allocator not in ALLOCATORS:
        raise InvalidStudyError(f"unknown allocator {allocator!r}; expected one of {', '.join(ALLOCATORS)}")
    if not (is_count(pool_slots) and is_count(block_size) and is_count(max_len) and is_count(max_batch)):
        raise InvalidStudyError(
            f"pool_slots, block_size, max_len and max_batch must be positive integers; got "
            f"{pool_slots}, {block_size}, {max_len}, {max_batch}"
        )
    if pool_slots < max_len:
        raise InvalidStudyError(f"a pool of {pool_slots} slots cannot hold one max-length ({max_len}) request")
    longest = max((s.prompt_len + s.output_len for s in workload), default=0)
    if longest > max_len:
        raise InvalidStudyError(f"a request of {longest} tokens is longer than max_len ({max_len})")
    if -(-max_len // block_size) > pool_slots // block_size:
        raise InvalidStudyError(
            f"a max-length ({max_len}) request needs {-(-max_len // block_size)} blocks of {block_size} slots; "
            f"the pool has {pool_slots // block_size}"
        )
    check_bounded(workload)
    limit = steps_bound(workload)
    report = WasteReport(allocator, pool_slots)
    pending = deque(sorted(workload, key=lambda s: s.arrival))
    waiting: deque[RequestSpec] = deque()
    running: list[list] = []  # [spec, length, reserved slots, start (contiguous) or None]
    space = FirstFit(pool_slots)
    free_blocks = pool_slots // block_size
    clock, step_seconds = 0.0, STEP_SECONDS
    paged = allocator == "paged"
    counted: set[str] = set()
    while pending or waiting or running:
        while pending and pending[0].arrival <= clock:
            waiting.append(pending.popleft())
        # Admit first come, first served; the head blocks the queue when it does not fit.
        while waiting and len(running) < max_batch:
            spec = waiting[0]
            if paged:
                need = -(-spec.prompt_len // block_size)
                if need > free_blocks:
                    break
                free_blocks -= need
                running.append([spec, spec.prompt_len, need * block_size, None])
            else:
                size = reservation(allocator, spec, max_len)
                start = space.allocate(size)
                if start is None:
                    break
                running.append([spec, spec.prompt_len, size, start])
            waiting.popleft()
        report.peak_batch = max(report.peak_batch, len(running))
        # Account this step's memory.
        tokens = sum(r[1] for r in running)
        if paged:
            held = sum(r[2] for r in running)
            parts = {
                "token_states": tokens,
                "reservation": 0,
                "internal_fragmentation": held - tokens,
                "external_fragmentation": 0,
            }
        else:
            finals = [r[0].prompt_len + r[0].output_len for r in running]
            future = sum(min(r[2], f) - r[1] for r, f in zip(running, finals, strict=True))
            never = sum(max(0, r[2] - f) for r, f in zip(running, finals, strict=True))
            held = sum(r[2] for r in running)
            free_total = pool_slots - held
            # The head waits on holes only when the batch has room (a full batch is the limit, not
            # memory) and the free memory as a whole would hold it: admission found no hole for it.
            blocked = (
                bool(waiting) and len(running) < max_batch and reservation(allocator, waiting[0], max_len) <= free_total
            )
            parts = {
                "token_states": tokens,
                "reservation": future,
                "internal_fragmentation": never,
                # Free memory the next request would fit in, were it not cut into holes.
                "external_fragmentation": free_total if blocked else 0,
            }
        parts["free"] = pool_slots - sum(parts.values())
        report.steps += 1
        if waiting:
            report.loaded_steps += 1
            for k, v in parts.items():
                report.totals[k] += v
        if keep_steps:
            report.per_step.append(parts)
        # Paged: a decode step that cannot get its blocks preempts the newest requests
        # (recompute: their tokens so far come back as a longer prompt).
        if paged:
            while running and sum(1 for r in running if r[1] + 1 > r[2]) > free_blocks:
                victim = running.pop()
                free_blocks += victim[2] // block_size
                spec = victim[0]
                done = victim[1] - spec.prompt_len
                waiting.appendleft(replace(spec, prompt_len=victim[1], output_len=spec.output_len - done))
        # Decode one token each; finish and release.
        still = []
        for r in running:
            spec = r[0]
            r[1] += 1
            if paged and r[1] > r[2]:
                free_blocks -= 1
                r[2] += block_size
            if r[1] >= spec.prompt_len + spec.output_len:
                report.finished += spec.request_id not in counted
                counted.add(spec.request_id)
                if paged:
                    free_blocks += r[2] // block_size
                else:
                    space.free(r[3], r[2])
                continue
            still.append(r)
        running = still
        clock += step_seconds
        if report.steps > limit:  # cannot happen for a workload that passed the checks above
            raise RuntimeError(f"the {allocator} replay did not finish within {limit} steps")
    return report


def compare(workload: list[RequestSpec], pool_slots: int, **kw) -> list[WasteReport]:
    return [simulate(a, workload, pool_slots, **kw) for a in ALLOCATORS]


@dataclass(frozen=True)
class WastePool:
    """The pool a waste study replays on, and where its size comes from (said with the result)."""

    slots: int
    block_size: int
    source: str  # e.g. "A100-40GB after LLaMA-13B's weights: 11.8 GiB"

    @property
    def blocks(self) -> int:
        return self.slots // self.block_size

    def describe(self) -> str:
        return f"{self.slots} slots ({self.blocks} blocks of {self.block_size}) · {self.source}"


def pool_from_preset(shape: ModelShape, spec: GpuSpec, block_size: int = 16) -> WastePool:
    """The KV pool a ``shape`` model leaves on ``spec``: vLLM's share of its memory less the weights."""
    blocks = pool_blocks(shape, spec, block_size)
    gib = blocks * block_size * shape.kv_bytes_per_token / GIB
    return WastePool(blocks * block_size, block_size, f"{spec.name} after {shape.name}'s weights: {gib:.1f} GiB of K/V")


def pool_of_blocks(blocks: int, block_size: int = 16, source: str = "") -> WastePool:
    return WastePool(blocks * block_size, block_size, source or f"{blocks} blocks, as given")


@dataclass(frozen=True)
class AllocatorShares:
    """One allocator's split of the pool (shares by category, they sum to 1)."""

    allocator: str
    shares: dict[str, float]
    peak_batch: int


@dataclass(frozen=True)
class WasteStudy:
    """Where KV memory goes for a seeded workload on one pool: paging against the contiguous
    allocators, as the app's Waste tab shows it."""

    distribution: str
    count: int
    slots: int
    allocators: tuple[AllocatorShares, ...]
    pool: str = ""  # which pool it used and where its size comes from


def study(
    distribution: str, count: int, slots: int, block_size: int, max_len: int, pool: WastePool | None = None
) -> WasteStudy:
    """The study on ``pool`` if given (a preset's or an explicit size), else on ``slots``
    (a scenario's own pool)."""
    if pool is None:
        pool = WastePool(slots, block_size, "the scenario's pool")
    workload = generate(distribution, count, rate=2000.0, seed=0, max_len=max_len)
    reports = compare(workload, pool.slots, block_size=pool.block_size, max_len=max_len)
    rows = tuple(AllocatorShares(r.allocator, dict(r.shares), r.peak_batch) for r in reports)
    return WasteStudy(distribution, count, pool.slots, rows, pool.describe())
