"""The simulated serving engine: validates operations, has the block manager and the KV
cache carry them out, runs attention, and emits events.

Every operation is checked against the current state first (raising a
:class:`~core.errors.PagesimError` if it cannot be done) and only then applied, so a
refused operation leaves the pool, the tables and the KV data exactly as they were.

Who owns what: :class:`~core.block_manager.BlockManager` the blocks (pool, holders,
fills, CPU pool, usage counters); :class:`~core.kv_cache.PagedKVCache` the K/V data on
the backend, and :class:`~core.kv_cache.SwapSpace` the swapped K/V on the host;
:class:`~core.dense_check.DenseCheck` the contiguous reference and the dense outputs;
:class:`~core.scheduler.Scheduler` the request queues. The ``Simulator`` holds the
sequence registry and the query of each sequence's newest token.
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass, replace

import numpy as np
from pagesim.core import events as ev
from pagesim.core.block_manager import BlockManager, BlockManagerSnapshot
from pagesim.core.config import CacheConfig
from pagesim.core.dense_check import DenseCheck, DenseCheckSnapshot, RowStack
from pagesim.core.errors import (
    DuplicateSequenceError,
    InvalidOperationError,
    InvalidPlacementError,
    OutOfMemoryError,
    PoolExhaustedError,
    UnknownSequenceError,
)
from pagesim.core.events import EventLog
from pagesim.core.kv_cache import CacheCheckpoint, PagedKVCache, SwapSpace
from pagesim.core.metrics import Metrics
from pagesim.core.operations import Add, Fork, Free, Grow, Operation, Schedule, Submit
from pagesim.core.scheduler import Scheduler, SchedulerSnapshot
from pagesim.core.sequence import Sequence, SequenceSnapshot
from pagesim.core.token_model import TokenModel, check_vocab
from pagesim.kernels.backend import Backend, default_scale, host_memory_available
from pagesim.kernels.dtypes import storage_dtype
from pagesim.kernels.selection import select_backend


@dataclass(frozen=True)
class AttentionReport:
    """One decode step over every live sequence: the kernel's inputs, its output and dense's."""

    backend: str
    device: str
    seq_ids: tuple[str, ...]
    query: np.ndarray  # (num_seqs, num_heads, head_dim), cache dtype
    block_tables: np.ndarray  # (num_seqs, max_blocks) int32
    context_lens: np.ndarray  # (num_seqs,) int32
    scale: float
    output: np.ndarray  # (num_seqs, num_heads, head_dim) float32, the paged kernel's
    dense: np.ndarray  # same shape, dense SDPA on the same tokens
    tolerances: np.ndarray  # (num_seqs, num_heads): what rounding explains (core.dense_check.error_bounds)
    kernel_seconds: float
    dense_seconds: float
    block_size: int

    def table_of(self, row: int) -> tuple[int, ...]:
        """The physical blocks the kernel read for sequence ``row``, in logical order."""
        used = -(-int(self.context_lens[row]) // self.block_size)
        return tuple(self.block_tables[row, :used].tolist())

    def events(self) -> tuple[ev.Event, ...]:
        """A lookup and a check per sequence, then the launch: what the animation and the
        event log show of the step's attention."""
        errors, bounds = self.head_errors, self.tolerances
        rows = zip(
            self.seq_ids,
            self.context_lens.tolist(),
            errors.tolist(),
            errors.max(axis=1, initial=0.0).tolist(),
            bounds.tolist(),
            bounds.max(axis=1, initial=0.0).tolist(),
            strict=True,
        )
        out: list[ev.Event] = []
        for row, (seq_id, n, head_errors, worst, head_bounds, widest) in enumerate(rows):
            out.append(ev.LookupPerformed(seq_id, self.table_of(row), n))
            check = ev.AttentionComputed(seq_id, n, worst, tuple(head_errors), widest, self.backend, tuple(head_bounds))
            out.append(check)
        seconds = self.kernel_seconds, self.dense_seconds
        return (*out, ev.KernelLaunched(self.backend, self.device, len(self.seq_ids), *seconds))

    @functools.cached_property
    def head_errors(self) -> np.ndarray:
        """Max abs error per (sequence, head) (computed once: the views ask for it often)."""
        return np.abs(self.output - self.dense).max(axis=2)

    @property
    def max_abs_error(self) -> float:
        return float(self.head_errors.max()) if self.seq_ids else 0.0

    @property
    def tolerance(self) -> float:
        """The loosest row's bound (for a one-number summary; ``passed`` checks every row)."""
        return float(self.tolerances.max()) if self.seq_ids else 0.0

    @property
    def passed(self) -> bool:
        return bool((self.head_errors <= self.tolerances).all())

    def index_of(self, seq_id: str) -> int:
        return self.seq_ids.index(seq_id)


@dataclass(frozen=True)
class StepResult:
    step: int  # 1-based: the state after this many operations
    op: Operation
    op_events: tuple[ev.Event, ...]  # what the operation did to blocks, tokens and requests
    metrics: Metrics
    attention: AttentionReport | None
    detail_dropped: bool = False  # an old step: its attention and detail events recompute on a seek
    recorded: bool = True  # False: a run that keeps no events (apply's record=False)

    @functools.cached_property
    def events(self) -> tuple[ev.Event, ...]:
        """Every event of the step: the operation's, then the attention's (a lookup and a
        check per sequence, the launch), built from the report when first asked for — the
        window reads one sequence's lookup (:meth:`lookup_of`), the event log all of them."""
        if self.attention is None or not self.recorded:
            return self.op_events
        return self.op_events + self.attention.events()

    def lookup_of(self, seq_id: str | None) -> tuple[int, ...] | None:
        """The blocks the kernel read for ``seq_id`` this step, in logical order (None: not attended)."""
        report = self.attention
        if report is None or not self.recorded or seq_id not in report.seq_ids:
            return None
        return report.table_of(report.index_of(seq_id))


@dataclass(frozen=True)
class SimulatorSnapshot:
    step: int
    blocks: BlockManagerSnapshot
    sequences: tuple[SequenceSnapshot, ...]
    swapped: tuple[SequenceSnapshot, ...]
    cache: CacheCheckpoint | None  # only the newest snapshot's can be restored
    swap_space: tuple[np.ndarray, np.ndarray] | None
    dense: DenseCheckSnapshot
    last_query: dict[str, np.ndarray]
    last_attention: AttentionReport | None
    scheduler: SchedulerSnapshot


# What the bookkeeping costs per block (Python lists of ints and the free queue's links),
# measured on CPython 3.11; generous, so that a refusal is never wrong by much.
BOOKKEEPING_BYTES_PER_BLOCK = 160


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_memory(config: CacheConfig, backend: Backend, kv_data: bool) -> None:
    """Refuse a configuration whose caches cannot fit, before allocating any of them."""
    itemsize = storage_dtype(config.dtype).itemsize
    per_block = 2 * config.block_size * config.num_kv_heads * config.head_dim * itemsize  # K and V
    kv = config.num_blocks * per_block if kv_data else 0
    host = (config.num_blocks + config.num_cpu_blocks) * BOOKKEEPING_BYTES_PER_BLOCK
    host += config.num_cpu_blocks * per_block if kv_data else 0  # the swap space, on the host
    free_host = host_memory_available()
    where = free_host if backend.cache_on_host else backend.memory_available()
    if backend.cache_on_host:  # the cache and the bookkeeping share one memory
        host += kv
        kv = 0
    if kv and where is not None and kv > where:
        raise OutOfMemoryError(
            f"the KV cache of {config.num_blocks} blocks needs {_gib(kv)} on {backend.device}; {_gib(where)} is free"
        )
    if free_host is not None and host > free_host:
        raise OutOfMemoryError(
            f"{config.num_blocks} GPU blocks and {config.num_cpu_blocks} CPU blocks need {_gib(host)} of host "
            f"memory (the caches and their bookkeeping); {_gib(free_host)} is available"
        )


QKV_PIECE_TOKENS = 64  # tokens the token model projects at once


class Simulator:
    def __init__(self, config: CacheConfig, backend: Backend | None = None, kv_data: bool = True) -> None:
        """``kv_data=False`` simulates memory management only: token ids, blocks, tables and
        the prefix cache, with no K/V computed or stored and no attention (for large
        workloads through the scheduler)."""
        self.config = config
        self.kv_data = kv_data
        self.backend = backend or select_backend("auto" if kv_data else "cpu")
        check_memory(config, self.backend, kv_data)
        self.model = TokenModel(config)
        self.events = EventLog()
        self.blocks = BlockManager(config, self.events)
        self.cache = PagedKVCache(config, self.backend) if kv_data else None
        self.swap_space = SwapSpace(config, self.cache.dtype) if kv_data else None
        # Dense attention's working memory: at most half the pool's bytes per SDPA call.
        batch_bytes = max(1 << 20, config.num_blocks * config.block_bytes // 2)
        self.dense = DenseCheck(config.num_kv_heads, config.head_dim, storage_dtype(config.dtype), batch_bytes)
        self.sequences: dict[str, Sequence] = {}
        # Preemption by swap: sequences whose blocks wait in the CPU pool, off the GPU.
        self.swapped: dict[str, Sequence] = {}
        self.step = 0
        self.last_attention: AttentionReport | None = None
        self._last_query: dict[str, np.ndarray] = {}  # q of each sequence's newest token (float32)
        self._query_stack = RowStack()  # the decode batch's queries, restacked where they changed
        self._last_tables: tuple[tuple[str, ...], list[list[int]], np.ndarray] | None = None  # _block_tables'
        self.scheduler = Scheduler(config, self.model, self.blocks, self, self.events)

    # -- queries ------------------------------------------------------------------------
    @property
    def pool(self):
        return self.blocks.pool

    @property
    def cpu_pool(self):
        return self.blocks.cpu_pool

    def sequence(self, seq_id: str) -> Sequence:
        try:
            return self.sequences[seq_id]
        except KeyError:
            raise UnknownSequenceError(seq_id, list(self.sequences)) from None

    def sequences_of(self, seq_ids: list[str]) -> list[Sequence]:
        """Many live sequences at once (a decode batch)."""
        try:
            return [self.sequences[s] for s in seq_ids]
        except KeyError as exc:
            raise UnknownSequenceError(exc.args[0], list(self.sequences)) from None

    def swapped_sequence(self, seq_id: str) -> Sequence:
        return self.swapped[seq_id]

    def is_taken(self, seq_id: str) -> bool:
        """A live or swapped sequence holds the name."""
        return seq_id in self.sequences or seq_id in self.swapped

    def block_fill(self, block_id: int) -> int:
        return self.blocks.fill(block_id)

    def block_fills(self) -> list[int]:
        return self.blocks.fills()

    def holders(self, block_id: int) -> list[tuple[str, int]]:
        """(sequence, logical index) pairs whose tables hold ``block_id``."""
        return self.blocks.holders(block_id)

    def holders_map(self) -> dict[int, tuple[tuple[str, int], ...]]:
        """Every held block -> its (sequence, logical index) pairs."""
        return self.blocks.holders_map()

    def metrics(self) -> Metrics:
        c, u, pool = self.config, self.blocks.usage, self.blocks.pool
        used = pool.num_used
        return Metrics(
            step=self.step,
            num_sequences=len(self.sequences),
            used_blocks=used,
            free_blocks=pool.num_free,
            shared_blocks=u.shared_blocks,
            logical_tokens=u.logical_tokens,
            slots_allocated=used * c.block_size,
            slots_filled=u.slots_filled,
            contiguous_blocks=u.contiguous_blocks,
            prefix_lookup_blocks=self.blocks.prefix_lookups,
            prefix_hit_blocks=self.blocks.prefix_hits,
            cached_free_blocks=pool.num_cached_free() if c.prefix_caching else 0,
        )

    def verify_kv(self, seq_id: str) -> str | None:
        """Compare, bit for bit, the K/V the kernel reads for ``seq_id`` through its block
        table with what the token model wrote (the dense reference's copy). None if equal;
        else the first slot that differs. A corrupted slot at a long context moves the
        softmax average by ~1/L, below any rounding bound: this sees it."""
        seq = self.sequence(seq_id)
        if not self.kv_data or not seq.num_tokens:
            return None
        keys, values = self.cache.read_sequence(seq.block_table, seq.num_tokens)
        dense_k, dense_v = self.dense.view(seq_id)
        bs = self.config.block_size
        for name, got, want in (("K", keys, dense_k), ("V", values, dense_v)):
            same = got.astype(np.float32).view(np.uint32) == want.astype(np.float32).view(np.uint32)
            if not same.all():
                position = int(np.argwhere(~same)[0][0])
                block = seq.block_table[position // bs]
                where = f"{name} in block {block}, slot {position % bs}"
                return f"{seq_id}'s token {position} ({where}) is not what was written"
        return None

    def dense_kv(self, seq_id: str) -> tuple[np.ndarray, np.ndarray]:
        """The sequence's K/V as the dense reference holds them (contiguous, from the tokens)."""
        self.sequence(seq_id)
        return self.dense.view(seq_id)

    def warm_up(self) -> None:
        """Compile (or load from the on-disk cache) the kernel for this cache's dtype."""
        c = self.config
        query = self.backend.to_device(np.zeros((1, c.num_heads, c.head_dim), dtype=self.cache.dtype))
        tables, lens = np.zeros((1, 1), np.int32), np.ones(1, np.int32)
        self.backend.paged_attention(query, self.cache.key_cache, self.cache.value_cache, tables, lens, 1.0)

    # -- operations -----------------------------------------------------------------------
    def apply(self, op: Operation, attend: bool = True, record: bool = True) -> StepResult:
        """Validate ``op``, apply it, then (if ``attend``) run decode attention for every
        sequence. ``record=False`` keeps no events (large simulations)."""
        self.events.enabled = record
        self.events.clear()
        try:
            self.execute(op)
        except Exception:
            self.events.clear()
            raise
        self.step += 1
        self.last_attention = self._attend() if attend and self.kv_data else None
        return StepResult(self.step, op, self.events.take(), self.metrics(), self.last_attention, recorded=record)

    def execute(self, op: Operation) -> None:
        """Validate and apply one operation (its events go to the log); no attention, no step."""
        if isinstance(op, Submit | Schedule):
            self.scheduler.execute(op)
            return
        handler = {Add: self._add, Grow: self._grow, Fork: self._fork, Free: self._free}.get(type(op))
        if handler is None:
            raise InvalidOperationError(f"not an operation: {op!r}")
        if isinstance(op, Grow | Free):
            target = self.sequences.get(op.seq) or self.swapped.get(op.seq)
            owner = None if target is None else target.owner
            if owner is not None:
                raise InvalidOperationError(
                    f"sequence {op.seq!r} belongs to request {owner!r}: the scheduler grows and frees it"
                )
        handler(op)

    # The scheduler's side of the registry (core.scheduler.SequenceEngine).
    def add_owned(self, seq_id: str, prompt: tuple[int, ...], owner: str) -> None:
        """A request's sequence: its prompt was checked against the vocabulary on submission."""
        self._check_new_id(seq_id, by_user=False)
        self._add_sequence(seq_id, list(prompt), None, owner, vocab_checked=True)

    def fork_owned(self, parent: str, child: str, owner: str) -> None:
        self._check_new_id(child, by_user=False)
        self._fork_sequence(parent, child, owner)

    def free_owned(self, seq_id: str) -> None:
        self._free(Free(seq_id))

    def _check_new_id(self, seq_id: str, by_user: bool = True) -> None:
        """A new name must be free: no live or swapped sequence holds it, and (for the
        user's own) no waiting request of the scheduler will take it when admitted."""
        if self.is_taken(seq_id):
            raise DuplicateSequenceError(seq_id)
        if by_user and (request := self.scheduler.reserving(seq_id)) is not None:
            raise DuplicateSequenceError(seq_id, f"request {request!r} will run a sequence of that name")

    def _add(self, op: Add) -> None:
        self._check_new_id(op.seq)
        if op.prompt is None:
            # Refuse what cannot fit before generating the prompt (a long one costs time and memory).
            c, blocks = self.config, self.blocks
            reusable = blocks.pool.num_used if c.prefix_caching else 0  # hits on held blocks take none
            if c.blocks_for(op.num_tokens) > blocks.num_free + reusable:
                need = c.blocks_for(op.num_tokens)
                raise PoolExhaustedError(need, blocks.num_free, f"add {op.seq} ({op.num_tokens} tokens)")
        token_ids = list(op.prompt) if op.prompt is not None else self.model.token_ids(op.seq, 0, op.num_tokens)
        self._add_sequence(op.seq, token_ids, op.blocks, None)

    def _add_sequence(
        self,
        seq_id: str,
        token_ids: list[int],
        placement: tuple[int, ...] | None,
        owner: str | None,
        vocab_checked: bool = False,
    ) -> None:
        if not vocab_checked:
            check_vocab(token_ids, "prompt")
        c, blocks = self.config, self.blocks
        caching = c.prefix_caching and placement is None
        hits = blocks.cached_prefix(token_ids) if caching else []
        if placement is not None:
            placement = blocks.pool.check_placement(placement)
            needed = c.blocks_for(len(token_ids)) - len(hits)
            if len(placement) != needed:
                raise InvalidPlacementError(
                    f"{len(token_ids)} tokens at block size {c.block_size} need exactly "
                    f"{needed} block(s); placement names {len(placement)}"
                )
        elif not blocks.can_allocate(len(token_ids), hits):
            taken = blocks.allocation_need(len(token_ids), hits)
            raise PoolExhaustedError(taken, blocks.num_free, f"add {seq_id} ({len(token_ids)} tokens)")
        # -- validated; apply --
        seq = Sequence(seq_id, owner=owner)
        self.sequences[seq_id] = seq
        if self.kv_data:
            self.dense.add(seq_id)
        self.events.add(ev.SequenceAdded, seq_id, len(token_ids))
        blocks.allocate(seq, len(token_ids), hits, placement)
        if caching:
            blocks.note_prefix_lookup(len(token_ids), len(hits))
        self._append([seq], [token_ids], skip=len(hits) * c.block_size)

    def _grow(self, op: Grow) -> None:
        seq = self.sequence(op.seq)
        needed = self.blocks.append_plan(seq, op.length).blocks_needed  # before generating the tokens
        if needed > self.blocks.num_free:
            raise PoolExhaustedError(needed, self.blocks.num_free, f"grow {op.seq} by {op.length}")
        if op.token_ids is not None:
            token_ids = list(op.token_ids)
        else:
            token_ids = self.model.token_ids(op.seq, seq.num_tokens, op.num_tokens)
        check_vocab(token_ids, "token_ids")
        self._append([seq], [token_ids])

    def decode(self, seq_ids: list[str], checked: bool = False, seqs: list[Sequence] | None = None) -> None:
        """One new token for each sequence at once (a decode step), validated as a whole.
        ``checked``: the caller has just compared the block manager's
        ``decode_blocks_needed`` with the free pool, for ``seqs`` (these sequences)."""
        if seqs is None:
            seqs = self.sequences_of(seq_ids)
        if not checked and (need := self.blocks.decode_blocks_needed(seqs)) > self.blocks.num_free:
            raise PoolExhaustedError(need, self.blocks.num_free, f"a decode step of {len(seqs)} sequences")
        starts = [len(s.token_ids) for s in seqs]
        tokens = self.model.next_token_ids(seq_ids, starts)
        done = self.blocks.append_decode(seqs, tokens, starts, with_slots=self.kv_data)
        if self.kv_data and seqs:
            self._write_kv(seqs, starts, [[t] for t in tokens], done.slots, done.copies)

    def _append(self, seqs: list[Sequence], token_ids: list[list[int]], skip: int = 0) -> None:
        """Tokens join a sequence: block manager first (slots, copy-on-write), then the K/V."""
        starts = [s.num_tokens for s in seqs]
        slots, copies = [], []
        for seq, ids in zip(seqs, token_ids, strict=True):
            done = self.blocks.append_slots(seq, ids, skip, with_slots=self.kv_data)
            slots += done.slots
            copies += done.copies
        if self.kv_data:
            self._write_kv(seqs, starts, token_ids, slots, copies, skip)

    def _write_kv(self, seqs, starts, token_ids, slots, copies, skip: int = 0) -> None:
        """The K/V side of an append: copy-on-write copies, then the new tokens' K/V into
        their slots and into the dense reference (the first ``skip`` tokens of a single
        sequence are prefix-cache hits, already in their blocks). Long prompts go through
        the token model in pieces, so its working arrays stay small."""
        for src, dst in copies:  # before the writes: the new token goes into the copy
            self.cache.copy_block(src, dst)
        flat = [t for ids in token_ids for t in ids]
        if len(seqs) == 1:  # (one sequence, most appends: NumPy's set-up costs more than the work)
            positions = np.arange(starts[0], starts[0] + len(flat))
        else:
            positions = np.concatenate([np.arange(n, n + len(ids)) for n, ids in zip(starts, token_ids, strict=True)])
        ends = list(itertools.accumulate(len(ids) for ids in token_ids))
        slot_array = np.array(slots, np.int64)
        seq_index = 0
        for first in range(0, len(flat), QKV_PIECE_TOKENS):
            last = min(first + QKV_PIECE_TOKENS, len(flat))
            queries, keys, values = self.model.qkv(flat[first:last], positions[first:last])
            keys, values = keys.astype(self.cache.dtype, copy=False), values.astype(self.cache.dtype, copy=False)
            written = max(first, skip)  # tokens before ``skip`` are already in their blocks
            if written < last:
                self.cache.write(
                    slot_array[written - skip : last - skip], keys[written - first :], values[written - first :]
                )
            while seq_index < len(seqs) and (seq_index == 0 or ends[seq_index - 1] < last):
                begin = ends[seq_index - 1] if seq_index else 0
                lo, hi = max(begin, first), min(ends[seq_index], last)
                seq_id = seqs[seq_index].seq_id
                if lo < hi:
                    self.dense.append(seq_id, keys[lo - first : hi - first], values[lo - first : hi - first])
                if hi == ends[seq_index] and hi > begin:
                    # the decode query until the next write (a copy: no view keeps the piece alive)
                    self._last_query[seq_id] = queries[hi - 1 - first].copy()
                if ends[seq_index] > last:
                    break  # this sequence goes on in the next piece
                seq_index += 1

    def _fork(self, op: Fork) -> None:
        self.sequence(op.seq)
        self._check_new_id(op.new_seq)
        self._fork_sequence(op.seq, op.new_seq, None)

    def _fork_sequence(self, parent_id: str, child_id: str, owner: str | None) -> None:
        parent = self.sequence(parent_id)
        child = parent.copy(child_id)
        child.owner = owner
        self.sequences[child_id] = child
        if self.kv_data:
            self.dense.fork(parent_id, child_id)
            self._last_query[child_id] = self._last_query[parent_id]
        self.events.add(ev.SequenceForked, parent_id, child_id)
        self.blocks.fork(parent, child)

    def _free(self, op: Free) -> None:
        seq = self.sequence(op.seq)
        self.blocks.free(seq)
        del self.sequences[op.seq]
        if self.kv_data:
            self.dense.free(op.seq)
        self._last_query.pop(op.seq, None)
        self.events.add(ev.SequenceFreed, op.seq)

    # -- swapping -------------------------------------------------------------------------
    def swap_out(self, seq_ids: list[str]) -> int:
        """Move a group's blocks to the CPU pool (shared blocks once) and free them on the GPU."""
        seqs = [self.sequence(s) for s in seq_ids]
        if not self.blocks.can_swap_out(seqs):
            need = len(self.blocks.distinct_blocks(seqs))
            raise PoolExhaustedError(need, self.blocks.cpu_free, "swap to the CPU pool")
        pairs = self.blocks.swap_out(seqs)
        if self.kv_data:  # the GPU blocks were freed, not yet overwritten
            self.swap_space.swap_out(self.backend, self.cache, pairs)
        for seq in seqs:
            del self.sequences[seq.seq_id]
            self.swapped[seq.seq_id] = seq
        return len(pairs)

    def swap_in(self, seq_ids: list[str]) -> int:
        """Bring a swapped group back: new GPU blocks, bit-identical K/V, the same sharing."""
        seqs = [self.swapped[s] for s in seq_ids]
        if not self.blocks.can_swap_in(seqs):
            raise PoolExhaustedError(len(self.blocks.distinct_blocks(seqs)), self.blocks.num_free, "swap in")
        pairs = self.blocks.swap_in(seqs)
        if self.kv_data:
            self.swap_space.swap_in(self.backend, self.cache, pairs)
        for seq in seqs:
            del self.swapped[seq.seq_id]
            self.sequences[seq.seq_id] = seq
        return len(pairs)

    # -- attention ------------------------------------------------------------------------
    def attention_inputs(self) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray]:
        """(seq ids, query, block_tables, context_lens) for a decode step over every sequence."""
        seqs = list(self.sequences.values())
        ids = tuple(s.seq_id for s in seqs)
        block_tables = self._block_tables(ids, seqs)
        context_lens = np.array([s.num_tokens for s in seqs], dtype=np.int32)
        c = self.config
        query = self._query_stack([self._last_query[i] for i in ids]) if ids else np.empty((0, c.num_heads, c.head_dim))
        return ids, query.astype(self.cache.dtype), block_tables, context_lens

    def _block_tables(self, ids: tuple[str, ...], seqs: list[Sequence]) -> np.ndarray:
        """The padded (num_seqs, max blocks) table of a decode step. A step changes a few
        tables: when the sequences are the same, rows whose list still equals its copy from the
        last step are kept and only the others rewritten (into a new array: reports keep theirs)."""
        last = self._last_tables
        if last is not None and ids and last[0] == ids:
            _, copies, previous = last
            changed = [i for i, (seq, copy) in enumerate(zip(seqs, copies, strict=True)) if seq.block_table != copy]
            # The same width as a fresh build: the CPU kernel's work split reads it.
            width = max(1, max(len(s.block_table) for s in seqs))
            if 2 * len(changed) <= len(seqs) and width == previous.shape[1]:
                tables = previous.copy()
                for i in changed:
                    row = seqs[i].block_table
                    tables[i, : len(row)] = row
                    tables[i, len(row) :] = 0
                    copies[i] = list(row)
                self._last_tables = (ids, copies, tables)
                return tables
        lengths = np.array([len(s.block_table) for s in seqs], dtype=np.int64)
        tables = np.zeros((len(seqs), max(int(lengths.max(initial=0)), 1)), dtype=np.int32)
        # One scatter of every table's entries (a row assignment per sequence cost ~3 µs each).
        flat = np.array(list(itertools.chain.from_iterable(s.block_table for s in seqs)), dtype=np.int32)
        rows = np.repeat(np.arange(len(seqs)), lengths)
        tables[rows, np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)] = flat
        self._last_tables = (ids, [list(s.block_table) for s in seqs], tables)
        return tables

    def _attend(self) -> AttentionReport | None:
        if not self.sequences:
            return None
        ids, query, block_tables, context_lens = self.attention_inputs()
        scale = default_scale(self.config.head_dim)
        backend = self.backend
        # The dense check first: the kernel streams the whole cache through the CPU's caches,
        # and the check's many small calls ran several times slower right after it.
        started = time.perf_counter()
        dense = self.dense.outputs(ids, query, scale)
        dense_seconds = time.perf_counter() - started
        tolerances = self.dense.bounds(ids, query, scale, context_lens)

        xp_query = backend.to_device(query)
        started = time.perf_counter()
        output = backend.paged_attention(
            xp_query, self.cache.key_cache, self.cache.value_cache, block_tables, context_lens, scale
        )
        backend.synchronize()
        kernel_seconds = time.perf_counter() - started

        report = AttentionReport(
            backend=backend.name,
            device=backend.device,
            seq_ids=ids,
            query=query,
            block_tables=block_tables,
            context_lens=context_lens,
            scale=scale,
            output=output,
            dense=dense,
            tolerances=tolerances,
            kernel_seconds=kernel_seconds,
            dense_seconds=dense_seconds,
            block_size=self.config.block_size,
        )
        return report  # its events are built when a StepResult's are first asked for

    # -- snapshots --------------------------------------------------------------------------
    def snapshot(self, with_data: bool = True) -> SimulatorSnapshot:
        """The whole state; ``with_data=False`` leaves out the K/V arrays and the attention
        report (as :func:`without_data`, with nothing copied first): :meth:`restore` then
        rebuilds the data from the tokens."""
        data = with_data and self.kv_data
        return SimulatorSnapshot(
            step=self.step,
            blocks=self.blocks.snapshot(),
            sequences=tuple(s.snapshot() for s in self.sequences.values()),
            swapped=tuple(s.snapshot() for s in self.swapped.values()),
            cache=self.cache.snapshot(self._live_blocks()) if data else None,
            swap_space=self.swap_space.snapshot() if data else None,
            dense=self.dense.snapshot(with_data),
            last_query=dict(self._last_query),
            last_attention=self.last_attention if with_data else None,
            scheduler=self.scheduler.snapshot(),
        )

    def _live_blocks(self) -> set[int]:
        """GPU blocks whose K/V someone may read: held by a sequence, or cached for reuse."""
        live = {b for seq in self.sequences.values() for b in seq.block_table}
        return live | set(self.blocks.pool.cached_blocks())

    def restore(self, snap: SimulatorSnapshot) -> None:
        if self.kv_data and snap.cache is not None and not self.cache.can_restore(snap.cache):
            snap = without_data(snap)  # a newer checkpoint replaced its undo log: rebuild instead
        self.step = snap.step
        self.sequences = {s.seq_id: s.restore() for s in snap.sequences}
        self.swapped = {s.seq_id: s.restore() for s in snap.swapped}
        self.blocks.restore(snap.blocks, self.sequences.values())
        self.dense.restore(snap.dense)
        if self.kv_data:
            if snap.cache is None:
                self.cache.forget_checkpoint()  # the rebuild's writes are not changes to undo
                self._rebuild_kv()
            else:
                self.cache.restore(snap.cache)
                self.swap_space.restore(snap.swap_space)
        self._last_query = dict(snap.last_query)
        self.last_attention = snap.last_attention
        self.scheduler.restore(snap.scheduler)

    def _rebuild_kv(self) -> None:
        """Write back every K/V that state holds — each referenced or cached block, each
        swapped block, each sequence's dense row — from the tokens, which the token model
        turns into bit-identical K/V. What no block holds (free slots) is left as it is:
        the kernel never reads it."""
        bs, pool = self.config.block_size, self.blocks.pool
        pieces: dict[tuple[str, int], tuple[list[int], int]] = {}  # (pool, block) -> (tokens, first position)
        for seqs, where in ((self.sequences.values(), "gpu"), (self.swapped.values(), "cpu")):
            for seq in seqs:
                for index, block in enumerate(seq.block_table):
                    pieces.setdefault((where, block), (seq.token_ids[index * bs : (index + 1) * bs], index * bs))
        for block in pool.cached_blocks():
            if ("gpu", block) not in pieces:  # free, but holding a prefix a later prompt may reuse
                tokens, first = pool.cached_tokens(block)
                pieces[("gpu", block)] = (list(tokens), first)
        keys_of: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
        if pieces:
            order = list(pieces)
            flat = [t for key in order for t in pieces[key][0]]
            positions = np.concatenate([np.arange(first, first + len(tokens)) for tokens, first in pieces.values()])
            _, keys, values = self.model.qkv(flat, positions)
            keys, values = keys.astype(self.cache.dtype), values.astype(self.cache.dtype)
            offset = 0
            gpu_slots, gpu_rows = [], []
            for key in order:
                tokens, _ = pieces[key]
                end = offset + len(tokens)
                keys_of[key] = (keys[offset:end], values[offset:end])
                if key[0] == "gpu":
                    gpu_slots += [key[1] * bs + i for i in range(len(tokens))]
                    gpu_rows.append(np.arange(offset, end))
                offset = end
            if gpu_slots:
                rows = np.concatenate(gpu_rows)
                self.cache.write(np.array(gpu_slots, np.int64), keys[rows], values[rows])
        self.swap_space.rebuild(
            {block: kv for (where, block), kv in keys_of.items() if where == "cpu"}, self.config.block_size
        )
        for seqs, where in ((self.sequences.values(), "gpu"), (self.swapped.values(), "cpu")):
            for seq in seqs:
                if not seq.block_table:
                    self.dense.rebuild_row(seq.seq_id, None, None)
                    continue
                parts = [keys_of[(where, b)] for b in seq.block_table]
                self.dense.rebuild_row(
                    seq.seq_id, np.concatenate([k for k, _ in parts]), np.concatenate([v for _, v in parts])
                )


def without_data(snap: SimulatorSnapshot) -> SimulatorSnapshot:
    """The snapshot less its K/V arrays (paged cache, swap space, dense reference) and its
    attention report: what an older snapshot keeps, so that memory does not grow with steps."""
    return replace(snap, cache=None, swap_space=None, dense=snap.dense.without_data(), last_attention=None)
