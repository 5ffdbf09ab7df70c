"""llmd's Q2_K and Q3_K kernels (kernels/kquant_low_bits.h, kquant_low_bits_prefill.h) against a
reference built from the `gguf` package, and against each other.

gguf-py dequantizes both types but cannot quantize to them, so the weights are blocks of random
bytes with sane fp16 scales (gguf_files.random_blocks): every code, Q3_K high bit, 6-bit scale
and Q2_K min occurs. The reference dequantizes them with `gguf.quants.dequantize` (not our
code) and multiplies in float64; the tolerance is the int8 activation rounding's worst case (kernel_checks.py, blocks
of 256). Every path computes one exact integer sum per super-block and then the float step
of the Q6_K prompt kernel it hands many rows to (AVX-512: from 48 rows, kb6_tile; AVX2: from 5
rows, dot8_q6k_x; the portable path takes AVX2's form), so the AVX2 and scalar paths agree bit
for bit and a row's bits do not depend on its batch on any path: both checked bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from ..unit.gguf_files import random_blocks
from .kernel_checks import check_matches_reference

engine = pytest.importorskip("llmd._engine")

TYPES = {"Q2_K": GGMLQuantizationType.Q2_K, "Q3_K": GGMLQuantizationType.Q3_K}
PATHS = engine.runnable_kernel_paths()
BLOCKED_ROWS = 48  # kquant_zmm_blocked.h kKbMinRows: the AVX-512 path's prefill kernel from here


def random_weights(rng: np.random.Generator, type_name: str, n: int, k: int) -> np.ndarray:
    return np.ascontiguousarray(random_blocks(rng, TYPES[type_name], n, k, 1e-3))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("type_name", list(TYPES))
@pytest.mark.parametrize("n,k", [(1, 256), (7, 512), (33, 1536), (130, 768)])
def test_kernel_matches_gguf_dequantize_reference(
    path: str, type_name: str, n: int, k: int
) -> None:
    rng = np.random.default_rng(n * 1000 + k)
    w = random_weights(rng, type_name, n, k)
    w_deq = dequantize(w, TYPES[type_name]).astype(np.float64)
    check_matches_reference(engine.kernel_gemm, type_name, w, w_deq, path, rng)
    # The prefill sizes too (check_matches_reference stops at 67 rows).
    x = rng.standard_normal((130, k), dtype=np.float32)
    got = engine.kernel_gemm(type_name, w, n, k, x, path)
    want = x.astype(np.float64) @ w_deq.T
    assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()


@pytest.mark.skipif("avx2" not in PATHS, reason="no AVX2 on this CPU")
@pytest.mark.parametrize("type_name", list(TYPES))
@pytest.mark.parametrize("n", [5, 37, 96])
def test_avx2_gives_the_scalar_bits(type_name: str, n: int) -> None:
    """SIMD = scalar exactly: the integer sums are exact and the float steps the same, through
    the one-row kernel, the four-column decode tile and the expanded prompt kernel."""
    rng = np.random.default_rng(n)
    k = 1024
    w = random_weights(rng, type_name, n, k)
    for rows in (1, 3, 4, 5, 9, BLOCKED_ROWS, 70):
        x = rng.standard_normal((rows, k), dtype=np.float32)
        avx2 = engine.kernel_gemm(type_name, w, n, k, x, "avx2")
        assert np.array_equal(avx2, engine.kernel_gemm(type_name, w, n, k, x, "scalar")), rows


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("type_name", list(TYPES))
def test_each_row_is_bit_identical_whatever_the_batch(path: str, type_name: str) -> None:
    """Isolation, across the decode kernel (few rows, four weight rows at a time) and the
    prefill kernel (from 48 rows on AVX-512), and column counts that are no multiple of 4 or 32."""
    rng = np.random.default_rng(7)
    n, k = 45, 1536
    w = random_weights(rng, type_name, n, k)
    x = rng.standard_normal((70, k), dtype=np.float32)
    batched = engine.kernel_gemm(type_name, w, n, k, x, path)
    for r in (0, 3, 4, 31, 32, 47, 69):
        alone = engine.kernel_gemm(type_name, w, n, k, x[r : r + 1], path)
        assert np.array_equal(alone[0], batched[r]), r
        five = engine.kernel_gemm(type_name, w, n, k, x[max(r - 4, 0) : r + 1], path)
        assert np.array_equal(five[-1], batched[r]), r


@pytest.mark.parametrize("type_name", list(TYPES))
def test_extreme_blocks(type_name: str) -> None:
    """Every code at its largest with the largest scales (Q3_K: the most negative scale, -32,
    with the most negative value, q - 4 = -4; Q2_K: scale and min 15) against activations at
    the int8 limits: the exact integer sums must not wrap."""
    n, k = 8, 512
    block_bytes = GGML_QUANT_SIZES[TYPES[type_name]][1]
    w = random_weights(np.random.default_rng(3), type_name, n, k).reshape(-1, block_bytes)
    if type_name == "Q2_K":
        w[:, :16] = 0xFF  # scale 15, min 15
        w[:, 16:80] = 0xFF  # q = 3
    else:
        w[:, :96] = 0x00  # hmask 0 and q = 0: q - 4 = -4
        w[:, 96:108] = 0x00  # every scale 0 - 32
    w = np.ascontiguousarray(w.reshape(n, -1))
    w_deq = dequantize(w, TYPES[type_name]).astype(np.float64)
    x = np.full((2, k), 3.0, dtype=np.float32)
    x[1, ::2] = -3.0
    for path in PATHS:
        got = engine.kernel_gemm(type_name, w, n, k, x, path)
        want = x.astype(np.float64) @ w_deq.T
        scale = (np.abs(x).astype(np.float64) @ np.abs(w_deq).T).max()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * scale, err_msg=path)
