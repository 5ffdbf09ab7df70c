"""MTP drafting (Qwen3.5's `mtp.*` head) at the engine level: what drafting with the head costs
when its guesses are wrong and what it gains when they are right, on random Qwen3.5-MoE-shaped
checkpoints (no Qwen3.5 checkpoint with its head fits this machine).

Two heads per shape (tests/native/test_speculative_mtp.py builds both):
- random: a random head, whose drafts are nearly all rejected: the cost floor (the head's
  forward, the recurrent-state snapshots at every drafted position, the rollback; the
  adaptive draft length then drafts little);
- agreeing: a model whose layers only nudge its residual stream and a head built to guess what
  it will say (~90% of drafts kept): the gain a head that agrees this often can give here.

One stream, greedy, `max_draft` 4, fresh 64-token prompts each round; decode tokens/s over the
generation (prefill included: short prompts), median over rounds.

  python -m bench.speculative_mtp [--rounds 3] [--tokens 128] [--shapes tiny]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from tests.native.test_speculative_mtp import _agreeing_weights
from tests.native.tiny_models import CONFIGS, write_qwen3_5_moe_with_mtp

SHAPES = {
    "tiny": CONFIGS["qwen3_5_moe_text"],
}


def _generate(engine, prompt: list[int], tokens: int, spec: dict) -> tuple[float, int, int]:  # type: ignore[no-untyped-def]
    engine.submit("g", prompt, tokens, **spec)
    out = 0
    start = time.perf_counter()
    while True:
        for ev in engine.poll(1000):
            if ev["type"] == "tokens":
                out += len(ev["tokens"])
            elif ev["type"] == "done":
                elapsed = time.perf_counter() - start
                return out / elapsed, ev.get("drafted_tokens", 0), ev.get("accepted_tokens", 0)
            else:
                raise RuntimeError(ev)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--shapes", default="tiny")
    args = ap.parse_args()
    import llmd._engine as native

    from llmd.worker.host import hf_config

    for shape in args.shapes.split(","):
        config = SHAPES[shape]
        with tempfile.TemporaryDirectory() as tmp:
            for head in ("random", "agreeing"):
                path = Path(tmp) / head
                if head == "random":
                    write_qwen3_5_moe_with_mtp(path, config=config)
                else:
                    model, mtp = _agreeing_weights(config)
                    write_qwen3_5_moe_with_mtp(path, mtp=mtp, model=model, config=config)
                engine = native.Engine(
                    str(path),
                    backend="cpu",
                    hf_config=hf_config(str(path)),
                    context_length=1024,
                    max_sequences=4,
                    kv_budget_bytes=256 << 20,
                )
                rng = np.random.default_rng(0)
                vocab = config["vocab_size"]
                for spec in ({}, {"max_draft": 4, "mtp": True}):  # warm-up (first graphs of each)
                    _generate(engine, [int(t) for t in rng.integers(3, vocab, 64)], 8, spec)
                plain, spec, drafted, accepted = [], [], 0, 0
                for _ in range(args.rounds):
                    # Prompts of their own: a prefix reused from the cache drafts nothing (the
                    # head never read its positions).
                    prompt = [int(t) for t in rng.integers(3, vocab, 64)]
                    plain.append(_generate(engine, prompt, args.tokens, {})[0])
                    prompt = [int(t) for t in rng.integers(3, vocab, 64)]
                    rate, d, a = _generate(
                        engine, prompt, args.tokens, {"max_draft": 4, "mtp": True}
                    )
                    spec.append(rate)
                    drafted += d
                    accepted += a
                engine.shutdown()
                p, s = statistics.median(plain), statistics.median(spec)
                print(
                    f"{shape:7} {head:9} plain {p:7.1f} tok/s  mtp {s:7.1f} tok/s  "
                    f"{s / p:5.2f}x  kept {accepted}/{drafted}"
                )


if __name__ == "__main__":
    main()
