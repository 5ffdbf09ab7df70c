"""Small GGUF inputs for the store's and the benches' tests: random valid blocks of types the
gguf package cannot quantize to, and tensor-only files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as T


def random_blocks(
    rng: np.random.Generator, qtype: T, rows: int, cols: int, scale: float
) -> np.ndarray:
    """Rows of random `qtype` blocks (every byte pattern is a valid block of Q2_K, Q3_K, Q5_0,
    IQ4_NL, IQ4_XS, ..., so every code and sub-block scale occurs) whose fp16 d (the first field,
    or Q3_K's last; Q2_K's d and dmin, its last two, each drawn on its own) is near `scale`,
    varied per block so scales of every mantissa occur."""
    block, nbytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, nbytes), dtype=np.uint8)
    for a in {T.Q3_K: [nbytes - 2], T.Q2_K: [nbytes - 4, nbytes - 2]}.get(qtype, [0]):
        d = (scale * rng.uniform(0.5, 2.0, size=(rows, cols // block))).astype(np.float16)
        raw[:, :, a : a + 2] = d.view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, -1)


def write_tensors(
    path: Path, tensors: dict[str, tuple[np.ndarray, T]], arch: str = "llama"
) -> Path:
    """A GGUF holding only `tensors` (name -> (blocks or floats, type)), no other metadata."""
    w = GGUFWriter(str(path), arch)
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=None if qtype == T.F32 else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
