"""llmd's Q4_K, Q5_K and Q6_K kernels against a reference built from the `gguf` package.

gguf 0.19 can dequantize K-quants but not quantize them, so the project carries small numpy
quantizers (kquants.py). Their packing is checked first: the integers it chose, dequantized by hand with the
formulas of ggml's block layouts, must equal what `gguf.quants.dequantize` reads back from the
packed bytes, and the result must be close to the input. The kernels are then checked as in
test_kernels.py: reference = x (float64) @ gguf-dequantized W.T, tolerance = the worst case of
the int8 activation rounding (sum_i |w_i| * blockmax|x| / 254, blocks of 256: the activations
of all three share one scale per super-block) plus a small float term. Besides
quantized weights, blocks of random bytes (sane fp16 scales) reach every bit pattern: 6-bit
scale high bits, Q5_K's fifth bits, negative Q6_K scales, q = 0 and q = 63.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from .kernel_checks import (
    activation_block,
    activation_rounding_tolerance,
    check_matches_reference,
)
from .kquants import QUANTIZERS, f16

engine = pytest.importorskip("llmd._engine")

QK = 256
TYPES = {
    "Q4_K": GGMLQuantizationType.Q4_K,
    "Q5_K": GGMLQuantizationType.Q5_K,
    "Q6_K": GGMLQuantizationType.Q6_K,
}
BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
PATHS = engine.runnable_kernel_paths()


def _random_blocks(rng: np.random.Generator, n: int, k: int, type_name: str) -> np.ndarray:
    """Blocks of random bytes, with finite fp16 super-block scales of a sane size."""
    blocks = rng.integers(0, 256, (n * k // QK, BLOCK_BYTES[type_name]), dtype=np.uint8)
    scale = f16(rng.uniform(1e-4, 2e-3, (blocks.shape[0], 2)))
    if type_name in ("Q4_K", "Q5_K"):
        blocks[:, 0:4] = scale.view(np.uint8)
    else:
        blocks[:, 208:210] = scale[:, :1].view(np.uint8)
    return blocks.reshape(n, -1)


def _weights(rng: np.random.Generator, n: int, k: int, type_name: str, source: str):
    if source == "random_bytes":
        packed = _random_blocks(rng, n, k, type_name)
    else:
        packed, _ = QUANTIZERS[type_name](rng.standard_normal((n, k), dtype=np.float32) * 0.05)
    packed = np.ascontiguousarray(packed)
    return packed, dequantize(packed, TYPES[type_name]).astype(np.float64)


@pytest.mark.parametrize("type_name", list(TYPES))
def test_quantizer_packs_what_gguf_reads(type_name: str) -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((9, 1024), dtype=np.float32) * 0.05
    w[0, :256] = 0.0  # an all-zero super-block
    w[1] = np.abs(w[1])  # no negative values: Q4_K mins of 0
    packed, expect = QUANTIZERS[type_name](w)
    assert packed.dtype == np.uint8 and packed.shape == (9, 1024 // QK * BLOCK_BYTES[type_name])
    got = dequantize(packed, TYPES[type_name])
    assert got.shape == w.shape
    np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-9)
    err = np.abs(got - w).reshape(-1, 32).max(axis=1)
    span = np.abs(w).reshape(-1, 32).max(axis=1)
    # Half a quantization step plus the 6/8-bit scale rounding, per 32-element slice.
    limit = span * {"Q4_K": 0.1, "Q5_K": 0.05, "Q6_K": 0.03}[type_name] + 1e-7
    assert (err <= limit).all(), f"worst relative error {(err / np.maximum(span, 1e-12)).max()}"
    rms = np.sqrt(((got - w) ** 2).mean() / (w**2).mean())
    assert rms < {"Q4_K": 0.09, "Q5_K": 0.045, "Q6_K": 0.03}[type_name], rms


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("type_name", list(TYPES))
@pytest.mark.parametrize("source", ["quantized", "random_bytes"])
@pytest.mark.parametrize("k", [256, 512, 1536])
@pytest.mark.parametrize("n", [1, 7, 33, 130])
def test_kernel_matches_gguf_dequantize_reference(
    path: str, type_name: str, source: str, k: int, n: int
) -> None:
    rng = np.random.default_rng(n * 1000 + k)
    packed, w_deq = _weights(rng, n, k, type_name, source)
    check_matches_reference(engine.kernel_gemm, type_name, packed, w_deq, path, rng)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("type_name", list(TYPES))
def test_each_row_is_bit_identical_whatever_the_batch(path: str, type_name: str) -> None:
    """Isolation: a row's output must not depend on the rows batched with it."""
    rng = np.random.default_rng(7)
    n, k = 45, 1536
    packed, _ = _weights(rng, n, k, type_name, "quantized")
    x = rng.standard_normal((67, k), dtype=np.float32)
    batched = engine.kernel_gemm(type_name, packed, n, k, x, path)
    for r in (0, 3, 4, 31, 32, 66):
        alone = engine.kernel_gemm(type_name, packed, n, k, x[r : r + 1], path)
        assert np.array_equal(alone[0], batched[r])
        pair = engine.kernel_gemm(type_name, packed, n, k, x[max(r - 1, 0) : r + 1], path)
        assert np.array_equal(pair[-1], batched[r])


# ------------------------------------------------------------------ 8-row packed layout
#
# The x86 paths pack Q4_K / Q5_K / Q6_K matrices whose row count is a multiple of 8 at load time
# (kernels/pack8.h) and run kernels that read each weight super-block once for a tile of
# activation rows and 8 output columns. Matrices of other row counts are not packed: the
# engine keeps them row-major (test_kquant_packed.py checks that), and the packed kernel
# refuses them.

PACKED_PATHS = [p for p in PATHS if set(TYPES) <= set(engine.packed_kernel_types(p))]


def _packed_kernel(type_name, weights, n, k, x, path):  # type: ignore[no-untyped-def]
    """The kernel of the 8-row packed layout, on weights packed as the engine packs them."""
    return engine.kernel_gemm(type_name, weights, n, k, x, path, packed=True)


def test_x86_paths_have_packed_kquant_kernels() -> None:
    assert PACKED_PATHS == [p for p in PATHS if p in ("avx2", "avx512vnni")]
    for path in PACKED_PATHS:
        with pytest.raises(ValueError, match="n = 12"):
            _packed_kernel(
                "Q4_K", np.zeros(12 * 144, np.uint8), 12, 256, np.zeros((1, 256), np.float32), path
            )


@pytest.mark.parametrize("path", PACKED_PATHS)
@pytest.mark.parametrize("type_name", list(TYPES))
def test_pack8_moves_bytes_and_every_row_unpacks_exactly(path: str, type_name: str) -> None:
    """Random bytes reach every scale bit pattern (Q4_K's 6-bit scales are re-encoded) and
    every fifth-bit pattern (the AVX-512 path's Q5_K tile turns qh into bit masks); each path
    packs the layout its kernels read, and a tied embedding reads rows back through it."""
    rng = np.random.default_rng(5)
    n, k = 24, 512
    rows = np.ascontiguousarray(_random_blocks(rng, n, k, type_name))
    packed = engine.pack8(type_name, rows, n, k, path)
    assert packed.shape == (rows.size,)
    assert not np.array_equal(packed, rows.reshape(-1))
    for r in range(n):
        assert np.array_equal(engine.unpack8_row(type_name, packed, n, k, r, path), rows[r]), r


@pytest.mark.parametrize("path", PACKED_PATHS)
@pytest.mark.parametrize("type_name", list(TYPES))
@pytest.mark.parametrize("source", ["quantized", "random_bytes"])
@pytest.mark.parametrize("n,k", [(8, 256), (24, 512), (136, 1536)])
def test_packed_kernel_matches_gguf_dequantize_reference(
    path: str, type_name: str, source: str, n: int, k: int
) -> None:
    rng = np.random.default_rng(n * 1000 + k + 2)
    packed, w_deq = _weights(rng, n, k, type_name, source)
    check_matches_reference(_packed_kernel, type_name, packed, w_deq, path, rng)


@pytest.mark.parametrize("path", PACKED_PATHS)
@pytest.mark.parametrize("type_name", list(TYPES))
def test_packed_rows_are_bit_identical_whatever_the_batch(path: str, type_name: str) -> None:
    """Isolation on the packed layout: 4-row tiles, single rows over 2 groups and the lone
    last group, and row chunks of 32 all give a row the same bits, for 1 to 9 rows and 67."""
    rng = np.random.default_rng(13)
    n, k = 56, 768  # 7 groups: single rows take 3 pairs of groups and one lone group
    packed, _ = _weights(rng, n, k, type_name, "quantized")
    x = rng.standard_normal((67, k), dtype=np.float32)
    batched = _packed_kernel(type_name, packed, n, k, x, path)
    for rows in range(1, 10):
        assert np.array_equal(
            _packed_kernel(type_name, packed, n, k, x[:rows], path), batched[:rows]
        ), rows
    for r in (4, 31, 32, 66):
        assert np.array_equal(
            _packed_kernel(type_name, packed, n, k, x[r : r + 1], path)[0], batched[r]
        ), r


@pytest.mark.parametrize("path", PACKED_PATHS)
@pytest.mark.parametrize("type_name", list(TYPES))
def test_prefill_rows_across_row_chunks_equal_decode_rows(path: str, type_name: str) -> None:
    """A prefill (many rows) and decode (one row at a time) give every row the same bits, past
    the first row chunk too. On the AVX2 path the two run different kernels (prefill over
    weights expanded once per chunk of up to 128 rows, decode over the packed tile), so this is
    what keeps a prompt's last logits equal to those of the same tokens decoded one by one."""
    rng = np.random.default_rng(17)
    n, k = 40, 512  # 5 groups; rows go in chunks of 128 at k = 512 (packed_row_chunk): 2 chunks
    packed, _ = _weights(rng, n, k, type_name, "random_bytes")
    x = rng.standard_normal((131, k), dtype=np.float32)
    batched = _packed_kernel(type_name, packed, n, k, x, path)
    for r in (0, 3, 4, 126, 127, 128, 130):
        alone = _packed_kernel(type_name, packed, n, k, x[r : r + 1], path)[0]
        assert np.array_equal(alone, batched[r]), r


# ------------------------------------------------------------------ SIMD paths against scalar
#
# Q4_K, Q5_K and Q6_K quantize activations per 256 (one int8 scale per super-block, llama.cpp's
# Q8_K) on every path, bit-identically, so a SIMD path and the scalar path see
# the same integers and may differ only in the order float partial sums are added: far inside
# the activation-rounding tolerance above, and what keeps the paths' logprobs as close as
# test_simd_spread asks.

SIMD_PATHS = [p for p in PATHS if p != "scalar"]


def _float_order_bound(x: np.ndarray, w_deq: np.ndarray) -> np.ndarray:
    """Float re-association of the same integer block dots: a few ulps of sum |x||w|."""
    return (np.abs(x).astype(np.float64) @ np.abs(w_deq).T) * 2e-6 + 1e-6


@pytest.mark.skipif(not SIMD_PATHS, reason="no SIMD kernel path runs on this CPU")
@pytest.mark.parametrize("path", SIMD_PATHS)
@pytest.mark.parametrize("type_name", list(TYPES))
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("n,k", [(8, 256), (40, 1280), (24, 2304)])
def test_simd_paths_match_the_scalar_path_to_float_rounding(
    path: str, type_name: str, packed: bool, n: int, k: int
) -> None:
    if packed and path not in PACKED_PATHS:
        pytest.skip(f"{path} has no packed kernels")
    rng = np.random.default_rng(n + k)
    weights, w_deq = _weights(rng, n, k, type_name, "quantized")
    # Rows of very different magnitudes within a super-block: a per-32 quantizer on one path
    # and a per-256 one on the other would differ by far more than the bound.
    x = rng.standard_normal((13, k), dtype=np.float32)
    x[:, ::7] *= 30.0
    scalar = engine.kernel_gemm(type_name, weights, n, k, x, "scalar")
    got = engine.kernel_gemm(type_name, weights, n, k, x, path, packed=packed)
    excess = np.abs(got.astype(np.float64) - scalar) - _float_order_bound(x, w_deq)
    assert (excess <= 0).all(), f"{path} {type_name} packed={packed}: max excess {excess.max()}"


# ------------------------------------------------------------------ prefill-sized products
#
# From 48 rows on, the AVX-512 path runs register-blocked kernels (kquant_zmm_blocked.h): 32
# columns per block of weights expanded per call, tiles of 4 rows, row chunks of 192 (fewer
# where k is large: 64 at 8192). These shapes leave every kind of remainder: a lone group (n =
# 8, 40), three groups in the last block (24, 56), tiles of 1 to 3 rows, a second chunk (200
# rows; 67 at k = 8192, whose second chunk is 3 rows), and k from one super-block to ffn_down's
# 8192 (slabs of 4 super-blocks and a partial one).
PREFILL_SHAPES = [(49, 8, 256), (53, 24, 2304), (67, 40, 8192), (200, 56, 1536)]


@pytest.mark.parametrize("path", PACKED_PATHS)
@pytest.mark.parametrize("type_name", list(TYPES))
@pytest.mark.parametrize("rows,n,k", PREFILL_SHAPES)
def test_prefill_rows_are_the_bits_of_one_row_decode(
    path: str, type_name: str, rows: int, n: int, k: int
) -> None:
    """A prompt's row must come out of a prefill-sized product with exactly the bits a lone
    decode step gives it (so a cached prefix and a recomputed one agree), and both must match
    the scalar path to float rounding and the float64 reference to activation rounding."""
    rng = np.random.default_rng(rows * 7 + n + k)
    packed, w_deq = _weights(rng, n, k, type_name, "random_bytes")
    x = rng.standard_normal((rows, k), dtype=np.float32)
    x[:, ::5] *= 20.0
    batched = _packed_kernel(type_name, packed, n, k, x, path)
    for r in range(rows):
        alone = _packed_kernel(type_name, packed, n, k, x[r : r + 1], path)[0]
        assert np.array_equal(alone, batched[r]), f"{path} {type_name} row {r}"
    scalar = engine.kernel_gemm(type_name, packed, n, k, x, "scalar")
    excess = np.abs(batched.astype(np.float64) - scalar) - _float_order_bound(x, w_deq)
    assert (excess <= 0).all(), f"{path} {type_name}: max excess over scalar {excess.max()}"
    err = np.abs(batched - x.astype(np.float64) @ w_deq.T)
    tol = activation_rounding_tolerance(x, w_deq, activation_block(type_name))
    assert (err <= tol).all(), f"{path} {type_name}: max excess {(err - tol).max()}"


@pytest.mark.parametrize("path", PACKED_PATHS)
@pytest.mark.parametrize("q", [0, 63])
def test_q6_k_prefill_at_the_int16_bounds(path: str, q: int) -> None:
    """The AVX2 Q6_K prefill kernel sums pairs of vpmaddubsw steps in int16 (saturating adds):
    every quant at an extreme (q - 32 = -32 or 31) against activations that all round to +-127
    puts each lane at its bound (4 * 255 * 32 = 32640). A sum off by one bound would saturate
    and show as a large error; exact sums give the scalar path's result to float rounding and
    the one-row (decode) kernel's bits. Scales at -128 and 127 reach the scale products' ends."""
    n, k = 16, 512
    blocks = np.zeros((n * k // QK, BLOCK_BYTES["Q6_K"]), np.uint8)
    # ql (128 bytes), then qh (64): q = 63 sets every 4 low and every 2 high bits.
    blocks[:, :192] = 0xFF if q == 63 else 0
    blocks[:, 192:208] = np.tile(np.array([127, -128], np.int8).view(np.uint8), 8)
    blocks[:, 208:210] = f16(np.full((blocks.shape[0], 1), 1e-3)).view(np.uint8)
    packed = np.ascontiguousarray(blocks.reshape(n, -1))
    w_deq = dequantize(packed, TYPES["Q6_K"]).astype(np.float64)
    assert np.abs(w_deq).max() == pytest.approx(1e-3 * 128 * abs(q - 32), rel=1e-3)
    rng = np.random.default_rng(q)
    x = np.ones((7, k), np.float32)
    x[1] = -1.0  # every activation -127: u = a + 128 = 1
    x[2:] = np.where(rng.random((5, k)) < 0.5, -1.0, 1.0)
    batched = _packed_kernel("Q6_K", packed, n, k, x, path)
    for r in range(len(x)):
        assert np.array_equal(
            _packed_kernel("Q6_K", packed, n, k, x[r : r + 1], path)[0], batched[r]
        ), r
    scalar = engine.kernel_gemm("Q6_K", packed, n, k, x, "scalar")
    excess = np.abs(batched.astype(np.float64) - scalar) - _float_order_bound(x, w_deq)
    assert (excess <= 0).all(), f"{path}: max excess over scalar {excess.max()}"
    # +-1 activations quantize exactly (d = 1 / 127, q = +-127): the float64 product itself.
    np.testing.assert_allclose(batched, x.astype(np.float64) @ w_deq.T, rtol=1e-5, atol=1e-3)
