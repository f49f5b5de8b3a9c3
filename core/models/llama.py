"""A Llama in plain torch, and the dense reference engine that runs it.

The model is a flat batch of tokens in, hidden states out, as vLLM and nano-vllm write
their model files: ``forward(token_ids, positions, attention)``. Everything but attention
is here (embedding, RMSNorm, RoPE, the Q/K/V and output projections, the SwiGLU MLP, the
final norm, the tied or untied LM head); attention is the caller's ``attention(layer, q,
k, v)``, with q ``(T, num_heads, head_dim)`` and k, v ``(T, num_kv_heads, head_dim)``
after RoPE, returning ``(T, num_heads, head_dim)``. The caller owns the K/V cache: a paged
runner writes k and v into its blocks and calls its paged kernel; :class:`DenseKVCache`
keeps one contiguous row per layer and calls torch's SDPA — the reference the paged path
is checked against.

Weights are the loader's arrays (Q and K rows already in Hugging Face's halves layout,
so RoPE rotates the first half of each head against the second): fp32, or bf16 (their bit
patterns as uint16). With bf16 weights the matmuls run in bf16 (oneDNN's AMX or
AVX512-BF16 kernels, fp32 accumulation, the result rounded to bf16), and so does the
SwiGLU product between the MLP's matmuls; the residual stream, the norms, RoPE and
attention's q, k, v and output stay fp32, and the logits come out of the LM head in bf16
(a step of 0.125 at SmolLM2's largest) as fp32 tensors. With fp32 weights all is fp32.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch
import torch.nn.functional as F
from pagesim.core.models.gguf_loader import LlamaConfig
from pagesim.core.sampling import SamplingParams, choose_token

Attention = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: torch.Tensor
    wq: torch.Tensor  # (num_heads * head_dim, hidden), as F.linear takes it
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    ffn_norm: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor


def as_tensor(w: np.ndarray) -> torch.Tensor:
    """A loader's array as a tensor sharing its memory (torch wants it writable): fp32, or
    bf16 bit patterns as uint16 (or ml_dtypes' bfloat16), which torch's bfloat16 views."""
    w = w if w.flags.writeable else w.copy()
    if w.dtype == np.uint16 or w.dtype.name == "bfloat16":
        return torch.from_numpy(w.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(w)


class Llama:
    def __init__(self, config: LlamaConfig, weights: dict[str, np.ndarray]) -> None:
        self.config = c = config

        def t(name: str) -> torch.Tensor:
            return as_tensor(weights[name])

        def vector(name: str) -> torch.Tensor:  # norms: fp32 whatever the weights' dtype
            return t(name).float()

        self.embed = t("token_embd.weight")
        self.dtype = self.embed.dtype  # the matmuls' dtype: the weights'
        self.dtype_name = "bfloat16" if self.dtype == torch.bfloat16 else "float32"
        self.norm = vector("output_norm.weight")
        self.lm_head = self.embed if c.tie_embeddings else t("output.weight")
        self.layers = []
        for i in range(c.num_layers):
            p = f"blk.{i}."
            self.layers.append(
                LayerWeights(
                    attn_norm=vector(p + "attn_norm.weight"),
                    wq=t(p + "attn_q.weight"),
                    wk=t(p + "attn_k.weight"),
                    wv=t(p + "attn_v.weight"),
                    wo=t(p + "attn_output.weight"),
                    ffn_norm=vector(p + "ffn_norm.weight"),
                    w_gate=t(p + "ffn_gate.weight"),
                    w_up=t(p + "ffn_up.weight"),
                    w_down=t(p + "ffn_down.weight"),
                )
            )
        inv_freq = c.rope_theta ** -(torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim)
        if "rope_freqs.weight" in weights:  # Llama 3.1+: per-frequency factors (llama.cpp divides by them)
            inv_freq = inv_freq / t("rope_freqs.weight").double()
        self.inv_freq = inv_freq.float()
        self.q_size = c.num_heads * c.head_dim

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def on(self, device: torch.device | str) -> Llama:
        """This model with its weights on ``device`` (a copy; this one stays where it is)."""
        moved = copy.copy(self)
        for name in ("embed", "norm", "inv_freq"):
            setattr(moved, name, getattr(self, name).to(device))
        # tied to the embedding: one tensor on the device too
        moved.lm_head = moved.embed if self.lm_head is self.embed else self.lm_head.to(device)
        moved.layers = [
            LayerWeights(**{f.name: getattr(layer, f.name).to(device) for f in fields(LayerWeights)})
            for layer in self.layers
        ]
        return moved

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin, ``(T, 1, head_dim)``, for each token's position."""
        angles = (positions.float() / self.config.rope_scale)[:, None] * self.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)[:, None, :]
        return angles.cos(), angles.sin()

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, attention: Attention) -> torch.Tensor:
        """Hidden states ``(T, hidden)`` after the final norm, for a flat batch of tokens."""
        c, dtype = self.config, self.dtype

        def project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # out in the weights' dtype
            return F.linear(x.to(dtype), w)

        def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # fp32 out
            return project(x, w).float()

        x = self.embed[token_ids.to(self.device)].float()
        cos, sin = self.rope(positions.to(self.device))
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, c.rms_eps)
            q = linear(h, layer.wq).view(-1, c.num_heads, c.head_dim)
            k = linear(h, layer.wk).view(-1, c.num_kv_heads, c.head_dim)
            v = linear(h, layer.wv).view(-1, c.num_kv_heads, c.head_dim)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            o = attention(i, q, k, v)
            x = x + linear(o.reshape(-1, self.q_size), layer.wo)
            h = rms_norm(x, layer.ffn_norm, c.rms_eps)
            x = x + linear(F.silu(project(h, layer.w_gate)) * project(h, layer.w_up), layer.w_down)
        return rms_norm(x, self.norm, c.rms_eps)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden.to(self.lm_head.dtype), self.lm_head).float()


class DenseKVCache:
    """One sequence's K and V, contiguous per layer, and attention over them with torch's
    SDPA (causal within the new tokens). Use it as a forward's ``attention``."""

    def __init__(
        self,
        config: LlamaConfig,
        capacity: int = 256,
        device: torch.device | str = "cpu",
        stored_dtype: torch.dtype | None = None,
    ) -> None:
        """``stored_dtype``: q, K and V are rounded to it (a paged cache of that dtype holds
        K and V so, and its kernels read q so), then kept and used in fp32."""
        self.config = config
        self.length = 0  # tokens whose K/V every layer holds
        self.stored_dtype = stored_dtype
        shape = (config.num_layers, config.num_kv_heads, capacity, config.head_dim)
        self.keys = torch.zeros(shape, device=device)
        self.values = torch.zeros(shape, device=device)

    def _reserve(self, length: int) -> None:
        capacity = self.keys.shape[2]
        if length <= capacity:
            return
        grown = max(length, 2 * capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros((*old.shape[:2], grown, old.shape[3]))
            new[:, :, :capacity] = old
            setattr(self, name, new)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        new = q.shape[0]
        start, end = self.length, self.length + new
        self._reserve(end)
        if self.stored_dtype is not None:  # (the paged kernels take q in the cache's dtype too)
            q, k, v = (t.to(self.stored_dtype).float() for t in (q, k, v))
        self.keys[layer, :, start:end] = k.transpose(0, 1)
        self.values[layer, :, start:end] = v.transpose(0, 1)
        if layer == self.config.num_layers - 1:  # a forward calls every layer in order
            self.length = end
        # (SDPA on CPU is many times slower on a strided slice than on a contiguous copy)
        keys = self.keys[layer : layer + 1, :, :end].contiguous()
        values = self.values[layer : layer + 1, :, :end].contiguous()
        query = q.transpose(0, 1)[None].contiguous()  # (1, heads, new, head_dim)
        mask = None
        if new > 1:  # token j of the new ones sees the cache and new tokens up to j
            device = self.keys.device
            mask = torch.arange(end, device=device)[None, :] <= torch.arange(start, end, device=device)[:, None]
        out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, enable_gqa=True)
        return out[0].transpose(0, 1)  # (new, heads, head_dim)


class DenseBatchKVCache:
    """A batch of sequences' K and V, each sequence's contiguous per layer (``(num_layers,
    batch, num_kv_heads, capacity, head_dim)``), attended with one SDPA call per layer over
    the whole batch: the dense engine a paged decode step is timed against. Every sequence
    holds ``length`` tokens and gets one new token per forward. Use it as a forward's
    ``attention``."""

    def __init__(self, config: LlamaConfig, batch: int, capacity: int, device: torch.device | str = "cpu") -> None:
        self.config = config
        self.length = 0
        shape = (config.num_layers, batch, config.num_kv_heads, capacity, config.head_dim)
        self.keys = torch.zeros(shape, device=device)
        self.values = torch.zeros(shape, device=device)

    def fill(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Every sequence holds the same ``(num_layers, num_kv_heads, n, head_dim)`` K and V."""
        n = keys.shape[2]
        self.keys[:, :, :, :n] = keys[:, None].to(self.keys.device)
        self.values[:, :, :, :n] = values[:, None].to(self.values.device)
        self.length = n

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        position = self.length
        self.keys[layer, :, :, position] = k
        self.values[layer, :, :, position] = v
        if layer == self.config.num_layers - 1:
            self.length = position + 1
        end = position + 1
        keys, values = self.keys[layer, :, :, :end], self.values[layer, :, :, :end]
        out = F.scaled_dot_product_attention(q[:, :, None], keys, values, enable_gqa=True)
        return out[:, :, 0]  # (batch, heads, head_dim)


@dataclass(frozen=True)
class Generation:
    prompt_ids: list[int]
    token_ids: list[int]  # the generated tokens (the stop token included, if one came)
    logits: torch.Tensor  # (len(token_ids), vocab): the logits each token was chosen from
    prefill_seconds: float
    decode_seconds: list[float]  # one per decode step


class DenseLlamaEngine:
    """The dense reference engine: prefill a prompt, then decode greedily one token at a
    time, each sequence's K/V in one contiguous :class:`DenseKVCache`."""

    def __init__(self, model: Llama) -> None:
        self.model = model

    def step(self, cache: DenseKVCache, token_ids: Sequence[int]) -> torch.Tensor:
        """Feed ``token_ids`` after what ``cache`` holds; the last token's logits ``(vocab,)``."""
        ids = torch.tensor(list(token_ids), dtype=torch.long)
        positions = torch.arange(cache.length, cache.length + len(ids))
        hidden = self.model.forward(ids, positions, cache)
        return self.model.logits(hidden[-1:])[0]

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        stop_ids: Sequence[int] | None = None,
        sampling: SamplingParams | None = None,
    ) -> Generation:
        """Greedy, or each token chosen under ``sampling`` (the paged engine's choice)."""
        if not prompt_ids:
            raise ValueError("an empty prompt")
        eos = self.model.config.eos_id
        stop = set(stop_ids if stop_ids is not None else ([] if eos is None else [eos]))
        cache = DenseKVCache(self.model.config, capacity=len(prompt_ids) + max_new_tokens)
        started = time.perf_counter()
        logits = self.step(cache, prompt_ids)
        prefill = time.perf_counter() - started
        tokens, rows, steps = [], [], []
        while len(tokens) < max_new_tokens:
            token = choose_token(logits, sampling, len(prompt_ids) + len(tokens))
            tokens.append(token)
            rows.append(logits)
            if token in stop or len(tokens) == max_new_tokens:
                break
            started = time.perf_counter()
            logits = self.step(cache, [token])
            steps.append(time.perf_counter() - started)
        stacked = torch.stack(rows) if rows else torch.empty(0, self.model.config.vocab_size)
        return Generation(list(prompt_ids), tokens, stacked, prefill, steps)
