"""The sequence registry: the live sequences and the swapped ones, and the operations that
change them — add, fork, append, decode, free, swap — each carried out by the block
manager (blocks, tables, events) and then the model runner (K/V).

The simulator validates the user's operations and the scheduler decides its own; both
change sequences only here, so the scheduler never calls back into the simulator. Each
operation checks what it needs before it changes anything (raising a
:class:`~pagesim.core.errors.PagesimError`), then applies it whole.
"""

from __future__ import annotations

from collections import abc
from typing import Any

from pagesim.core import events as ev
from pagesim.core.block_manager import BlockManager, distinct_blocks
from pagesim.core.config import CacheConfig
from pagesim.core.errors import (
    DuplicateSequenceError,
    InvalidPlacementError,
    PoolExhaustedError,
    UnknownSequenceError,
)
from pagesim.core.events import EventLog
from pagesim.core.model_runner import ModelRunner
from pagesim.core.sampling import SamplingParams
from pagesim.core.sequence import Sequence, TokenIds


class SequenceRegistry:
    def __init__(self, config: CacheConfig, blocks: BlockManager, runner: ModelRunner, events: EventLog) -> None:
        self.config = config
        self.blocks = blocks
        self.runner = runner
        self.events = events
        self.sequences: dict[str, Sequence] = {}
        # Preemption by swap: sequences whose blocks wait in the CPU pool, off the GPU.
        self.swapped: dict[str, Sequence] = {}
        # A real model's forwards in the operation under way: ("prefill" | "decode", tokens,
        # seconds); the engine clears it at each operation (the synthetic model runs none).
        self.forwards: list[tuple[str, int, float]] = []

    # -- lookups ----------------------------------------------------------------------------
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

    def check_new_id(self, seq_id: str) -> None:
        if self.is_taken(seq_id):
            raise DuplicateSequenceError(seq_id)

    def live_blocks(self) -> set[int]:
        """GPU blocks whose K/V someone may read: held by a sequence, or cached for reuse."""
        live = {b for seq in self.sequences.values() for b in seq.block_table}
        return live | set(self.blocks.pool.cached_blocks())

    # -- operations -------------------------------------------------------------------------
    def add(
        self,
        seq_id: str,
        token_ids: TokenIds,
        placement: abc.Iterable[object] | None = None,
        owner: str | None = None,
        vocab_checked: bool = False,
        sampling: SamplingParams | None = None,
        prompt_len: int | None = None,
        hits: list[tuple[int, int]] | None = None,
        known_hashes: list[int] | None = None,
        looked_up: int | None = None,
    ) -> None:
        """A new sequence with ``token_ids`` as its prompt: prefix-cache hits, then fresh
        blocks (``placement``: exactly these), then the tokens' K/V. ``sampling``: how a
        real model picks its next tokens; ``prompt_len``: how many of ``token_ids`` are the
        prompt (a preempted sequence comes back with what it had generated; default all);
        ``hits``: its prefix-cache hits, when the caller has just looked them up;
        ``known_hashes``: the hashes of its tokens' blocks found before (extended here);
        ``looked_up``: how many tokens the hits were looked up for, when more than
        ``token_ids`` (a chunked prefill's first chunk), for the prefix cache's hit rate."""
        self.check_new_id(seq_id)
        if not vocab_checked:
            self.runner.model.check_vocab(token_ids, "prompt")
        c, blocks = self.config, self.blocks
        caching = c.prefix_caching and placement is None
        if not caching:
            hits = []
        elif hits is None:
            hits = blocks.prefix.match(token_ids, known_hashes)
        chosen = None
        if placement is not None:
            chosen = blocks.pool.check_placement(placement)
            needed = c.blocks_for(len(token_ids)) - len(hits)
            if len(chosen) != needed:
                raise InvalidPlacementError(
                    f"{len(token_ids)} tokens at block size {c.block_size} need exactly "
                    f"{ev.plural(needed, 'block')}; placement names {len(chosen)}"
                )
        elif not blocks.can_allocate(len(token_ids), hits):
            taken = blocks.allocation_need(len(token_ids), hits)
            raise PoolExhaustedError(taken, blocks.num_free, f"add {seq_id} ({len(token_ids)} tokens)")
        # -- validated; apply --
        prompt_len = len(token_ids) if prompt_len is None else prompt_len
        seq = Sequence(seq_id, owner=owner, sampling=sampling, prompt_len=prompt_len, known_hashes=known_hashes)
        self.sequences[seq_id] = seq
        self.runner.add_sequence(seq_id)
        self.events.add(ev.SequenceAdded, seq_id, len(token_ids), None if prompt_len == len(token_ids) else prompt_len)
        blocks.allocate(seq, len(token_ids), hits, chosen)
        if caching:
            blocks.prefix.note_lookup(len(token_ids) if looked_up is None else looked_up, len(hits))
        self.append([seq], [token_ids], skip=len(hits) * c.block_size)

    def fork(self, parent_id: str, child_id: str, owner: str | None = None, index: int | None = None) -> None:
        """``child_id`` shares every block of ``parent_id`` (copy-on-write when either writes).
        It inherits the parent's sampling parameters with its own sequence ``index`` (its
        own draws; None: an index from its name)."""
        parent = self.sequence(parent_id)
        self.check_new_id(child_id)
        child = parent.copy(child_id)
        child.owner = owner
        if parent.sampling is not None:
            child.sampling = parent.sampling.for_fork(child_id) if index is None else parent.sampling.for_index(index)
        self.sequences[child_id] = child
        self.runner.fork_sequence(parent_id, child_id)
        self.events.add(ev.SequenceForked, parent_id, child_id)
        self.blocks.fork(parent, child)

    def free(self, seq_id: str) -> None:
        seq = self.sequence(seq_id)
        self.blocks.free(seq)
        del self.sequences[seq_id]
        self.runner.free_sequence(seq_id)
        self.events.add(ev.SequenceFreed, seq_id)

    def append(
        self,
        seqs: list[Sequence],
        token_ids: abc.Sequence[Any],  # a TokenIds per sequence, or one int each
        skip: int = 0,
        starts: list[int] | None = None,
    ) -> None:
        """Tokens join sequences: the block manager first (slots, copy-on-write), then the
        K/V. ``token_ids[i]``: a list of ``seqs[i]``'s new tokens, or its one new token. The
        caller has checked that the pool covers the blocks they take. ``starts``: the
        sequences' lengths before, when the caller has them."""
        if not self.runner.kv_data:  # memory management only: the blocks alone
            self.blocks.append(seqs, token_ids, skip, with_slots=False, starts=starts)
            return
        if token_ids and type(token_ids[0]) is int:
            token_ids = [[token] for token in token_ids]
        if starts is None:
            starts = [len(s.token_ids) for s in seqs]
        done = self.blocks.append(seqs, token_ids, skip, starts=starts)
        self.runner.write_kv(seqs, starts, token_ids, done.slots, done.copies, skip)
        self._note_forward("prefill" if skip or any(len(ids) > 1 for ids in token_ids) else "decode")

    def decode(
        self,
        seqs: list[Sequence],
        seq_ids: list[str] | None = None,
        checked: bool = False,
        chosen: dict[str, int] | None = None,
    ) -> None:
        """One new token for each of ``seqs`` (named ``seq_ids``) at once (a decode step),
        validated as a whole. ``checked``: the caller has just compared the block manager's
        ``decode_blocks_needed`` for these sequences with the free pool. ``chosen``: tokens
        already picked for some sequences (beam search); the model picks the others'."""
        if not checked and (need := self.blocks.decode_blocks_needed(seqs)) > self.blocks.num_free:
            raise PoolExhaustedError(need, self.blocks.num_free, f"a decode step of {len(seqs)} sequences")
        starts = [len(s.token_ids) for s in seqs]
        if seq_ids is None:
            seq_ids = [s.seq_id for s in seqs]
        model = self.runner.model
        if chosen:
            rest = [i for i, seq_id in enumerate(seq_ids) if seq_id not in chosen]
            picked = self._next_tokens(
                model, [seqs[i] for i in rest], [seq_ids[i] for i in rest], [starts[i] for i in rest]
            )
            drawn = iter(picked)
            tokens = [chosen[seq_id] if seq_id in chosen else next(drawn) for seq_id in seq_ids]
        else:
            tokens = self._next_tokens(model, seqs, seq_ids, starts)
        if not self.runner.kv_data:  # memory management only: the blocks alone
            self.blocks.append(seqs, tokens, with_slots=False, starts=starts)
            return
        done = self.blocks.append(seqs, tokens, starts=starts)
        self.runner.write_kv(seqs, starts, [[t] for t in tokens], done.slots, done.copies)
        self._note_forward("decode")

    def _note_forward(self, kind: str) -> None:
        seconds = getattr(self.runner, "paged_seconds", None)  # a real model's forward only
        if seconds is not None:
            self.forwards.append((kind, getattr(self.runner, "computed_tokens"), seconds))  # noqa: B009

    @staticmethod
    def _next_tokens(model, seqs: list[Sequence], seq_ids: list[str], starts: list[int]) -> list[int]:
        """The model's next token for each sequence, as a list of Python ints (whatever
        sequence of ints the model gave: compiled, the append path takes only those)."""
        if model.samples_from_logits:
            return list(map(int, model.next_token_ids(seq_ids, starts, [s.sampling for s in seqs])))
        return list(map(int, model.next_token_ids(seq_ids, starts)))

    def swap_out(self, seq_ids: list[str]) -> int:
        """Move a group's blocks to the CPU pool (shared blocks once) and free them on the GPU."""
        seqs = [self.sequence(s) for s in seq_ids]
        if not self.blocks.can_swap_out(seqs):
            need = len(distinct_blocks(seqs))
            raise PoolExhaustedError(need, self.blocks.cpu_free, "swap to the CPU pool")
        pairs = self.blocks.swap_out(seqs)
        self.runner.swap_out(pairs)
        for seq in seqs:
            del self.sequences[seq.seq_id]
            self.swapped[seq.seq_id] = seq
        return len(pairs)

    def swap_in(self, seq_ids: list[str]) -> int:
        """Bring a swapped group back: new GPU blocks, bit-identical K/V, the same sharing."""
        seqs = [self.swapped[s] for s in seq_ids]
        if not self.blocks.can_swap_in(seqs):
            raise PoolExhaustedError(len(distinct_blocks(seqs)), self.blocks.num_free, "swap in")
        pairs = self.blocks.swap_in(seqs)
        self.runner.swap_in(pairs)
        for seq in seqs:
            del self.swapped[seq.seq_id]
            self.sequences[seq.seq_id] = seq
        return len(pairs)
