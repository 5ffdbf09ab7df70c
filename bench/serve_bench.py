"""The daemon under load, over HTTP (OpenAI streaming API): aggregate decode tokens/s at 1, 4
and 16 concurrent streams, and time to first token of a second chat turn after a ~1,500-token
history, with the history's KV cached (a named session) and not (a history no cache holds).

Starts `llmd serve` on a free port with a private LLMD_HOME unless --base-url is given (any
OpenAI-compatible server works then; the cached case needs llmd's sessions or a prefix cache).
Rounds alternate; the table quotes medians.

    python bench/serve_bench.py [--rounds 3] [--base-url http://127.0.0.1:7477]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

# Run as a file (python bench/serve_bench.py), the repo root is not on the path: add it.
try:
    from bench import loadgen, servers
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench import loadgen, servers

MODEL = "smollm2-135m"
WORDS = (
    "the lighthouse keeper watched ships pass through the fog every night and wrote down".split()
)


def _history(seed: int, approx_tokens: int = 1500) -> list[dict[str, str]]:
    """A multi-turn conversation of about `approx_tokens` tokens; `seed` makes it unique."""
    msgs = [{"role": "system", "content": f"Conversation {seed}. You are a helpful assistant."}]
    text_per_turn = " ".join(WORDS[(seed + i) % len(WORDS)] for i in range(120))
    for turn in range(approx_tokens // 260):
        msgs.append({"role": "user", "content": f"Part {turn}: {text_per_turn}"})
        msgs.append({"role": "assistant", "content": f"Noted part {turn}. {text_per_turn}"})
    return msgs


async def throughput(target: loadgen.Target, streams: int, max_tokens: int = 128) -> float:
    """Aggregate completion tokens/s of `streams` concurrent requests, one each."""
    load = await loadgen.run_load(target, streams, max_tokens, requests=streams)
    if load.failed:
        raise RuntimeError(f"a request failed: {load.failed[0].error}")
    return load.aggregate_tps


async def second_turn_ttft(target: loadgen.Target, seed: int, cached: bool) -> float:
    """TTFT of a question after the ~1,500-token history; cached: the history went through
    the same named session first, which leaves its KV pinned."""
    history = _history(seed)
    sid = {"X-Session-Id": f"bench-{seed}"} if cached else {}
    async with loadgen.client_session() as s:
        if cached:
            await loadgen.stream_chat(s, target, history, 8, headers=sid)
        msgs = history + [{"role": "user", "content": "Summarize it in one sentence."}]
        second = await loadgen.stream_chat(s, target, msgs, 8, headers=sid)
        if cached:
            await s.delete(f"{target.base_url}/v1/sessions/bench-{seed}")
    if second.ttft is None:
        raise RuntimeError(f"the second turn failed: {second.error}")
    return second.ttft


async def main_async(args: argparse.Namespace, base: str) -> None:
    target = loadgen.Target("llmd", base, MODEL)
    await throughput(target, 1, 8)  # loads and warms the model
    rows: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for n in (1, 4, 16):
            rows.setdefault(f"streams{n}", []).append(await throughput(target, n))
        order = (True, False) if r % 2 == 0 else (False, True)
        for cached in order:
            key = "ttft_cached" if cached else "ttft_uncached"
            rows.setdefault(key, []).append(
                await second_turn_ttft(target, 1000 * r + cached, cached)
            )
        print(
            f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in rows.items()),
            flush=True,
        )
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\n{MODEL} over HTTP at {base}, {args.rounds} rounds, medians")
    print("| measure | value | ratio |")
    print("|---|---|---|")
    for n in (1, 4, 16):
        print(
            f"| aggregate decode, {n} streams | {med[f'streams{n}']:.1f} tok/s | {med[f'streams{n}'] / med['streams1']:.2f}x of 1 stream |"
        )
    print(
        f"| 2nd-turn TTFT, ~1,500-token history, uncached | {med['ttft_uncached'] * 1000:.0f} ms | |"
    )
    print(
        f"| 2nd-turn TTFT, same, cached (session) | {med['ttft_cached'] * 1000:.0f} ms | {med['ttft_uncached'] / med['ttft_cached']:.1f}x shorter |"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rows, "medians": med}, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.base_url:
        asyncio.run(main_async(args, args.base_url))
        return
    with servers.llmd_server() as daemon:
        daemon.start()
        asyncio.run(main_async(args, daemon.base_url))


if __name__ == "__main__":
    main()
