"""What one step computed, per sequence, as plain data: a prefill (a prompt, a grow of
several tokens, a recompute after preemption) or one decode token; and the prompt tokens a
prefix-cache hit let it skip (their K/V already in the pool: not computed again).

Read from the step's own events, so it holds for any scheduler and for the user's add and
grow: a sequence that arrived this step or wrote more than one token prefilled; one that
wrote a single token after its prompt decoded. A v1 schedule step shows its token budget
instead (``core.token_budget``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.core import events as ev

PREFILL, DECODE = "prefill", "decode"


@dataclass(frozen=True, slots=True)
class SequenceWork:
    seq: str
    kind: str  # PREFILL or DECODE
    tokens: int  # computed this step
    cached: int  # prompt tokens a prefix-cache hit skipped (not computed)

    def describe(self) -> str:
        if self.kind == DECODE:
            count = "1 token" if self.tokens == 1 else f"{self.tokens} tokens, one forward each"
            return f"{self.seq}: decode, {count} (every earlier token's K/V is read from the cache)"
        text = f"{self.seq}: prefill, {self.tokens} token{'s' * (self.tokens != 1)} computed in one pass"
        if self.cached:
            text += f"; {self.cached} prompt tokens skipped (prefix-cache hit: their K/V already in the pool)"
        return text


@dataclass(frozen=True)
class StepWork:
    sequences: tuple[SequenceWork, ...]  # prefills first, then decodes
    longest: int = 0  # the longest context the step wrote into or left: the scale a decode's one token is drawn against
    # A real model's forward time this step, prefill and decode (None: the synthetic model,
    # which computes no forward pass).
    prefill_seconds: float | None = None
    decode_seconds: float | None = None

    @property
    def prefill_tokens(self) -> int:
        return sum(w.tokens for w in self.sequences if w.kind == PREFILL)

    @property
    def decode_tokens(self) -> int:
        return sum(w.tokens for w in self.sequences if w.kind == DECODE)

    @property
    def cached_tokens(self) -> int:
        return sum(w.cached for w in self.sequences)

    @property
    def total(self) -> int:
        return self.prefill_tokens + self.decode_tokens + self.cached_tokens

    def phase(self, seq: str) -> str | None:
        return next((w.kind for w in self.sequences if w.seq == seq), None)

    def request_phase(self, request: str) -> str | None:
        """PREFILL if any of the request's sequences (``r``, ``r/s0`` …) prefilled this step,
        else DECODE if any decoded (None: it computed nothing)."""
        kinds = {w.kind for w in self.sequences if w.seq == request or w.seq.startswith(request + "/")}
        return PREFILL if PREFILL in kinds else DECODE if kinds else None

    def summary(self) -> str:
        """One line: "prefill 38 tokens · decode 3 (1 per sequence) · 8 skipped (prefix-cache hit)"."""
        parts = []
        if self.prefill_tokens:
            parts.append(f"prefill {self.prefill_tokens} token{'s' * (self.prefill_tokens != 1)}")
        if self.decode_tokens:
            several = any(w.kind == DECODE and w.tokens > 1 for w in self.sequences)
            each = "one forward each" if several else "1 per sequence"
            parts.append(f"decode {self.decode_tokens} ({each})")
        if self.cached_tokens:
            parts.append(f"{self.cached_tokens} skipped (prefix-cache hit)")
        return " · ".join(parts) or "no token computed"

    def timing(self) -> str:
        """The real model's forward time, split ("" for the synthetic model): "prefill 120 ms + decode 40 ms"."""
        if self.prefill_seconds is None or self.decode_seconds is None:
            return ""
        parts = [
            f"{phase} {seconds * 1e3:.0f} ms"
            for phase, seconds, tokens in (
                (PREFILL, self.prefill_seconds, self.prefill_tokens),
                (DECODE, self.decode_seconds, self.decode_tokens),
            )
            if tokens
        ]
        if len(parts) == 1:  # one phase: its time alone
            return parts[0].split(" ", 1)[1]
        return "time: " + " + ".join(parts)


def step_work(events, block_size: int, longest: int = 0, forwards=None) -> StepWork | None:
    """The step's work from its events (None: it computed no token). ``forwards``: a real
    model's forwards in the step, (PREFILL or DECODE, tokens, seconds) each."""
    if not events:
        return None
    written: dict[str, int] = {}
    arrived: set[str] = set()
    cached: dict[str, int] = {}
    token_written, added, reused = ev.TokenWritten, ev.SequenceAdded, ev.BlockReused
    for event in events:
        kind = type(event)
        if kind is token_written:
            written[event.seq] = written.get(event.seq, 0) + 1
            # (a sequence the step finished and freed still read its context)
            longest = max(longest, event.position + 1)
        elif kind is added:
            arrived.add(event.seq)
        elif kind is reused:  # a cached block is full: block_size prompt tokens skipped
            cached[event.seq] = cached.get(event.seq, 0) + block_size
    if not written and not cached:
        return None
    # A real model's grow by N runs N decode forwards, one token each: decode, not prefill.
    decode_only = bool(forwards) and all(kind == DECODE for kind, _, _ in forwards)
    work = [
        SequenceWork(
            seq, PREFILL if seq in arrived or (count > 1 and not decode_only) else DECODE, count, cached.get(seq, 0)
        )
        for seq, count in written.items()
    ]
    work += [SequenceWork(seq, PREFILL, 0, hits) for seq, hits in cached.items() if seq not in written]
    work.sort(key=lambda w: w.kind != PREFILL)  # stable: prefills first, each group in event order
    seconds = None
    if forwards is not None:
        seconds = [sum(s for kind, _, s in forwards if kind == phase) for phase in (PREFILL, DECODE)]
    return StepWork(tuple(work), max(longest, 1), *(seconds or (None, None)))
