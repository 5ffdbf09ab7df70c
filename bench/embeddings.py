"""Embedding throughput: llmd vs llama-server --embedding on the same encoder GGUF.

Both servers get the same 1,000 short inputs (code-snippet-sized: 8-40 words) through
``POST /v1/embeddings`` in requests of ``--batch`` inputs, one request at a time, as an editor
indexing a codebase sends them; the figure is input tokens per second (the tokens each server
reports in ``usage.prompt_tokens``, which the two tokenizers agree on) over the whole set.
Rounds alternate between the servers, one server running at a time, and the table quotes the
median of the per-round ratios (bench/README.md: run it on a quiet machine).

The model is a random-weight encoder in a real model's shape, written as llama.cpp's converter
writes a `bert` GGUF (tests/native/tiny_encoder_models.py): by default bge-small-en-v1.5's
(12 layers, hidden 384, 12 heads, FFN 1536, 30,522-token WordPiece vocabulary, CLS pooling) in
F16, as published encoder GGUFs are. Random weights change no cost: every input runs the same
layers whatever the numbers.

    python -m bench.embeddings --rounds 3 --threads 2
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench.servers import DEFAULT_LLAMA_SERVER, LLMD_BENCH_MODEL, llama_server, llmd_server

SHAPES = {
    "bge-small": {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 12},
    "bge-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12},
}


def write_model(path: Path, shape: str, quant: str) -> None:
    from tests.native.tiny_encoder_models import CONFIGS, write_encoder_gguf

    dims = SHAPES[shape]
    config = {
        **CONFIGS["bert"],
        **dims,
        "intermediate_size": 4 * dims["hidden_size"],
        "vocab_size": 30522,
        "max_position_embeddings": 512,
    }
    write_encoder_gguf(path, "bert", pooling="cls", quant=quant, config=config)


def inputs(n: int, seed: int = 0) -> list[str]:
    """`n` code-snippet-sized texts over the test vocabulary's words."""
    rng = random.Random(seed)
    return [
        " ".join(f"w{rng.randrange(5, 30000)}" for _ in range(rng.randrange(8, 41)))
        for _ in range(n)
    ]


def post(url: str, body: dict) -> dict:
    data = json.dumps(body).encode()
    for attempt in range(2):  # llama-server may drop an idle keep-alive connection once
        try:
            req = urllib.request.Request(
                url, data=data, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=600) as r:
                return json.loads(r.read())
        except urllib.error.URLError:
            if attempt:
                raise
    raise AssertionError("unreachable")


def run(base_url: str, model: str, texts: list[str], batch: int) -> tuple[float, int]:
    """(seconds, prompt tokens) to embed all `texts`."""
    tokens = 0
    started = time.perf_counter()
    for i in range(0, len(texts), batch):
        out = post(base_url + "/v1/embeddings", {"model": model, "input": texts[i : i + batch]})
        assert len(out["data"]) == len(texts[i : i + batch]), out
        tokens += out["usage"]["prompt_tokens"]
    return time.perf_counter() - started, tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--inputs", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=32, help="inputs per request")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="bge-small")
    ap.add_argument("--quant", choices=["F16", "Q8_0", "F32"], default="F16")
    ap.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA_SERVER)
    ap.add_argument("--llmd-only", action="store_true", help="measure llmd alone (no ratio)")
    args = ap.parse_args(argv)

    texts = inputs(args.inputs)
    with tempfile.TemporaryDirectory() as tmp:
        gguf = Path(tmp) / f"{args.shape}-{args.quant}.gguf"
        write_model(gguf, args.shape, args.quant)
        servers = {
            "llmd": lambda: llmd_server(threads=args.threads, max_sequences=args.batch, gguf=gguf),
        }
        if not args.llmd_only:
            servers["llama.cpp"] = lambda: llama_server(
                args.llama_server,
                gguf,
                threads=args.threads,
                slots=1,
                ctx_per_slot=8192,
                extra=["--embedding", "--pooling", "cls", "-b", "8192", "-ub", "8192"],
            )
        rates: dict[str, list[float]] = {name: [] for name in servers}
        for r in range(args.rounds):
            for name, make in servers.items():
                with make() as server:
                    server.start()
                    model = LLMD_BENCH_MODEL if name == "llmd" else "bench"
                    run(server.base_url, model, texts[:64], args.batch)  # warm up
                    seconds, tokens = run(server.base_url, model, texts, args.batch)
                rates[name].append(tokens / seconds)
                print(
                    f"round {r + 1} {name}: {tokens} tokens in {seconds:.2f} s = {tokens / seconds:,.0f} tok/s"
                )
    for name, values in rates.items():
        print(f"{name}: median {statistics.median(values):,.0f} tok/s")
    if "llama.cpp" in rates:
        ratios = [a / b for a, b in zip(rates["llmd"], rates["llama.cpp"], strict=True)]
        print(
            f"llmd / llama.cpp: median {statistics.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
