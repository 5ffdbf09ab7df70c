"""llmd's float GEMM (native/mlx/float_gemm.h: encoders' and vision towers' float weights on
the host backend) against numpy in float64, on shapes that leave partial 16-column panels, an
odd panel count (the AVX-512 kernel's 2-panel tile) and partial 12-row tiles, with each fused
epilogue (bias, GELU-tanh, residual) and with the weight kept in float16 panels where this CPU
runs them (AVX-512). Rows are computed the same whatever batch they are in: a row alone gives
the bits it gives among others.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

engine = pytest.importorskip("llmd._engine")

HALF = [False, True] if engine.float16_panels_supported() else [False]


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("half", HALF)
@pytest.mark.parametrize(("rows", "n", "k"), [(1, 1, 1), (13, 40, 24), (25, 50, 72), (37, 16, 100)])
@pytest.mark.parametrize(
    "epilogue", ["none", "bias", "bias_gelu", "bias_residual", "gelu_residual"]
)
def test_float_gemm_matches_numpy(half: bool, rows: int, n: int, k: int, epilogue: str) -> None:
    rng = np.random.default_rng(rows * 10_000 + n * 100 + k)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 0.2).astype(np.float32)
    if half:  # an F16 tensor's values: the float16 panels hold them exactly
        w = w.astype(np.float16).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if "bias" in epilogue else None
    residual = rng.standard_normal((rows, n)).astype(np.float32) if "residual" in epilogue else None
    gelu = "gelu" in epilogue
    got = engine.float_gemm(x, w, half=half, bias=bias, gelu_tanh=gelu, residual=residual)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    if bias is not None:
        want = want + bias
    if gelu:
        want = _gelu_tanh(want)
    if residual is not None:
        want = want + residual
    assert got.shape == (rows, n)
    # float32 accumulation over k terms of size ~|x||w|: a few ulps of the sum of magnitudes
    scale = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T + 1.0
    assert np.all(np.abs(got - want) <= 1e-5 * scale), np.abs(got - want).max()


@pytest.mark.parametrize("half", HALF)
def test_a_row_is_the_same_alone_or_among_others(half: bool) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((29, 72)).astype(np.float32)
    w = rng.standard_normal((50, 72)).astype(np.float16).astype(np.float32)
    bias = rng.standard_normal(50).astype(np.float32)
    together = engine.float_gemm(x, w, half=half, bias=bias, gelu_tanh=True)
    for r in (0, 11, 12, 28):
        alone = engine.float_gemm(x[r : r + 1], w, half=half, bias=bias, gelu_tanh=True)
        assert np.array_equal(alone[0], together[r]), r
