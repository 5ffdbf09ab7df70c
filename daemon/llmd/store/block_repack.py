"""Lossless re-encodings of GGUF blocks the engine has no kernel for into ones it has.

Why: a pull-time conversion that dequantizes and re-quantizes (convert.py's general path) adds
a rounding of its own, and its Q8_0 target costs 8.5 bits per weight. Some source formats
are, value for value, a special case of a native one; re-encoding their integers keeps every
weight exactly as llama.cpp reads it, and can be smaller:

- **IQ4_XS -> IQ4_NL** (4.5 bits per weight instead of Q8_0's 8.5): the same codes per 32
  weights, under the scale ``d * (s - 32)`` rounded to fp16 (exact when it fits 11 significant
  bits; otherwise off by at most 2^-11 of the scale, where re-quantizing to Q8_0 moves weights
  by up to half a Q8_0 step, 1/254 of the block's largest).

Each function takes rows of source blocks (uint8, one row per tensor row) and returns the
target's bytes for the same rows; gguf-py's dequantizers of source and result agree bit for
bit, IQ4_XS's up to that scale rounding (tests/unit/test_block_repack.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType as T


def _blocks(rows: np.ndarray, block_bytes: int) -> np.ndarray:
    return np.ascontiguousarray(rows).reshape(-1, block_bytes)


def iq4_xs_to_iq4_nl(rows: np.ndarray) -> np.ndarray:
    """IQ4_XS (136 bytes / 256 weights: d, scales_h as a uint16, scales_l[4], qs[128]) -> one
    IQ4_NL block (18 bytes: fp16 scale, the 16 code bytes as they are) per 32 weights, scaled
    by fp16(d * (s - 32))."""
    b = _blocks(rows, 136)
    n = b.shape[0]
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    scales_h = b[:, 2:4].copy().view("<u2").reshape(n, 1) >> (2 * np.arange(8, dtype=np.uint16))
    scales_l = np.stack([b[:, 4:8] & 0x0F, b[:, 4:8] >> 4], axis=2).reshape(n, 8)
    s = (scales_l.astype(np.int16) | ((scales_h & 3).astype(np.int16) << 4)) - 32
    out = np.empty((n * 8, 18), np.uint8)
    out[:, :2] = (d * s.astype(np.float32)).astype(np.float16).reshape(-1, 1).view(np.uint8)
    out[:, 2:] = b[:, 8:].reshape(n * 8, 16)  # sub-block j's 16 bytes: IQ4_NL's code layout
    return out.reshape(rows.shape[0], -1)


# (source, target) -> re-encoding; convert.py uses one whenever its plan pairs the two.
REPACKS: dict[tuple[int, int], Callable[[np.ndarray], np.ndarray]] = {
    (T.IQ4_XS, T.IQ4_NL): iq4_xs_to_iq4_nl,
}
