"""Shared checks for llmd's quantized matmul kernels (test_kernels, test_kquant_kernels,
test_arm64_cross).

The kernels quantize activations to int8 per 32-wide block (the K-quants: per 256, one scale
for a whole super-block, as llama.cpp's Q8_K), so the stated tolerance against a float64
reference is the worst case of that rounding, sum_i |w_i| * (blockmax|x| / 254), plus a small
float-accumulation term.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from ..unit.gguf_files import random_blocks

# kernel(type_name, packed, n, k, x, path) -> out [rows, n]
Kernel = Callable[[str, np.ndarray, int, int, np.ndarray, str], np.ndarray]


# Weight types whose kernels take activations quantized per 256 (kernels/qgemm.h).
SUPERBLOCK_ACTIVATIONS = frozenset({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"})


def kernel_weights(
    rng: np.random.Generator, n: int, k: int, qtype: GGMLQuantizationType
) -> np.ndarray:
    """n x k weights of `qtype` for a kernel test, near a normal of standard deviation 0.05:
    gguf-py's quantizer of random normals where it has one; random codes under random fp16
    scales for IQ4_NL (gguf-py cannot quantize it; every code then occurs)."""
    if qtype == GGMLQuantizationType.IQ4_NL:
        return np.ascontiguousarray(random_blocks(rng, qtype, n, k, 0.05 / 64))
    w = rng.standard_normal((n, k), dtype=np.float32) * 0.05
    return np.ascontiguousarray(quantize(w, qtype))


def activation_block(type_name: str) -> int:
    """How many activations share one int8 scale in the kernels of `type_name`."""
    return 256 if type_name in SUPERBLOCK_ACTIVATIONS else 32


def activation_rounding_tolerance(x: np.ndarray, w_deq: np.ndarray, block: int = 32) -> np.ndarray:
    rows, k = x.shape
    blockmax = np.abs(x.reshape(rows, k // block, block)).max(axis=2)  # [rows, k/block]
    step = np.repeat(blockmax / 254.0, block, axis=1)  # max rounding error per element
    bound = step @ np.abs(w_deq).T  # [rows, n]
    scale = np.abs(x) @ np.abs(w_deq).T
    return bound * 1.001 + scale * 1e-5 + 1e-6


def check_matches_reference(
    kernel: Kernel,
    type_name: str,
    packed: np.ndarray,
    w_deq: np.ndarray,
    path: str,
    rng: np.random.Generator,
) -> None:
    n, k = w_deq.shape
    for rows in (1, 2, 5, 67):
        x = rng.standard_normal((rows, k), dtype=np.float32)
        out = kernel(type_name, packed, n, k, x, path)
        err = np.abs(out - x.astype(np.float64) @ w_deq.T)
        tol = activation_rounding_tolerance(x, w_deq, activation_block(type_name))
        assert (err <= tol).all(), f"{path} {type_name} rows={rows}: max excess {(err - tol).max()}"


def check_rows_batch_invariant(
    kernel: Kernel,
    type_name: str,
    packed: np.ndarray,
    n: int,
    k: int,
    path: str,
    rng: np.random.Generator,
) -> None:
    """Isolation: a row's output must not depend on the rows batched with it."""
    x = rng.standard_normal((67, k), dtype=np.float32)
    batched = kernel(type_name, packed, n, k, x, path)
    for r in (0, 3, 4, 31, 32, 66):
        alone = kernel(type_name, packed, n, k, x[r : r + 1], path)
        assert np.array_equal(alone[0], batched[r]), f"{path} {type_name} row {r}"
    # Batches of every size a step of up to 9 sequences makes: each is cut into row tiles
    # differently (8, 4 and the rows left over), and no row may notice.
    for m in range(2, 10):
        small = kernel(type_name, packed, n, k, x[:m], path)
        assert np.array_equal(small, batched[:m]), f"{path} {type_name} batch of {m}"


def attention_case(seed: int, n: int, head_dim: int):  # type: ignore[no-untyped-def]
    """Six queries against n random keys/values and the positions each may see: the whole
    context, one position, a block edge, and sliding windows inside and across blocks (the
    cases every KV storage type's attention is checked on)."""
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((6, head_dim)) / np.sqrt(head_dim) * 2).astype(np.float32)
    k = rng.standard_normal((n, head_dim)).astype(np.float32)
    v = (rng.standard_normal((n, head_dim)) * 3).astype(np.float32)
    n_pos = [n, 1, 64, min(n, 65), n, max(2, n - 7)]
    first_pos = [0, 0, 0, 1, max(0, n - 100), max(0, n - 70)]
    return q, k, v, n_pos, first_pos


def attention_reference(q, k, v, n_pos, first_pos) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Row r of softmax(q[r] . k[first_pos[r]:n_pos[r]]) v[...], in float64: what every
    attention kernel (q pre-scaled) is compared with."""
    out = []
    for r in range(q.shape[0]):
        ks = k[first_pos[r] : n_pos[r]].astype(np.float64)
        vs = v[first_pos[r] : n_pos[r]].astype(np.float64)
        s = ks @ q[r].astype(np.float64)
        p = np.exp(s - s.max())
        out.append((p / p.sum()) @ vs)
    return np.array(out)
