"""What a real model's tokens say: each token's piece of text, a prompt typed as text turned
into token ids, and the visible form of whitespace the views and captions show.

The synthetic model has no tokenizer (its ids are hashes): every function here answers None
for it, and callers keep their numbers-only wording.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pagesim.core.checks import utf8_error
from pagesim.core.errors import InvalidOperationError

PieceOf = Callable[[Sequence[int], int], str]  # (a sequence's ids, index) -> that token's text

# A byte-level token can be part of one character (an emoji is 4 byte tokens): decoded alone
# it is "\ufffd". Decoding it with the tokens before it (at most 3 more bytes) gives the whole
# character, which is shown on the token that completes it.
_BYTES_PER_CHAR = 4
_REPLACEMENT = "\ufffd"
VISIBLE = {" ": "·", "\n": "↵", "\t": "→", "\r": "␍"}


def tokenizer_of(model) -> object | None:
    """The model's tokenizer (``encode``, ``decode``), or None for the synthetic model."""
    return getattr(model, "tokenizer", None)


@functools.lru_cache(maxsize=4)  # one per tokenizer: the frames of a scenario share its memory
def piece_function(tokenizer) -> PieceOf | None:
    """A function giving each token's text in its sequence, remembered per token id."""
    if tokenizer is None:
        return None
    alone: dict[int, str] = {}

    def piece(ids: Sequence[int], index: int) -> str:
        token = int(ids[index])
        text = alone.get(token)
        if text is None:
            text = alone[token] = tokenizer.decode([token])
        if _REPLACEMENT not in text:
            return text
        start = max(0, index - _BYTES_PER_CHAR + 1)
        # What the tokens before it said, less their own incomplete character.
        before = tokenizer.decode([int(t) for t in ids[start:index]]).rstrip(_REPLACEMENT) if index > start else ""
        together = tokenizer.decode([int(t) for t in ids[start : index + 1]])
        if not together.startswith(before):
            return text
        # A character still incomplete is shown on the token that completes it.
        return together[len(before) :].rstrip(_REPLACEMENT)

    return piece


def text_function(model) -> Callable[[Sequence[int]], str] | None:
    """Ids to text with ``model``'s tokenizer (None for the synthetic model)."""
    tokenizer = tokenizer_of(model)
    return None if tokenizer is None else tokenizer.decode


def pieces_of(piece: PieceOf, ids: Sequence[int]) -> tuple[str, ...]:
    return tuple(piece(ids, i) for i in range(len(ids)))


def visible(text: str, limit: int | None = None) -> str:
    """``text`` with its whitespace drawn (``·`` a space, ``↵`` a newline), cut to ``limit``
    characters with "…"."""
    shown = "".join(VISIBLE.get(c, c) for c in text)
    if limit is not None and len(shown) > limit:
        shown = shown[: max(1, limit - 1)] + "…"
    return shown


def quoted(text: str, limit: int = 40) -> str:
    """``text`` in quotes for a sentence: its spaces as they are, newlines as ``↵``."""
    shown = text.replace("\n", "↵").replace("\r", "")
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return f'"{shown}"'


def prompt_ids(model, text: str, as_chat: bool = False) -> list[int]:
    """The token ids of a prompt typed as ``text`` for ``model``: the text itself, or (with
    ``as_chat``) a user message in the model's chat template, ready for the reply."""
    tokenizer = tokenizer_of(model)
    if tokenizer is None:
        raise InvalidOperationError("this model has no tokenizer: give the prompt as a number of tokens", "prompt")
    if not text:
        raise InvalidOperationError("the prompt is empty: type some text", "prompt")
    if (at := utf8_error(text)) is not None:
        raise InvalidOperationError(f"the prompt is not valid UTF-8 text (at character {at})", "prompt")
    ids = tokenizer.encode_chat([{"role": "user", "content": text}]) if as_chat else tokenizer.encode(text)
    if not ids:
        raise InvalidOperationError("the prompt has no tokens", "prompt")
    return ids


@dataclass(frozen=True)
class Divergence:
    """Where two sequences that share blocks part: the blocks they share at the same logical
    places, and the first token whose text differs (None: one's text starts the other's)."""

    other: str
    shared_blocks: int  # leading logical blocks held by both (the same physical blocks)
    first_difference: int | None
    own_text: str  # each side's text from the first difference on, a few tokens
    other_text: str


def divergence(
    seq_id: str, pieces: Sequence[str], table: Sequence[int], other: str, other_pieces: Sequence[str],
    other_table: Sequence[int], shown: int = 6,
) -> Divergence | None:  # fmt: skip
    """How ``seq_id`` and ``other`` part (None: they share no leading block, a fork's or a
    cached prefix's)."""
    shared = 0
    for mine, theirs in zip(table, other_table, strict=False):
        if mine != theirs:
            break
        shared += 1
    if shared == 0:
        return None
    common = 0
    for mine, theirs in zip(pieces, other_pieces, strict=False):
        if mine != theirs:
            break
        common += 1
    if common == min(len(pieces), len(other_pieces)):
        return Divergence(other, shared, None, "", "")
    return Divergence(
        other, shared, common, "".join(pieces[common : common + shown]), "".join(other_pieces[common : common + shown])
    )
