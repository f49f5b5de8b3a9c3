"""bf16 weights: chosen by the CPU's instructions or the user, cached beside the fp32 ones,
run by the Llama in bf16 matmuls with fp32 between them; thread counts; the dense batch
engine the model benchmark times the paged engine against."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from pagesim.core.errors import PagesimError
from pagesim.core.llama_model import LOGITS_TOLERANCE, LOGITS_TOLERANCE_BF16, DenseReference
from pagesim.core.models import DenseKVCache, DenseLlamaEngine, Llama, load_gguf, precision, threads
from pagesim.core.models.gguf_loader import cache_root, to_bfloat16_bits
from pagesim.core.models.llama import DenseBatchKVCache

from tests.models import tiny_gguf

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("PAGESIM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def tiny(fresh_cache, tmp_path):
    path = tmp_path / "tiny.gguf"
    return path, tiny_gguf.write_llama(path)


def test_the_choice_follows_the_cpu_the_option_and_the_environment(monkeypatch):
    monkeypatch.delenv(precision.DTYPE_ENV, raising=False)
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "amx_bf16", "avx512_bf16"})
    assert precision.resolve_dtype() == ("float32", "the default")
    assert precision.resolve_dtype("auto") == ("bfloat16", "auto: the CPU has amx_bf16 and avx512_bf16")
    assert precision.resolve_dtype("fp32") == ("float32", "asked for")
    monkeypatch.setenv(precision.DTYPE_ENV, "auto")
    assert precision.resolve_dtype()[0] == "bfloat16"
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "avx512f"})
    assert precision.resolve_dtype() == ("float32", "auto: the CPU has no bf16 matmul instructions")
    dtype, why = precision.resolve_dtype("bf16")  # asked for: bf16 even where it is emulated, and said so
    assert dtype == "bfloat16" and "emulated" in why
    monkeypatch.setenv(precision.DTYPE_ENV, "fp16")
    with pytest.raises(precision.DtypeChoiceError, match="PAGESIM_DTYPE='fp16'"):
        precision.resolve_dtype()


def test_bf16_bits_round_to_nearest_even_as_torch_does():
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            rng.standard_normal(10_000).astype(np.float32) * 10.0 ** rng.integers(-6, 6, 10_000),
            # exact ties between two bf16 values: to the even one
            np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8), 0.0, -0.0, 3.4e38, 1e-40], np.float32),
        ]
    ).astype(np.float32)
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.uint16).numpy()
    assert np.array_equal(to_bfloat16_bits(values), expected)


def test_a_bf16_load_caches_its_own_weights_and_never_needs_the_fp32_ones(tiny):
    path, expected = tiny
    first = load_gguf(path, dtype="bfloat16")
    assert first.cache_status == "built" and first.dtype == "bfloat16"
    for name, w in expected.items():
        assert first.weights[name].dtype == np.uint16
        assert np.array_equal(first.weights[name], to_bfloat16_bits(w)), name
    folder = cache_root() / "models" / first.sha256
    assert (folder / "weights-bfloat16.npy").is_file() and (folder / "weights.npy").is_file()
    assert first.weight_bytes * 2 == load_gguf(path).weight_bytes  # half the fp32 weights' bytes
    (folder / "weights.npy").write_bytes(b"")  # a bf16 hit reads only its own file
    again = load_gguf(path, dtype="bfloat16")
    assert again.cache_status == "hit"
    for name, w in first.weights.items():
        assert np.array_equal(again.weights[name], w), name


def test_bf16_weights_are_made_from_the_fp32_cache_and_remade_when_damaged(tiny):
    path, expected = tiny
    assert load_gguf(path).cache_status == "built"  # fp32 only
    folder = cache_root() / "models" / load_gguf(path).sha256
    assert not (folder / "weights-bfloat16.npy").exists()
    made = load_gguf(path, dtype="bfloat16")
    assert made.cache_status == "hit, bf16 made"
    data = bytearray((folder / "weights-bfloat16.npy").read_bytes())
    data[-100] ^= 0x01
    (folder / "weights-bfloat16.npy").write_bytes(bytes(data))
    remade = load_gguf(path, dtype="bfloat16")
    assert remade.cache_status == "hit, bf16 made"
    for name, w in expected.items():
        assert np.array_equal(remade.weights[name], to_bfloat16_bits(w)), name
    assert load_gguf(path, dtype="bfloat16").cache_status == "hit"


def test_an_unknown_weights_dtype_is_refused(tiny):
    with pytest.raises(ValueError, match="float16"):
        load_gguf(tiny[0], dtype="float16")


def test_the_bf16_llama_runs_bf16_matmuls_close_to_fp32(tiny):
    path, _ = tiny
    fp32, bf16 = load_gguf(path), load_gguf(path, dtype="bfloat16")
    llama32, llama16 = Llama(fp32.config, fp32.weights), Llama(bf16.config, bf16.weights)
    assert (llama32.dtype_name, llama16.dtype_name) == ("float32", "bfloat16")
    assert llama16.layers[0].wq.dtype == torch.bfloat16 and llama16.layers[0].attn_norm.dtype == torch.float32
    ids = [5, 40, 41, 7, 100, 3]
    a = DenseLlamaEngine(llama32).step(DenseKVCache(fp32.config), ids)
    b = DenseLlamaEngine(llama16).step(DenseKVCache(bf16.config), ids)
    assert b.dtype == torch.float32
    gap = float((a - b).abs().max())
    assert 0 < gap < 0.2, gap  # bf16's rounding, not another model
    assert DenseReference(llama16).tolerance == LOGITS_TOLERANCE_BF16
    assert DenseReference(llama32).tolerance == LOGITS_TOLERANCE


def test_the_dense_batch_engine_gives_each_sequences_own_logits(tiny):
    """A decode step of a batch through DenseBatchKVCache equals each sequence's own step
    through its DenseKVCache (what the model benchmark times the paged engine against)."""
    path, _ = tiny
    file = load_gguf(path)
    llama = Llama(file.config, file.weights)
    engine = DenseLlamaEngine(llama)
    prompt = [9, 8, 7, 6, 5, 4, 3]
    one = DenseKVCache(file.config, capacity=16)
    engine.step(one, prompt)
    n = len(prompt)
    batch = DenseBatchKVCache(file.config, batch=3, capacity=16)
    batch.fill(one.keys[:, :, :n], one.values[:, :, :n])
    new = [11, 12, 13]
    hidden = llama.forward(torch.tensor(new), torch.full((3,), n), batch)
    logits = llama.logits(hidden)
    assert batch.length == n + 1
    for row, token in enumerate(new):
        own = DenseKVCache(file.config, capacity=16)
        engine.step(own, prompt)
        expected = engine.step(own, [token])
        assert torch.allclose(logits[row], expected, atol=1e-4), row


def test_threads_one_on_two_cores_else_a_core_left_over(monkeypatch):
    assert [threads.default_threads(n) for n in (1, 2, 3, 8)] == [1, 1, 2, 7]
    monkeypatch.setenv(threads.THREADS_ENV, "3")
    assert threads.chosen_threads() == (3, "PAGESIM_THREADS")
    monkeypatch.setenv(threads.THREADS_ENV, "none")
    with pytest.raises(PagesimError, match="PAGESIM_THREADS"):
        threads.chosen_threads()
    # (100000 segfaulted torch; 20000 failed in libgomp, after the run had started)
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setenv(threads.THREADS_ENV, "8")
    assert threads.chosen_threads() == (8, "PAGESIM_THREADS")
    monkeypatch.setenv(threads.THREADS_ENV, "100000")
    with pytest.raises(PagesimError, match=r"PAGESIM_THREADS=100000: at most 8 \(4 per core of the 2 here\)"):
        threads.chosen_threads()


def test_the_first_model_load_sets_both_thread_pools_once(tiny, tmp_path):
    """In a fresh process (the pools are process-wide): the first load chooses, a later
    choice of the caller's stands through the next load."""
    code = (
        "import sys, numba, torch\n"
        "from pagesim.core.models.catalog import load_model\n"
        "load_model(sys.argv[1])\n"
        "first = (torch.get_num_threads(), numba.get_num_threads())\n"
        "torch.set_num_threads(2)\n"
        "load_model(sys.argv[1])\n"
        "print(first, torch.get_num_threads())\n"
    )
    env = os.environ | {threads.THREADS_ENV: "1", "PAGESIM_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", code, str(tiny[0])], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(1,", "1)", "2"]
