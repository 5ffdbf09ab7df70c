"""The benchmarks' one load generator: streaming chat requests against any OpenAI-compatible
server (`/v1/chat/completions` with `stream: true`), timed from the client's side.

Every figure the benchmarks quote comes from here, so that llmd, llama.cpp's `llama-server`,
Ollama or vLLM are measured by the same code with the same prompts:

- `stream_chat`: one request; time to first token (TTFT: send -> first content delta), tokens
  generated (the server's `usage.completion_tokens` when it streams usage, else the number of
  content deltas), per-stream decode tokens/s ((tokens - 1) / (last delta - first delta)),
  prompt and cached prompt tokens when the server reports them.
- `run_load`: N concurrent streams for a fixed duration or a fixed number of requests.
  Aggregate tokens/s over a duration counts the tokens that arrived within it (requests still
  running at its end finish, for their TTFT and decode speed, but their later tokens do not
  count: the drain, where fewer than N streams run, would otherwise weigh in); over a request
  count it is all tokens over the wall time from the first send to the last completion.
- `run_chat`: a multi-turn conversation whose history grows by the assistant's reply and a new
  user message each turn, the workload where a server's prefix (KV) reuse shows: TTFT per turn.

Prompts are deterministic functions of a seed, so two servers measured in the same round see
the same requests, and a new seed per round keeps one round's prefix cache from serving the
next. Usable as a library (the runner `compare_servers.py`, `serve_bench.py`, the integration
test) and from the command line for a quick look at one server:

    python -m bench.loadgen --base-url http://127.0.0.1:7477 --concurrency 4 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

Message = dict[str, str]

SYSTEM = "You are a helpful assistant. Answer in detail."
TOPICS = (
    "a lighthouse keeper who finds a message in a bottle",
    "the history of the printing press",
    "how bees build and defend their hives",
    "a journey by train across a snowy mountain range",
    "the life cycle of a star",
    "a small bakery that opens before dawn",
    "how rivers shape valleys over millions of years",
    "a chess tournament in an old library",
)
FOLLOW_UPS = (
    "Continue, and add more detail about the place.",
    "Now describe the same events from another character's point of view.",
    "What happened next? Keep going.",
    "Explain the most important moment again, more slowly.",
    "Add a conversation between two of the people involved.",
    "Describe the weather and the sounds around them.",
    "What did they learn? Write a few paragraphs.",
    "Tell the ending in a different way.",
    "Summarize everything so far, then continue the story.",
    "Write one more chapter.",
)
# Words that pad a chat turn's user message, so that the history grows by a realistic amount
# of user text as well as the replies (prefix reuse then has something to save).
_FILLER = (
    "remember that the details matter and that every small observation about the light the "
    "wind the people and the objects around them helps the reader see the scene clearly"
).split()


@dataclass(frozen=True)
class Target:
    """One server to measure: a display name, its base URL (no `/v1`) and the model name it
    expects (llama-server accepts any; llmd and Ollama need theirs)."""

    name: str
    base_url: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class RequestResult:
    """One streamed request as the client saw it; times are `time.perf_counter()` seconds."""

    ok: bool
    error: str | None = None
    t_start: float = 0.0
    t_first: float | None = None  # first content delta
    t_last: float | None = None  # last content delta
    t_end: float = 0.0  # stream closed
    deltas: int = 0  # content deltas received
    usage_tokens: int | None = None  # usage.completion_tokens, when streamed
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    finish_reason: str | None = None
    text: str = ""
    delta_times: list[float] = field(default_factory=list, repr=False)

    @property
    def tokens(self) -> int:
        """Generated tokens: the server's count when it gave one (a delta may hold several
        tokens, or none while a multi-byte character is incomplete), else the deltas."""
        return self.usage_tokens if self.usage_tokens is not None else self.deltas

    def tokens_until(self, t: float) -> float:
        """Tokens that had arrived by time `t`: content deltas by then, scaled by the
        request's tokens per delta (1 for servers sending a delta per token)."""
        if not self.deltas:
            return 0.0
        arrived = sum(1 for d in self.delta_times if d <= t)
        return arrived * self.tokens / self.deltas

    @property
    def ttft(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_start

    @property
    def decode_tps(self) -> float | None:
        """Tokens/s of this stream after its first token: what one user sees, excluding the
        prompt's prefill and queueing, which TTFT covers."""
        if self.t_first is None or self.t_last is None or self.tokens < 2:
            return None
        span = self.t_last - self.t_first
        return (self.tokens - 1) / span if span > 0 else None

    @property
    def total(self) -> float:
        return self.t_end - self.t_start

    def summary(self) -> dict[str, Any]:
        """The JSON-able per-request record kept in results files (no absolute times)."""
        return {
            "ok": self.ok,
            "error": self.error,
            "ttft_s": self.ttft,
            "tokens": self.tokens,
            "decode_tok_s": self.decode_tps,
            "total_s": self.total,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason,
        }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def load_prompt(seed: int, index: int) -> list[Message]:
    """Request `index` of a load run: a fresh prompt (its own number up front, so no server
    can serve it from another request's prefix beyond the system message) asking for a long
    answer; the max_tokens cap ends it, or the model does, earlier."""
    topic = TOPICS[(seed + index) % len(TOPICS)]
    return [
        {"role": "system", "content": SYSTEM},
        {
            "role": "user",
            "content": f"Request {seed}-{index}. Write a long, detailed story about {topic}.",
        },
    ]


def chat_opening(seed: int) -> list[Message]:
    """Turn 1 of a multi-turn conversation."""
    topic = TOPICS[seed % len(TOPICS)]
    return [
        {"role": "system", "content": f"Conversation {seed}. {SYSTEM}"},
        {"role": "user", "content": f"Tell me a long story about {topic}. {_filler(seed, 0)}"},
    ]


def chat_follow_up(seed: int, turn: int) -> Message:
    """The user message that opens turn `turn` (2, 3, ...)."""
    ask = FOLLOW_UPS[(turn - 2) % len(FOLLOW_UPS)]
    return {"role": "user", "content": f"{ask} {_filler(seed, turn)}"}


def _filler(seed: int, turn: int, words: int = 40) -> str:
    start = (seed * 7 + turn * 13) % len(_FILLER)
    return " ".join(_FILLER[(start + i) % len(_FILLER)] for i in range(words)) + "."


def client_session(timeout: float = 600.0) -> aiohttp.ClientSession:
    """The HTTP client for `stream_chat`: no connection limit, and a new connection for every
    request. llama-server closes a connection after a streamed response while advertising
    keep-alive, so a reused one fails on the next request; a fresh loopback connection per
    request costs every server the same fraction of a millisecond."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, force_close=True),
        timeout=aiohttp.ClientTimeout(total=timeout),
    )


def _chat_body(target: Target, messages: list[Message], max_tokens: int) -> dict[str, Any]:
    return {
        "model": target.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _take_event(result: RequestResult, data: str, now: float, parts: list[str]) -> bool:
    """Apply one SSE `data:` payload; False once the stream is over (`[DONE]` or an error)."""
    if data == "[DONE]":
        return False
    event = json.loads(data)
    if "error" in event:
        err = event["error"]
        result.ok = False
        result.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        return False
    for choice in event.get("choices") or ():
        content = (choice.get("delta") or {}).get("content")
        if content:
            result.deltas += 1
            result.delta_times.append(now)
            parts.append(content)
            if result.t_first is None:
                result.t_first = now
            result.t_last = now
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]
    usage = event.get("usage")
    if usage:
        result.usage_tokens = usage.get("completion_tokens")
        result.prompt_tokens = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details") or {}
        result.cached_tokens = details.get("cached_tokens")
    return True


async def stream_chat(
    session: aiohttp.ClientSession,
    target: Target,
    messages: list[Message],
    max_tokens: int,
    *,
    headers: dict[str, str] | None = None,
    extra_body: dict[str, Any] | None = None,
) -> RequestResult:
    """One streaming chat completion at temperature 0, timed; never raises for a failed
    request (HTTP error, broken stream, an `error` event): the result says `ok=False`.
    `session` should come from `client_session()`; `extra_body`: fields added to the request
    (a server's own extensions, e.g. llmd's `speculative`)."""
    result = RequestResult(ok=True, t_start=time.perf_counter())
    parts: list[str] = []
    url = f"{target.base_url.rstrip('/')}/v1/chat/completions"
    body = {**_chat_body(target, messages, max_tokens), **(extra_body or {})}
    try:
        async with session.post(url, json=body, headers={**target.headers, **(headers or {})}) as r:
            if r.status != 200:
                result.ok = False
                result.error = f"HTTP {r.status}: {(await r.text())[:300]}"
                return result
            buffer = b""
            going = True
            # Split lines by hand: an SSE line may exceed aiohttp's readline limit.
            async for chunk in r.content.iter_any():
                now = time.perf_counter()
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for raw in lines:
                    line = raw.strip()
                    if line.startswith(b"data:") and going:
                        going = _take_event(result, line[5:].strip().decode(), now, parts)
                if not going:
                    break
            if going and result.finish_reason is None:
                result.ok, result.error = False, "the stream ended without [DONE] or a finish"
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        result.ok = False
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.t_end = time.perf_counter()
        result.text = "".join(parts)
    if result.ok and result.t_first is None and result.tokens > 0:
        result.ok, result.error = False, "usage reports tokens but no content delta came"
    return result


@dataclass
class LoadResult:
    """A load run: every request, its start, its deadline (None for a request count) and the
    wall time from first send to last completion."""

    concurrency: int
    start: float
    deadline: float | None
    wall_s: float
    requests: list[RequestResult]

    @property
    def failed(self) -> list[RequestResult]:
        return [r for r in self.requests if not r.ok]

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.requests if r.ok)

    @property
    def window_s(self) -> float:
        """The span aggregate tokens/s is taken over."""
        return self.wall_s if self.deadline is None else self.deadline - self.start

    @property
    def aggregate_tps(self) -> float:
        if self.window_s <= 0:
            return 0.0
        if self.deadline is None:
            return self.tokens / self.window_s
        ok = [r for r in self.requests if r.ok]
        return sum(r.tokens_until(self.deadline) for r in ok) / self.window_s

    def metrics(self) -> dict[str, Any]:
        """Aggregate tok/s, per-stream decode tok/s (median over requests) and TTFT p50/p95."""
        ok = [r for r in self.requests if r.ok]
        ttfts = [r.ttft for r in ok if r.ttft is not None]
        decode = [r.decode_tps for r in ok if r.decode_tps is not None]
        return {
            "concurrency": self.concurrency,
            "requests": len(self.requests),
            "failed": len(self.failed),
            "tokens": self.tokens,
            "wall_s": self.wall_s,
            "window_s": self.window_s,
            "aggregate_tok_s": self.aggregate_tps,
            "decode_tok_s_p50": statistics.median(decode) if decode else None,
            "ttft_s_p50": percentile(ttfts, 50),
            "ttft_s_p95": percentile(ttfts, 95),
            "mean_tokens_per_request": self.tokens / len(ok) if ok else 0.0,
        }


async def run_load(
    target: Target,
    concurrency: int,
    max_tokens: int,
    *,
    requests: int | None = None,
    duration: float | None = None,
    seed: int = 0,
    timeout: float = 600.0,
) -> LoadResult:
    """`concurrency` streams, each sending its next request as soon as its last one ends,
    until `requests` have been sent or `duration` seconds have passed (requests running then
    finish). Request i carries `load_prompt(seed, i)` whichever stream sends it."""
    if (requests is None) == (duration is None):
        raise ValueError("give exactly one of requests and duration")
    sent = 0
    results: list[RequestResult] = []
    async with client_session(timeout) as session:
        start = time.perf_counter()
        deadline = start + duration if duration is not None else math.inf

        async def stream() -> None:
            nonlocal sent
            while time.perf_counter() < deadline and (requests is None or sent < requests):
                index = sent
                sent += 1
                results.append(
                    await stream_chat(session, target, load_prompt(seed, index), max_tokens)
                )

        await asyncio.gather(*(stream() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return LoadResult(
        concurrency=concurrency,
        start=start,
        deadline=None if duration is None else deadline,
        wall_s=wall,
        requests=results,
    )


@dataclass
class ChatResult:
    """A multi-turn conversation: one request per turn, in order."""

    turns: list[RequestResult]

    @property
    def failed(self) -> list[RequestResult]:
        return [r for r in self.turns if not r.ok]

    def metrics(self) -> dict[str, Any]:
        return {
            "turns": len(self.turns),
            "failed": len(self.failed),
            "ttft_s_per_turn": [r.ttft for r in self.turns],
            "prompt_tokens_per_turn": [r.prompt_tokens for r in self.turns],
            "cached_tokens_per_turn": [r.cached_tokens for r in self.turns],
            "tokens_per_turn": [r.tokens for r in self.turns],
            "ttft_s_mean": statistics.fmean(t) if (t := _ttfts(self.turns)) else None,
        }


def _ttfts(results: list[RequestResult]) -> list[float]:
    return [r.ttft for r in results if r.ok and r.ttft is not None]


async def run_chat(
    target: Target,
    turns: int,
    max_tokens: int,
    *,
    seed: int = 0,
    headers: dict[str, str] | None = None,
    timeout: float = 600.0,
) -> ChatResult:
    """One conversation of `turns` turns: each turn sends the whole history so far, then
    appends the assistant's reply (as generated, so a server can reuse the KV it computed for
    it) and the next user message. Stops at the first failed turn."""
    messages = chat_opening(seed)
    results: list[RequestResult] = []
    async with client_session(timeout) as session:
        for turn in range(1, turns + 1):
            result = await stream_chat(session, target, messages, max_tokens, headers=headers)
            results.append(result)
            if not result.ok:
                break
            messages = [
                *messages,
                {"role": "assistant", "content": result.text},
                chat_follow_up(seed, turn + 1),
            ]
    return ChatResult(turns=results)


async def _main(args: argparse.Namespace) -> None:
    target = Target("server", args.base_url, args.model)
    load = await run_load(
        target,
        args.concurrency,
        args.max_tokens,
        duration=args.duration,
        seed=args.seed,
    )
    print(json.dumps(load.metrics(), indent=2))
    for r in load.failed[:3]:
        print("failed:", r.error)
    if args.turns:
        chat = await run_chat(target, args.turns, args.max_tokens, seed=args.seed)
        print(json.dumps(chat.metrics(), indent=2))
        for r in chat.failed:
            print("failed:", r.error)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:7477 (no /v1)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--turns", type=int, default=0, help="then a chat of this many turns")
    ap.add_argument("--seed", type=int, default=0)
    asyncio.run(_main(ap.parse_args()))


if __name__ == "__main__":
    main()
