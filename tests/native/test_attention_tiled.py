"""The tiled (flash-style) attention kernel on long ranges, against a float64 reference.

A tile holds up to 64 queries (rows of one sequence x the heads of one KV group in the
engine) and sweeps the keys and values in 64-position KV tiles aligned to absolute positions,
with an online softmax. These checks build KV in the pool's block layout through the write
path's conversion and run every attention variant this CPU runs: many KV tiles, tails that are
not a multiple of the tile, sliding windows (first_pos > 0) inside and across tiles, GQA-style
queries sharing their range, running maxima that grow late (the accumulator is rescaled) or
early, the head dims the architectures use (64 Llama/SmolLM2, 128 Qwen, 256 Gemma, 512 Gemma
4's global layers). And the isolation property at kernel level: a query gives the same bits
alone, in a tile of 4 and in a full tile, whatever queries share it.
"""

from __future__ import annotations

import numpy as np
import pytest

from .kernel_checks import attention_reference

native = pytest.importorskip("llmd._engine")
PATHS = native.runnable_kernel_paths()
MAX_TILE = 64


def _queries(n: int, chunk: int, group: int, window: int):  # type: ignore[no-untyped-def]
    """A prefill chunk of the last `chunk` positions of an n-position context, `group` heads
    per position (they share n_pos and first_pos), causal, optionally windowed."""
    n_pos, first_pos = [], []
    for p in range(n - chunk, n):
        for _ in range(group):
            n_pos.append(p + 1)
            first_pos.append(max(0, p + 1 - window) if window else 0)
    return n_pos, first_pos


def _kv(rng: np.random.Generator, n: int, head_dim: int, q: np.ndarray, trend: float):  # type: ignore[no-untyped-def]
    k = rng.standard_normal((n, head_dim)).astype(np.float32)
    # A component along the mean query that grows (trend > 0) or shrinks with the position:
    # the running max then rises tile after tile (every tile rescales the accumulator) or is
    # set by the first tile.
    direction = q.mean(axis=0) / np.linalg.norm(q.mean(axis=0))
    k += (trend * np.linspace(0.0, 1.0, n)[:, None] * direction[None, :]).astype(np.float32)
    v = (rng.standard_normal((n, head_dim)) * 3).astype(np.float32)
    return k, v


CASES = [
    # n, chunk, group, window, head_dim, trend
    (1000, 24, 3, 0, 64, 6.0),  # SmolLM2 shape: 3 heads per KV head; 16 KV tiles, tail of 40
    (777, 16, 4, 0, 64, -6.0),  # Llama-3.2-1B: 4 heads per KV head; the max set early
    (1300, 40, 1, 0, 128, 4.0),  # a tile of rows of one head (tiles of 64: one full, one part)
    (700, 8, 8, 300, 128, 0.0),  # Qwen-like group of 8 with a sliding window across tiles
    (1030, 12, 2, 512, 256, 3.0),  # Gemma: head_dim 256, window of 512 positions
    (90, 90, 1, 70, 64, 0.0),  # a whole short prompt, window inside the second tile
    (200, 6, 2, 0, 512, 2.0),  # Gemma 4's global layers: head_dim 512
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kv_type", ["f16", "f32"])
@pytest.mark.parametrize("n,chunk,group,window,head_dim,trend", CASES)
def test_tiled_attention_matches_float64attention_reference(
    path: str,
    kv_type: str,
    n: int,
    chunk: int,
    group: int,
    window: int,
    head_dim: int,
    trend: float,
) -> None:
    rng = np.random.default_rng(n * 7 + head_dim)
    n_pos, first_pos = _queries(n, chunk, group, window)
    rows = len(n_pos)
    q = (rng.standard_normal((rows, head_dim)) / np.sqrt(head_dim) * 2).astype(np.float32)
    k, v = _kv(rng, n, head_dim, q, trend)
    out = native.kernel_attention(q, k, v, n_pos, first_pos, kv_type, path, MAX_TILE)
    # Against the KV the kernel holds (rounded to float16 for f16), in float64: only float32
    # accumulation over up to ~1,300 positions and the polynomial exp differ (seen: 7e-7 of the
    # largest value).
    held = (k.astype(np.float16), v.astype(np.float16)) if kv_type == "f16" else (k, v)
    expected = attention_reference(q, *held, n_pos, first_pos)
    vmax = np.abs(v).max()
    assert np.abs(out - expected).max() <= 4e-6 * vmax, (path, kv_type)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kv_type", ["f16", "f32", "q8_0", "q4_0"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_query_gives_the_same_bits_alone_and_in_any_tile(
    path: str, kv_type: str, head_dim: int
) -> None:
    """No bleed at kernel level: a query's result depends on its own range only, not on the
    queries it shares a tile with (decode: one row's heads; prefill: up to 64 queries of one
    sequence; a prompt split into chunks differently puts a query with other neighbours).
    Tiles of up to 4 queries read float16 and quantized KV in registers, larger ones from a
    float32 copy of each KV tile: both must give the same bits."""
    rng = np.random.default_rng(head_dim)
    n = 600
    # Ranges of every kind side by side: long, short, windowed, single position, block edges.
    n_pos = list(rng.integers(1, n + 1, size=150)) + [1, 64, 65, 128, n, n - 1]
    first_pos = [int(rng.integers(0, p)) if i % 3 == 0 else 0 for i, p in enumerate(n_pos)]
    n_pos = [int(p) for p in n_pos]
    rows = len(n_pos)
    q = (rng.standard_normal((rows, head_dim)) / np.sqrt(head_dim) * 3).astype(np.float32)
    k, v = _kv(rng, n, head_dim, q, 5.0)
    alone = native.kernel_attention(q, k, v, n_pos, first_pos, kv_type, path, 1)
    for tile_rows in (2, 4, 5, 17, MAX_TILE):
        tiled = native.kernel_attention(q, k, v, n_pos, first_pos, kv_type, path, tile_rows)
        assert np.array_equal(tiled, alone), (path, tile_rows)
    # The same queries in another order meet other neighbours in their tiles.
    order = rng.permutation(rows)
    shuffled = native.kernel_attention(
        np.ascontiguousarray(q[order]),
        k,
        v,
        [n_pos[i] for i in order],
        [first_pos[i] for i in order],
        kv_type,
        path,
        MAX_TILE,
    )
    assert np.array_equal(shuffled, alone[order]), path


def test_tiles_hold_up_to_64_queries() -> None:
    q = np.zeros((65, 64), np.float32)
    kv = np.zeros((8, 64), np.float32)
    with pytest.raises(ValueError, match="1..64"):
        native.kernel_attention(q, kv, kv, [8] * 65, [0] * 65, "f16", "", 65)


X86_SIMD = [p for p in PATHS if p in ("avx2", "avx512vnni")]


@pytest.mark.skipif(len(X86_SIMD) < 2, reason="needs both the AVX2 and the AVX-512 variant")
@pytest.mark.parametrize("kv_type", ["f16", "f32", "q8_0", "q4_0"])
def test_avx2_and_avx512_variants_give_the_same_bits(kv_type: str) -> None:
    """The AVX-512 variant sweeps 16 lanes, the AVX2 one 8: each lane's arithmetic and the
    softmax sums' order are the same, so a machine's choice of variant never changes a token
    (decode-sized tiles read the KV in registers, prefill-sized ones from a float32 copy)."""
    rng = np.random.default_rng(11)
    n, head_dim = 700, 64
    q = (rng.standard_normal((96, head_dim)) / 4).astype(np.float32)
    k, v = _kv(rng, n, head_dim, q, 4.0)
    n_pos = [int(p) for p in rng.integers(1, n + 1, size=96)]
    first_pos = [int(rng.integers(0, p)) if i % 3 == 0 else 0 for i, p in enumerate(n_pos)]
    for tile_rows in (4, MAX_TILE):
        outs = [
            native.kernel_attention(q, k, v, n_pos, first_pos, kv_type, path, tile_rows)
            for path in X86_SIMD
        ]
        assert np.array_equal(outs[0], outs[1]), (kv_type, tile_rows)


SPAN = 512  # kKvSpan (attention_kernels.h)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kv_type", ["f16", "f32", "q8_0", "q4_0"])
def test_span_tasks_give_the_bits_of_one_sweep(path: str, kv_type: str) -> None:
    """A decode of a few sequences splits each long tile into one task per 512-position span
    (so all threads work when the tiles are fewer than the threads) and folds the spans' results
    afterwards. A greedy user must get the same tokens either way, so the split must give the
    bits of one sweep: for decode-sized tiles (a row's heads, KV read in registers) and
    prefill-sized ones (float32 copies of KV tiles), ranges inside one span, across span edges
    and windowed so that they start mid-span; and it must still be attention."""
    rng = np.random.default_rng(5)
    n, head_dim = 1700, 64
    n_pos = [1700, 1699, 1536, 1025, 513, 512, 300, 1] + [
        int(p) for p in rng.integers(1, n + 1, size=40)
    ]
    first_pos = [0, 900, 0, 512, 511, 0, 10, 0] + [
        int(rng.integers(0, p)) if i % 2 else 0 for i, p in enumerate(n_pos[8:])
    ]
    rows = len(n_pos)
    q = (rng.standard_normal((rows, head_dim)) / np.sqrt(head_dim) * 3).astype(np.float32)
    k, v = _kv(rng, n, head_dim, q, 6.0)
    rotate = kv_type in ("q8_0", "q4_0")
    for tile_rows in (3, MAX_TILE):
        sweep = native.kernel_attention(q, k, v, n_pos, first_pos, kv_type, path, tile_rows, rotate)
        split = native.kernel_attention(
            q, k, v, n_pos, first_pos, kv_type, path, tile_rows, rotate, True
        )
        assert np.array_equal(split, sweep), (path, kv_type, tile_rows)
    if kv_type in ("f16", "f32"):
        held = (k.astype(np.float16), v.astype(np.float16)) if kv_type == "f16" else (k, v)
        expected = attention_reference(q, *held, n_pos, first_pos)
        assert np.abs(split - expected).max() <= 4e-6 * np.abs(v).max(), path
