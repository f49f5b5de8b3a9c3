"""Operations: the only way state changes. Each is a small immutable command."""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import InvalidOperationError


def _check_seq_id(seq_id: object, name: str = "seq") -> None:
    if not isinstance(seq_id, str) or not seq_id:
        raise InvalidOperationError(f"{name} must be a non-empty sequence name; got {seq_id!r}")


def _check_token_ids(token_ids: tuple[int, ...], field: str) -> None:
    if not token_ids:
        raise InvalidOperationError(f"{field} must hold at least one token id")
    for token in token_ids:
        if not isinstance(token, int) or isinstance(token, bool):
            raise InvalidOperationError(f"{field} must hold integer token ids; got {token!r}")


@dataclass(frozen=True)
class Add:
    """A new sequence with a prompt: ``num_tokens`` synthetic ids or explicit ``prompt``.
    ``blocks`` optionally places it on named physical blocks."""

    seq: str
    num_tokens: int | None = None
    prompt: tuple[int, ...] | None = None
    blocks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _check_seq_id(self.seq)
        if (self.num_tokens is None) == (self.prompt is None):
            raise InvalidOperationError("add needs exactly one of tokens (a count) or prompt (token ids)")
        if self.num_tokens is not None and (
            not isinstance(self.num_tokens, int) or isinstance(self.num_tokens, bool) or self.num_tokens < 1
        ):
            raise InvalidOperationError(f"tokens must be a positive integer; got {self.num_tokens!r}")
        if self.prompt is not None:
            object.__setattr__(self, "prompt", tuple(self.prompt))
            _check_token_ids(self.prompt, "prompt")
        if self.blocks is not None:
            object.__setattr__(self, "blocks", tuple(self.blocks))

    @property
    def length(self) -> int:
        return self.num_tokens if self.prompt is None else len(self.prompt)

    def describe(self) -> str:
        where = f" on {list(self.blocks)}" if self.blocks is not None else ""
        return f"add {self.seq} ({self.length} tok){where}"


@dataclass(frozen=True)
class Grow:
    """Decode ``num_tokens`` new tokens (synthetic) or the explicit ``token_ids``."""

    seq: str
    num_tokens: int | None = 1
    token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _check_seq_id(self.seq)
        if self.token_ids is not None:
            object.__setattr__(self, "token_ids", tuple(self.token_ids))
            _check_token_ids(self.token_ids, "token_ids")
            object.__setattr__(self, "num_tokens", None)
        elif not isinstance(self.num_tokens, int) or isinstance(self.num_tokens, bool) or self.num_tokens < 1:
            raise InvalidOperationError(f"tokens must be a positive integer; got {self.num_tokens!r}")

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
        _check_seq_id(self.new_seq, "as")

    def describe(self) -> str:
        return f"fork {self.seq} → {self.new_seq}"


@dataclass(frozen=True)
class Free:
    seq: str

    def __post_init__(self) -> None:
        _check_seq_id(self.seq)

    def describe(self) -> str:
        return f"free {self.seq}"


Operation = Add | Grow | Fork | Free
