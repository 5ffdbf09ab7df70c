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
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

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


async def _stream(
    session: aiohttp.ClientSession, base: str, body: dict, headers: dict
) -> tuple[float, int, float]:
    """(time to first content token, content chunks, end) of one streaming chat request."""
    start = time.perf_counter()
    first = 0.0
    chunks = 0
    async with session.post(f"{base}/v1/chat/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"]
            if delta and delta[0]["delta"].get("content"):
                chunks += 1
                if not first:
                    first = time.perf_counter() - start
    return first, chunks, time.perf_counter()


async def throughput(base: str, streams: int, max_tokens: int = 128) -> float:
    """Aggregate completion tokens/s of `streams` concurrent requests (usage counts)."""
    async with aiohttp.ClientSession() as s:

        async def one(i: int) -> int:
            body = {
                "model": MODEL,
                "messages": [
                    {"role": "user", "content": f"Story {i}: tell me about a lighthouse."}
                ],
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            usage = 0
            async with s.post(f"{base}/v1/chat/completions", json=body) as r:
                async for raw in r.content:
                    line = raw.decode().strip()
                    if line.startswith("data: {") and '"usage": {' in line:
                        usage = json.loads(line[6:])["usage"]["completion_tokens"]
            return usage

        t = time.perf_counter()
        tokens = await asyncio.gather(*(one(i) for i in range(streams)))
        return sum(tokens) / (time.perf_counter() - t)


async def second_turn_ttft(base: str, seed: int, cached: bool) -> float:
    history = _history(seed)
    sid = {"X-Session-Id": f"bench-{seed}"} if cached else {}
    body = {"model": MODEL, "max_tokens": 8, "temperature": 0, "stream": True}
    async with aiohttp.ClientSession() as s:
        if cached:  # turn 1 leaves the history's KV pinned in the session
            await _stream(s, base, {**body, "messages": history}, sid)
        msgs = history + [{"role": "user", "content": "Summarize it in one sentence."}]
        ttft, _, _ = await _stream(s, base, {**body, "messages": msgs}, sid)
        if cached:
            await s.delete(f"{base}/v1/sessions/bench-{seed}")
        return ttft


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_daemon() -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = dict(os.environ, LLMD_HOME=tempfile.mkdtemp(prefix="llmd-b-"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmd", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, base
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("llmd serve did not start")


async def main_async(args: argparse.Namespace) -> None:
    base = args.base_url
    proc = None
    if not base:
        proc, base = _start_daemon()
    try:
        await throughput(base, 1, 8)  # loads and warms the model
        rows: dict[str, list[float]] = {}
        for r in range(args.rounds):
            for n in (1, 4, 16):
                rows.setdefault(f"streams{n}", []).append(await throughput(base, n))
            order = (True, False) if r % 2 == 0 else (False, True)
            for cached in order:
                key = "ttft_cached" if cached else "ttft_uncached"
                rows.setdefault(key, []).append(
                    await second_turn_ttft(base, 1000 * r + cached, cached)
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
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--json", default=None)
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
