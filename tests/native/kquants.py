"""Small numpy quantizers for the K-quant block types (gguf 0.19 dequantizes K-quants but
cannot quantize them), shared by the kernel, model and arm64 tests. MLX-free, so the arm64
cross test can use them without the engine. test_kquant_kernels checks that gguf's
dequantizer reads back exactly what they mean to write.
"""

from __future__ import annotations

import numpy as np


def f16(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16)


def _quantize_affine_k(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K (bits=4) / Q5_K (bits=5): w [n, k] -> (packed uint8 [n, k/256*bytes], what those
    bytes should dequantize to)."""
    top = (1 << bits) - 1
    x = w.astype(np.float32).reshape(-1, 8, 32)  # [blocks, sub-block, element]
    lo = np.minimum(x.min(axis=2), 0.0)
    hi = np.maximum(x.max(axis=2), 0.0)
    scale = (hi - lo) / top  # per sub-block step
    mn = -lo  # per sub-block offset, >= 0
    d = f16(scale.max(axis=1) / 63.0)
    dmin = f16(mn.max(axis=1) / 63.0)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df > 0, np.rint(scale / df), 0).clip(0, 63).astype(np.uint8)
        m = np.where(dminf > 0, np.rint(mn / dminf), 0).clip(0, 63).astype(np.uint8)
        step = (df * sc)[:, :, None]
        q = np.where(step > 0, np.rint((x + (dminf * m)[:, :, None]) / step), 0)
    q = q.clip(0, top).astype(np.uint8)

    nblk = x.shape[0]
    scales = np.zeros((nblk, 12), np.uint8)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    qq = q.reshape(nblk, 4, 2, 32) & 0x0F  # chunk j: sub-blocks 2j (low nibble), 2j+1 (high)
    qs = (qq[:, :, 0, :] | (qq[:, :, 1, :] << 4)).reshape(nblk, 128)
    fields = [d.view(np.uint8).reshape(nblk, 2), dmin.view(np.uint8).reshape(nblk, 2), scales]
    if bits == 5:
        # qh[l]: bit j is the fifth bit of element l of sub-block j.
        fifth = (q >> 4).astype(np.uint8)  # [blocks, sub-block, element]
        fields.append(
            (fifth << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
        )
    packed = np.concatenate([*fields, qs], axis=1)
    expect = df[:, :, None] * sc[:, :, None] * q - dminf[:, :, None] * m[:, :, None]
    n = w.shape[0]
    return packed.reshape(n, -1), expect.reshape(w.shape)


def quantize_q4_k(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _quantize_affine_k(w, 4)


def quantize_q5_k(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _quantize_affine_k(w, 5)


def quantize_q6_k(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w [n, k] -> (packed uint8 [n, k/256*210], what those bytes should dequantize to)."""
    x = w.astype(np.float32).reshape(-1, 16, 16)  # [blocks, sub-block, element]
    scale = np.abs(x).max(axis=2) / 31.0
    d = f16(scale.max(axis=1) / 127.0)
    df = d.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df > 0, np.rint(scale / df), 0).clip(-128, 127).astype(np.int8)
        step = (df * sc)[:, :, None]
        q = np.where(step != 0, np.rint(x / step), 0)
    q = (q.clip(-32, 31) + 32).astype(np.uint8)  # [0, 63]

    nblk = x.shape[0]
    qe = q.reshape(nblk, 2, 4, 32)  # half h, quarter t, l: element 128h + 32t + l
    ql = np.concatenate(
        [
            qe[:, :, 0] & 0x0F | (qe[:, :, 2] & 0x0F) << 4,
            qe[:, :, 1] & 0x0F | (qe[:, :, 3] & 0x0F) << 4,
        ],
        axis=2,
    ).reshape(nblk, 128)
    qh = (
        (qe[:, :, 0] >> 4)
        | (qe[:, :, 1] >> 4) << 2
        | (qe[:, :, 2] >> 4) << 4
        | (qe[:, :, 3] >> 4) << 6
    ).reshape(nblk, 64)
    packed = np.concatenate([ql, qh, sc.view(np.uint8), d.view(np.uint8).reshape(nblk, 2)], axis=1)
    expect = df[:, :, None] * sc[:, :, None] * (q.astype(np.float32) - 32)
    n = w.shape[0]
    return packed.reshape(n, -1), expect.reshape(w.shape)


QUANTIZERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}
