"""llmd's CPU attention kernel alone, per variant and KV storage type, one thread.

Two shapes at an n-position context (head_dim 64, 4 query heads per KV head as Llama-3.2-1B):
- prefill: the last 256 rows of an n-token prompt, 4 heads each, in tiles of 64 queries (16
  rows x 4 heads) as the engine cuts a prefill chunk;
- decode: 64 queries over all n positions in tiles of 4 (one row's heads per step), i.e. 16
  decode steps of one KV group.

Timed with the thread's CPU time (`time.thread_time`), so other jobs on a shared machine slow
the figures far less than wall time would; the pool-layout KV is built inside each call (the
write path's conversion), so the time of a call with one query at position 1 is subtracted.
GFLOP/s counts 4 * head_dim per query and position (the score and the value FMA).

    python -m bench.attention_kernel [--n 8192] [--paths avx512vnni,avx2,scalar]
        [--kv-types f16,q8_0,q4_0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

HEAD_DIM = 64
GROUP = 4


def _best(fn, tries: int = 3) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(tries):
        t = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t)
    return best


def measure(native, n: int, path: str, kv_type: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """GFLOP/s of the prefill and decode shapes, and ms per decode step of one KV group."""
    rng = np.random.default_rng(0)
    k = rng.standard_normal((n, HEAD_DIM)).astype(np.float32)
    v = rng.standard_normal((n, HEAD_DIM)).astype(np.float32)
    n_pos = [p + 1 for p in range(n - 256, n) for _ in range(GROUP)]
    q = (rng.standard_normal((len(n_pos), HEAD_DIM)) / 8).astype(np.float32)
    qd = np.ascontiguousarray(q[:64])
    first = [0] * len(n_pos)

    def call(queries, pos, tile):  # type: ignore[no-untyped-def]
        return lambda: native.kernel_attention(
            queries, k, v, pos, [0] * len(pos), kv_type, path, tile
        )

    setup = _best(call(qd[:1], [1], 1))
    prefill = (
        _best(lambda: native.kernel_attention(q, k, v, n_pos, first, kv_type, path, 64)) - setup
    )
    decode = _best(call(qd, [n] * 64, GROUP)) - setup
    return {
        "prefill_gflops": sum(4 * HEAD_DIM * p for p in n_pos) / prefill / 1e9,
        "decode_gflops": 64 * 4 * HEAD_DIM * n / decode / 1e9,
        "decode_step_ms": decode / 16 * 1e3,
    }


def main() -> None:
    from llmd import _engine as native

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8192, help="context positions")
    ap.add_argument("--paths", default=",".join(native.runnable_kernel_paths()))
    ap.add_argument("--kv-types", default="f16,q8_0,q4_0")
    args = ap.parse_args()
    print(f"n={args.n}, head_dim {HEAD_DIM}, 1 thread (thread CPU time)")
    print(
        "| KV | path | prefill tiles GFLOP/s | decode tiles GFLOP/s | ms per decode step (4 heads) |"
    )
    print("|---|---|---|---|---|")
    for kv_type in args.kv_types.split(","):
        for path in args.paths.split(","):
            r = measure(native, args.n, path, kv_type)
            print(
                f"| {kv_type} | {path} | {r['prefill_gflops']:.1f} | {r['decode_gflops']:.1f} "
                f"| {r['decode_step_ms']:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
