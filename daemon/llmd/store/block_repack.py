"""Lossless re-encodings of GGUF blocks the engine has no kernel for into ones it has.

Why: a pull-time conversion that dequantizes and re-quantizes (convert.py's general path) adds
a rounding of its own, and its Q8_0 target costs 8.5 bits per weight. Some source formats
are, value for value, a special case of a native one; re-encoding their integers keeps every
weight exactly as llama.cpp reads it, and can be smaller:

- **IQ4_XS -> IQ4_NL** (4.5 bits per weight instead of Q8_0's 8.5): the same codes per 32
  weights, under the scale ``d * (s - 32)`` rounded to fp16 (exact when it fits 11 significant
  bits; otherwise off by at most 2^-11 of the scale, where re-quantizing to Q8_0 moves weights
  by up to half a Q8_0 step, 1/254 of the block's largest).
- **IQ3_S -> Q4_K** (4.5 bits per weight instead of Q8_0's 8.5; the bulk of IQ3_S and IQ3_M
  files): IQ3_S's weight ``d * (1 + 2 s) * v`` has ``v`` a signed odd grid value, -15 .. 15, so
  ``v = 2 q - 15`` with ``q`` in 0 .. 15 and the weight is ``2 d * (1 + 2 s) * q - 15 d * (1 + 2 s)``:
  a Q4_K sub-block of 32 with scale and min ``1 + 2 s`` (at most 31 of Q4_K's 63), super-block
  scale ``2 d`` (exact) and min scale ``15 d`` rounded to fp16 (at most 2^-11 of the min term).
  Every code is kept; re-quantizing to Q8_0 would round every weight by up to 1/254 of its
  block's largest and take 1.9x the memory.
- **IQ2_XXS -> Q8_0** (its target as for every IQ2 type, but its codes kept): the weight
  ``d * (1 + 2 s) / 8 * v`` has ``v`` a signed grid value (8, 25 or 43), so each 32 weights are
  a Q8_0 block holding ``v`` under the scale ``d * (1 + 2 s) / 8`` rounded to fp16 (at most 2^-11
  of each weight); a re-quantization would round the 8s to 24/127 of the 43s (up to 1.6 %).
- **IQ3_XXS -> Q6_K** (6.5625 bits per weight instead of Q8_0's 8.5, every weight exact): the
  weight ``d * (1 + 2 s) / 4 * v`` has ``v`` a signed grid value whose magnitude is even (4 .. 62),
  so it is ``d / 2 * (1 + 2 s) * (v / 2)``: Q6_K's ``d * scale * (q - 32)`` with ``q - 32 = v / 2``
  in -31 .. 31 and both 16-weight halves of a 32-weight sub-block under the scale ``1 + 2 s``.

Each function takes rows of source blocks (uint8, one row per tensor row) and returns the
target's bytes for the same rows; gguf-py's dequantizers of source and result agree bit for
bit, IQ4_XS's up to that scale rounding (tests/unit/test_block_repack.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize


def _blocks(rows: np.ndarray, block_bytes: int) -> np.ndarray:
    return np.ascontiguousarray(rows).reshape(-1, block_bytes)


def _first_fp16(b: np.ndarray) -> np.ndarray:
    """Each block's leading fp16 field (the IQ types' d) as float32, shape (n, 1)."""
    return b[:, :2].copy().view(np.float16).astype(np.float32).reshape(-1, 1)


def _grid_values(b: np.ndarray, qtype: T, step: np.ndarray) -> np.ndarray:
    """The signed grid values of IQ blocks `b` (int32, (n, 8, 32)), given each 32 weights' step
    (n, 8): gguf-py's float32 weights are exact multiples of it (at most 22 significant bits),
    so the division gives them back. 0 where the step is 0 (a block whose d is 0)."""
    w = dequantize(b, qtype).reshape(-1, 8, 32)
    v = np.divide(w, step[:, :, None], out=np.zeros_like(w), where=step[:, :, None] != 0)
    return np.rint(v).astype(np.int32)


def iq4_xs_to_iq4_nl(rows: np.ndarray) -> np.ndarray:
    """IQ4_XS (136 bytes / 256 weights: d, scales_h as a uint16, scales_l[4], qs[128]) -> one
    IQ4_NL block (18 bytes: fp16 scale, the 16 code bytes as they are) per 32 weights, scaled
    by fp16(d * (s - 32))."""
    b = _blocks(rows, 136)
    n = b.shape[0]
    d = _first_fp16(b)
    scales_h = b[:, 2:4].copy().view("<u2").reshape(n, 1) >> (2 * np.arange(8, dtype=np.uint16))
    scales_l = np.stack([b[:, 4:8] & 0x0F, b[:, 4:8] >> 4], axis=2).reshape(n, 8)
    s = (scales_l.astype(np.int16) | ((scales_h & 3).astype(np.int16) << 4)) - 32
    out = np.empty((n * 8, 18), np.uint8)
    out[:, :2] = (d * s.astype(np.float32)).astype(np.float16).reshape(-1, 1).view(np.uint8)
    out[:, 2:] = b[:, 8:].reshape(n * 8, 16)  # sub-block j's 16 bytes: IQ4_NL's code layout
    return out.reshape(rows.shape[0], -1)


def iq3_s_to_q4_k(rows: np.ndarray) -> np.ndarray:
    """IQ3_S (110 bytes / 256 weights: fp16 d, qs[64], qh[8], signs[32], scales[4]) -> Q4_K (144
    bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, qs[128]). The signed grid values
    come from gguf-py's own dequantizer (_grid_values; the step is ``d * (1 + 2 s)``)."""
    b = _blocks(rows, 110)
    n = b.shape[0]
    d = _first_fp16(b)
    nibbles = np.stack([b[:, 106:110] & 0x0F, b[:, 106:110] >> 4], axis=2).reshape(n, 8)
    scale = 1 + 2 * nibbles.astype(np.int32)  # sub-block j's 1 + 2 s, 1 .. 31
    # A block of d = 0 holds only zeros: any code gives them (7 here).
    q = ((_grid_values(b, T.IQ3_S, d * scale) + 15) // 2).astype(np.uint8)  # 0 .. 15
    out = np.zeros((n, 144), np.uint8)
    out[:, 0:2] = (2 * d).astype(np.float16).view(np.uint8)
    out[:, 2:4] = (15 * d).astype(np.float16).view(np.uint8)
    sc = scale.astype(np.uint8)  # the sub-block's scale and its min are the same number
    for j in range(4):  # Q4_K's 6-bit packing (ggml's get_scale_min_k4)
        out[:, 4 + j] = sc[:, j] | ((sc[:, j + 4] >> 4) << 6)
        out[:, 8 + j] = sc[:, j] | ((sc[:, j + 4] >> 4) << 6)
        out[:, 12 + j] = (sc[:, j + 4] & 15) | ((sc[:, j + 4] & 15) << 4)
    for p in range(4):  # bytes 32p .. 32p + 31: sub-block 2p in the low nibbles, 2p + 1 high
        out[:, 16 + 32 * p : 48 + 32 * p] = q[:, 2 * p] | (q[:, 2 * p + 1] << 4)
    return out.reshape(rows.shape[0], -1)


def iq3_xxs_to_q6_k(rows: np.ndarray) -> np.ndarray:
    """IQ3_XXS (98 bytes / 256 weights: fp16 d, grid indices[64], 8 uint32 of signs and 4-bit
    scales) -> Q6_K (210 bytes: ql[128], qh[64], int8 scales[16], fp16 d). As for IQ3_S, the
    signed grid values come from gguf-py's dequantizer (exact multiples of each sub-block's step)."""
    b = _blocks(rows, 98)
    n = b.shape[0]
    d = _first_fp16(b)
    scale = 1 + 2 * (b[:, 66:98].copy().view("<u4") >> 28).astype(np.int32)  # (n, 8): 1 .. 31
    # Steps of d / 2 * (1 + 2 s): the grid values halved, Q6_K's q - 32.
    half = _grid_values(b, T.IQ3_XXS, d * np.float32(0.5) * scale)
    q = (half + 32).astype(np.uint8).reshape(n, 256)  # 1 .. 63
    out = np.zeros((n, 210), np.uint8)
    for h in range(2):  # ggml's Q6_K order: element 128h + 32k + l (k = 0..3, l = 0..31)
        e = q[:, 128 * h : 128 * h + 128].reshape(n, 4, 32)
        out[:, 64 * h : 64 * h + 32] = (e[:, 0] & 15) | ((e[:, 2] & 15) << 4)
        out[:, 64 * h + 32 : 64 * h + 64] = (e[:, 1] & 15) | ((e[:, 3] & 15) << 4)
        out[:, 128 + 32 * h : 160 + 32 * h] = (
            (e[:, 0] >> 4) | ((e[:, 1] >> 4) << 2) | ((e[:, 2] >> 4) << 4) | ((e[:, 3] >> 4) << 6)
        )
    out[:, 192:208] = np.repeat(scale, 2, axis=1).astype(np.int8).view(np.uint8)
    out[:, 208:210] = (d * np.float32(0.5)).astype(np.float16).view(np.uint8)
    return out.reshape(rows.shape[0], -1)


def iq2_xxs_to_q8_0(rows: np.ndarray) -> np.ndarray:
    """IQ2_XXS (66 bytes / 256 weights: fp16 d, then per 32 weights a uint32 of grid indices and
    a uint32 of signs and a 4-bit scale) -> Q8_0 (34 bytes / 32 weights). The signed grid values
    come from gguf-py's dequantizer (exact multiples of each 32 weights' step)."""
    b = _blocks(rows, 66)
    n = b.shape[0]
    aux = b[:, 2:66].copy().view("<u4").reshape(n, 8, 2)[:, :, 1]
    step = _first_fp16(b) * (np.float32(0.5) + (aux >> 28).astype(np.float32)) * np.float32(0.25)
    out = np.empty((n * 8, 34), np.uint8)
    out[:, :2] = step.astype(np.float16).reshape(-1, 1).view(np.uint8)
    out[:, 2:] = _grid_values(b, T.IQ2_XXS, step).astype(np.int8).reshape(n * 8, 32).view(np.uint8)
    return out.reshape(rows.shape[0], -1)


# (source, target) -> re-encoding; convert.py uses one whenever its plan pairs the two.
REPACKS: dict[tuple[int, int], Callable[[np.ndarray], np.ndarray]] = {
    (T.IQ4_XS, T.IQ4_NL): iq4_xs_to_iq4_nl,
    (T.IQ3_S, T.Q4_K): iq3_s_to_q4_k,
    (T.IQ3_XXS, T.Q6_K): iq3_xxs_to_q6_k,
    (T.IQ2_XXS, T.Q8_0): iq2_xxs_to_q8_0,
}
