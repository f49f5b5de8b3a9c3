"""Tiny GGUF files written with gguf's own writer: a two-layer Llama with random weights
(some tensors quantised), a SentencePiece-style vocabulary, another architecture."""

from __future__ import annotations

import gguf
import numpy as np

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS = 32, 4, 2, 8, 64, 2

# A small SentencePiece vocabulary: unknown, BOS, EOS, the 256 byte tokens, then pieces.
SPM_PIECES = ["▁", "h", "e", "l", "o", "w", "r", "d", "t", "a", "he", "ll", "llo", "▁w", "or", "▁wor", "ld", "▁t"]


def spm_vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *SPM_PIECES]
    types = [2, 3, 3, *([6] * 256), *([1] * len(SPM_PIECES))]
    # longer pieces score higher, as SentencePiece's do for frequent merges
    scores = [0.0, 0.0, 0.0, *([0.0] * 256), *(float(len(p)) - i / 100 for i, p in enumerate(SPM_PIECES))]
    return tokens, scores, types


def byte_level_vocab() -> tuple[list[str], list[int], list[str]]:
    """GPT-2's 256 byte characters, two control tokens and a few merges."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    chars = [chr(c) for c in cs]
    merges = ["Ġ t", "h e", "Ġt he", "l l", "ll o"]
    tokens = ["<|start|>", "<|end|>", *chars, "Ġt", "he", "Ġthe", "ll", "llo"]
    types = [3, 3, *([1] * (len(tokens) - 2))]
    return tokens, types, merges


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's reordering of a Q or K projection (Hugging Face → GGUF)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_weights(seed: int = 0, vocab: int = 0) -> dict[str, np.ndarray]:
    """Hugging Face-layout fp32 weights by GGUF name (Q and K rows not yet permuted)."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    weights = {"token_embd.weight": w(vocab, HIDDEN), "output_norm.weight": 1 + w(HIDDEN) / 4}
    for i in range(LAYERS):
        p = f"blk.{i}."
        weights |= {
            p + "attn_norm.weight": 1 + w(HIDDEN) / 4,
            p + "attn_q.weight": w(HEADS * HEAD_DIM, HIDDEN),
            p + "attn_k.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "attn_v.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "attn_output.weight": w(HIDDEN, HEADS * HEAD_DIM),
            p + "ffn_norm.weight": 1 + w(HIDDEN) / 4,
            p + "ffn_gate.weight": w(FFN, HIDDEN),
            p + "ffn_up.weight": w(FFN, HIDDEN),
            p + "ffn_down.weight": w(HIDDEN, FFN),
        }
    return weights


# How each tensor is stored: F32 keeps the values exact; the others go through gguf's quantiser.
QTYPE = {"attn_v": gguf.GGMLQuantizationType.Q8_0, "ffn_up": gguf.GGMLQuantizationType.F16}


def write_llama(
    path,
    arch: str = "llama",
    tokenizer: str = "gpt2",
    seed: int = 0,
    ffn_metadata: int = FFN,
    drop: str = "",
    extra=None,
    metadata=None,
) -> dict[str, np.ndarray]:
    """Write a tiny Llama GGUF; return what a loader should read back (fp32, HF layout).
    To spoil it: another FFN size in the metadata, a tensor left out (``drop``), more
    tensors (``extra``, a dict), metadata values of another kind (``metadata``: key →
    value, written in place of the default one; a value of None leaves the key out)."""
    if tokenizer == "gpt2":
        tokens, types, merges = byte_level_vocab()
        scores = None
    else:
        tokens, scores, types = spm_vocab()
        merges = None
    hf = llama_weights(seed, len(tokens)) | (extra or {})
    hf.pop(drop, None)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny test llama")
    metadata = metadata or {}
    for key, value in {
        "block_count": LAYERS,
        "context_length": 256,
        "embedding_length": HIDDEN,
        "feed_forward_length": ffn_metadata,
        "attention.head_count": HEADS,
        "attention.head_count_kv": KV_HEADS,
        "rope.freq_base": 10000.0,
        "attention.layer_norm_rms_epsilon": 1e-5,
    }.items():
        metadata.setdefault(f"{arch}.{key}", value)
    for key, value in metadata.items():
        if value is None:
            continue
        kind = gguf.GGUFValueType.get_type(value)
        if kind == gguf.GGUFValueType.INT32 and value < 0:
            kind = gguf.GGUFValueType.INT64
        elif kind == gguf.GGUFValueType.INT32:
            kind = gguf.GGUFValueType.UINT32  # (as llama.cpp's converter writes counts)
        sub = gguf.GGUFValueType.get_type(value[0]) if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, kind, sub)
    writer.add_tokenizer_model(tokenizer)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if merges is not None:
        writer.add_tokenizer_pre("smollm")
        writer.add_token_merges(merges)
    if scores is not None:
        writer.add_token_scores(scores)
        writer.add_unk_token_id(0)
    if "tokenizer.ggml.bos_token_id" not in metadata:
        writer.add_bos_token_id(1 if tokenizer == "llama" else 0)
    if "tokenizer.ggml.eos_token_id" not in metadata:
        writer.add_eos_token_id(2 if tokenizer == "llama" else 1)
    expected = {}
    for name, w in hf.items():
        stored = w
        if name.endswith("attn_q.weight"):
            stored = permute(w, HEADS)
        elif name.endswith("attn_k.weight"):
            stored = permute(w, KV_HEADS)
        kind = name.split(".")[-2]
        qtype = QTYPE.get(kind, gguf.GGMLQuantizationType.F32)
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, stored)
            expected[name] = w
        else:
            data = gguf.quants.quantize(stored, qtype)
            writer.add_tensor(name, data, raw_dtype=qtype)
            expected[name] = gguf.quants.dequantize(data, qtype).reshape(w.shape).astype(np.float32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def write_other_architecture(path, arch: str = "qwen2") -> None:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
