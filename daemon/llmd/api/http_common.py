"""What the HTTP route modules share: the application's keys, the JSON body reader and the
relay that streams a protocol's frames (SSE or NDJSON)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import ClientPayloadError, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from llmd.api.security import SecurityConfig
from llmd.errors import ApiError, bad_request, server_error
from llmd.runtime.counters import Metrics
from llmd.runtime.model_registry import ModelRegistry
from llmd.runtime.sessions import SessionTable
from llmd.store.model_store import ModelStore
from llmd.text.chat_pipeline import SESSION_HEADER, RequestContext
from llmd.text.images import ImagePolicy

T = TypeVar("T")

REGISTRY = web.AppKey("registry", ModelRegistry)
SESSIONS = web.AppKey("sessions", SessionTable)
STORE = web.AppKey("store", ModelStore)
METRICS = web.AppKey("metrics", Metrics)
STARTED = web.AppKey("started", float)
DRAINING = web.AppKey("draining", asyncio.Event)
ADDRESSES = web.AppKey("addresses", list)
SECURITY = web.AppKey("security", SecurityConfig)
ErrorShape = Callable[[ApiError], Any]
# (path prefix, renderer): a protocol's routes answer errors in its own shape.
ERROR_SHAPES = web.AppKey("error_shapes", list)
# Seconds a started stream may stay silent before a keep-alive frame is sent: a long prefill
# (an agent's 30k-token prompt on a CPU) must not trip a client's or a proxy's idle timeout.
STREAM_KEEPALIVE = web.AppKey("stream_keepalive", float)
# Set on a request once its stream's last frame is written (the HTTP status it was sent with):
# a client that read the whole stream and hung up before the handler returned (its teardown,
# `write_eof`) has its handler cancelled, and the metrics middleware then counts this status
# instead of 499 ("the client went away first"), which it was not.
# (web.RequestKey from aiohttp 3.14; a plain key before it.)
STREAM_DELIVERED: Any = (
    web.RequestKey("stream_delivered", int)
    if hasattr(web, "RequestKey")
    else "llmd.stream_delivered"
)
DEFAULT_STREAM_KEEPALIVE = 10.0
# `--default-max-tokens`: the output limit of a chat request that names none (None: the rest
# of the context). Codex sends no limit; a model that never ends its turn would fill the context.
DEFAULT_MAX_TOKENS = web.AppKey("default_max_tokens", object)
IMAGE_POLICY = web.AppKey("image_policy", ImagePolicy)

log = logging.getLogger("llmd.http")


def add_error_shape(app: web.Application, prefix: str, render: ErrorShape) -> None:
    """Errors on paths under `prefix` (any status, from any middleware or handler) are
    rendered by `render` instead of as OpenAI's envelope."""
    app.setdefault(ERROR_SHAPES, []).append((prefix, render))


def error_shape_for(request: web.Request) -> ErrorShape:
    for prefix, render in request.app.get(ERROR_SHAPES, []):
        if request.path == prefix or request.path.startswith(prefix.rstrip("/") + "/"):
            return render  # type: ignore[no-any-return]
    return ApiError.envelope


# Deepest nesting of arrays and objects a request body may have: far beyond any real request
# (a tool schema nests a few levels), far below what recursive code downstream can take.
MAX_JSON_DEPTH = 128
# A lone UTF-16 surrogate ("\ud800" in JSON) decodes into a str no tokenizer or encoder takes.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _invalid_unicode() -> ApiError:
    return bad_request(
        "text must be valid Unicode: the body holds a lone UTF-16 surrogate "
        "(an escape such as \\ud800 without its pair)",
        code="invalid_unicode",
    )


def could_hold_surrogates(raw: bytes) -> bool:
    """False when `raw` JSON cannot decode to a lone surrogate: no \\uD8xx-\\uDFxx escape
    and no UTF-8-encoded surrogate (which json.loads lets through)."""
    return b"\\ud" in raw.lower() or b"\xed" in raw


def check_json_value(value: Any, max_depth: int = MAX_JSON_DEPTH, *, text: bool = True) -> None:
    """400 when a decoded JSON value nests deeper than `max_depth` or (with `text`) holds a
    string, key or value, that is not valid Unicode. Walked level by level, never recursing."""
    level = [value]
    depth = 0
    while level:
        below: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                if text:
                    below.extend(item)
                below.extend(item.values())
            elif isinstance(item, list):
                below.extend(item)
            elif text and isinstance(item, str) and _SURROGATE.search(item):
                raise _invalid_unicode()
        if not below:
            return
        depth += 1
        if depth > max_depth and any(isinstance(x, (dict, list)) for x in below):
            raise bad_request(
                f"the request body nests deeper than {max_depth} levels",
                code="too_deeply_nested",
            )
        level = below


BODY_READ_ERRORS = (ClientPayloadError, RequestPayloadError, HttpProcessingError)


def body_read_error(request: web.BaseRequest, exc: BaseException) -> ApiError:
    """The 400 for a body aiohttp could not read (a `Content-Encoding: gzip` header on plain
    bytes, broken chunked framing)."""
    detail = (getattr(exc, "message", "") or str(exc)).strip()
    encoding = request.headers.get("Content-Encoding")
    what = f" (Content-Encoding: {encoding})" if encoding else ""
    err = bad_request(f"the request body could not be read{what}: {detail}", code="invalid_body")
    err.close_connection = True
    return err


async def read_request_body(request: web.Request) -> bytes:
    """The raw body; one aiohttp cannot decode is a 400, not an internal error. The size limit
    (413) stays aiohttp's HTTPRequestEntityTooLarge, which the error middleware renders."""
    try:
        return await request.read()
    except BODY_READ_ERRORS as exc:
        raise body_read_error(request, exc) from exc


# Bodies past this size are decoded and checked in a thread: an 8 MB prompt takes ~0.1-0.3 s
# to parse and walk, which on the event loop would stall every other client (and /health).
OFF_LOOP_BODY = 256 * 1024


async def json_body(request: web.Request) -> Any:
    """The body decoded and checked, in a thread when it is big (parsed_body)."""
    return await parsed_body(request, _as_is)


def _as_is(body: Any) -> Any:
    return body


async def parsed_body(request: web.Request, parse: Callable[..., T], *args: Any) -> T:
    """The body decoded, then `parse`d (validated, translated between protocols). Both run in a
    thread for big bodies: validating a 100k-message Anthropic body took 2 s, which on the
    event loop stalls every other client; in a thread the loop still gets the GIL between
    pydantic's per-message calls."""
    raw = await read_request_body(request)
    if len(raw) <= OFF_LOOP_BODY:
        return parse(_decode_json(raw), *args)
    return await asyncio.to_thread(lambda: parse(_decode_json(raw), *args))


def _decode_json(raw: bytes) -> Any:
    """A request body's JSON, checked (depth, valid Unicode); a 400 naming what is wrong."""
    try:
        value = json.loads(raw)
    except RecursionError as exc:
        raise bad_request(
            f"the request body nests deeper than {MAX_JSON_DEPTH} levels",
            code="too_deeply_nested",
        ) from exc
    except ValueError as exc:  # UnicodeDecodeError and huge integers included
        raise bad_request(f"the request body is not valid JSON: {exc}") from exc
    check_json_value(value, text=could_hold_surrogates(raw))
    return value


async def start_stream(request: web.Request, content_type: str) -> web.StreamResponse:
    """A prepared streaming response (SSE or NDJSON) that proxies do not buffer."""
    resp = web.StreamResponse(
        headers={
            "Content-Type": content_type,
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await resp.prepare(request)
    return resp


async def with_keepalive(
    frames: AsyncIterator[bytes], interval: float, beat: bytes, *, after_first: bool = False
) -> AsyncIterator[bytes]:
    """`frames`, with `beat` whenever the next frame takes longer than `interval` seconds.
    `after_first`: the first frame is awaited without beats (a stream that must open with its
    own event, Anthropic's `message_start`)."""
    pending: asyncio.Future[bytes] | None = None
    first = after_first
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(frames))
            if not first:
                done, _ = await asyncio.wait({pending}, timeout=interval)
                if not done:
                    yield beat
                    continue
            try:
                frame = await pending
            except StopAsyncIteration:
                return
            pending, first = None, False
            yield frame
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)


async def relay(
    request: web.Request,
    accepted: Awaitable[None],
    frames: AsyncIterator[bytes],
    *,
    content_type: str,
    error_frame: Callable[[ApiError], bytes],
    keepalive: bytes | None = None,
    keepalive_after_first: bool = False,
) -> web.StreamResponse:
    """Stream a generation's `frames` once `accepted` (the worker took the request) returns.

    Until then errors are plain HTTP statuses (a 429 when the queue is full). Once the stream
    has started an error can only travel in-band: `error_frame` renders it in the protocol's
    own shape, then the stream ends. A client that goes away stops the relay; closing
    `frames` then cancels the generation in the worker. `keepalive`: the protocol's
    keep-alive frame, sent while the stream is silent (see STREAM_KEEPALIVE), from the start
    or `keepalive_after_first` frame."""

    async def source() -> AsyncIterator[bytes]:
        """`frames`, marking the request delivered when they end: a generator resumes only once
        its last frame was written, so the client can have read the whole stream from here on,
        even if it hangs up (and aiohttp cancels this handler) before the handler returns."""
        async for frame in frames:
            yield frame
        request[STREAM_DELIVERED] = resp.status  # `resp` exists once frames are asked for

    tracked = source()
    sent: AsyncIterator[bytes] = tracked
    if keepalive is not None:
        interval = request.app.get(STREAM_KEEPALIVE, DEFAULT_STREAM_KEEPALIVE)
        sent = with_keepalive(sent, interval, keepalive, after_first=keepalive_after_first)
    try:
        await accepted
        resp = await start_stream(request, content_type)
        try:
            async for frame in sent:
                await resp.write(frame)
        except ApiError as err:
            await resp.write(error_frame(err))
            request[STREAM_DELIVERED] = resp.status
        except ConnectionResetError:  # aiohttp's ClientConnectionResetError is one too
            log.info("client disconnected from %s mid-stream", request.path)
            return resp
        except Exception as exc:  # noqa: BLE001 - a started stream can only report, not re-status
            log.exception("error while streaming %s", request.path)
            await resp.write(error_frame(server_error(f"internal error: {exc}")))
    finally:
        if sent is not tracked:
            await sent.aclose()  # type: ignore[attr-defined]
        await tracked.aclose()
        await frames.aclose()  # type: ignore[attr-defined]
    await resp.write_eof()
    return resp


# OpenAI's streams: an SSE comment, which every SSE client skips.
SSE_KEEPALIVE = b": keep-alive\n\n"


def sse(payload: Any, event: str | None = None) -> bytes:
    """One server-sent event (`event:` line when named), JSON data unless already a string."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data}\n\n".encode()


def ndjson(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False).encode() + b"\n"


async def stream_ndjson(request: web.Request, lines: AsyncIterator[Any]) -> web.StreamResponse:
    """Progress records (not generations: nothing to cancel) as one JSON object per line."""
    resp = await start_stream(request, "application/x-ndjson")
    async for line in lines:
        await resp.write(ndjson(line))
    request[STREAM_DELIVERED] = resp.status
    await resp.write_eof()
    return resp


def pipeline_context(request: web.Request) -> RequestContext:
    """The generation pipeline's view of `request`: its session header, the app's session
    table, default output limit and image policy."""
    limit = request.app.get(DEFAULT_MAX_TOKENS)
    return RequestContext(
        sessions=request.app[SESSIONS],
        session_header=request.headers.get(SESSION_HEADER),
        default_max_tokens=limit if isinstance(limit, int) else None,
        images=request.app.get(IMAGE_POLICY) or ImagePolicy(),
    )
