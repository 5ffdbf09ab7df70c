"""Time to first token of a long prompt after a daemon restart, against its cold prefill: the
KV cache's disk tier (`llmd serve --kv-disk`, issue 25) at work.

Each round starts `llmd serve` in a fresh LLMD_HOME (an empty disk tier), sends one chat
request whose prompt fills the test model's context (~8k tokens; SmolLM2-135M is trained on
8,192) and times its first token (cold: a whole prefill); then stops the daemon (SIGTERM, as
`llmd stop`), starts it again in the same home and sends the same request (its KV comes from
disk), and once more (from RAM, for reference). Models are preloaded and ready before a
request is timed, so load time is in none of the figures. The block files were just written,
so they are read from the OS page cache: a restart after a reboot reads them from the SSD.

    python -m bench.kv_disk [--rounds 3] [--words 7600] [--seed 0]

`--engine BACKEND` (e.g. `mlx-cpu`, the device path on MLX's CPU device) times the same in
process instead, on the native engine alone: a prompt of `--words` random token ids prefilled
cold by one engine, which is then deleted (a worker restart), and the same prompt on a new
engine over the same directory (from disk), then once more (from RAM); each TTFT is the wall
time from submission to the one token of a one-token greedy request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

try:
    from bench import loadgen, servers
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench import loadgen, servers

MODEL = "smollm2-135m"
WORDS = (
    "harbor lantern keeper fog ship rope tide stone gull bell wind north chart oil glass "
    "night morning storm river bridge town market grain boat festival paint white blue red "
    "green reader scene light people objects details matter small observation clearly"
).split()


def long_messages(seed: int, words: int) -> list[dict[str, str]]:
    """A system prompt of about `words` tokens (an agent's rules and tool list stand-in);
    `seed` makes each round's prompt its own."""
    text = " ".join(WORDS[(seed * 7 + i * i) % len(WORDS)] for i in range(words))
    return [
        {"role": "system", "content": f"Session {seed}. {text}"},
        {"role": "user", "content": "Summarize the rules above in one sentence."},
    ]


def wait_ready(base: str, timeout: float = 120.0) -> dict:
    """/status once the model is loaded and ready (preloaded at start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/status", timeout=2) as r:
                info = json.load(r)
            if any(m["name"] == MODEL and m["state"] == "ready" for m in info["models"]):
                return info
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the model did not become ready")


def engine_stats(base: str) -> dict:
    with urllib.request.urlopen(base + "/status", timeout=30) as r:
        [model] = [m for m in json.load(r)["models"] if m["name"] == MODEL]
    return model.get("engine", {})


async def timed(target: loadgen.Target, messages: list[dict[str, str]]) -> dict:
    """One greedy request for a single token, timed end to end: its time to first token
    (prefill, or loading the prefix, plus one decode step). Not streamed: with this prompt
    the model's first tokens can be whitespace that a stream sends no content delta for."""
    body = {"model": target.model, "messages": messages, "max_tokens": 1, "temperature": 0}
    async with loadgen.client_session() as s:
        start = time.perf_counter()
        async with s.post(target.base_url + "/v1/chat/completions", json=body) as r:
            answer = await r.json()
            if r.status != 200:
                raise RuntimeError(f"request failed: {answer}")
        ttft = time.perf_counter() - start
    usage = answer["usage"]
    return {
        "ttft": ttft,
        "text": answer["choices"][0]["message"]["content"],
        "prompt_tokens": usage["prompt_tokens"],
        "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
    }


def server(home: Path, threads: int | None) -> servers.ManagedServer:
    port = servers.free_port()
    argv = [sys.executable, "-m", "llmd", "serve", "--port", str(port), "--preload", MODEL]
    if threads:
        argv += ["--threads", str(threads)]
    return servers.ManagedServer("llmd", argv, port, env=servers.llmd_env(home))


def one_round(seed: int, words: int, threads: int | None) -> dict:
    home = Path(tempfile.mkdtemp(prefix="llmd-kvd-"))
    messages = long_messages(seed, words)
    try:
        with server(home, threads) as first:
            first.start()
            wait_ready(first.base_url)
            target = loadgen.Target("llmd", first.base_url, MODEL)
            cold = asyncio.run(timed(target, messages))
            deadline = time.monotonic() + 60  # every block on disk before the restart
            blocks = cold["prompt_tokens"] // 64
            while engine_stats(first.base_url)["kv_disk"]["written_blocks"] < blocks:
                if time.monotonic() > deadline:
                    raise RuntimeError("the disk tier did not write the prompt's blocks")
                time.sleep(0.1)
        with server(home, threads) as second:
            second.start()
            wait_ready(second.base_url)
            target = loadgen.Target("llmd", second.base_url, MODEL)
            restarted = asyncio.run(timed(target, messages))
            in_ram = asyncio.run(timed(target, messages))
            disk = engine_stats(second.base_url)["kv_disk"]
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if restarted["text"] != cold["text"]:
        raise RuntimeError(f"the answer changed: {cold['text']!r} vs {restarted['text']!r}")
    return {
        "prompt_tokens": cold["prompt_tokens"],
        "cold_ttft_s": cold["ttft"],
        "restart_ttft_s": restarted["ttft"],
        "restart_cached_tokens": restarted["cached_tokens"],
        "ram_ttft_s": in_ram["ttft"],
        "disk_read_mb": disk["read_bytes"] / 1e6,
        "ratio": restarted["ttft"] / cold["ttft"],
    }


def engine_round(backend: str, tokens: int, seed: int, kv_type: str) -> dict:
    """One round on the native engine in this process (see the module docstring)."""
    import random

    from bench.step_bench import default_model
    from llmd import _engine  # type: ignore[attr-defined]

    model = default_model()
    rng = random.Random(seed)
    prompt = [1] + [rng.randrange(100, 40000) for _ in range(tokens - 1)]
    disk = Path(tempfile.mkdtemp(prefix="llmd-kvd-"))

    def make():  # type: ignore[no-untyped-def]
        return _engine.Engine(
            model,
            context_length=8192,
            backend=backend,
            kv_type=kv_type,
            kv_budget_bytes=4 << 30,
            kv_disk_dir=str(disk),
            kv_disk_bytes=20 << 30,
            model_digest="sha256:" + "0" * 64,
        )

    def timed_one(engine, rid: str) -> tuple[float, list[int], dict]:  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        engine.submit(rid, prompt=prompt, max_tokens=1)
        out: list[int] = []
        while True:
            for ev in engine.poll(1000):
                if ev["type"] == "tokens":
                    out += ev["tokens"]
                elif ev["type"] in ("done", "error"):
                    if ev["type"] == "error":
                        raise RuntimeError(ev["message"])
                    return time.perf_counter() - start, out, ev

    try:
        first = make()
        cold_s, cold_tokens, _ = timed_one(first, "cold")
        first.flush_kv_disk()
        del first
        second = make()
        restart_s, restart_tokens, done = timed_one(second, "restart")
        ram_s, _, _ = timed_one(second, "ram")
        disk_stats = second.stats()["kv_disk"]
        del second
    finally:
        shutil.rmtree(disk, ignore_errors=True)
    if restart_tokens != cold_tokens:
        raise RuntimeError(f"the answer changed: {cold_tokens} vs {restart_tokens}")
    return {
        "prompt_tokens": tokens,
        "cold_ttft_s": cold_s,
        "restart_ttft_s": restart_s,
        "restart_cached_tokens": done["cached_tokens"],
        "ram_ttft_s": ram_s,
        "disk_read_mb": disk_stats["read_bytes"] / 1e6,
        "ratio": restart_s / cold_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--words", type=int, default=7600, help="system prompt words (~tokens)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0, help="first round's prompt seed")
    parser.add_argument(
        "--engine", default=None, help="time the native engine in process on this backend"
    )
    parser.add_argument("--kv-type", default="f16", help="with --engine: the KV type")
    args = parser.parse_args()
    rows = []
    for seed in range(args.seed, args.seed + args.rounds):
        if args.engine:
            rows.append(engine_round(args.engine, args.words, seed, args.kv_type))
        else:
            rows.append(one_round(seed, args.words, args.threads))
        print(json.dumps(rows[-1]), flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(
        f"prompt {med['prompt_tokens']:.0f} tokens: cold TTFT {med['cold_ttft_s']:.2f} s, "
        f"after a restart {med['restart_ttft_s']:.3f} s ({med['ratio'] * 100:.1f}% of cold, "
        f"{med['restart_cached_tokens']:.0f} tokens from disk, {med['disk_read_mb']:.0f} MB read), "
        f"from RAM {med['ram_ttft_s']:.3f} s (medians of {len(rows)} rounds)"
    )


if __name__ == "__main__":
    main()
