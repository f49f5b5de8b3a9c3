"""Reference implementations the kernels are checked against (torch, on the CPU or GPU).

- :func:`dense_attention`: attention on contiguous K/V through
  ``torch.nn.functional.scaled_dot_product_attention``, computed in fp32.
- :func:`paged_attention_reference`: the seed article's algorithm: gather every block
  of a sequence into a contiguous buffer, then attend. Correct, and slow by design.
- :func:`causal_attention` and :func:`paged_prefill_reference`: the prefill kernel's
  references: causal SDPA of a sequence's newest tokens over its whole context, on K/V
  gathered from the block table into a contiguous buffer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

# torch is imported on first use: it takes over a second to load, and the app's first
# frame (and every CLI command that runs no attention) should not wait for it.


def to_torch(array) -> torch.Tensor:
    """Zero-copy view of a NumPy or CuPy array as a torch tensor (bfloat16 included)."""
    import torch

    if isinstance(array, torch.Tensor):
        return array
    if isinstance(array, np.ndarray):
        if array.dtype.name == "bfloat16":
            return torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(array)  # strided views stay views
    tensor = torch.from_dlpack(array)  # CuPy: zero-copy on the device
    # CuPy has no bfloat16: the CUDA backend keeps bf16 caches as uint16 bit patterns.
    return tensor.view(torch.bfloat16) if tensor.dtype == torch.uint16 else tensor


def dense_attention(query, keys, values, scale: float) -> torch.Tensor:
    """Decode attention of one query per head over contiguous K/V, in fp32.

    ``query`` (num_heads, head_dim); ``keys``/``values`` (context_len, num_kv_heads,
    head_dim). Returns (num_heads, head_dim) float32. GQA/MQA by ``enable_gqa``.
    """
    import torch.nn.functional as F

    q = to_torch(query).float()[:, None, :]  # (H, 1, D)
    k = to_torch(keys).float().permute(1, 0, 2)  # (Hkv, T, D)
    v = to_torch(values).float().permute(1, 0, 2)
    out = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=q.shape[0] != k.shape[0])
    return out[:, 0, :]


def dense_attention_batched(query, keys, values, scale: float) -> torch.Tensor:
    """Batched decode on pre-gathered contiguous K/V: the dense limit for a paged kernel.

    ``query`` (B, H, D); ``keys``/``values`` (B, Hkv, T, D), all sequences of length T.
    """
    import torch.nn.functional as F

    q = to_torch(query)[:, :, None, :]
    k, v = to_torch(keys), to_torch(values)
    out = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out[:, :, 0, :]


def paged_attention_reference(query, key_cache, value_cache, block_tables, context_lens, scale: float) -> torch.Tensor:
    """The seed article's gather-then-attend reference, extended to GQA.

    ``query`` (num_seqs, num_heads, head_dim); caches (num_blocks, block_size,
    num_kv_heads, head_dim). Returns (num_seqs, num_heads, head_dim) float32.
    """
    import torch

    query, key_cache, value_cache = (to_torch(a) for a in (query, key_cache, value_cache))
    block_size = key_cache.shape[1]
    output = torch.empty(query.shape, dtype=torch.float32, device=query.device)
    for seq, context_len in enumerate(int(n) for n in context_lens):
        keys, values = [], []
        for logical_block in range((context_len + block_size - 1) // block_size):
            physical_block = int(block_tables[seq][logical_block])
            tokens_here = min(block_size, context_len - logical_block * block_size)
            keys.append(key_cache[physical_block, :tokens_here])
            values.append(value_cache[physical_block, :tokens_here])
        k = torch.cat(keys).float().permute(1, 0, 2)  # (Hkv, T, D)
        v = torch.cat(values).float().permute(1, 0, 2)
        q = query[seq].float()  # (H, D)
        group = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        probs = torch.softmax((q[:, None, :] @ k.transpose(-2, -1)) * scale, dim=-1)
        output[seq] = (probs @ v)[:, 0, :]
    return output


def dense_attention_rows(query, keys, values, lengths, scale: float) -> torch.Tensor:
    """Decode attention over a contiguous per-sequence buffer, one SDPA call.

    ``query`` (R, H, D); ``keys``/``values`` (R, Hkv, capacity, D) with row r valid up
    to ``lengths[r]`` (the rest masked out). Returns (R, H, D) float32; rows of length
    0 come back as NaN or zeros and must be ignored.
    """
    import torch
    import torch.nn.functional as F

    q = to_torch(query).float()[:, :, None, :]
    k, v = to_torch(keys).float(), to_torch(values).float()
    lengths = torch.as_tensor(np.asarray(lengths))
    mask = (torch.arange(k.shape[2])[None, :] < lengths[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out[:, :, 0, :]


def causal_attention(query, keys, values, scale: float) -> torch.Tensor:
    """Causal attention of a context's last ``q_len`` tokens over contiguous K/V, in fp32.

    ``query`` (q_len, num_heads, head_dim); ``keys``/``values`` (context_len, num_kv_heads,
    head_dim). Query row j sits at position ``context_len - q_len + j`` and sees positions
    0..that one: the causal mask aligned bottom-right (SDPA's ``is_causal`` aligns it top-left,
    which is right only when q_len = context_len). Returns (q_len, num_heads, head_dim) float32.
    """
    import torch
    import torch.nn.functional as F

    q = to_torch(query).float().permute(1, 0, 2)  # (H, q_len, D)
    k = to_torch(keys).float().permute(1, 0, 2)  # (Hkv, T, D)
    v = to_torch(values).float().permute(1, 0, 2)
    q_len, context_len = q.shape[1], k.shape[1]
    positions = torch.arange(context_len - q_len, context_len, device=q.device)
    mask = torch.arange(context_len, device=q.device)[None, :] <= positions[:, None]  # (q_len, T)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[0] != k.shape[0])
    return out.permute(1, 0, 2)


def paged_prefill_reference(
    query, key_cache, value_cache, query_starts, block_tables, context_lens, scale: float
) -> torch.Tensor:
    """The prefill kernel's dense reference: each sequence's K/V gathered from the block table
    into a contiguous buffer, then :func:`causal_attention` for its query rows.

    ``query`` (total_query_tokens, num_heads, head_dim), sequence i's rows
    ``query[query_starts[i]:query_starts[i + 1]]``; ``context_lens`` count the new tokens.
    Returns (total_query_tokens, num_heads, head_dim) float32.
    """
    import torch

    query, key_cache, value_cache = (to_torch(a) for a in (query, key_cache, value_cache))
    block_size = key_cache.shape[1]
    output = torch.empty(query.shape, dtype=torch.float32, device=query.device)
    for seq, context_len in enumerate(int(n) for n in context_lens):
        begin, end = int(query_starts[seq]), int(query_starts[seq + 1])
        positions = torch.arange(context_len, device=key_cache.device)
        table = torch.as_tensor(np.asarray(block_tables[seq], dtype=np.int64), device=key_cache.device)
        blocks = table[positions // block_size]
        keys = key_cache[blocks, positions % block_size]
        values = value_cache[blocks, positions % block_size]
        output[begin:end] = causal_attention(query[begin:end], keys, values, scale)
    return output
