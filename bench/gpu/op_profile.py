"""Where a decode step's time goes on the GPU: each op of an 8B-shaped llama step, timed alone
with MLX at batch 1 and 32, with the bandwidth it achieves (bytes it must move / time).

Why MLX timing and not a system profiler: it times exactly the kernels llmd's device backend
calls (MLX's quantized_matmul, scaled_dot_product_attention, rms_norm, ...), at the step's
shapes, without needing Nsight Systems. Each op runs `reps` times inside one graph so launch
overhead is amortized as in a real step; the step itself is timed by gpu_bench.py, and the gap
between the sum of ops and the step is graph building and dispatch.

    python bench/gpu/op_profile.py [--bandwidth GBPS]
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, LAYERS = 4096, 32, 8, 128, 14336, 128256, 32


def timed(fn, reps: int = 50) -> float:
    """Seconds per call of fn() (a function returning an array), `reps` chained in one graph."""
    mx.eval(fn())
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        outs = [fn() for _ in range(reps)]
        mx.eval(outs)
        best = min(best, (time.perf_counter() - t) / reps)
    return best


def qweight(n: int, k: int) -> tuple[mx.array, mx.array, mx.array]:
    w = mx.random.normal((n, k)).astype(mx.float16) * 0.02
    return mx.quantize(w, group_size=32, bits=4)


def profile_batch(
    batch: int, shapes: dict, weights: dict, norm_w: mx.array, context: int, bandwidth: float
) -> None:
    """Prints one row per op at this batch size."""
    rows = []
    for name, (n, k) in shapes.items():
        w, s, b = weights[name]
        x = mx.random.normal((batch, k)).astype(mx.float16)
        sec = timed(lambda w=w, s=s, b=b, x=x: mx.quantized_matmul(x, w, s, b, True, 32, 4))
        moved = w.nbytes + s.nbytes + b.nbytes + x.nbytes + batch * n * 2
        rows.append((f"qmm {name} [{n}x{k}]", sec, 1 if name == "output" else LAYERS, moved))
    L = context
    q = mx.random.normal((batch, HEADS, 1, HEAD_DIM)).astype(mx.float16)
    kv = mx.random.normal((batch, KV_HEADS, L, HEAD_DIM)).astype(mx.float16)
    sec = timed(lambda: mx.fast.scaled_dot_product_attention(q, kv, kv, scale=HEAD_DIM**-0.5))
    rows.append((f"sdpa (kv {L})", sec, LAYERS, 2 * kv.nbytes + 2 * q.nbytes))
    store = mx.zeros((batch * L, KV_HEADS * HEAD_DIM), dtype=mx.float16)
    idx = mx.arange(batch * L).reshape(batch, L)
    sec = timed(lambda: mx.take(store, idx, axis=0))
    rows.append((f"kv gather (kv {L})", sec, 2 * LAYERS, 2 * store.nbytes))
    x32 = mx.random.normal((batch, HIDDEN))
    sec = timed(lambda: mx.fast.rms_norm(x32, norm_w, 1e-5))
    rows.append(("rms_norm f32", sec, 2 * LAYERS + 1, 2 * x32.nbytes))
    sec = timed(lambda: x32.astype(mx.float16))
    rows.append(("cast f32->f16", sec, 8 * LAYERS, x32.nbytes * 3 // 2))
    total = 0.0
    for label, sec, calls, moved in rows:
        gbs = moved / sec / 1e9
        pct = f"{100 * gbs / bandwidth:.0f}%" if bandwidth else "-"
        total += sec * calls
        print(
            f"| {label} | {batch} | {sec * 1e6:.1f} | {calls} | {sec * calls * 1e6:.0f} | {gbs:.0f} | {pct} |"
        )
    print(f"| sum of listed ops | {batch} | | | {total * 1e6:.0f} | | |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bandwidth", type=float, default=0.0, help="GB/s limit for the % column")
    ap.add_argument("--context", type=int, default=512, help="KV length for attention")
    args = ap.parse_args()
    shapes = {
        "attn_qkv": (HIDDEN + 2 * KV_HEADS * HEAD_DIM, HIDDEN),
        "attn_output": (HIDDEN, HIDDEN),
        "ffn_gate_up": (2 * FFN, HIDDEN),
        "ffn_down": (HIDDEN, FFN),
        "output": (VOCAB, HIDDEN),
    }
    weights = {name: qweight(n, k) for name, (n, k) in shapes.items()}
    norm_w = mx.ones((HIDDEN,))
    print("| op | batch | us / call | calls / step | us / step | GB/s | % of limit |")
    print("|---|---|---|---|---|---|---|")
    for batch in (1, 32):
        profile_batch(batch, shapes, weights, norm_w, args.context, args.bandwidth)


if __name__ == "__main__":
    main()
