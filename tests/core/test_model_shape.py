"""A model shape, published or read from a GGUF file's metadata, is a shape: positive sizes,
KV heads that divide the query heads. A file that breaks that is refused by name (it gave a
ZeroDivisionError, or billions of tokens a second)."""

import gguf
import numpy as np
import pytest
from pagesim.core.errors import InvalidStudyError
from pagesim.core.studies.serving_time import MODEL_SHAPES, model_shape


def _write(path, layers=1, hidden=8, heads=2, kv_heads=2, tokenizer=True, arch="llama"):
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(layers)
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(16)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list([f"t{i}" for i in range(10)])
        writer.add_token_types([1] * 10)
    writer.add_tensor("token_embd.weight", np.zeros((12, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"heads": 0}, "head_count must be at least 1; got 0"),
        ({"kv_heads": 0}, "kv_heads must be an integer from 1 to"),
        ({"layers": 0}, "layers must be an integer from 1 to"),
        ({"kv_heads": 3}, "3 KV heads do not divide 2 query heads"),
    ],
)
def test_a_gguf_whose_metadata_is_no_shape_is_refused_by_name(tmp_path, fields, said):
    path = _write(tmp_path / "m.gguf", **fields)
    with pytest.raises(InvalidStudyError, match=said):
        model_shape(path)


def test_a_gguf_without_a_tokenizer_takes_its_vocabulary_from_the_embedding(tmp_path):
    shape = model_shape(_write(tmp_path / "qwen.gguf", tokenizer=False, arch="qwen2"))
    assert shape.vocab == 12 and shape.heads == 2 and shape.layers == 1


def test_every_published_shape_is_one():
    for shape in MODEL_SHAPES.values():
        assert shape.heads % shape.kv_heads == 0 and shape.kv_bytes_per_token > 0
