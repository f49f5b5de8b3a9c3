"""The tokenizer and the chat template a GGUF file carries, as the field builds them.

A GGUF file holds its vocabulary (``tokenizer.ggml.tokens``), each token's type (normal,
control, user-defined, byte, ...), the BPE merges and the name of the pre-tokenizer its
converter saw (``tokenizer.ggml.pre``). From these, :func:`build_tokenizer` builds a Hugging
Face ``tokenizers`` tokenizer, the way llama.cpp reads the same fields:

* ``gpt2`` (byte-level BPE: SmolLM2, Llama 3): the merges as they are, and the
  pre-tokenizer's split rules from llama.cpp's table (``smollm`` splits digits one by one
  before GPT-2's rules; ``llama-bpe`` is Llama 3's regex);
* ``llama`` (SentencePiece, as in TinyLlama and Llama 2): BPE over ``▁``-marked words with
  byte fallback, the merges derived from the vocabulary's scores, as Hugging Face's own
  GGUF converter does.

Control tokens (``<|im_start|>``) are special tokens: text that spells one becomes that
one id, and decoding with ``skip_special=True`` drops them. The chat template is Jinja2,
rendered in a sandbox as ``transformers``' ``apply_chat_template`` renders it.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from pagesim.core.errors import PagesimError
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers


class TokenizerError(PagesimError):
    """A GGUF tokenizer this package cannot build (an unknown model or pre-tokenizer)."""


# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# GPT-2's split rule; what ByteLevel(use_regex=True) applies.
_GPT2 = ("gpt2", "default", "mpt", "olmo", "jais")
# llama.cpp's table: these split each digit apart first, then apply GPT-2's rule.
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
_LLAMA3_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3 = ("llama-bpe", "llama3", "llama-v3")


def _byte_level_pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre is None or pre in _GPT2:
        return byte_level
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _LLAMA3:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    known = ", ".join(sorted({*_GPT2, *_DIGITS_THEN_GPT2, *_LLAMA3}))
    raise TokenizerError(f"the pre-tokenizer {pre!r} is not supported (supported: {known})")


def _merges_from_scores(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int]) -> list[tuple[str, str]]:
    """A SentencePiece vocabulary's BPE merges: every split of a piece into two pieces of the
    vocabulary, the pieces with the highest scores merged first (how ``transformers``
    converts a SentencePiece model to BPE)."""
    vocab = {t: i for i, (t, kind) in enumerate(zip(tokens, types, strict=True)) if kind in (NORMAL, USER_DEFINED)}
    merges = []
    for piece, index in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((-scores[index], vocab[left], vocab[right], left, right))
    merges.sort()
    return [(left, right) for *_, left, right in merges]


def build_tokenizer(
    model: str,
    pre: str | None,
    tokens: Sequence[str],
    types: Sequence[int],
    merges: Sequence[str] = (),
    scores: Sequence[float] = (),
    unk_id: int | None = None,
    add_space_prefix: bool = True,
) -> Tokenizer:
    """A ``tokenizers`` tokenizer from a GGUF file's tokenizer fields."""
    types = list(types) if types else [NORMAL] * len(tokens)
    if model == "gpt2":
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        tok = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
        tok.pre_tokenizer = _byte_level_pre_tokenizer(pre)
        tok.decoder = decoders.ByteLevel()
    elif model == "llama":
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = _merges_from_scores(tokens, scores or [0.0] * len(tokens), types)
        unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
        tok = Tokenizer(models.BPE(vocab, pairs, unk_token=unk, fuse_unk=True, byte_fallback=True))
        steps = [normalizers.Prepend("▁")] if add_space_prefix else []
        tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
        strip = [decoders.Strip(" ", 1, 0)] if add_space_prefix else []
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    else:
        raise TokenizerError(f"the tokenizer model {model!r} is not supported (supported: gpt2, llama)")
    # Control tokens are special (matched whole in any text, dropped by skip_special);
    # user-defined ones are matched whole but kept.
    added = [
        AddedToken(t, special=kind == CONTROL, normalized=False)
        for t, kind in zip(tokens, types, strict=True)
        if kind in (CONTROL, USER_DEFINED)
    ]
    tok.add_tokens(added)
    return tok


@dataclass(frozen=True)
class SpecialTokens:
    bos_id: int | None
    eos_id: int | None
    add_bos: bool  # whether encoding a prompt puts BOS first (tokenizer.ggml.add_bos_token)


class GGUFTokenizer:
    """Encode and decode with the file's vocabulary; render its chat template."""

    def __init__(self, tokenizer: Tokenizer, special: SpecialTokens, chat_template: str | None) -> None:
        self.tokenizer = tokenizer
        self.special = special
        self.chat_template = chat_template

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token(self, token_id: int) -> str:
        return self.tokenizer.id_to_token(token_id)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text``; control tokens spelled in it become their ids. BOS first
        when ``add_bos`` (default: the file's ``add_bos_token``) and the text has none."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        bos = self.special.bos_id
        add = self.special.add_bos if add_bos is None else add_bos
        if add and bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special)

    def render_chat(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The chat template applied to ``messages`` (``[{"role": "user", "content": ...}]``)."""
        if not self.chat_template:
            raise TokenizerError("this model file has no chat template (tokenizer.chat_template)")
        bos, eos = self.special.bos_id, self.special.eos_id
        return _compiled(self.chat_template).render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.token(bos) if bos is not None else "",
            eos_token=self.token(eos) if eos is not None else "",
        )

    def encode_chat(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt))


def _raise(message: str):
    raise TokenizerError(f"the chat template refused the messages: {message}")


@functools.lru_cache(maxsize=8)
def _compiled(source: str):
    # As transformers renders chat templates: a sandbox, blocks trimmed, loop controls on.
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)  # Llama 3's templates
    return env.from_string(source)
