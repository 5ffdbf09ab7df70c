"""A remote model's upstream, as the runtime sees it: request slots, health, the request's
body and headers, and the upstream's errors in llmd's envelope. The HTTP side that relays an
answer to the client as it came is ``api/remote_forward.py``; the chat pipeline's side is
``text/remote_chat.py``.

What travels: the request as llmd validated it (the same pydantic models as local requests;
fields the client did not set stay unset), minus llmd's own extensions (sessions,
keep_alive), with `model` replaced by the upstream's id; headers are llmd's own (the remote's
key as ``Authorization: Bearer`` when configured), never the client's. What comes back: the
upstream's JSON as it gave it, or its SSE events one by one, with `model` rewritten to the
local name. A client that goes away closes the upstream connection, which cancels the
generation there (vLLM, SGLang, llama-server and llmd all stop on disconnect).

Limits (decision): each remote has `max_concurrency` requests in flight; more wait in a FIFO
queue for up to `queue_timeout` seconds, then get 429 ``remote_busy`` with Retry-After. Waiting
smooths bursts (an agent fanning out a few calls) without letting a stuck upstream pile up
clients forever. Errors leave in llmd's envelope: an upstream 4xx keeps its status (429 with
its Retry-After, a 400 about a parameter), 503 stays 503 (back-pressure), other 5xx and an
unreachable or broken upstream are 502, a timeout 504; the key never appears in them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
from pydantic import BaseModel

from llmd.errors import ApiError, ContextOverflow
from llmd.store.remotes import RemoteError, RemoteRecord, ssl_context

if TYPE_CHECKING:
    from llmd.runtime.counters import Metrics

log = logging.getLogger("llmd.remote")

# llmd's own request fields: they steer local state (sessions, loaded models) and mean nothing
# (or something else) to an upstream.
LOCAL_ONLY_FIELDS = {"session_id", "session_ttl", "keep_alive"}
SSE = "text/event-stream"


@dataclass
class Slots:
    """One remote's in-flight bound: a semaphore sized from its record."""

    limit: int
    semaphore: asyncio.Semaphore
    in_flight: int = 0
    queued: int = 0


@dataclass
class Health:
    """What the last check of a remote found (remote_health.py, or a failed request)."""

    healthy: bool | None = None  # None: not checked yet
    checked_at: float | None = None
    last_error: str | None = None
    failures: int = 0  # in a row: the backoff grows with them
    next_check: float = 0.0
    context_length: int | None = None  # as the upstream reports it now
    capabilities: dict[str, bool] | None = None  # likewise


@dataclass
class RemoteGate:
    """The daemon's upstream connections and per-remote runtime state (one per app): request
    slots and health."""

    _slots: dict[str, Slots] = field(default_factory=dict)
    _health: dict[str, Health] = field(default_factory=dict)
    _session: aiohttp.ClientSession | None = None
    metrics: Metrics | None = None  # the app's, once the app has them

    def health(self, name: str) -> Health:
        return self._health.setdefault(name, Health())

    def forget(self, keep: set[str]) -> None:
        """Drops the state of remotes that were removed."""
        for name in set(self._health) - keep:
            del self._health[name]

    def session(self) -> aiohttp.ClientSession:
        """One connection pool for every upstream; TLS certificates are verified."""
        if self._session is None or self._session.closed:
            # No pool-wide cap: each remote's own bound (max_concurrency) is the limit.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def post(self, remote: RemoteRecord, path: str, **kwargs: Any) -> Any:
        """POST to one of the remote's API paths: the URL comes from its record only (never
        from a request body), TLS verified against the system's CAs or the remote's own
        bundle (`--ca-bundle`)."""
        try:
            tls = ssl_context(remote)
        except RemoteError as exc:
            raise ApiError(exc.status, exc.message, type="server_error", code=exc.code) from exc
        return await self.session().post(remote.endpoint(path), ssl=tls, **kwargs)

    def failed(self, remote: RemoteRecord, err: ApiError, seconds: float) -> None:
        """A request to `remote` ended with `err`: counted; an upstream that could not be
        reached or stalled is marked down until the next health check finds it back."""
        if err.code in ("upstream_unreachable", "upstream_timeout"):
            health = self.health(remote.name)
            health.healthy, health.last_error = False, err.message
        if self.metrics is not None:
            self.metrics.remote_requests.labels(remote.name, "error").inc()
            self.metrics.remote_errors.labels(remote.name, str(err.status)).inc()
            self.metrics.remote_duration.labels(remote.name).observe(seconds)

    def finished(
        self,
        remote: RemoteRecord,
        seconds: float,
        usage: dict[str, Any] | None,
        *,
        complete: bool = True,
    ) -> None:
        """A request to `remote` ended without an error: its tokens (the upstream's usage,
        when it reported one) and latency; `complete` False when the client left first."""
        m = self.metrics
        if m is None:
            return
        m.remote_requests.labels(remote.name, "ok" if complete else "cancelled").inc()
        m.remote_duration.labels(remote.name).observe(seconds)
        if usage:
            details = usage.get("prompt_tokens_details") or {}
            for counter, value in (
                (m.remote_prompt_tokens, usage.get("prompt_tokens")),
                (m.remote_generated_tokens, usage.get("completion_tokens")),
                (m.remote_cached_tokens, details.get("cached_tokens")),
            ):
                if isinstance(value, int) and value > 0:
                    counter.labels(remote.name).inc(value)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _for(self, remote: RemoteRecord) -> Slots:
        slots = self._slots.get(remote.name)
        if slots is None or (slots.limit != remote.max_concurrency and slots.in_flight == 0):
            slots = Slots(remote.max_concurrency, asyncio.Semaphore(remote.max_concurrency))
            self._slots[remote.name] = slots
        return slots

    async def acquire(self, remote: RemoteRecord) -> Slots:
        """A slot, waiting up to the remote's queue timeout; 429 beyond it."""
        slots = self._for(remote)
        slots.queued += 1
        try:
            await asyncio.wait_for(slots.semaphore.acquire(), timeout=remote.queue_timeout)
        except asyncio.TimeoutError as exc:
            err = ApiError(
                429,
                f"remote model '{remote.name}' has {remote.max_concurrency} requests in flight "
                f"and no slot freed within {remote.queue_timeout:g} s; retry later",
                type="rate_limit_error",
                code="remote_busy",
            )
            err.retry_after = 1
            raise err from exc
        finally:
            slots.queued -= 1
        slots.in_flight += 1
        return slots

    @staticmethod
    def release(slots: Slots) -> None:
        slots.in_flight -= 1
        slots.semaphore.release()

    def in_flight(self) -> int:
        """Requests to any remote running or queued now (a draining daemon waits for them)."""
        return sum(s.in_flight + s.queued for s in self._slots.values())

    def status(self, remote: RemoteRecord) -> dict[str, Any]:
        slots = self._slots.get(remote.name)
        health = self.health(remote.name)
        return {
            "in_flight": slots.in_flight if slots else 0,
            "queued": slots.queued if slots else 0,
            "max_concurrency": remote.max_concurrency,
            "healthy": health.healthy,
            "checked_at": health.checked_at,
            "last_error": health.last_error,
        }


def request_options(remote: RemoteRecord) -> dict[str, Any]:
    """`headers` and `timeout` of one upstream request: llmd's own headers (the key read from
    its environment variable now) and the remote's connect/read timeouts, with no total, since a
    long answer may stream for minutes. A missing key is the remote's error as an ApiError,
    raised before the request takes a slot."""
    try:
        headers = remote.headers()
    except RemoteError as exc:
        raise ApiError(exc.status, exc.message, type="server_error", code=exc.code) from exc
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=remote.connect_timeout, sock_read=remote.read_timeout
    )
    return {"headers": headers, "timeout": timeout}


def upstream_body(req: BaseModel, remote: RemoteRecord) -> dict[str, Any]:
    """The validated request as the upstream gets it: what the client set, under the
    upstream's model id, without llmd's local-only fields."""
    body = req.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude=LOCAL_ONLY_FIELDS)
    body["model"] = remote.upstream_model
    return body


def upstream_error(
    remote: RemoteRecord, status: int, text: str, headers: Any, *, in_stream: bool = False
) -> ApiError:
    """An upstream's error answer in llmd's envelope: its message (key scrubbed), its status
    for 4xx and 503, 502 for other failures. `in_stream`: an error event that ended a stream
    the upstream had started (no status of its own: 502)."""
    message, etype, code, param = text.strip()[:500], None, None, None
    sizes: tuple[Any, Any] = (None, None)
    try:
        err = json.loads(text).get("error")
        if isinstance(err, dict):
            sizes = (err.get("n_prompt_tokens"), err.get("n_ctx"))  # llama-server's
            message = str(err.get("message") or message)
            etype, code, param = err.get("type"), err.get("code"), err.get("param")
        elif isinstance(err, str):
            message = err
    except (ValueError, AttributeError):
        pass
    message = remote.scrub(message)
    kept = 400 <= status < 500 or status == 503
    default_type = "invalid_request_error" if status < 500 else "server_error"
    out = ApiError(
        status if kept else 502,
        f"remote '{remote.name}' ({remote.host}) "
        + ("failed mid-stream" if in_stream else f"answered {status}")
        + f": {message}",
        type=str(etype) if etype and kept else default_type,
        param=str(param) if isinstance(param, str) else None,
        code=str(code) if isinstance(code, (str, int)) and kept else "upstream_error",
    )
    if status == 400:
        out = _as_overflow(out, message, sizes) or out
    if headers.get("Retry-After"):
        out.retry_after = headers["Retry-After"]
    return out


# OpenAI's wording of a prompt beyond the context, as llmd and vLLM (and llama-server, in
# its own words) answer it: the context, then the prompt's tokens.
_CONTEXT = re.compile(r"(?:maximum context length is|context size \()\s*(\d+)")
_PROMPT = re.compile(
    r"(\d+) in the messages|resulted in (?:at least )?(\d+) tokens|request \((\d+) tokens\)"
)


def _as_overflow(
    err: ApiError, message: str, sizes: tuple[Any, Any] = (None, None)
) -> ContextOverflow | None:
    """An upstream's context-overflow refusal as llmd's own ContextOverflow, so each protocol
    words it as its clients parse it (Claude Code compacts its history only on Anthropic's
    `prompt is too long: N tokens > M maximum`); the upstream's message is kept. `sizes`:
    the (prompt, context) counts an upstream sent as fields (llama-server)."""
    if all(isinstance(x, int) and not isinstance(x, bool) for x in sizes):
        tokens, context_length = int(sizes[0]), int(sizes[1])
    else:
        context, prompt = _CONTEXT.search(message), _PROMPT.search(message)
        if context is None or prompt is None:
            return None
        tokens = next(int(g) for g in prompt.groups() if g)
        context_length = int(context.group(1))
    out = ContextOverflow(tokens, context_length, err.param or "messages")
    out.message = err.message
    return out


def transport_error(remote: RemoteRecord, exc: BaseException) -> ApiError:
    """An upstream we could not reach, that stalled or broke off: 504 for a timeout, else 502."""
    if isinstance(exc, asyncio.TimeoutError):
        return ApiError(
            504,
            f"remote '{remote.name}' ({remote.host}) did not answer in time",
            type="server_error",
            code="upstream_timeout",
        )
    detail = remote.scrub(str(exc) or type(exc).__name__)
    return ApiError(
        502,
        f"remote '{remote.name}' ({remote.host}) failed: {detail}",
        type="server_error",
        code="upstream_unreachable",
    )


async def read_lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The stream's lines without their ends, however long: aiohttp's own line reader refuses
    lines past 128 KiB, and one SSE event (a big tool call's arguments, logprobs) can be."""
    pending = b""
    async for chunk in content.iter_any():
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line.rstrip(b"\r")
    if pending:
        yield pending.rstrip(b"\r")
