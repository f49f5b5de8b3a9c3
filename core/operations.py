"""Operations: the only way state changes. Each is a small immutable command."""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.core.checks import all_ints, is_count, is_int
from pagesim.core.errors import InvalidOperationError
from pagesim.core.sampling import SamplingParams

# Every operation checks its own fields, here and nowhere else: scenario files and the app
# build operations and report these errors with the field they name.
CHILD_SEPARATOR = "/"  # the scheduler names a request's samples and beams request/s0, request/b1
MAX_NAME_CHARS = 100  # a new sequence's or request's name (vLLM's request ids run to ~45)


def _check_seq_id(seq_id: object, name: str = "seq", new: bool = False) -> None:
    """A name; one the user gives to something new may not contain ``/``, so that it can
    never collide with, or pass for, a sequence the scheduler forks from a request."""
    if not isinstance(seq_id, str) or not seq_id:
        raise InvalidOperationError(f"{name} must be a non-empty sequence name; got {seq_id!r}", name)
    if not new:
        return
    # (names are shown in tables, captions and the log: a blank one, a line break or a
    # paragraph of a name would be read as nothing, or break the lines around it)
    if not seq_id.strip() or not seq_id.isprintable():
        what = "is blank" if not seq_id.strip() else "holds a line break or another control character"
        raise InvalidOperationError(f"{name} {seq_id!r} {what}: give a name to show", name)
    if len(seq_id) > MAX_NAME_CHARS:
        raise InvalidOperationError(
            f"{name} is {len(seq_id)} characters long; a name has at most {MAX_NAME_CHARS}", name
        )
    if CHILD_SEPARATOR in seq_id:
        raise InvalidOperationError(
            f"{name} {seq_id!r} may not contain '{CHILD_SEPARATOR}': it is reserved for the scheduler's samples "
            "and beams (request/s0, request/b1)",
            name,
        )


def _check_token_ids(token_ids: tuple[int, ...], field: str) -> None:
    if not token_ids:
        raise InvalidOperationError(f"{field} must hold at least one token id", field)
    if not all_ints(token_ids):
        bad = next(t for t in token_ids if not is_int(t))
        raise InvalidOperationError(f"{field} must hold integer token ids; got {bad!r}", field)


def _check_sampling(sampling) -> None:
    if sampling is not None and not isinstance(sampling, SamplingParams):
        raise InvalidOperationError(f"sampling must be SamplingParams or None; got {sampling!r}", "sampling")


def _describe_sampling(sampling: SamplingParams | None) -> str:
    """A request's sampling in a step's description ("" when greedy with no limit)."""
    if sampling is None:
        return ""
    parts = [] if sampling.greedy else [f"T={sampling.temperature:g}"]
    if not sampling.greedy and sampling.top_k:
        parts.append(f"top-k {sampling.top_k}")
    if not sampling.greedy and sampling.top_p < 1:
        parts.append(f"top-p {sampling.top_p:g}")
    if not sampling.greedy:
        parts.append(f"seed {sampling.seed}")
    if sampling.max_tokens is not None:
        parts.append(f"max {sampling.max_tokens}")
    return f", {', '.join(parts)}" if parts else ""


def _check_count(value, field: str, minimum: int = 1) -> None:
    if not is_count(value, minimum):
        kind = "a positive integer" if minimum == 1 else f"an integer ≥ {minimum}"
        raise InvalidOperationError(f"{field} must be {kind}; got {value!r}", field)


@dataclass(frozen=True)
class Add:
    """A new sequence with a prompt: ``num_tokens`` synthetic ids or explicit ``prompt``.
    ``blocks`` optionally places it on named physical blocks; ``sampling``: how a real
    model picks its next tokens (None: greedy, no limit)."""

    seq: str
    num_tokens: int | None = None
    prompt: tuple[int, ...] | None = None
    blocks: tuple[int, ...] | None = None
    sampling: SamplingParams | None = None

    def __post_init__(self) -> None:
        _check_seq_id(self.seq, new=True)
        if (self.num_tokens is None) == (self.prompt is None):
            raise InvalidOperationError("add needs exactly one of tokens (a count) or prompt (token ids)", "tokens")
        if self.num_tokens is not None:
            _check_count(self.num_tokens, "tokens")
        if self.prompt is not None:
            object.__setattr__(self, "prompt", tuple(self.prompt))
            _check_token_ids(self.prompt, "prompt")
        if self.blocks is not None:
            object.__setattr__(self, "blocks", tuple(self.blocks))
        _check_sampling(self.sampling)

    @property
    def length(self) -> int:
        return self.num_tokens if self.prompt is None else len(self.prompt)

    def describe(self) -> str:
        where = f" on {list(self.blocks)}" if self.blocks is not None else ""
        return f"add {self.seq} ({self.length} tok{_describe_sampling(self.sampling)}){where}"


@dataclass(frozen=True)
class Grow:
    """Decode ``num_tokens`` new tokens (synthetic; one if neither is given) or the
    explicit ``token_ids``."""

    seq: str
    num_tokens: int | None = None
    token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _check_seq_id(self.seq)
        if self.token_ids is not None:
            if self.num_tokens is not None:
                raise InvalidOperationError("grow takes tokens (a count) or token_ids, not both", "tokens")
            object.__setattr__(self, "token_ids", tuple(self.token_ids))
            _check_token_ids(self.token_ids, "token_ids")
            return
        if self.num_tokens is None:
            object.__setattr__(self, "num_tokens", 1)
        _check_count(self.num_tokens, "tokens")

    @property
    def length(self) -> int:
        return self.num_tokens if self.token_ids is None else len(self.token_ids)

    def describe(self) -> str:
        return f"grow {self.seq} +{self.length}"


@dataclass(frozen=True)
class Fork:
    """A new sequence ``new_seq`` sharing every block of ``seq`` (ref counts up)."""

    seq: str
    new_seq: str

    def __post_init__(self) -> None:
        _check_seq_id(self.seq)
        _check_seq_id(self.new_seq, "as", new=True)

    def describe(self) -> str:
        return f"fork {self.seq} → {self.new_seq}"


@dataclass(frozen=True)
class Free:
    seq: str

    def __post_init__(self) -> None:
        _check_seq_id(self.seq)

    def describe(self) -> str:
        return f"free {self.seq}"


@dataclass(frozen=True)
class Submit:
    """A request for the scheduler: a prompt (``prompt_len`` synthetic tokens, the first
    ``shared_prefix`` of them common to every request, or explicit ``prompt`` ids) and
    ``output_len`` tokens to decode, as ``n`` parallel samples or ``beam_width`` beams;
    ``sampling``: how a real model picks each sample's tokens (its ``max_tokens`` unused:
    ``output_len`` is the request's)."""

    request: str
    output_len: int
    prompt_len: int | None = None
    prompt: tuple[int, ...] | None = None
    n: int = 1
    beam_width: int = 0
    shared_prefix: int = 0
    sampling: SamplingParams | None = None

    def __post_init__(self) -> None:
        _check_seq_id(self.request, "request", new=True)
        if (self.prompt_len is None) == (self.prompt is None):
            raise InvalidOperationError("submit needs exactly one of tokens (a count) or prompt (token ids)", "tokens")
        if self.prompt is not None:
            object.__setattr__(self, "prompt", tuple(self.prompt))
            _check_token_ids(self.prompt, "prompt")
        else:
            _check_count(self.prompt_len, "tokens")
        _check_count(self.output_len, "output")
        _check_count(self.n, "n")
        _check_count(self.beam_width, "beam_width", 0)
        _check_count(self.shared_prefix, "shared_prefix", 0)
        if self.n > 1 and self.beam_width:
            raise InvalidOperationError("a request samples n > 1 or searches with beams, not both", "beam_width")
        if self.beam_width and self.sampling is not None and not self.sampling.greedy:
            raise InvalidOperationError("beam search draws no samples: leave temperature at 0", "temperature")
        if self.n > 1 and self.sampling is not None and self.sampling.greedy:  # (vLLM refuses it too)
            raise InvalidOperationError(
                f"{self.n} samples at temperature 0 (greedy) would all be the same text: raise the temperature",
                "temperature",
            )
        _check_sampling(self.sampling)

    @property
    def length(self) -> int:
        return self.prompt_len if self.prompt is None else len(self.prompt)

    @property
    def num_seqs(self) -> int:
        return self.beam_width or self.n

    def describe(self) -> str:
        fan = f", n={self.n}" if self.n > 1 else f", beam={self.beam_width}" if self.beam_width else ""
        return f"submit {self.request} ({self.length}+{self.output_len}{fan}{_describe_sampling(self.sampling)})"


@dataclass(frozen=True)
class Schedule:
    """Run ``steps`` scheduler iterations: admit, decode one token per running sequence,
    preempt when a block cannot be had."""

    steps: int = 1

    def __post_init__(self) -> None:
        _check_count(self.steps, "steps")

    def describe(self) -> str:
        return f"schedule ×{self.steps}"


Operation = Add | Grow | Fork | Free | Submit | Schedule


def introduced_names(operations) -> tuple[str, ...]:
    """The sequences and requests the operations bring in, in order (each once)."""
    names: dict[str, None] = {}
    for op in operations:
        if isinstance(op, Add):
            names.setdefault(op.seq)
        elif isinstance(op, Fork):
            names.setdefault(op.new_seq)
        elif isinstance(op, Submit):
            names.setdefault(op.request)
    return tuple(names)


def new_sequence_name(taken, prefix: str = "s") -> str:
    """The first free name ``s1``, ``s2``, … for a sequence the user adds or forks."""
    taken = set(taken)
    n = 1
    while f"{prefix}{n}" in taken:
        n += 1
    return f"{prefix}{n}"
