"""The runner for a real language model: its weights, one paged KV cache per layer with
one block table for all (vLLM's layout, ``(num_layers, num_blocks, block_size,
num_kv_heads, head_dim)`` as one cache per layer), and the dense engine it is checked
against.

Each forward (a prompt, a chunk of one, a grow, a decode step of many sequences, the
recompute after preemption) runs the model over the new tokens only. In every layer the
new tokens' K/V go to the slots the block manager gave (``reshape_and_cache``), then
attention reads the cache through the block tables: the backend's paged decode kernel
when every sequence has one new token, its paged prefill kernel otherwise (causal over the
cached prefix and the chunk), so a prefix-cache hit skips computing the hit tokens.
Copy-on-write copies and swaps move every layer's block. Each sequence's last logits go
to the model (:class:`~pagesim.core.llama_model.LlamaModel`), which chooses the next token
of a decode step from them (greedy, or drawn under the sequence's sampling parameters).

Two checks, each step: the dense engine (:class:`~pagesim.core.llama_model.DenseReference`,
contiguous K/V per layer, SDPA) is fed the same tokens and its logits are held to the
paged ones (``logits_checks``: within ``LOGITS_TOLERANCE`` and the same next token, greedy or
drawn with the same seed); and,
as for the synthetic model, the last layer's paged decode attention of every sequence's
newest token against dense SDPA on the same stored K/V (:meth:`attend`, the report the
app and ``pagesim run`` show).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
import torch
from pagesim.core.blocks import BlockPool
from pagesim.core.config import CacheConfig
from pagesim.core.errors import InvalidOperationError
from pagesim.core.kv_cache import CacheCheckpoint, PagedKVCache, SwapSpace
from pagesim.core.layer_check import LayerCheck, LayerDetail, check_layer, gather_slots, gathered_attention
from pagesim.core.llama_model import DenseReference, LlamaModel, LogitsCheck
from pagesim.core.model_runner import AttentionReport, ModelRunner, RunnerSnapshot, check_memory
from pagesim.core.models import DenseKVCache, ModelFile
from pagesim.core.models.catalog import SHAPE_FIELDS, check_shapes, load_model
from pagesim.core.sequence import Sequence
from pagesim.kernels.backend import Backend, ForwardInputs, default_scale
from pagesim.kernels.dtypes import dtype_name


@dataclass(frozen=True)
class LlamaRunnerSnapshot(RunnerSnapshot):
    layers: tuple[CacheCheckpoint | None, ...] | None = None  # every layer's but the checked one (its is ``cache``)
    layer_swaps: tuple | None = None
    logits: tuple[tuple[str, torch.Tensor], ...] = ()
    reference: tuple | None = None  # the dense engine's rows and logits
    layer_queries: tuple[tuple[str, np.ndarray], ...] = ()

    def without_data(self) -> LlamaRunnerSnapshot:
        return replace(super().without_data(), layers=None, layer_swaps=None, reference=None)


TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16}


def torch_device_for(backend: Backend) -> torch.device:
    """Where the paged engine runs its model: the CUDA backend's GPU where this torch build
    has CUDA, else the host."""
    if backend.name == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", getattr(backend, "device_id", 0))
    return torch.device("cpu")


def _host(t: torch.Tensor) -> np.ndarray:
    """A tensor's values in a host array of their own."""
    return t.detach().cpu().numpy().copy()


def padded_tables(seqs: list[Sequence]) -> np.ndarray:
    width = max(1, max(len(s.block_table) for s in seqs))
    tables = np.zeros((len(seqs), width), np.int32)
    for row, seq in enumerate(seqs):
        tables[row, : len(seq.block_table)] = seq.block_table
    return tables


def empty_report(backend: Backend, config: CacheConfig, dtype) -> AttentionReport:
    """A report of no live sequence (a step whose forwards' sequences all finished)."""
    heads, dim = config.num_heads, config.head_dim
    no_rows = np.zeros((0, heads, dim), np.float32)
    return AttentionReport(
        backend.name, backend.device, (), no_rows.astype(dtype), np.zeros((0, 1), np.int32),
        np.zeros(0, np.int32), default_scale(dim), no_rows, no_rows, np.zeros((0, heads)), 0.0, 0.0,
        config.block_size,
    )  # fmt: skip


class LlamaRunner(ModelRunner):
    @classmethod
    def for_config(cls, config: CacheConfig, backend: Backend, kv_data: bool = True) -> LlamaRunner:
        return cls(config, backend, load_model(config.model), kv_data)

    def __init__(self, config: CacheConfig, backend: Backend, file: ModelFile, kv_data: bool = True) -> None:
        if not kv_data:
            raise InvalidOperationError("a real model needs its K/V: memory-only runs use the synthetic model")
        check_shapes({f: getattr(config, f) for f in SHAPE_FIELDS}, file.config, config.model)
        num_layers = file.config.num_layers
        check_memory(config, backend, True, num_layers)
        model = LlamaModel(file, config.seed)
        super().__init__(config, backend, True, model=model)
        self.model: LlamaModel = model
        # The paged engine's model: on the GPU with the CUDA backend (where torch has CUDA),
        # its q, k and v handed to the kernels through DLPack (no copy for an fp32 cache, a
        # cast for fp16 and bf16 ones); the dense reference keeps the host's copy.
        self.torch_device = torch_device_for(backend)
        # The kernels read the model's tensors where they are (DLPack) and leave their output
        # there, and each forward's tables are uploaded once: the CUDA backend with torch on
        # its GPU (or, in a test, an emulated device that reads host memory).
        self.on_device = self.torch_device.type != "cpu"
        self.llama = model.llama.on(self.torch_device) if self.on_device else model.llama
        others = range(num_layers - 1)  # the last layer's cache is the base runner's: the report shows it
        self.caches = [PagedKVCache(config, backend) for _ in others] + [self.cache]
        self.swaps = [SwapSpace(config, self.cache.dtype) for _ in others] + [self.swap_space]
        self.reference = DenseReference(model.llama, config.dtype)
        self.scale = default_scale(config.head_dim)
        self.logits_checks: list[LogitsCheck] = []  # the last forward's, one per sequence computed
        self.paged_seconds = self.dense_seconds = 0.0  # the last forward's, each side's
        self.check_seconds = 0.0  # the last forward's layer check
        self.computed_tokens = 0  # how many tokens the last forward ran (prefix hits are not run)
        self.check_layers = True  # every layer's attention against dense (off: a benchmark's forward)
        self.layer_check: LayerCheck | None = None  # the operation's forwards', until its report takes it
        self._forward_check: LayerCheck | None = None
        # Each sequence's newest token's query in every layer (num_layers, num_heads, head_dim),
        # float32: a layer's attention can be shown and replayed after the step.
        self._layer_queries: dict[str, np.ndarray] = {}

    @property
    def num_layers(self) -> int:
        return len(self.caches)

    # -- a sequence's rows ------------------------------------------------------------------
    def add_sequence(self, seq_id: str) -> None:
        super().add_sequence(seq_id)
        self.reference.add(seq_id)

    def fork_sequence(self, parent: str, child: str) -> None:
        super().fork_sequence(parent, child)
        self.reference.fork(parent, child)
        if parent in self.model.logits:
            self.model.logits[child] = self.model.logits[parent]
        if parent in self._layer_queries:
            self._layer_queries[child] = self._layer_queries[parent]

    def free_sequence(self, seq_id: str) -> None:
        super().free_sequence(seq_id)
        self.reference.free(seq_id)
        self.model.logits.pop(seq_id, None)
        self._layer_queries.pop(seq_id, None)

    # -- the forward ----------------------------------------------------------------------------
    def write_kv(self, seqs, starts, token_ids, slots, copies, skip: int = 0) -> None:
        """Copy-on-write copies in every layer, then one forward over the new tokens of
        every sequence (but the first ``skip`` of each: prefix-cache hits, whose K/V every
        layer's blocks already hold), attention through the block tables; then the dense
        engine on the same tokens, and the two sides' logits compared."""
        for src, dst in copies:  # before the writes: the new token goes into the copy
            for cache in self.caches:
                cache.copy_block(src, dst)
        rows = zip(seqs, starts, token_ids, strict=True)
        computed = [(seq, start, ids) for seq, start, ids in rows if len(ids) > skip]
        self.logits_checks = []
        self.computed_tokens = sum(len(ids) - skip for _, _, ids in computed)
        started, self.check_seconds = time.perf_counter(), 0.0
        if computed:
            self._forward(computed, np.array(slots, np.int64), skip)
        self.paged_seconds = time.perf_counter() - started - self.check_seconds
        started = time.perf_counter()
        fed = [(seq.seq_id, list(ids)) for seq, ids in zip(seqs, token_ids, strict=True) if len(ids) > skip]
        self.reference.feed_all(fed)
        for seq, start, ids in zip(seqs, starts, token_ids, strict=True):
            if len(ids) <= skip:
                continue
            paged = self.model.logits[seq.seq_id]
            check = self.reference.compare(seq.seq_id, start + len(ids) - 1, paged, seq.sampling)
            self.logits_checks.append(check)
        self.dense_seconds = time.perf_counter() - started
        if self._forward_check is not None:
            check = replace(
                self._forward_check,
                logits_diff=max(c.max_abs_diff for c in self.logits_checks),
                logits_tolerance=self.reference.tolerance,
                tokens_agree=all(c.paged_token == c.dense_token for c in self.logits_checks),
            )
            self._forward_check = None
            self.layer_check = check if self.layer_check is None else self.layer_check.merged(check)

    def _forward(self, computed, slot_array: np.ndarray, skip: int) -> None:
        seqs = [seq for seq, _, _ in computed]
        q_lens = [len(ids) - skip for _, _, ids in computed]
        flat = [t for _, _, ids in computed for t in ids[skip:]]
        positions = np.concatenate([np.arange(start + skip, start + len(ids)) for _, start, ids in computed])
        query_starts = np.array([0, *itertools.accumulate(q_lens)], np.int32)
        context_lens = np.array([start + len(ids) for _, start, ids in computed], np.int32)
        tables = padded_tables(seqs)
        decode = max(q_lens) == 1
        backend, check, scale = self.backend, self.check_layer, self.scale
        seen: dict[str, np.ndarray] = {}
        last_rows = query_starts[1:] - 1  # each sequence's newest token
        slots = gather_slots([s.block_table for s in seqs], context_lens.tolist(), self.config.block_size)
        layer_errors, layer_bounds, layer_queries = [], [], []

        on_device = self.on_device
        last_rows_t = torch.from_numpy(last_rows.astype(np.int64)).to(self.torch_device)
        # The slots and tables of every layer: on the device, uploaded once (a synchronous
        # copy a layer drained the device's queue, and the host's, every layer).
        inputs = ForwardInputs(slot_array, tables, context_lens, None if decode else query_starts)

        def attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            cache = self.caches[layer]
            keys, values = self._as_stored(k), self._as_stored(v)
            cache.write_for(inputs, keys, values)
            query = self._as_stored(q)
            kc, vc = cache.key_cache, cache.value_cache
            if on_device:  # (the kernels' own output stays there: the next layer's input)
                out = backend.attention_device_for(query, kc, vc, inputs, scale)
            else:
                query = backend.to_device(np.ascontiguousarray(query))
                if decode:
                    out = backend.paged_attention(query, kc, vc, tables, context_lens, scale)
                else:
                    out = backend.paged_prefill(query, kc, vc, query_starts, tables, context_lens, scale)
            if layer == check:
                seen.update(q=_host(q), k=backend.to_numpy(keys).copy(), v=backend.to_numpy(values).copy())
            # (on the device, kept there: one copy to the host after the last layer, not one a layer)
            layer_queries.append(q[last_rows_t].detach() if on_device else _host(q[last_rows_t]))
            if on_device:
                out = torch.from_dlpack(out)
            else:
                out = torch.from_numpy(np.ascontiguousarray(backend.to_numpy(out), dtype=np.float32))
            if self.check_layers:  # (its time is the check's, not the paged forward's)
                started = time.perf_counter()
                last_out = _host(out[last_rows_t]) if on_device else out.numpy()[last_rows]
                arrays = backend.to_numpy(cache.key_cache), backend.to_numpy(cache.value_cache)
                query_rows = backend.to_numpy(query)[last_rows]
                errors, bounds = check_layer(*arrays, slots, query_rows, last_out, scale)
                layer_errors.append(errors)
                layer_bounds.append(bounds)
                self.check_seconds += time.perf_counter() - started
            return out

        hidden = self.llama.forward(torch.tensor(flat, dtype=torch.long), torch.from_numpy(positions), attention)
        if layer_errors:
            ids = tuple(s.seq_id for s in seqs)
            self._forward_check = LayerCheck(ids, np.stack(layer_errors), np.stack(layer_bounds))
        logits = self.llama.logits(hidden[last_rows_t]).cpu()
        for i, (seq, start, _) in enumerate(computed):
            seq_id, lo, hi = seq.seq_id, int(query_starts[i]), int(query_starts[i + 1])
            self.model.logits[seq_id] = logits[i].clone()
            if skip and start == 0:  # the hit tokens' K/V, for the dense check's row: from the pool
                hit_k, hit_v = self.cache.read_sequence(seq.block_table, skip)
                self.dense.append(seq_id, hit_k, hit_v)
            self.dense.append(seq_id, seen["k"][lo:hi], seen["v"][lo:hi])
            self._last_query[seq_id] = seen["q"][hi - 1].copy()
        stacked = torch.stack(layer_queries, dim=1).cpu().numpy() if on_device else np.stack(layer_queries, axis=1)
        for i, queries in enumerate(stacked):
            self._layer_queries[seqs[i].seq_id] = queries

    def _as_stored(self, t: torch.Tensor):
        """A forward's q, k or v in the cache's dtype where the kernels read it: a host array,
        or on the device a view of the same memory (DLPack, no copy where the dtype is the
        cache's)."""
        if not self.on_device:
            return t.numpy().astype(self.cache.dtype, copy=False)
        xp = self.backend.xp
        name = dtype_name(self.cache.dtype)
        if name == "bfloat16":  # the device cache holds bf16 bit patterns as uint16
            return xp.from_dlpack(t.to(torch.bfloat16).view(torch.int16).contiguous()).view(xp.uint16)
        return xp.from_dlpack(t.to(TORCH_DTYPES[name]).contiguous())

    def attend(self, seqs: list[Sequence]):
        """The checked layer's decode attention over every live sequence (as for the synthetic
        model), with the last forward's check of every layer and of the logits (once: a step
        that runs no forward reports none)."""
        report = super().attend(seqs)
        if self.layer_check is not None:
            if report is None:  # every sequence it computed has finished: the check still counts
                report = empty_report(self.backend, self.config, self.cache.dtype)
            report = replace(report, layers=self.layer_check)
        self.layer_check = None
        return report

    # -- swapping and inspection -------------------------------------------------------------------
    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        for cache, swap in zip(self.caches, self.swaps, strict=True):
            swap.swap_out(self.backend, cache, pairs)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        for cache, swap in zip(self.caches, self.swaps, strict=True):
            swap.swap_in(self.backend, cache, pairs)

    def attention_weights(self, seq: Sequence) -> tuple[np.ndarray, np.ndarray]:
        """Softmax weights (num_heads, context_len) of ``seq``'s newest token in the checked
        layer, from its dense K/V, and the physical block each context token was read from."""
        c = self.config
        keys, _ = self.dense_kv(seq.seq_id)
        q = self._last_query[seq.seq_id].astype(self.cache.dtype).astype(np.float32)
        weights = self._softmax_over_context(q, keys.astype(np.float32))
        token_blocks = np.repeat(np.array(seq.block_table), c.block_size)[: seq.num_tokens]
        return weights, token_blocks

    def _softmax_over_context(self, q: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Softmax weights (num_heads, T) of ``q`` (num_heads, head_dim) over ``keys``
        (T, num_kv_heads, head_dim), each query head reading its KV head (GQA)."""
        c = self.config
        kv_of_head = np.arange(c.num_heads) // (c.num_heads // c.num_kv_heads)
        scores = np.einsum("hd,thd->ht", q, keys[:, kv_of_head, :]) * self.scale
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        return weights.astype(np.float32)

    def layer_cache(self, layer: int) -> PagedKVCache:
        if not 0 <= layer < self.num_layers:
            raise InvalidOperationError(f"layer {layer} is outside 0..{self.num_layers - 1}")
        return self.caches[layer]

    def layer_detail(self, seq: Sequence, layer: int, context_len: int) -> LayerDetail:
        """``seq``'s newest token in ``layer`` over its first ``context_len`` tokens: the paged
        kernel's output over that layer's cache, dense attention over the K/V gathered through
        the block table, and the softmax weights (the layer check's comparison, for one row)."""
        cache, backend = self.layer_cache(layer), self.backend
        query = self._layer_queries[seq.seq_id][layer][None]  # (1, H, D)
        stored = query.astype(cache.dtype)
        tables, lens = padded_tables([seq]), np.array([context_len], np.int32)
        device_query = backend.to_device(stored)
        out = backend.paged_attention(device_query, cache.key_cache, cache.value_cache, tables, lens, self.scale)
        output = np.asarray(backend.to_numpy(out), dtype=np.float32)[0]
        slots = gather_slots([seq.block_table], [context_len], self.config.block_size)
        arrays = backend.to_numpy(cache.key_cache), backend.to_numpy(cache.value_cache)
        dense, bounds, keys = gathered_attention(*arrays, slots, stored, self.scale)
        weights = self._softmax_over_context(stored[0].astype(np.float32), keys[0, :, :context_len].transpose(1, 0, 2))
        errors = np.abs(output - dense[0]).max(axis=1)
        return LayerDetail(layer, stored[0], output, dense[0], errors, bounds[0], weights, tables, lens)

    # -- snapshots -----------------------------------------------------------------------------------
    def snapshot(self, live_blocks: Iterable[int], with_data: bool = True) -> LlamaRunnerSnapshot:
        live = set(live_blocks)
        base = super().snapshot(live, with_data)
        layers = swaps = reference = None
        if with_data:
            layers = tuple(c.snapshot(live) for c in self.caches[:-1])
            swaps = tuple(s.snapshot() for s in self.swaps[:-1])
            reference = self.reference.snapshot()
        logits = tuple(self.model.logits.items())
        return LlamaRunnerSnapshot(
            **{f: getattr(base, f) for f in ("cache", "swap_space", "dense", "last_query")},
            layers=layers,
            layer_swaps=swaps,
            logits=logits,
            reference=reference,
            layer_queries=tuple(self._layer_queries.items()),
        )

    def paged_caches(self) -> list[PagedKVCache]:
        return list(self.caches)

    def can_restore(self, snap: LlamaRunnerSnapshot) -> bool:
        if snap.layers is None:
            return True
        layers_ok = all(c.can_restore(p) for c, p in zip(self.caches[:-1], snap.layers, strict=True))
        return super().can_restore(snap) and layers_ok

    def restore(
        self, snap: LlamaRunnerSnapshot, sequences: Iterable[Sequence], swapped: Iterable[Sequence], pool: BlockPool
    ) -> None:
        self.model.logits = dict(snap.logits)
        self._layer_queries = dict(snap.layer_queries)
        if snap.cache is not None:
            for cache, swap, point, data in zip(self.caches, self.swaps, snap.layers, snap.layer_swaps, strict=False):
                cache.restore(point)
                swap.restore(data)
            self.reference.restore(snap.reference)
        super().restore(snap, sequences, swapped, pool)  # the checked layer's (or a rebuild of every layer)
        self.logits_checks = []
        self.layer_check = self._forward_check = None

    def rebuild_kv(self, sequences: list[Sequence], swapped: list[Sequence], pool: BlockPool) -> None:
        """Every sequence's K/V in every layer recomputed from its tokens by the dense engine
        (within rounding of what the paged forwards wrote), into its blocks or its swapped
        blocks; the dense rows and logits with them. Free blocks that only the prefix cache
        holds are not recomputed (no sequence names their prefix)."""
        for cache in self.caches[:-1]:
            cache.forget_checkpoint()
        self.reference.restore(None)
        bs, dtype = self.config.block_size, self.cache.dtype
        for seqs, where in ((sequences, "gpu"), (swapped, "cpu")):
            for seq in seqs:
                self.reference.add(seq.seq_id)
                if not seq.token_ids:
                    self.dense.rebuild_row(seq.seq_id, None, None)
                    continue
                logits = self.reference.feed(seq.seq_id, list(seq.token_ids))
                self.model.logits.setdefault(seq.seq_id, logits)
                rows: DenseKVCache = self.reference.caches[seq.seq_id]
                n = seq.num_tokens
                keys = rows.keys[:, :, :n].transpose(1, 2).numpy().astype(dtype)  # (layers, n, kv, d)
                values = rows.values[:, :, :n].transpose(1, 2).numpy().astype(dtype)
                for layer, (cache, swap) in enumerate(zip(self.caches, self.swaps, strict=True)):
                    if where == "gpu":
                        slots = np.array([seq.block_table[p // bs] * bs + p % bs for p in range(n)], np.int64)
                        cache.write(slots, keys[layer], values[layer])
                    else:
                        blocks = {
                            b: (keys[layer, i * bs : (i + 1) * bs], values[layer, i * bs : (i + 1) * bs])
                            for i, b in enumerate(seq.block_table)
                        }
                        swap.rebuild(blocks, bs)
                self.dense.rebuild_row(seq.seq_id, keys[self.check_layer], values[self.check_layer])
