"""Lossless pull-time re-encodings (block_repack.py), judged by gguf-py: the dequantized
values of the source blocks and of their re-encoding must be the same floats.

Blocks are random bytes with sane fp16 scales (gguf_files.random_blocks; gguf-py cannot
quantize to most of these types), so every code and scale value occurs."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from llmd.store.block_repack import REPACKS
from llmd.store.model_support import CONVERSION_TARGET

from . import gguf_files

RNG = np.random.default_rng(11)


def random_blocks(qtype: T, rows: int, cols: int, scale: float) -> np.ndarray:
    return gguf_files.random_blocks(RNG, qtype, rows, cols, scale)


def test_iq3_xxs_becomes_q6_k_keeping_every_weight() -> None:
    source, target = T.IQ3_XXS, CONVERSION_TARGET[T.IQ3_XXS]
    assert target == T.Q6_K
    rows = random_blocks(source, 64, 1024, 1e-3)
    out = REPACKS[(source, target)](rows)
    assert out.shape == (64, 1024 // GGML_QUANT_SIZES[target][0] * GGML_QUANT_SIZES[target][1])
    want, got = dequantize(rows, source), dequantize(out, target)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # bit for bit
    assert np.abs(want).max() > 0


def test_iq4_xs_becomes_iq4_nl_moving_weights_only_by_its_scale_rounding() -> None:
    assert CONVERSION_TARGET[T.IQ4_XS] == T.IQ4_NL  # 4.5 bits per weight, as IQ4_XS's 4.25
    rows = random_blocks(T.IQ4_XS, 64, 1024, 1e-4)
    want = dequantize(rows, T.IQ4_XS)
    out = REPACKS[(T.IQ4_XS, T.IQ4_NL)](rows)
    assert out.shape == (64, 1024 // 32 * 18)
    got = dequantize(out, T.IQ4_NL)
    # Per 32 weights: got = fp16(scale) * level, want = scale * level, the same level.
    block_max = np.abs(want).reshape(-1, 32).max(axis=1, keepdims=True)
    rel = (np.abs(got - want).reshape(-1, 32) / np.maximum(block_max, 1e-30)).max()
    assert rel <= 2.0**-11
    assert np.mean(got == want) > 0.1  # scales that fit fp16 come through exactly
    assert np.array_equal(np.sign(got), np.sign(want))  # every code kept
    # Re-quantizing to Q8_0 (the general path) rounds the scale as well, and the codes too
    # wherever a block lacks the -127 level: 3.5x the mean error of the re-encoding, measured.
    requantized = dequantize(quantize(want, T.Q8_0), T.Q8_0)
    assert np.abs(got - want).mean() < np.abs(requantized - want).mean() / 2


def test_iq3_s_becomes_q4_k_keeping_every_code() -> None:
    """IQ3_S's d * (1 + 2s) * v (v a signed odd grid value) as Q4_K's 2d * (1 + 2s) * q -
    fp16(15d) * (1 + 2s): only the min term's scale is rounded, by at most 2^-11 of it."""
    assert CONVERSION_TARGET[T.IQ3_S] == T.Q4_K  # 4.5 bits per weight, not Q8_0's 8.5
    rows = random_blocks(T.IQ3_S, 32, 1024, 1e-3)
    want = dequantize(rows, T.IQ3_S).reshape(-1, 8, 32)
    out = REPACKS[(T.IQ3_S, T.Q4_K)](rows)
    assert out.shape == (32, 1024 // 256 * 144)
    got = dequantize(out, T.Q4_K).reshape(-1, 8, 32)
    blocks = rows.reshape(-1, 110)
    d = np.abs(blocks[:, :2].copy().view(np.float16).astype(np.float64))
    s = np.stack([blocks[:, 106:110] & 15, blocks[:, 106:110] >> 4], axis=2).reshape(-1, 8)
    min_term = 15 * d * (1 + 2 * s)  # per sub-block of 32
    assert (np.abs(got - want).max(axis=2) <= min_term * 2.0**-11 * 1.01).all()
    # Every code kept: each weight is still nearest its own grid value (steps of 2 d (1 + 2s)).
    step = (d * (1 + 2 * s))[:, :, None]
    assert np.array_equal(np.rint(got / step), np.rint(want / step))
    assert len(np.unique(np.rint(want / step))) == 16  # every signed odd value -15 .. 15 occurred
    # The general path's Q8_0 re-quantization moves weights far more.
    requantized = dequantize(quantize(want.reshape(32, -1), T.Q8_0), T.Q8_0).reshape(want.shape)
    assert np.abs(got - want).mean() < np.abs(requantized - want).mean() / 10


def test_iq2_xxs_becomes_q8_0_keeping_every_code() -> None:
    """IQ2_XXS's signed grid values (8, 25, 43) become Q8_0's codes under the 32 weights' scale
    rounded to fp16: each weight moves by at most 2^-11 of itself, where re-quantizing moves the
    8s by up to 1.6 %."""
    assert CONVERSION_TARGET[T.IQ2_XXS] == T.Q8_0
    rows = random_blocks(T.IQ2_XXS, 32, 1024, 1e-3)
    want = dequantize(rows, T.IQ2_XXS)
    got = dequantize(REPACKS[(T.IQ2_XXS, T.Q8_0)](rows), T.Q8_0)
    np.testing.assert_allclose(got, want, rtol=2.0**-11, atol=0)
    requantized = dequantize(quantize(want, T.Q8_0), T.Q8_0)
    assert np.abs(got - want).mean() < np.abs(requantized - want).mean() / 10


def test_repacks_work_on_any_number_of_rows_and_blocks() -> None:
    for (source, target), repack in REPACKS.items():
        block = GGML_QUANT_SIZES[source][0]
        for rows, cols in ((1, block), (3, 2 * block)):
            raw = random_blocks(source, rows, cols, 1e-3)
            out = repack(raw)
            assert out.dtype == np.uint8 and out.shape[0] == rows
            want = dequantize(raw, source)
            # A scale rounded to fp16 moves a weight by at most 2^-11 of the largest its block
            # holds (each repack's own test states its exact bound).
            tol = 2.0**-11 * np.abs(want).max()
            np.testing.assert_allclose(dequantize(out, target), want, rtol=0, atol=tol)
