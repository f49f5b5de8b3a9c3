"""The model runner: the model that turns tokens into q, k and v, the paged KV cache it
writes them into, the swap space, the dense reference, and the attention backend that
reads the cache through block tables. The shape of nano-vllm's ``ModelRunner``: it owns
the device-side state and the attention inputs (block-table tensor, queries, context
lengths); which sequence holds which block is the block manager's business, and the
slots to write, the blocks to copy and the swap pairs come from it.

``kv_data=False`` (memory management only) keeps the token model and nothing else: every
K/V method then returns at once.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
from pagesim.core import events as ev
from pagesim.core.blocks import BlockPool
from pagesim.core.config import CacheConfig
from pagesim.core.dense_check import DenseCheck, DenseCheckSnapshot, RowStack
from pagesim.core.errors import InvalidOperationError, OutOfMemoryError
from pagesim.core.kv_cache import CacheCheckpoint, PagedKVCache, SwapSpace
from pagesim.core.language_model import LanguageModel
from pagesim.core.layer_check import LayerCheck
from pagesim.core.sequence import Sequence
from pagesim.core.token_model import MEMORY_ONLY_VOCAB, VOCAB_SIZE, TokenModel
from pagesim.kernels.backend import Backend, default_scale, host_memory_available
from pagesim.kernels.dtypes import storage_dtype


class NearestBound(NamedTuple):
    seq_id: str
    head: int
    error: float  # its max abs error against dense attention
    bound: float  # what rounding explains for it

    @property
    def exceeded(self) -> bool:
        return not self.error <= self.bound  # (NaN too)


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
    layers: LayerCheck | None = None  # a real model's: every layer's attention and the logits

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
        if self.layers is not None:
            out.append(ev.LayersChecked(self.layers.describe(), self.layers.worst_layer, self.layers.passed))
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

    def nearest_bound(self, row: int | None = None) -> NearestBound | None:
        """The (sequence, head) nearest its bound (the largest error / bound), of the step or
        of sequence ``row``: the pair a one-line summary shows, since the largest error may
        sit on a head with a looser bound. None when the step attended no sequence."""
        if not self.seq_ids:
            return None
        if row is None:
            row, head = (int(i) for i in np.unravel_index(int(np.argmax(self._margins)), self._margins.shape))
        else:
            head = int(np.argmax(self._margins[row]))
        error, bound = float(self.head_errors[row, head]), float(self.tolerances[row, head])
        return NearestBound(self.seq_ids[row], head, error, bound)

    @functools.cached_property
    def _margins(self) -> np.ndarray:
        return self.head_errors / np.maximum(self.tolerances, np.finfo(np.float64).tiny)

    @property
    def attention_passed(self) -> bool:
        """Every head of this check, and every layer of a real model's forward, within its
        bound (``passed`` asks the logits and the next tokens too)."""
        layers_ok = self.layers is None or self.layers.attention_passed
        return bool((self.head_errors <= self.tolerances).all()) and layers_ok

    @property
    def passed(self) -> bool:
        return self.attention_passed and (self.layers is None or self.layers.passed)

    def index_of(self, seq_id: str) -> int:
        return self.seq_ids.index(seq_id)


@dataclass(frozen=True)
class RunnerSnapshot:
    cache: CacheCheckpoint | None  # only the newest snapshot's can be restored
    swap_space: tuple[np.ndarray, np.ndarray] | None
    dense: DenseCheckSnapshot
    last_query: dict[str, np.ndarray]

    @property
    def has_data(self) -> bool:
        return self.cache is not None

    def without_data(self) -> RunnerSnapshot:
        """Less the K/V arrays (paged cache, swap space, dense reference): rebuilt from the tokens."""
        return replace(self, cache=None, swap_space=None, dense=self.dense.without_data())


# What the bookkeeping costs per block (Python lists of ints and the free queue's links),
# measured on CPython 3.11; generous, so that a refusal is never wrong by much.
BOOKKEEPING_BYTES_PER_BLOCK = 160


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_memory(config: CacheConfig, backend: Backend, kv_data: bool, num_layers: int = 1) -> None:
    """Refuse a configuration whose caches cannot fit, before allocating any of them
    (``num_layers``: a real model's caches, one per layer, with one block table)."""
    itemsize = storage_dtype(config.dtype).itemsize
    per_block = 2 * config.block_size * config.num_kv_heads * config.head_dim * itemsize * num_layers  # K and V
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
            f"the KV cache of {config.num_blocks} blocks of {config.block_size} tokens needs {_gib(kv)} on "
            f"{backend.device}; {_gib(where)} is free"
        )
    if free_host is not None and host > free_host:
        raise OutOfMemoryError(
            f"{config.num_blocks} GPU blocks and {config.num_cpu_blocks} CPU blocks of {config.block_size} tokens "
            f"need {_gib(host)} of host "
            f"memory (the caches and their bookkeeping); {_gib(free_host)} is available"
        )


QKV_PIECE_TOKENS = 64  # tokens the token model projects at once


class ModelRunner:
    def __init__(
        self, config: CacheConfig, backend: Backend, kv_data: bool = True, model: LanguageModel | None = None
    ) -> None:
        """``model``: what turns tokens into the next tokens (default: the synthetic token
        model, whose ``qkv`` this runner's K/V come from; a subclass with a real model
        computes its K/V otherwise)."""
        self.config = config
        self.backend = backend
        self.kv_data = kv_data
        if model is None:  # (memory only, no embedding is read: any model's ids are hashed only)
            model = TokenModel(config, VOCAB_SIZE if kv_data else MEMORY_ONLY_VOCAB)
        self.model: LanguageModel = model
        self.cache = PagedKVCache(config, backend) if kv_data else None
        self.swap_space = SwapSpace(config, self.cache.dtype) if kv_data else None
        # Dense attention's working memory: at most half the pool's bytes per SDPA call.
        batch_bytes = max(1 << 20, config.num_blocks * config.block_bytes // 2)
        self.dense = DenseCheck(config.num_kv_heads, config.head_dim, storage_dtype(config.dtype), batch_bytes)
        self._last_query: dict[str, np.ndarray] = {}  # q of each sequence's newest token (float32)
        self._query_stack = RowStack()  # the decode batch's queries, restacked where they changed
        self._last_tables: tuple[tuple[str, ...], list[list[int]], np.ndarray] | None = None  # _block_tables'

    @property
    def num_layers(self) -> int:
        """Layers with a paged cache each (the synthetic model attends once)."""
        return 1

    @property
    def check_layer(self) -> int:
        """The layer whose decode attention the step's report shows."""
        return self.num_layers - 1

    # -- a sequence's rows: its dense reference and its decode query ----------------------
    def add_sequence(self, seq_id: str) -> None:
        if self.kv_data:
            self.dense.add(seq_id)

    def fork_sequence(self, parent: str, child: str) -> None:
        if self.kv_data:
            self.dense.fork(parent, child)
            self._last_query[child] = self._last_query[parent]

    def free_sequence(self, seq_id: str) -> None:
        if self.kv_data:
            self.dense.free(seq_id)
        self._last_query.pop(seq_id, None)

    # -- K/V --------------------------------------------------------------------------------
    def write_kv(self, seqs, starts, token_ids, slots, copies, skip: int = 0) -> None:
        """The K/V side of an append: copy-on-write copies, then the new tokens' K/V into
        their slots and into the dense reference (the first ``skip`` tokens of a single
        sequence are prefix-cache hits, already in their blocks). Long prompts go through
        the token model in pieces, so its working arrays stay small."""
        if not self.kv_data or not seqs:
            return
        for src, dst in copies:  # before the writes: the new token goes into the copy
            self.cache.copy_block(src, dst)
        flat = [t for ids in token_ids for t in ids]
        if len(seqs) == 1:  # (one sequence, most appends: NumPy's set-up costs more than the work)
            positions = np.arange(starts[0], starts[0] + len(flat))
            if not skip and 0 < len(flat) <= QKV_PIECE_TOKENS:  # a grow: one piece, all of it written
                self._write_piece(seqs[0].seq_id, flat, positions, np.array(slots, np.int64))
                return
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

    def _write_piece(self, seq_id: str, tokens: list[int], positions: np.ndarray, slots: np.ndarray) -> None:
        """:meth:`write_kv` of one sequence's few new tokens: the loop below with one piece."""
        queries, keys, values = self.model.qkv(tokens, positions)
        keys, values = keys.astype(self.cache.dtype, copy=False), values.astype(self.cache.dtype, copy=False)
        self.cache.write(slots, keys, values)
        self.dense.append(seq_id, keys, values)
        self._last_query[seq_id] = queries[-1].copy()  # the decode query until the next write

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy the (gpu, cpu) block pairs to the swap space (the GPU blocks were freed, not yet overwritten)."""
        if self.kv_data:
            self.swap_space.swap_out(self.backend, self.cache, pairs)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        if self.kv_data:
            self.swap_space.swap_in(self.backend, self.cache, pairs)

    def verify_kv(self, seq: Sequence) -> str | None:
        """Compare, bit for bit, the K/V the kernel reads for ``seq_id`` through its block
        table with what the token model wrote (the dense reference's copy). None if equal;
        else the first slot that differs. A corrupted slot at a long context moves the
        softmax average by ~1/L, below any rounding bound: this sees it."""
        seq_id = seq.seq_id
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
        return self.dense.view(seq_id)

    def attention_weights(self, seq: Sequence) -> tuple[np.ndarray, np.ndarray]:
        """Softmax weights (num_heads, context_len) of ``seq``'s newest token over its
        context, from its dense K/V, and the physical block each context token was read from."""
        c = self.config
        keys, _ = self.dense_kv(seq.seq_id)
        query, _, _ = self.model.qkv([seq.token_ids[-1]], [seq.num_tokens - 1])
        q = query[0].astype(self.cache.dtype).astype(np.float32)  # (H, D)
        k = keys.astype(np.float32)  # (T, Hkv, D)
        kv_of_head = np.arange(c.num_heads) // (c.num_heads // c.num_kv_heads)
        scores = np.einsum("hd,thd->ht", q, k[:, kv_of_head, :]) / np.sqrt(c.head_dim)
        scores -= scores.max(axis=1, keepdims=True)
        weights = np.exp(scores)
        weights /= weights.sum(axis=1, keepdims=True)
        token_blocks = np.repeat(np.array(seq.block_table), c.block_size)[: seq.num_tokens]
        return weights.astype(np.float32), token_blocks

    def cache_arrays(self, layer: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The paged key and value caches as NumPy arrays (host copies when they live on a
        GPU): ``layer``'s on a real model (None: the report's)."""
        cache = self.cache if layer is None else self.layer_cache(layer)
        return self.backend.to_numpy(cache.key_cache), self.backend.to_numpy(cache.value_cache)

    def layer_cache(self, layer: int) -> PagedKVCache:
        if layer != self.check_layer:
            raise InvalidOperationError(f"layer {layer} is outside 0..{self.num_layers - 1}")
        return self.cache

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def device(self) -> str:
        return self.backend.device

    def warm_up(self) -> None:
        """Compile (or load from the on-disk cache) the kernel for this cache's dtype."""
        c = self.config
        query = self.backend.to_device(np.zeros((1, c.num_heads, c.head_dim), dtype=self.cache.dtype))
        tables, lens = np.zeros((1, 1), np.int32), np.ones(1, np.int32)
        self.backend.paged_attention(query, self.cache.key_cache, self.cache.value_cache, tables, lens, 1.0)

    # -- attention -------------------------------------------------------------------------
    def attention_inputs(self, seqs: list[Sequence]) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray]:
        """(seq ids, query, block_tables, context_lens) for a decode step over ``seqs``."""
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
        # One scatter of every table's entries (not a row assignment per sequence).
        flat = np.array(list(itertools.chain.from_iterable(s.block_table for s in seqs)), dtype=np.int32)
        rows = np.repeat(np.arange(len(seqs)), lengths)
        tables[rows, np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)] = flat
        self._last_tables = (ids, [list(s.block_table) for s in seqs], tables)
        return tables

    def attend(self, seqs: list[Sequence]) -> AttentionReport | None:
        """The paged kernel over every sequence's newest query, and dense attention on the same tokens."""
        if not self.kv_data or not seqs:
            return None
        ids, query, block_tables, context_lens = self.attention_inputs(seqs)
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

    # -- snapshots ----------------------------------------------------------------------------
    def snapshot(self, live_blocks: Iterable[int], with_data: bool = True) -> RunnerSnapshot:
        """``live_blocks``: the GPU blocks whose K/V someone may read (held, or cached for reuse)."""
        data = with_data and self.kv_data
        return RunnerSnapshot(
            cache=self.cache.snapshot(set(live_blocks)) if data else None,
            swap_space=self.swap_space.snapshot() if data else None,
            dense=self.dense.snapshot(with_data),
            last_query=dict(self._last_query),
        )

    def keep_checkpoints(self, count: int) -> None:
        """How many of the newest snapshots with data stay restorable from their undo logs."""
        for cache in self.paged_caches():
            cache.keep_checkpoints = count

    def paged_caches(self) -> list[PagedKVCache]:
        return [] if self.cache is None else [self.cache]

    def can_restore(self, snap: RunnerSnapshot) -> bool:
        """False when a newer checkpoint replaced the one ``snap``'s cache data goes back to."""
        return not (self.kv_data and snap.cache is not None and not self.cache.can_restore(snap.cache))

    def restore(
        self, snap: RunnerSnapshot, sequences: Iterable[Sequence], swapped: Iterable[Sequence], pool: BlockPool
    ) -> None:
        """Back to ``snap``, with the block manager already restored (``pool``) and the
        sequences as they were then: K/V from the checkpoint, or rebuilt from the tokens."""
        self.dense.restore(snap.dense)
        if self.kv_data:
            if snap.cache is None:
                self.cache.forget_checkpoint()  # the rebuild's writes are not changes to undo
                self.rebuild_kv(list(sequences), list(swapped), pool)
            else:
                self.cache.restore(snap.cache)
                self.swap_space.restore(snap.swap_space)
        self._last_query = dict(snap.last_query)

    def rebuild_kv(self, sequences: list[Sequence], swapped: list[Sequence], pool: BlockPool) -> None:
        """Write back every K/V that state holds — each referenced or cached block, each
        swapped block, each sequence's dense row — from the tokens, which the token model
        turns into bit-identical K/V. What no block holds (free slots) is left as it is:
        the kernel never reads it."""
        bs = self.config.block_size
        pieces: dict[tuple[str, int], tuple[list[int], int]] = {}  # (pool, block) -> (tokens, first position)
        for seqs, where in ((sequences, "gpu"), (swapped, "cpu")):
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
        for seqs, where in ((sequences, "gpu"), (swapped, "cpu")):
            for seq in seqs:
                if not seq.block_table:
                    self.dense.rebuild_row(seq.seq_id, None, None)
                    continue
                parts = [keys_of[(where, b)] for b in seq.block_table]
                self.dense.rebuild_row(
                    seq.seq_id, np.concatenate([k for k, _ in parts]), np.concatenate([v for _, v in parts])
                )
