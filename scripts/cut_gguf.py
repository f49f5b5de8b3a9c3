"""A Llama GGUF file cut to its first layers: the same metadata (the layer count changed),
vocabulary and tensors, byte for byte, for the layers kept. It carries a real model's
weights to a machine that takes a few tens of MiB (the GPU check's): its text is no
longer the model's, but every layer it keeps is, and paged against dense needs no more.

    python scripts/cut_gguf.py SRC.gguf DST.gguf --layers 8
"""

from __future__ import annotations

import argparse
import re
import sys

import gguf


def cut(src: str, dst: str, layers: int) -> int:
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    count_key = f"{arch}.block_count"
    total = int(reader.fields[count_key].contents())
    if not 1 <= layers <= total:
        raise SystemExit(f"error: --layers {layers}: {src} has {total} layers")
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer writes these itself
        value = layers if name == count_key else field.contents()
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub_type)
    kept = 0
    for tensor in reader.tensors:
        block = re.match(r"blk\.(\d+)\.", tensor.name)
        if block and int(block.group(1)) >= layers:
            continue
        # the reader's array is the stored bytes (quantised rows as uint8): written as they are
        writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
        kept += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--layers", type=int, required=True)
    args = parser.parse_args()
    kept = cut(args.src, args.dst, args.layers)
    print(f"{args.dst}: {args.layers} layers, {kept} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
