"""The Llama and the dense reference engine on SmolLM2-135M-Instruct."""

import pytest
import torch
from pagesim.core.models import DenseKVCache

pytestmark = pytest.mark.timeout(600)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_the_model_answers(smollm, engine):
    tok = smollm.tokenizer
    out = engine.generate(tok.encode_chat(QUESTION), max_new_tokens=12)
    answer = tok.decode(out.token_ids, skip_special=True)
    assert "Paris" in answer, answer
    assert out.token_ids[-1] == smollm.config.eos_id  # it ended its turn
    assert out.logits.shape == (len(out.token_ids), smollm.config.vocab_size)
    assert out.logits.argmax(dim=1).tolist() == out.token_ids  # greedy


def naive_attention(config):
    """Causal attention over the whole sequence at once: each KV head repeated for its
    query heads, scores, mask, softmax, in float64 (no SDPA, no cache)."""
    group = config.num_heads // config.num_kv_heads

    def attend(layer, q, k, v):
        q, k, v = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / config.head_dim**0.5
        n = q.shape[0]
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).float()

    return attend


def test_incremental_decode_matches_one_full_forward(smollm, llama, engine):
    """The engine's logits (prefill, then one token at a time through its K/V cache) equal
    a forward over the whole sequence with naive attention, position by position."""
    prompt = smollm.tokenizer.encode("The capital of France is")
    out = engine.generate(prompt, max_new_tokens=6, stop_ids=[])
    assert len(out.token_ids) == 6
    sequence = prompt + out.token_ids[:-1]
    hidden = llama.forward(torch.tensor(sequence), torch.arange(len(sequence)), naive_attention(smollm.config))
    full = llama.logits(hidden)[len(prompt) - 1 :]
    assert (full - out.logits).abs().max().item() <= 1e-4
    assert full.argmax(dim=1).tolist() == out.token_ids


def test_chunked_prefill_matches_one_prefill(smollm, engine):
    """New tokens after cached ones (a chunk of a prompt) see the cache and, causally, each other."""
    ids = smollm.tokenizer.encode_chat(QUESTION)
    whole = DenseKVCache(smollm.config, capacity=8)  # grows as it goes
    expected = engine.step(whole, ids)
    chunked = DenseKVCache(smollm.config, capacity=8)
    for start in range(0, len(ids), 10):
        got = engine.step(chunked, ids[start : start + 10])
    assert chunked.length == whole.length == len(ids)
    assert (got - expected).abs().max().item() <= 1e-4
    n = len(ids)
    assert torch.allclose(chunked.keys[:, :, :n], whole.keys[:, :, :n], atol=1e-4)
    assert torch.allclose(chunked.values[:, :, :n], whole.values[:, :, :n], atol=1e-4)


def test_attention_is_the_callers_call_per_layer(smollm, llama):
    """What a paged runner gets: each layer's q, k, v after RoPE, in layer order."""
    c = smollm.config
    cache = DenseKVCache(c)
    seen = []

    def attention(layer, q, k, v):
        seen.append((layer, tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        return cache(layer, q, k, v)

    llama.forward(torch.tensor([1, 2, 3]), torch.arange(3), attention)
    q_shape, kv_shape = (3, c.num_heads, c.head_dim), (3, c.num_kv_heads, c.head_dim)
    assert seen == [(i, q_shape, kv_shape, kv_shape) for i in range(c.num_layers)]
