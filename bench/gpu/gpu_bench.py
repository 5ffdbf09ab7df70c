"""llmd's engine on the GPU vs llama.cpp's CUDA build, same GGUF, same run.

Measures, for each side: single-stream decode (tg128), prefill of 512 and 4,096 tokens, and
aggregate decode at batch 8 and 32 (128-token prompts, 128 generated tokens each, the
llama-batched-bench definition: generated tokens over the time after every prompt is in).
Rounds alternate llmd / llama.cpp; the table quotes medians of per-round ratios. Each figure
is also given as a fraction of the bandwidth limit: a device-to-device copy measured in the
same run, divided into the bytes a decode step must read (all weights once per step).

    python bench/gpu/gpu_bench.py --model /tmp/llama3-8b-q4_0.gguf --llamacpp-bin DIR --rounds 3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import time
from pathlib import Path


def copy_bandwidth_gb_s(n_bytes: int = 2 << 30, reps: int = 20) -> float:
    """Device-to-device bandwidth (read + write bytes / s) of a large copy, via MLX."""
    import mlx.core as mx

    a = mx.zeros((n_bytes // 4,), dtype=mx.float32)
    mx.eval(a)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        b = mx.array(a + 0)  # one read, one write of n_bytes
        mx.eval(b)
        best = min(best, time.perf_counter() - t)
        del b
    return 2 * n_bytes / best / 1e9


class Llmd:
    def __init__(self, model: str, kv_budget: int, backend: str) -> None:
        from llmd import _engine

        self.engine = _engine.Engine(
            model,
            context_length=8192,
            max_sequences=32,
            step_token_budget=512,
            kv_budget_bytes=kv_budget,
            backend=backend,
        )
        self.info = self.engine.info()
        self.vocab = self.info["vocab_size"]
        self.rng = random.Random(0)
        self.n = 0

    def _prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(300, self.vocab) for _ in range(n)]

    def _run(self, prompts: list[list[int]], max_tokens: int) -> tuple[list[dict], float, float]:
        """Runs requests together; returns done events, time the last first token came, end."""
        ids = []
        for p in prompts:
            self.n += 1
            rid = f"r{self.n}"
            ids.append(rid)
            self.engine.submit(rid, p, max_tokens)
        first: dict[str, float] = {}
        done: dict[str, dict] = {}
        while len(done) < len(ids):
            for ev in self.engine.poll(1000):
                if ev["type"] == "tokens":
                    first.setdefault(ev["id"], time.perf_counter())
                elif ev["type"] == "done":
                    done[ev["id"]] = ev
                else:
                    raise RuntimeError(ev["message"])
        return [done[i] for i in ids], max(first.values()), time.perf_counter()

    def round(self) -> dict[str, float]:
        out = {}
        for n in (512, 4096):
            (ev,), _, _ = self._run([self._prompt(n)], 1)
            out[f"pp{n}"] = n / (ev["timings"]["prefill_ms"] / 1000)
        (ev,), _, _ = self._run([self._prompt(1)], 129)
        out["tg128"] = 128 / (ev["timings"]["decode_ms"] / 1000)
        for b in (8, 32):
            evs, last_first, end = self._run([self._prompt(128) for _ in range(b)], 128)
            generated = sum(e["completion_tokens"] - 1 for e in evs)
            out[f"batch{b}_tg"] = generated / (end - last_first)
        return out


def _run_tool(argv: list[str]) -> subprocess.CompletedProcess:
    """Runs a llama.cpp tool; on failure shows its stderr (the exit status alone says nothing)."""
    import mlx.core as mx

    mx.clear_cache()  # hand MLX's cached buffers back so the other process can allocate
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {r.returncode}: {r.stderr[-2000:]}")
    return r


def llamacpp_round(bin_dir: Path, model: str) -> dict[str, float]:
    out: dict[str, float] = {}
    bench = [str(bin_dir / "llama-bench"), "-m", model, "-ngl", "99", "-r", "1", "-o", "json"]
    for extra in (["-p", "512,4096", "-n", "0"], ["-p", "0", "-n", "128"]):
        for t in json.loads(_run_tool(bench + extra).stdout):
            key = f"pp{t['n_prompt']}" if t["n_gen"] == 0 else f"tg{t['n_gen']}"
            out[key] = float(t["avg_ts"])
    r = _run_tool(
        [
            str(bin_dir / "llama-batched-bench"),
            "-m",
            model,
            "-ngl",
            "99",
            "-c",
            "9000",
            "-b",
            "2048",
            "-npp",
            "128",
            "-ntg",
            "128",
            "-npl",
            "8,32",
            "--output-format",
            "jsonl",
        ]
    )
    for line in (r.stdout + r.stderr).splitlines():
        line = line.strip()
        if line.startswith("{") and "speed_tg" in line:
            row = json.loads(line)
            out[f"batch{row['pl']}_tg"] = float(row["speed_tg"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", required=True)
    ap.add_argument("--llamacpp-bin", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv-budget", type=int, default=8 << 30)
    ap.add_argument("--backend", default="gpu")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    bw = copy_bandwidth_gb_s()
    llmd = Llmd(args.model, args.kv_budget, args.backend)
    print(f"device {llmd.info['device_name']}, copy bandwidth {bw:.0f} GB/s", flush=True)
    llmd.round()  # warm-up: first use moves weights onto the device
    rounds = []
    for i in range(args.rounds):
        order = ["llmd", "llama.cpp"] if i % 2 == 0 else ["llama.cpp", "llmd"]
        got = {
            w: (llmd.round() if w == "llmd" else llamacpp_round(args.llamacpp_bin, args.model))
            for w in order
        }
        rounds.append(got)
        print(f"round {i + 1}: {json.dumps(got)}", flush=True)

    weight_bytes = Path(args.model).stat().st_size
    tests = ["tg128", "pp512", "pp4096", "batch8_tg", "batch32_tg"]
    table = {}
    for t in tests:
        ours = [r["llmd"][t] for r in rounds if t in r["llmd"]]
        ref = [r["llama.cpp"][t] for r in rounds if t in r["llama.cpp"]]
        if not ours or not ref:
            continue
        table[t] = {
            "llmd": statistics.median(ours),
            "llamacpp": statistics.median(ref),
            "ratio": statistics.median(o / r for o, r in zip(ours, ref, strict=True)),
        }
    print(
        f"\nmodel {Path(args.model).name} ({weight_bytes / 2**30:.2f} GiB), {llmd.info['device_name']}, "
        f"copy bandwidth {bw:.0f} GB/s, {args.rounds} alternating rounds"
    )
    print(
        "| test | llmd tok/s | llama.cpp tok/s | llmd / llama.cpp | llmd % of bandwidth limit | llama.cpp % |"
    )
    print("|---|---|---|---|---|---|")
    for t, row in table.items():
        # Decode steps read every weight once; batch b shares one read among b tokens.
        per_step = {"tg128": 1, "batch8_tg": 8, "batch32_tg": 32}.get(t)
        if per_step:
            limit = bw * 1e9 / weight_bytes * per_step
            frac = f"{100 * row['llmd'] / limit:.0f}% | {100 * row['llamacpp'] / limit:.0f}%"
        else:
            frac = "- | -"
        print(f"| {t} | {row['llmd']:.1f} | {row['llamacpp']:.1f} | {row['ratio']:.2f} | {frac} |")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "bandwidth_gb_s": bw,
                    "device": llmd.info["device_name"],
                    "rounds": rounds,
                    "table": table,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
