"""Immutable events the engine emits; a GUI animates these without reading internals."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SequenceAdded:
    seq: str
    num_tokens: int


@dataclass(frozen=True, slots=True)
class SequenceForked:
    parent: str
    child: str


@dataclass(frozen=True, slots=True)
class SequenceFreed:
    seq: str


@dataclass(frozen=True, slots=True)
class BlockAllocated:
    """``block`` left the free queue to become ``seq``'s logical block ``logical_index``."""

    block: int
    seq: str
    logical_index: int


@dataclass(frozen=True, slots=True)
class BlockShared:
    """``seq``'s table now holds ``block`` too (fork); ``ref_count`` after the change."""

    block: int
    seq: str
    logical_index: int
    ref_count: int


@dataclass(frozen=True, slots=True)
class BlockReleased:
    """``seq`` let go of ``block``, which others still hold (``ref_count`` > 0)."""

    block: int
    seq: str
    ref_count: int


@dataclass(frozen=True, slots=True)
class BlockFreed:
    """``block``'s last holder ``seq`` let go; it joined the free queue's tail."""

    block: int
    seq: str


@dataclass(frozen=True, slots=True)
class BlockCopied:
    """Copy-on-write: ``seq`` was about to write into shared ``src``; its KV went to ``dst``."""

    src: int
    dst: int
    seq: str
    logical_index: int


@dataclass(frozen=True, slots=True)
class BlockReused:
    """Prefix-cache hit: ``seq``'s logical block ``logical_index`` is the cached ``block``
    (taken back from the free queue if ``was_free``); its tokens are not computed again."""

    block: int
    seq: str
    logical_index: int
    ref_count: int
    was_free: bool


@dataclass(frozen=True, slots=True)
class BlockCached:
    """A full block's tokens were hashed: a later identical prefix can reuse it."""

    block: int
    seq: str
    block_hash: int


@dataclass(frozen=True, slots=True)
class BlockEvicted:
    """A free cached block was reallocated: its hash (and cached data) are gone."""

    block: int


@dataclass(frozen=True, slots=True)
class BlockSwappedOut:
    """Preemption by swap: GPU ``block``'s K/V moved to ``cpu_block`` of the CPU pool."""

    block: int
    cpu_block: int


@dataclass(frozen=True, slots=True)
class BlockSwappedIn:
    cpu_block: int
    block: int


@dataclass(frozen=True, slots=True)
class RequestSubmitted:
    request: str
    prompt_len: int
    output_len: int
    num_seqs: int


@dataclass(frozen=True, slots=True)
class RequestAdmitted:
    request: str
    seqs: tuple[str, ...]
    resumed: bool  # after a preemption by recompute


@dataclass(frozen=True, slots=True)
class RequestPreempted:
    """``mode`` is "recompute" (blocks freed; ``tokens`` will be computed again) or
    "swap" (``blocks`` moved to the CPU pool, taking ``swap_seconds`` of simulated time)."""

    request: str
    mode: str
    seqs: tuple[str, ...]
    blocks: int
    tokens: int
    swap_seconds: float


@dataclass(frozen=True, slots=True)
class RequestSwappedIn:
    request: str
    blocks: int
    swap_seconds: float


@dataclass(frozen=True, slots=True)
class RequestFinished:
    request: str
    output_tokens: int


@dataclass(frozen=True, slots=True)
class RequestRejected:
    request: str
    reason: str


@dataclass(frozen=True, slots=True)
class TokenWritten:
    seq: str
    position: int
    token_id: int
    block: int
    slot: int


@dataclass(frozen=True, slots=True)
class LookupPerformed:
    """The kernel walked ``seq``'s block table in this order: ``blocks[i]`` is the physical
    block it read for logical block ``i``, up to ``context_len`` tokens."""

    seq: str
    blocks: tuple[int, ...]
    context_len: int


@dataclass(frozen=True, slots=True)
class AttentionComputed:
    """Paged kernel vs dense attention for one sequence (query = its newest token)."""

    seq: str
    context_len: int
    max_abs_error: float
    head_errors: tuple[float, ...]
    tolerance: float
    backend: str

    @property
    def passed(self) -> bool:
        return self.max_abs_error <= self.tolerance


@dataclass(frozen=True, slots=True)
class KernelLaunched:
    backend: str
    device: str
    num_seqs: int
    kernel_seconds: float
    dense_seconds: float


Event = (
    SequenceAdded
    | SequenceForked
    | SequenceFreed
    | BlockAllocated
    | BlockShared
    | BlockReleased
    | BlockFreed
    | BlockCopied
    | BlockReused
    | BlockCached
    | BlockEvicted
    | TokenWritten
    | BlockSwappedOut
    | BlockSwappedIn
    | RequestSubmitted
    | RequestAdmitted
    | RequestPreempted
    | RequestSwappedIn
    | RequestFinished
    | RequestRejected
    | LookupPerformed
    | AttentionComputed
    | KernelLaunched
)
