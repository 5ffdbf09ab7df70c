"""Answering an OpenAI request for a remote model with the upstream's own answer, as it came
(chat and completions, and the embedding and rerank routes, which vLLM, SGLang, llama-server
and llmd all serve under the same paths):
its JSON, or its SSE events one by one, with `model` rewritten to the local name. A client that
goes away closes the upstream connection, which cancels the generation there (vLLM, SGLang,
llama-server and llmd all stop on disconnect). Slots, health, bodies and errors are the
runtime's (``runtime/remote_upstream.py``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from llmd.api.embedding_schemas import EmbeddingRequest, RerankRequest
from llmd.api.http_common import SSE_KEEPALIVE, relay, sse
from llmd.errors import ApiError
from llmd.runtime.remote_upstream import (
    SSE,
    RemoteGate,
    read_lines,
    request_options,
    transport_error,
    upstream_body,
    upstream_error,
)
from llmd.store.remotes import RemoteRecord
from llmd.text.openai_schemas import SamplingFields

# The validated requests that travel to an upstream as they are (with the upstream's model id).
Forwarded = SamplingFields | EmbeddingRequest | RerankRequest


async def forward(
    request: web.Request,
    gate: RemoteGate,
    remote: RemoteRecord,
    req: Forwarded,
    path: str,
) -> web.StreamResponse:
    """Answer `request` (already validated as `req`) from the remote's `path`. An error that
    says when to retry (429, 503) keeps its Retry-After header."""
    started = time.perf_counter()
    try:
        return await _forward(request, gate, remote, req, path, started)
    except ApiError as err:
        gate.failed(remote, err, time.perf_counter() - started)
        raise


async def _forward(
    request: web.Request,
    gate: RemoteGate,
    remote: RemoteRecord,
    req: Forwarded,
    path: str,
    started: float,
) -> web.StreamResponse:
    options = request_options(remote)
    body = upstream_body(req, remote)
    slots = await gate.acquire(remote)
    try:
        try:
            resp = await gate.post(remote, path, json=body, **options)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise transport_error(remote, exc) from exc
        try:
            if resp.status >= 400:
                try:
                    text = await resp.text(errors="replace")
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    raise transport_error(remote, exc) from exc
                raise upstream_error(remote, resp.status, text, resp.headers)
            if getattr(req, "stream", False) and resp.content_type == SSE:
                seen = _Seen()
                answer = await relay(
                    request,
                    _ready(),
                    _events(resp, remote, req.model, seen),
                    content_type=SSE,
                    error_frame=lambda err: sse(err.envelope()),
                    keepalive=SSE_KEEPALIVE,
                )
                elapsed = time.perf_counter() - started
                if seen.error is not None:
                    gate.failed(remote, seen.error, elapsed)
                else:
                    gate.finished(remote, elapsed, seen.usage, complete=seen.done)
                return answer
            try:
                raw = await resp.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                raise transport_error(remote, exc) from exc
            try:
                payload = json.loads(raw)
            except ValueError as exc:
                raise ApiError(
                    502,
                    f"remote '{remote.name}' ({remote.host}) answered with something that is "
                    "not JSON",
                    type="server_error",
                    code="upstream_error",
                ) from exc
            usage = payload.get("usage") if isinstance(payload, dict) else None
            gate.finished(remote, time.perf_counter() - started, usage)
            return web.json_response(_renamed(payload, req.model))
        finally:
            if resp.content.is_eof():
                resp.release()  # read to the end: the connection goes back to the pool
            else:
                resp.close()  # cut short (the client left, an error): the upstream stops
    finally:
        gate.release(slots)


async def _ready() -> None:
    """The upstream accepted the request (its status is already known to be 2xx)."""


@dataclass
class _Seen:
    """What a relayed stream showed, for the remote's metrics: its usage (when the client
    asked for it), whether it finished, the error that ended it."""

    usage: dict[str, Any] | None = None
    done: bool = False
    error: ApiError | None = None


async def _events(
    resp: aiohttp.ClientResponse, remote: RemoteRecord, name: str, seen: _Seen
) -> AsyncIterator[bytes]:
    """The upstream's SSE stream, one event per frame, `model` renamed in each JSON event.
    A stream that breaks off or stalls ends with llmd's error event (502/504)."""
    lines: list[bytes] = []
    try:
        try:
            async for line in read_lines(resp.content):
                if line:
                    lines.append(line)
                    # [DONE], or an upstream's own in-band error (its stream ends with it)
                    seen.done = (
                        seen.done or line == b"data: [DONE]" or line.startswith(b'data: {"error"')
                    )
                    continue
                if lines:
                    yield _event(lines, name, seen)
                    lines = []
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise transport_error(remote, exc) from exc
        if lines:
            yield _event(lines, name, seen)
        if not seen.done:  # the upstream closed the stream without finishing it
            raise ApiError(
                502,
                f"remote '{remote.name}' ({remote.host}) ended the stream before it was complete",
                type="server_error",
                code="upstream_unreachable",
            )
    except ApiError as err:
        seen.error = err
        raise


def _renamed(payload: Any, name: str) -> Any:
    if isinstance(payload, dict) and "model" in payload:
        payload["model"] = name
    return payload


def _event(lines: list[bytes], name: str, seen: _Seen) -> bytes:
    out = []
    for line in lines:
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data.startswith(b"{"):
                try:
                    payload = json.loads(data)
                except ValueError:
                    pass
                else:
                    if isinstance(payload, dict) and isinstance(payload.get("usage"), dict):
                        seen.usage = payload["usage"]
                    line = (
                        b"data: " + json.dumps(_renamed(payload, name), ensure_ascii=False).encode()
                    )
        out.append(line)
    return b"\n".join(out) + b"\n\n"
