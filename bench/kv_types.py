"""KV cache types (issue 25): what f16, q8_0 and q4_0 KV cost and buy, llmd beside llama.cpp.

For each type, on the same GGUF and text:
- KV bytes per token and the context a fixed --kv-budget holds (llmd's engine reports them;
  llama.cpp's figure is GGML's block size, the same by construction);
- quality: the mean KL divergence of next-token distributions against the same engine with
  f16 KV, and how often the top token agrees, over `--chunks` chunks of `--ctx` tokens scored
  as llama-perplexity scores them (each chunk starts with BOS; the second half of each chunk is
  scored). llama.cpp runs `llama-perplexity --kl-divergence-base` with f16 KV, then
  `--kl-divergence` with `-ctk/-ctv TYPE` (flash attention on, which quantized V needs). Both
  engines Hadamard-rotate Q/K/V before a quantized cache (llama.cpp by default, llmd always:
  native/core/hadamard.h); LLAMA_ATTN_ROT_DISABLE=1 in the environment turns llama.cpp's off,
  for a comparison with plain GGML blocks;
- speed: prefill of a `--prompt`-token prompt and decode of 64 tokens after it (llmd's engine;
  llama.cpp's `llama-bench -p N -n 64 -d 0` and `-n 64 -d N` with the same KV type).

    bench/build_llamacpp.sh        # once: llama-perplexity, llama-bench
    python -m bench.kv_types [--chunks 8] [--ctx 512] [--prompt 2048] [--threads 2]

Prints one table; ratios are llmd / llama.cpp from this same run. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.step_bench import DEFAULT_BIN, default_model

HERE = Path(__file__).resolve().parent
TYPES = ("f16", "q8_0", "q4_0")


def corpus_text() -> str:
    """English prose from this repository (its docs), a few thousand tokens: the same text
    goes to both engines."""
    root = HERE.parent
    parts = [root / "README.md", HERE / "README.md"]
    return "\n\n".join(p.read_text() for p in parts if p.exists())


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def llmd_chunks(model: str, text: str, ctx: int, chunks: int) -> list[list[int]]:
    """The text's tokens cut as llama-perplexity cuts them: `chunks` runs of `ctx` tokens,
    each starting with BOS."""
    from llmd.text.text_model import load_text_model

    tm = load_text_model(Path(model))
    ids = tm.encode(text, add_bos=True)
    if len(ids) < ctx * chunks:
        raise SystemExit(f"the text has {len(ids)} tokens; {ctx * chunks} needed")
    out = []
    for c in range(chunks):
        chunk = ids[c * ctx : (c + 1) * ctx]
        if tm.bos_id is not None:
            chunk[0] = tm.bos_id
        out.append(chunk)
    return out


def llmd_log_probs(model: str, kv_type: str, chunks: list[list[int]]) -> np.ndarray:
    """Log-softmax of the logits at positions ctx/2 .. ctx-2 of each chunk (those that
    predict tokens ctx/2+1 .. ctx-1, as llama-perplexity scores)."""
    import llmd._engine as native

    ctx = len(chunks[0])
    engine = native.Engine(model, context_length=ctx, backend="cpu", kv_type=kv_type)
    first = ctx // 2
    rows = [_log_softmax(engine.score(c, first + 1)[:-1]) for c in chunks]
    return np.concatenate(rows)


def kl_and_top1(base: np.ndarray, other: np.ndarray) -> tuple[float, float]:
    kl = (np.exp(base) * (base - other)).sum(-1)
    return float(kl.mean()), float((base.argmax(-1) == other.argmax(-1)).mean())


def llmd_speed(model: str, kv_type: str, prompt_len: int, threads: int) -> dict[str, float]:
    """Prefill tok/s of a random `prompt_len`-token prompt and decode tok/s of 64 tokens
    after it, one sequence, best of two runs (first run warms up)."""
    import llmd._engine as native

    native.set_threads(threads)
    engine = native.Engine(
        model, context_length=prompt_len + 128, backend="cpu", kv_type=kv_type, max_sequences=1
    )
    rng = np.random.default_rng(0)
    best = {"prefill": 0.0, "decode": 0.0}
    for r in range(2):
        prompt = [int(t) for t in rng.integers(100, 40000, prompt_len)]
        engine.submit(f"r{r}", prompt, 64)
        done = None
        while done is None:
            for ev in engine.poll(1000):
                if ev["type"] == "done":
                    done = ev
        t = done["timings"]
        best["prefill"] = max(best["prefill"], prompt_len / (t["prefill_ms"] / 1000))
        best["decode"] = max(
            best["decode"], (done["completion_tokens"] - 1) / (t["decode_ms"] / 1000)
        )
    return best


_KLD = re.compile(r"Mean\s+KLD:\s*([0-9.eE+-]+)")
_TOP = re.compile(r"Same top p:\s*([0-9.]+)")


def llamacpp_kl(
    binary: Path, model: str, text_file: Path, ctx: int, chunks: int, threads: int
) -> dict:
    """llama-perplexity's mean KL divergence and same-top-token share of q8_0 / q4_0 KV
    against its own f16-KV logits."""
    common = [
        str(binary / "llama-perplexity"),
        "-m",
        model,
        "-f",
        str(text_file),
        "-c",
        str(ctx),
        "--chunks",
        str(chunks),
        "-t",
        str(threads),
        "-fa",
        "on",
    ]
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.kld"
        subprocess.run(
            [*common, "-ctk", "f16", "-ctv", "f16", "--kl-divergence-base", str(base)],
            capture_output=True,
            text=True,
            check=True,
        )
        for t in TYPES[1:]:
            run = subprocess.run(
                [
                    *common,
                    "-ctk",
                    t,
                    "-ctv",
                    t,
                    "--kl-divergence-base",
                    str(base),
                    "--kl-divergence",
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            log = run.stdout + run.stderr
            kld, top = _KLD.search(log), _TOP.search(log)
            if not kld:
                raise SystemExit(f"llama-perplexity printed no KLD for {t}:\n{log[-2000:]}")
            out[t] = {
                "kl": float(kld.group(1)),
                "top1": float(top.group(1)) / 100 if top else float("nan"),
            }
    return out


def llamacpp_speed(
    binary: Path, model: str, kv_type: str, prompt_len: int, threads: int
) -> dict[str, float]:
    """llama-bench: pp of `prompt_len` tokens, and tg64 after `prompt_len` tokens of depth."""
    args = [str(binary / "llama-bench"), "-m", model, "-t", str(threads), "-r", "2", "-o", "json"]
    args += ["-ctk", kv_type, "-ctv", kv_type, "-fa", "on"]
    pp = json.loads(
        subprocess.run(
            [*args, "-p", str(prompt_len), "-n", "0"], capture_output=True, text=True, check=True
        ).stdout
    )
    tg = json.loads(
        subprocess.run(
            [*args, "-p", "0", "-n", "64", "-d", str(prompt_len)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    return {"prefill": float(pp[0]["avg_ts"]), "decode": float(tg[0]["avg_ts"])}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=None)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--budget-mib", type=int, default=64, help="the --kv-budget the capacity column assumes"
    )
    ap.add_argument("--bin", type=Path, default=DEFAULT_BIN)
    ap.add_argument("--no-llamacpp", action="store_true", help="llmd's figures only")
    ap.add_argument("--no-speed", action="store_true", help="skip the speed columns")
    ap.add_argument("--no-kl", action="store_true", help="skip the quality columns")
    args = ap.parse_args()
    model = args.model or default_model()
    text = corpus_text()
    have_llamacpp = not args.no_llamacpp and (args.bin / "llama-bench").exists()

    import llmd._engine as native

    started = time.time()
    chunks = llmd_chunks(model, text, args.ctx, args.chunks)
    base = None if args.no_kl else llmd_log_probs(model, "f16", chunks)
    rows: dict[str, dict] = {}
    for t in TYPES:
        kv = native.Engine(
            model,
            context_length=args.ctx,
            backend="cpu",
            kv_type=t,
            kv_budget_bytes=args.budget_mib << 20,
        )
        info = kv.kv_cache()
        row = {"bytes_per_token": info["bytes_per_token"], "capacity": info["capacity_tokens"]}
        if t != "f16" and base is not None:
            row["kl"], row["top1"] = kl_and_top1(base, llmd_log_probs(model, t, chunks))
        if not args.no_speed:
            row["speed"] = llmd_speed(model, t, args.prompt, args.threads)
        rows[t] = row
    ref_kl: dict = {}
    ref_speed: dict = {}
    if have_llamacpp:
        if not args.no_kl and (args.bin / "llama-perplexity").exists():
            with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
                f.write(text)
            ref_kl = llamacpp_kl(args.bin, model, Path(f.name), args.ctx, args.chunks, args.threads)
            Path(f.name).unlink()
        if not args.no_speed:
            ref_speed = {
                t: llamacpp_speed(args.bin, model, t, args.prompt, args.threads) for t in TYPES
            }

    scored = args.chunks * (args.ctx - 1 - args.ctx // 2)
    print(
        f"model {Path(model).name}, {scored} scored tokens ({args.chunks} x {args.ctx}), "
        f"prompt {args.prompt}, {args.threads} threads, kernels {native.active_kernel_path()}, "
        f"{time.time() - started:.0f} s"
    )
    print(
        "| KV | bytes/token | tokens in "
        f"{args.budget_mib} MiB | vs f16 | llmd KL vs f16 | llama.cpp KL | llmd / llama.cpp KL "
        "| top-1 same (llmd / llama.cpp) | prefill tok/s llmd / llama.cpp | decode tok/s llmd / llama.cpp |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for t, row in rows.items():
        ref = ref_kl.get(t, {})
        kl = f"{row['kl']:.5f}" if "kl" in row else "-"
        rkl = f"{ref['kl']:.5f}" if ref else "-"
        ratio = f"{row['kl'] / ref['kl']:.2f}x" if ref and ref["kl"] > 0 else "-"
        top = f"{row['top1']:.3f} / {ref.get('top1', float('nan')):.3f}" if "top1" in row else "-"
        sp, rs = row.get("speed"), ref_speed.get(t)
        pre = (
            f"{sp['prefill']:.0f} / {rs['prefill']:.0f} ({sp['prefill'] / rs['prefill']:.2f}x)"
            if sp and rs
            else (f"{sp['prefill']:.0f} / -" if sp else "-")
        )
        dec = (
            f"{sp['decode']:.1f} / {rs['decode']:.1f} ({sp['decode'] / rs['decode']:.2f}x)"
            if sp and rs
            else (f"{sp['decode']:.1f} / -" if sp else "-")
        )
        cap = row["capacity"] / rows["f16"]["capacity"]
        print(
            f"| {t} | {row['bytes_per_token']:,} | {row['capacity']:,} | {cap:.2f}x | {kl} | {rkl} | {ratio} "
            f"| {top} | {pre} | {dec} |"
        )


if __name__ == "__main__":
    main()
