"""llmd's quantized matmul kernels against a reference built from the `gguf` package.

The reference dequantizes the weights with `gguf.quants.dequantize` (not our code) and
multiplies in float64. The kernels quantize activations to int8 per 32-wide block, so the
stated tolerance is the worst case of that rounding: sum_i |w_i| * (blockmax|x| / 254), plus a
small float-accumulation term.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

engine = pytest.importorskip("llmd._engine")

TYPES = {
    "Q4_0": GGMLQuantizationType.Q4_0,
    "Q4_1": GGMLQuantizationType.Q4_1,
    "Q8_0": GGMLQuantizationType.Q8_0,
}
PATHS = engine.runnable_kernel_paths()


def _weights(rng: np.random.Generator, n: int, k: int, qtype: GGMLQuantizationType):
    w = rng.standard_normal((n, k), dtype=np.float32) * 0.05
    packed = quantize(w, qtype)
    return np.ascontiguousarray(packed), dequantize(packed, qtype).astype(np.float64)


def _tolerance(x: np.ndarray, w_deq: np.ndarray) -> np.ndarray:
    rows, k = x.shape
    blockmax = np.abs(x.reshape(rows, k // 32, 32)).max(axis=2)  # [rows, k/32]
    step = np.repeat(blockmax / 254.0, 32, axis=1)  # max rounding error per element
    bound = step @ np.abs(w_deq).T  # [rows, n]
    scale = np.abs(x) @ np.abs(w_deq).T
    return bound * 1.001 + scale * 1e-5 + 1e-6


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("type_name", list(TYPES))
@pytest.mark.parametrize("n,k", [(1, 32), (7, 96), (33, 576), (130, 1536)])
def test_kernel_matches_gguf_dequantize_reference(
    path: str, type_name: str, n: int, k: int
) -> None:
    rng = np.random.default_rng(n * 1000 + k)
    packed, w_deq = _weights(rng, n, k, TYPES[type_name])
    for rows in (1, 2, 5, 67):
        x = rng.standard_normal((rows, k), dtype=np.float32)
        out = engine.kernel_gemm(type_name, packed, n, k, x, path)
        ref = x.astype(np.float64) @ w_deq.T
        err = np.abs(out - ref)
        tol = _tolerance(x, w_deq)
        assert (err <= tol).all(), f"{path} {type_name} rows={rows}: max excess {(err - tol).max()}"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("type_name", list(TYPES))
def test_each_row_is_bit_identical_whatever_the_batch(path: str, type_name: str) -> None:
    """Isolation: a row's output must not depend on the rows batched with it."""
    rng = np.random.default_rng(7)
    n, k = 45, 576
    packed, _ = _weights(rng, n, k, TYPES[type_name])
    x = rng.standard_normal((67, k), dtype=np.float32)
    batched = engine.kernel_gemm(type_name, packed, n, k, x, path)
    for r in (0, 3, 4, 31, 32, 66):
        alone = engine.kernel_gemm(type_name, packed, n, k, x[r : r + 1], path)
        assert np.array_equal(alone[0], batched[r])


def test_the_best_path_this_cpu_runs_is_active() -> None:
    assert engine.active_kernel_path() == PATHS[0]
    assert "scalar" in PATHS
