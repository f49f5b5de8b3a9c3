"""The tokenizer built from a GGUF file's vocabulary, and its chat template."""

import pytest
from pagesim.core.models import TokenizerError, load_gguf
from pagesim.core.models.tokenizer import GGUFTokenizer, SpecialTokens, build_tokenizer

from tests.models import tiny_gguf

pytestmark = pytest.mark.timeout(600)

TEXTS = [
    "Hello, world!",
    "The capital of France is Paris.",
    "  leading spaces, trailing spaces  \n\n\tand tabs\r\n",
    "Ünïcödé: café, naïve, Größe, Ελληνικά, русский, 日本語のテキスト, 한국어, العربية",
    "emoji 😀👍🏽 and a family 👨‍👩‍👧 and a flag 🇫🇷",
    "combining: e\u0301 a\u0308, zero width\u200bjoiner, nbsp\u00a0here",
    "numbers 1234567890 3.14159 -42 1e10",
    "code: def f(x):\n    return x ** 2  # comment",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(smollm, text):
    tok = smollm.tokenizer
    assert tok.decode(tok.encode(text)) == text


def test_digits_are_split_one_by_one(smollm):
    tok = smollm.tokenizer
    ids = tok.encode("2024")
    assert [tok.token(i) for i in ids] == ["2", "0", "2", "4"]
    assert [tok.token(i) for i in tok.encode(" 42")] == ["Ġ", "4", "2"]


def test_known_encodings(smollm):
    """Ids as transformers' own GGUF tokenizer gives them for this file."""
    tok = smollm.tokenizer
    assert tok.encode("Hello, world!") == [19556, 28, 905, 17]
    assert tok.encode("What is the capital of France?") == [1780, 314, 260, 3575, 282, 4649, 47]


def test_control_tokens_are_whole(smollm):
    tok = smollm.tokenizer
    text = "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>"
    ids = tok.encode(text)
    assert ids[0] == 1 and 2 in ids and 0 in ids
    assert tok.token(1) == "<|im_start|>" and tok.token(2) == "<|im_end|>"
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special=True) == "user\nHi\n"
    assert tok.encode("<|im_start") != [1]  # a partial spelling is just text


def test_chat_template(smollm):
    tok = smollm.tokenizer
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert tok.render_chat(messages) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    system = [{"role": "system", "content": "Be brief."}, *messages]
    rendered = tok.render_chat(system, add_generation_prompt=False)
    assert rendered.startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and "SmolLM" not in rendered
    assert not rendered.endswith("assistant\n")
    ids = tok.encode_chat(messages)
    tail = [1, *tok.encode("assistant\n")]
    assert ids[0] == 1 and ids[-len(tail) :] == tail
    assert tok.decode(ids) == tok.render_chat(messages)


def test_no_chat_template_is_a_clear_error():
    tok = GGUFTokenizer(
        build_tokenizer("gpt2", "smollm", *tiny_gguf.byte_level_vocab()[:2]), SpecialTokens(0, 1, False), None
    )
    with pytest.raises(TokenizerError, match="no chat template"):
        tok.render_chat([{"role": "user", "content": "hi"}])


def test_unknown_pre_tokenizer_or_model_is_refused():
    tokens, types, merges = tiny_gguf.byte_level_vocab()
    with pytest.raises(TokenizerError, match="pre-tokenizer 'qwen2' is not supported"):
        build_tokenizer("gpt2", "qwen2", tokens, types, merges)
    with pytest.raises(TokenizerError, match="tokenizer model 'bert' is not supported"):
        build_tokenizer("bert", None, tokens, types, merges)


def test_llama3_pre_tokenizer_groups_digits_by_three():
    tokens, types, merges = tiny_gguf.byte_level_vocab()
    tok = build_tokenizer("gpt2", "llama-bpe", tokens, types, merges)
    pieces = tok.pre_tokenizer.pre_tokenize_str("abc 1234567")
    assert [p for p, _ in pieces] == ["abc", "Ġ", "123", "456", "7"]


def test_tiny_byte_level_file(monkeypatch, tmp_path):
    monkeypatch.setenv("PAGESIM_CACHE_DIR", str(tmp_path / "cache"))
    tiny_gguf.write_llama(tmp_path / "tiny.gguf")
    tok = load_gguf(tmp_path / "tiny.gguf").tokenizer
    text = "<|start|> the hello 12 ünï<|end|>"
    ids = tok.encode(text)
    assert [tok.token(i) for i in ids[:8]] == ["<|start|>", "Ġthe", "Ġ", "he", "llo", "Ġ", "1", "2"]
    assert ids[-1] == 1
    assert tok.decode(ids) == text


def test_tiny_sentencepiece_file(monkeypatch, tmp_path):
    """A SentencePiece vocabulary (as TinyLlama's): ▁-marked words, merges from the scores,
    bytes for what the vocabulary lacks, BOS first."""
    monkeypatch.setenv("PAGESIM_CACHE_DIR", str(tmp_path / "cache"))
    tiny_gguf.write_llama(tmp_path / "spm.gguf", tokenizer="llama")
    for _ in range(2):  # built, then from the cache
        tok = load_gguf(tmp_path / "spm.gguf").tokenizer
        ids = tok.encode("hello world")
        assert [tok.token(i) for i in ids] == ["<s>", "▁", "he", "llo", "▁wor", "ld"]
        assert tok.decode(ids, skip_special=True) == "hello world"
        text = "hello wörld 😀\n"
        ids = tok.encode(text)
        assert "<0xC3>" in [tok.token(i) for i in ids]  # ö through byte fallback
        assert tok.decode(ids, skip_special=True) == text
