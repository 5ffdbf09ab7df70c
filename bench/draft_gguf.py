"""A draft model cut from its target: the same GGUF with only its first layers.

Speculative decoding with a draft model needs a small model with the target's vocabulary.
Where no trained one exists (the test model, a random-weight benchmark model), a copy of the
target that keeps its first N layers (embeddings, final norm and output head included) is
one: it shares the target's weights, so it agrees with it often, and costs about N / layers
of a target step. Used by the tests (a draft that differs from its target) and by
`bench/speculative.py` (the draft-model mode).
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np

_LAYER = re.compile(r"^blk\.(\d+)\.")


def write_truncated(src: Path | str, dst: Path | str, n_layers: int) -> Path:
    """Writes `dst`: `src` with only its layers [0, n_layers) and block_count set to match.
    Every other tensor and metadata field (tokenizer, template) is copied as it is."""
    return _rewrite(src, dst, n_layers=n_layers)


def write_requantized(src: Path | str, dst: Path | str, quant: str = "Q4_0") -> Path:
    """Writes `dst`: `src` with every quantized tensor dequantized and quantized again as
    `quant` (Q8_0, Q4_0, ...: what gguf can write). A draft whose numbers differ a little from
    its target's: it agrees with it on most tokens, not all (a test's draft that differs)."""
    return _rewrite(src, dst, quant=gguf.GGMLQuantizationType[quant])


def _rewrite(
    src: Path | str,
    dst: Path | str,
    *,
    n_layers: int | None = None,
    quant: gguf.GGMLQuantizationType | None = None,
) -> Path:
    reader = gguf.GGUFReader(str(src))
    arch = str(reader.fields["general.architecture"].contents())
    total = int(reader.fields[f"{arch}.block_count"].contents())
    n_layers = total if n_layers is None else n_layers
    if not 1 <= n_layers <= total:
        raise ValueError(f"n_layers must be 1..{total}")
    writer = gguf.GGUFWriter(str(dst), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # written by GGUFWriter itself
        if name == f"{arch}.block_count":
            writer.add_uint32(name, n_layers)
            continue
        kind = field.types[0]
        value = field.contents()
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, value, kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, kind)
    for tensor in reader.tensors:
        m = _LAYER.match(tensor.name)
        if m and int(m.group(1)) >= n_layers:
            continue
        # Quantized tensors come back as their bytes, [rows, bytes per row]: the writer turns
        # that back into the logical shape from the type.
        data, kind = np.asarray(tensor.data), tensor.tensor_type
        floats = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        if quant is not None and kind not in floats:
            data = gguf.quants.quantize(gguf.quants.dequantize(data, kind), quant)
            kind = quant
        writer.add_tensor(tensor.name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(dst)
