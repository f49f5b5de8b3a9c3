"""``scripts/cut_gguf.py``: a Llama GGUF cut to its first layers loads as that model's first
layers, byte for byte (quantised tensors included), with its vocabulary."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from pagesim.core.models import load_gguf

from tests.models import tiny_gguf

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cut_gguf.py"


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("PAGESIM_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def cut_gguf():
    spec = importlib.util.spec_from_file_location("cut_gguf", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cut_file_is_the_models_first_layers(cut_gguf, fresh_cache, tmp_path):
    whole, cut = tmp_path / "whole.gguf", tmp_path / "cut.gguf"
    tiny_gguf.write_llama(whole)
    assert tiny_gguf.LAYERS == 2
    assert cut_gguf.cut(str(whole), str(cut), 1) == 2 + 9  # the embedding, the final norm, one layer's 9
    full, first = load_gguf(whole), load_gguf(cut)
    assert first.config.num_layers == 1
    assert first.config == full.config.__class__(**{**vars(full.config), "num_layers": 1})
    assert set(first.weights) == {n for n in full.weights if not n.startswith("blk.1.")}
    for name, w in first.weights.items():
        assert np.array_equal(w, full.weights[name]), name
    text = "the world"
    assert first.tokenizer.encode(text) == full.tokenizer.encode(text)


def test_more_layers_than_the_file_has_is_refused(cut_gguf, tmp_path):
    whole = tmp_path / "whole.gguf"
    tiny_gguf.write_llama(whole)
    with pytest.raises(SystemExit, match="has 2 layers"):
        cut_gguf.cut(str(whole), str(tmp_path / "cut.gguf"), 3)
