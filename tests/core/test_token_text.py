"""A real model's tokens as text, and the synthetic model's as numbers only."""

import pytest
from pagesim.core import events as ev
from pagesim.core.errors import InvalidOperationError
from pagesim.core.token_model import TokenModel
from pagesim.core.token_text import piece_function, pieces_of, prompt_ids, quoted, text_function, visible


class _Bytes:
    """A tokenizer whose ids are UTF-8 bytes: a character can span several tokens."""

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode(errors="replace")


def test_a_character_split_over_byte_tokens_shows_on_the_token_that_completes_it():
    ids = list(" é😀 ok".encode())
    pieces = pieces_of(piece_function(_Bytes()), ids)
    assert "".join(pieces) == " é😀 ok"
    assert pieces[2] == "é" and pieces[1] == "" and pieces[6] == "😀" and pieces[7] == " "


def test_whitespace_is_drawn_and_long_text_cut():
    assert visible(" Paris\n") == "·Paris↵"
    assert visible(" a long token", 5) == "·a·l…"
    assert quoted(" Paris") == '" Paris"' and quoted("a\nb") == '"a↵b"'


def test_the_synthetic_model_has_no_text():
    model = TokenModel.__new__(TokenModel)
    assert text_function(model) is None and piece_function(None) is None
    with pytest.raises(InvalidOperationError, match="no tokenizer"):
        prompt_ids(model, "hello")


def test_a_caption_says_what_was_written_only_with_a_tokenizer():
    written = [ev.TokenWritten("A", 5, ord("P"), 1, 1), ev.TokenWritten("A", 6, ord("!"), 1, 2)]
    plain = ev.TokenWritten.summarize(written)
    assert plain == "A's tokens 5–6 went into block 1, slot 1 … block 1, slot 2 (room in its last block: no new block)"
    said = ev.TokenWritten.summarize(written, text_of=_Bytes().decode)
    assert (
        said == 'A wrote the K/V of "P!" into block 1, slot 1 … block 1, slot 2 (room in its last block: no new block)'
    )


def test_divergence_names_the_shared_blocks_and_the_first_differing_token():
    from pagesim.core.token_text import divergence

    a = ("The", " capital", " is", " Paris", ".")
    b = ("The", " capital", " is", " a", " city")
    parted = divergence("a", a, (0, 1, 4), "b", b, (0, 1, 5))
    assert parted.shared_blocks == 2 and parted.first_difference == 3
    assert parted.own_text == " Paris." and parted.other_text == " a city"
    same = divergence("a", a, (0, 1, 4), "c", a[:4], (0, 1, 4))
    assert same.shared_blocks == 3 and same.first_difference is None
    assert divergence("a", a, (0, 1), "d", a, (2, 1)) is None  # no leading block in common
