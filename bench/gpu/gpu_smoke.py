"""Three sequences of different lengths decoded together on the GPU through llmd's engine
(backend "gpu": MLX's CUDA or Metal device): what a GPU session runs before it times anything,
so that a crash shows up as one short backtrace instead of a failed benchmark.

    python bench/gpu/gpu_smoke.py MODEL.gguf [BACKEND]   # e.g. make_random_gguf.py --preset tiny
"""

from __future__ import annotations

import sys

import llmd._engine as native


def main(model: str, backend: str = "gpu") -> None:
    engine = native.Engine(
        model, context_length=256, max_sequences=4, kv_budget_bytes=8 << 20, backend=backend
    )
    for i in range(3):
        engine.submit(f"a{i}", [1, 5, 6, 7, 8][: 3 + i], 12)
    tokens: dict[str, list[int]] = {}
    done = 0
    while done < 3:
        for ev in engine.poll(1000):
            if ev["type"] == "tokens":
                tokens.setdefault(ev["id"], []).extend(ev["tokens"])
            elif ev["type"] in ("done", "error"):
                done += 1
                if ev["type"] == "error":
                    print("error:", ev.get("message", ""))
    rows = engine.stats()["max_rows_sampled_in_a_step"]
    print("gpu smoke", [tokens.get(f"a{i}") for i in range(3)], "rows in a step:", rows)


if __name__ == "__main__":
    main(*sys.argv[1:3])
