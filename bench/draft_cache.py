"""The draft model's own prefix cache (issue 24): a conversation sent again with a draft model.

An agent's every turn repeats its whole conversation. The target takes it from its prefix
cache; this measures whether the draft model does too (`native/core/model_drafter.h`), or
first runs the conversation through the draft model again before it can draft. Engine level,
one stream, greedy: the same long prompt (the edit workload's file, several times over) sent
`--requests` times with draft-model drafting; the first request prefills both models, the
later ones should cost about the decode alone.

    python -m bench.draft_cache                         # the test model, its Q4_0 copy drafting
    python -m bench.draft_cache --copies 20 --requests 4

The draft is the test model requantized as Q4_0 (`bench/draft_gguf.py`): as large as its
target, so this shows the mechanism's time, not a useful pairing's (a real draft several times
smaller than its target saves proportionally less).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from llmd import _engine
from llmd.text.text_model import load_text_model

from .draft_gguf import write_requantized
from .speculative import EDIT_FILE
from .step_bench import default_model


def generate(engine, rid: str, prompt: list[int], max_tokens: int) -> dict:  # type: ignore[no-untyped-def]
    engine.submit(rid, prompt=prompt, max_tokens=max_tokens, max_draft=8, draft_model=True)
    while True:
        for ev in engine.poll(1000):
            if ev["type"] == "done":
                return ev
            if ev["type"] == "error":
                raise RuntimeError(ev["message"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--copies", type=int, default=4, help="times the file appears in the prompt")
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    model = Path(default_model())
    with tempfile.TemporaryDirectory() as tmp:
        run(model, write_requantized(model, Path(tmp) / "draft-q4_0.gguf"), args)


def run(model: Path, draft: Path, args: argparse.Namespace) -> None:
    text = load_text_model(model)
    user = ("Here is a file:\n" + EDIT_FILE) * args.copies + "\nRewrite the whole file."
    prompt = text.encode_rendered_chat(
        f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )
    _engine.set_threads(args.threads)
    engine = _engine.Engine(
        str(model), draft_model_path=str(draft), context_length=16384, max_sequences=4
    )
    print(f"prompt: {len(prompt)} tokens, {args.tokens} out, draft: {draft.name}")
    print(
        "| request | seconds | target prefix cached | draft KV from the draft cache | drafted | kept |"
    )
    print("|---|---|---|---|---|---|")
    try:
        for i in range(args.requests):
            before = engine.stats().get("draft_cached_tokens", 0)
            start = time.perf_counter()
            done = generate(engine, f"r{i}", prompt, args.tokens)
            seconds = time.perf_counter() - start
            reused = engine.stats().get("draft_cached_tokens", 0) - before
            print(
                f"| {i + 1} | {seconds:.2f} | {done['cached_tokens']} | {reused} "
                f"| {done['drafted_tokens']} | {done['accepted_tokens']} |",
                flush=True,
            )
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
