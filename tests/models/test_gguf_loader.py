"""The GGUF loader: the config from the metadata, the weights dequantised and cached, the
cache trusted only when whole, other architectures refused by name."""

import time

import numpy as np
import pytest
from pagesim.core.models import ModelFileError, UnsupportedModelError, load_gguf
from pagesim.core.models.gguf_loader import cache_root

from tests.models import tiny_gguf

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("PAGESIM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_smollm2_config(smollm):
    c = smollm.config
    assert (c.num_layers, c.hidden_size, c.ffn_size) == (30, 576, 1536)
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (9, 3, 64)
    assert c.rope_theta == 100000.0
    assert c.rms_eps == pytest.approx(1e-5)
    assert c.vocab_size == 49152
    assert c.tie_embeddings
    assert (c.bos_id, c.eos_id) == (1, 2)
    assert smollm.weights["token_embd.weight"].shape == (49152, 576)
    assert smollm.weights["blk.0.attn_k.weight"].shape == (3 * 64, 576)
    assert smollm.weights["blk.29.ffn_down.weight"].shape == (576, 1536)
    assert all(w.dtype == np.float32 for w in smollm.weights.values())


def test_second_load_is_fast_and_bit_identical(smollm, smollm_path):
    assert smollm.cache_status == "built"
    started = time.perf_counter()
    again = load_gguf(smollm_path)
    seconds = time.perf_counter() - started
    assert again.cache_status == "hit"
    assert seconds <= 2.0, f"a cached load took {seconds:.2f} s"
    assert again.config == smollm.config
    assert again.weights.keys() == smollm.weights.keys()
    for name, w in smollm.weights.items():  # the first load's are the dequantiser's own arrays
        assert np.array_equal(again.weights[name].view(np.uint32), w.view(np.uint32)), name
    text = "<|im_start|>user\nCafé 2024 ☕<|im_end|>"
    assert again.tokenizer.encode(text) == smollm.tokenizer.encode(text)
    assert again.tokenizer.chat_template == smollm.tokenizer.chat_template


def test_tiny_llama_weights_read_back_in_hugging_face_layout(fresh_cache, tmp_path):
    """Q and K rows come back in Hugging Face's order (llama.cpp's permutation undone),
    quantised tensors as the quantiser's own dequantisation gives them."""
    path = tmp_path / "tiny.gguf"
    expected = tiny_gguf.write_llama(path)
    model = load_gguf(path)
    assert model.config.num_layers == tiny_gguf.LAYERS and model.config.num_kv_heads == tiny_gguf.KV_HEADS
    assert model.config.tie_embeddings
    assert model.weights.keys() == expected.keys()
    for name, w in expected.items():
        assert np.array_equal(model.weights[name], w), name


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("flip a weight", "weights checksum mismatch"),
        ("truncate the weights", "ValueError"),
        ("garble the manifest", "unreadable manifest"),
        ("edit the tokenizer", "tokenizer checksum mismatch"),
    ],
)
def test_a_damaged_cache_is_rebuilt_not_trusted(fresh_cache, tmp_path, damage, why):
    path = tmp_path / "tiny.gguf"
    expected = tiny_gguf.write_llama(path)
    first = load_gguf(path)
    assert first.cache_status == "built"
    folder = cache_root() / "models" / first.sha256
    if damage == "flip a weight":
        data = bytearray((folder / "weights.npy").read_bytes())
        data[-200] ^= 0x40
        (folder / "weights.npy").write_bytes(bytes(data))
    elif damage == "truncate the weights":
        data = (folder / "weights.npy").read_bytes()
        (folder / "weights.npy").write_bytes(data[: len(data) // 2])
    elif damage == "garble the manifest":
        (folder / "manifest.json").write_text('{"format": 1, "tens')
    else:
        text = (folder / "tokenizer.json").read_text()
        (folder / "tokenizer.json").write_text(text.replace('"Ġthe"', '"Ġthf"'))
    second = load_gguf(path)
    assert second.cache_status.startswith("rebuilt (") and why in second.cache_status, second.cache_status
    for name, w in expected.items():
        assert np.array_equal(second.weights[name], w), name
    assert load_gguf(path).cache_status == "hit"  # the rebuilt entry is whole


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("PAGESIM_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "pagesim"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "pagesim"
    monkeypatch.setenv("PAGESIM_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_an_unwritable_cache_still_loads(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("PAGESIM_CACHE_DIR", str(blocker))
    path = tmp_path / "tiny.gguf"
    expected = tiny_gguf.write_llama(path)
    model = load_gguf(path)
    assert model.cache_status.startswith("not cached (")
    assert np.array_equal(model.weights["blk.1.attn_q.weight"], expected["blk.1.attn_q.weight"])


@pytest.mark.parametrize("arch", ["qwen2", "gpt2", "mamba"])
def test_another_architecture_is_refused_by_name(fresh_cache, tmp_path, arch):
    path = tmp_path / f"{arch}.gguf"
    tiny_gguf.write_other_architecture(path, arch)
    with pytest.raises(UnsupportedModelError, match=f"architecture is '{arch}'") as caught:
        load_gguf(path)
    assert caught.value.architecture == arch
    assert "Llama" in str(caught.value)


def test_not_a_gguf_file_is_refused(fresh_cache, tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("just some text, long enough to look at" * 10)
    with pytest.raises(ModelFileError, match="not a readable GGUF file"):
        load_gguf(path)
    with pytest.raises(ModelFileError, match="No such file"):
        load_gguf(tmp_path / "missing.gguf")
    with pytest.raises(ModelFileError, match="not a regular file"):
        load_gguf(tmp_path)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("llama.attention.head_count", 0, "llama.attention.head_count must be a positive integer; got 0"),
        ("llama.attention.head_count", "two", "llama.attention.head_count must be a positive integer; got 'two'"),
        ("llama.attention.head_count", [4, 4], r"head_count must be a positive integer; got \[4, 4\]"),
        ("llama.attention.head_count_kv", 3, "4 attention heads cannot share 3 K/V heads evenly"),
        ("llama.block_count", None, "the metadata key llama.block_count is missing"),
        ("llama.context_length", 0, "llama.context_length must be a positive integer; got 0"),
        ("llama.expert_count", "8", "llama.expert_count must be an integer of at least 0; got '8'"),
        ("llama.rope.freq_base", float("nan"), "llama.rope.freq_base must be a positive number; got nan"),
        ("llama.rope.freq_base", 0.0, "llama.rope.freq_base must be a positive number; got 0.0"),
        ("llama.attention.layer_norm_rms_epsilon", -1e-5, "layer_norm_rms_epsilon must be a positive number"),
        ("llama.rope.scaling.factor", "2", "llama.rope.scaling.factor must be a positive number; got '2'"),
        ("tokenizer.ggml.eos_token_id", 100_000, "tokenizer.ggml.eos_token_id must be a token id below"),
    ],
)
def test_metadata_of_the_wrong_kind_is_refused_by_its_key(fresh_cache, tmp_path, key, value, message):
    path = tmp_path / "odd.gguf"
    metadata = {key: value}
    if key == "llama.rope.scaling.factor":
        metadata["llama.rope.scaling.type"] = "linear"
    tiny_gguf.write_llama(path, metadata=metadata)
    with pytest.raises(ModelFileError, match=message):
        load_gguf(path)


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        ({"ffn_metadata": 48}, r"tensor blk.0.ffn_gate.weight is \(64, 32\); the metadata's sizes make it \(48, 32\)"),
        ({"drop": "blk.1.ffn_up.weight"}, "tensor blk.1.ffn_up.weight is missing"),
        ({"extra": {"blk.0.attn_q.bias": np.zeros(32, np.float32)}}, "blk.0.attn_q.bias is not part of a Llama"),
    ],
)
def test_a_llama_file_that_does_not_add_up_is_refused(fresh_cache, tmp_path, spoil, message):
    path = tmp_path / "odd.gguf"
    tiny_gguf.write_llama(path, **spoil)
    with pytest.raises(ModelFileError, match=message):
        load_gguf(path)
