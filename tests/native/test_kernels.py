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
from gguf.quants import dequantize

from .kernel_checks import check_matches_reference, check_rows_batch_invariant, kernel_weights

engine = pytest.importorskip("llmd._engine")

TYPES = {
    "Q4_0": GGMLQuantizationType.Q4_0,
    "Q4_1": GGMLQuantizationType.Q4_1,
    "Q8_0": GGMLQuantizationType.Q8_0,
    "IQ4_NL": GGMLQuantizationType.IQ4_NL,
    "Q5_0": GGMLQuantizationType.Q5_0,
    "Q5_1": GGMLQuantizationType.Q5_1,
}
PATHS = engine.runnable_kernel_paths()


def _weights(rng: np.random.Generator, n: int, k: int, qtype: GGMLQuantizationType):
    packed = kernel_weights(rng, n, k, qtype)
    return packed, dequantize(packed, qtype).astype(np.float64)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("type_name", list(TYPES))
@pytest.mark.parametrize("n,k", [(1, 32), (7, 96), (33, 576), (130, 1536)])
def test_kernel_matches_gguf_dequantize_reference(
    path: str, type_name: str, n: int, k: int
) -> None:
    rng = np.random.default_rng(n * 1000 + k)
    packed, w_deq = _weights(rng, n, k, TYPES[type_name])
    check_matches_reference(engine.kernel_gemm, type_name, packed, w_deq, path, rng)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("type_name", list(TYPES))
def test_each_row_is_bit_identical_whatever_the_batch(path: str, type_name: str) -> None:
    """Isolation: a row's output must not depend on the rows batched with it."""
    rng = np.random.default_rng(7)
    n, k = 45, 576
    packed, _ = _weights(rng, n, k, TYPES[type_name])
    check_rows_batch_invariant(engine.kernel_gemm, type_name, packed, n, k, path, rng)


# Q4_K / Q5_K / Q6_K have packed kernels too; test_kquant_kernels.py checks those.
PACKED = [(p, t) for p in PATHS for t in engine.packed_kernel_types(p) if t in TYPES]


def _packed_kernel(type_name, weights, n, k, x, path):  # type: ignore[no-untyped-def]
    """The kernel of the 8-row packed layout, on weights packed as the engine packs them."""
    return engine.kernel_gemm(type_name, weights, n, k, x, path, packed=True)


@pytest.mark.parametrize("path,type_name", PACKED)
@pytest.mark.parametrize("n,k", [(8, 32), (24, 96), (40, 576), (136, 1536)])
def test_packed_kernel_matches_gguf_dequantize_reference(
    path: str, type_name: str, n: int, k: int
) -> None:
    rng = np.random.default_rng(n * 1000 + k + 1)
    packed, w_deq = _weights(rng, n, k, TYPES[type_name])
    check_matches_reference(_packed_kernel, type_name, packed, w_deq, path, rng)


@pytest.mark.parametrize("path,type_name", PACKED)
def test_packed_rows_are_bit_identical_whatever_the_batch(path: str, type_name: str) -> None:
    """Isolation on the packed layout: 4-row tiles, 2-group single rows and the 1-group
    tail all give a row the same bits."""
    rng = np.random.default_rng(11)
    n, k = 56, 576  # 7 groups: single rows take 3 pairs of groups and one lone group
    packed, _ = _weights(rng, n, k, TYPES[type_name])
    check_rows_batch_invariant(_packed_kernel, type_name, packed, n, k, path, rng)


@pytest.mark.parametrize("path", sorted({p for p, _ in PACKED}))
@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0", "IQ4_NL", "Q5_0", "Q5_1"])
@pytest.mark.parametrize("k", [576, 608])
def test_pack8_moves_bytes_and_every_row_unpacks_exactly(path: str, type_name: str, k: int) -> None:
    """The AVX-512 path pairs blocks in its Q4_0 / IQ4_NL / Q8_0 tile (Q8_0's quants stored
    offset by 128) where a row has an even number of blocks (k = 576) and keeps the 4-byte tile
    where it has not (k = 608); either way packing is a byte-exact bijection, as a tied
    embedding that reads rows back through it needs."""
    rng = np.random.default_rng(k)
    n = 24
    row_bytes = k // 32 * {"Q8_0": 34, "Q5_0": 22, "Q5_1": 24}.get(type_name, 18)
    rows = rng.integers(0, 256, (n, row_bytes), dtype=np.uint8)
    packed = engine.pack8(type_name, rows, n, k, path)
    assert not np.array_equal(packed, rows.reshape(-1))
    for r in range(n):
        assert np.array_equal(engine.unpack8_row(type_name, packed, n, k, r, path), rows[r]), r


def test_packed_kernels_exist_on_x86_paths() -> None:
    """The AVX2 and AVX-512 paths run Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K / Q6_K / IQ4_NL in the
    packed layout; the others (scalar, NEON) keep GGUF's row-major one and say so."""
    for path in PATHS:
        x86 = path in ("avx2", "avx512vnni")
        expected = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "Q5_0", "Q5_1"]
        expected = expected if x86 else []
        assert engine.packed_kernel_types(path) == expected
    with pytest.raises(ValueError, match="n = 12"):
        engine.kernel_gemm(
            "Q4_1",
            np.zeros(12 * 20, np.uint8),
            12,
            32,
            np.zeros((1, 32), np.float32),
            "scalar",
            packed=True,
        )


def test_the_best_path_this_cpu_runs_is_active() -> None:
    assert engine.active_kernel_path() == PATHS[0]
    assert "scalar" in PATHS
