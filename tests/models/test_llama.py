"""The Llama and the dense reference engine: on SmolLM2-135M-Instruct, and on a tiny file
against an independent NumPy forward."""

import numpy as np
import pytest
import torch
from pagesim.core.models import DenseKVCache, DenseLlamaEngine, Llama, load_gguf
from pagesim.kernels.cpu_backend import CpuBackend

from tests.models import tiny_gguf

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


def test_the_model_moves_whole_to_another_device(smollm, llama):
    """``Llama.on``: every weight on the device (a GPU's where the paged engine runs there;
    here torch's meta device, which holds shapes alone), the tied head still the embedding,
    the original where it was; a forward there takes the host's token ids and runs
    throughout on the device, the dense cache too."""
    moved = llama.on("meta")
    tensors = [moved.embed, moved.norm, moved.lm_head, moved.inv_freq]
    tensors += [getattr(layer, name) for layer in moved.layers for name in vars(layer)]
    assert len(moved.layers) == smollm.config.num_layers
    assert all(t.device.type == "meta" for t in tensors)
    assert (moved.lm_head is moved.embed) == smollm.config.tie_embeddings
    assert llama.device.type == "cpu" and all(layer.wq.device.type == "cpu" for layer in llama.layers)

    cache = DenseKVCache(smollm.config, capacity=8, device=moved.device)
    hidden = moved.forward(torch.tensor([1, 2, 3]), torch.arange(3), cache)
    assert hidden.device.type == "meta" and tuple(hidden.shape) == (3, smollm.config.hidden_size)
    assert tuple(moved.logits(hidden).shape) == (3, smollm.config.vocab_size)


def test_the_paged_engine_runs_its_model_where_the_kernels_are(smollm):
    from types import SimpleNamespace

    from pagesim.core.llama_runner import LlamaRunner, torch_device_for
    from pagesim.core.models.catalog import config_for_model

    runner = LlamaRunner(config_for_model(str(smollm.path), num_blocks=4, block_size=16), CpuBackend(), smollm)
    assert runner.torch_device.type == "cpu"
    assert runner.llama is runner.model.llama, "on the host the paged engine shares the model, no copy"
    assert runner.reference.engine.model is runner.model.llama
    gpu_backend = SimpleNamespace(name="cuda", device_id=0)
    expected = "cuda" if torch.cuda.is_available() else "cpu"  # (a CPU build of torch keeps it on the host)
    assert torch_device_for(gpu_backend).type == expected


def llama_cpp_style_logits(w, config, token_ids):
    """An independent forward in NumPy (float64) on the weights as the GGUF file stores
    them (``w``: Q and K rows in llama.cpp's order), RoPE rotating adjacent pairs (0, 1),
    (2, 3), ... as llama.cpp's does; causal attention with each KV head repeated for its
    group."""
    c = config
    n, d = len(token_ids), c.head_dim
    w = {k: v.astype(np.float64) for k, v in w.items()}

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c.rms_eps) * g

    def rope_pairs(x):  # (n, heads, d)
        theta = np.arange(n)[:, None] * c.rope_theta ** (-np.arange(0, d, 2) / d)[None, :]
        cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = even * cos - odd * sin, even * sin + odd * cos
        return out

    x = w["token_embd.weight"][token_ids]
    group = c.num_heads // c.num_kv_heads
    for i in range(c.num_layers):
        p = f"blk.{i}."
        h = norm(x, w[p + "attn_norm.weight"])
        q = rope_pairs((h @ w[p + "attn_q.weight"].T).reshape(n, -1, d))
        k = rope_pairs((h @ w[p + "attn_k.weight"].T).reshape(n, -1, d))
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, -1, d)
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d) + np.triu(np.full((n, n), -np.inf), 1)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        x = x + np.einsum("hqk,khd->qhd", probs, v).reshape(n, -1) @ w[p + "attn_output.weight"].T
        h = norm(x, w[p + "ffn_norm.weight"])
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
    return norm(x, w["output_norm.weight"]) @ w["token_embd.weight"].T


def test_tiny_llama_matches_llama_cpps_rope_on_the_stored_weights(monkeypatch, tmp_path):
    """Undoing the GGUF row order and rotating halves gives what llama.cpp computes from the
    file as stored, rotating adjacent pairs; norms, SwiGLU and the tied head as well."""
    monkeypatch.setenv("PAGESIM_CACHE_DIR", str(tmp_path / "cache"))
    written = tiny_gguf.write_llama(tmp_path / "tiny.gguf")  # Hugging Face's layout
    stored = dict(written)
    for i in range(tiny_gguf.LAYERS):  # as llama.cpp's converter reorders them
        stored[f"blk.{i}.attn_q.weight"] = tiny_gguf.permute(written[f"blk.{i}.attn_q.weight"], tiny_gguf.HEADS)
        stored[f"blk.{i}.attn_k.weight"] = tiny_gguf.permute(written[f"blk.{i}.attn_k.weight"], tiny_gguf.KV_HEADS)
    model = load_gguf(tmp_path / "tiny.gguf")
    ids = [0, 40, 71, 100, 3, 255, 17, 9]
    llama = Llama(model.config, model.weights)
    out = DenseLlamaEngine(llama).generate(ids, max_new_tokens=4, stop_ids=[])
    sequence = ids + out.token_ids[:-1]
    expected = llama_cpp_style_logits(stored, model.config, sequence)[len(ids) - 1 :]
    assert np.abs(out.logits.numpy() - expected).max() <= 1e-4
