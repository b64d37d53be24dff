"""A copy of a GGUF file with one token's text changed (gguf-py's reader and writer, laid out as
its ``gguf_new_metadata.py`` copies a file): a model of the same weights and another vocabulary."""

from __future__ import annotations

from pathlib import Path


def gguf_with_token_text(src: Path, out: Path, token_id: int, text: str) -> Path:
    """``src`` copied to ``out`` with ``tokenizer.ggml.tokens[token_id]`` set to ``text``."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(out, arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == gguf.Keys.Tokenizer.LIST:
            value = [*value[:token_id], text, *value[token_id + 1:]]
        writer.add_key_value(field.name, value, val_type, sub_type=sub_type)
    for tensor in reader.tensors:
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes,
                               tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()
    return out
