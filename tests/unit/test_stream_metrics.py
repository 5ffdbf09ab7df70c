"""`llmd_http_requests_total` for streamed answers, through the real middleware, `relay` and
aiohttp server with handler cancellation on (as `llmd serve` runs): a client that read the whole
stream and hung up while the handler was still tearing down (closing the generation, writing the
stream's end) counts as answered (200), as it was; a client that left mid-stream counts as 499.

The OpenAI client closes its connection as soon as it reads `data: [DONE]`; on a loaded box the
handler had not returned by then, aiohttp cancelled it, and a whole answer was counted as 499
(CI saw the 200 counter never move). The generation here is a plain async generator: what is
under test is the HTTP side, not the worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from llmd.api.http_common import METRICS, SSE_KEEPALIVE, relay, sse
from llmd.api.metrics import metrics_middleware
from llmd.api.security import SecurityConfig, make_runner
from llmd.runtime.counters import Metrics

ROUTE = "/v1/stream"


def make_app(frames_of) -> web.Application:  # type: ignore[no-untyped-def]
    app = web.Application(middlewares=[metrics_middleware])
    app[METRICS] = Metrics()

    async def stream(request: web.Request) -> web.StreamResponse:
        async def accepted() -> None:
            return None

        try:
            return await relay(
                request,
                accepted(),
                frames_of(),
                content_type="text/event-stream",
                error_frame=lambda err: sse({"error": err.message}),
                keepalive=SSE_KEEPALIVE,
            )
        finally:
            # The route's own teardown after the stream (the chat route closes its run here):
            # slow enough that the client has hung up before the handler returns.
            await asyncio.sleep(1.0)

    app.router.add_get(ROUTE, stream)
    return app


def counted(app: web.Application) -> dict[str, float]:
    """Requests counted on ROUTE by status."""
    out: dict[str, float] = {}
    for family in app[METRICS].registry.collect():
        for sample in family.samples:
            if sample.name == "llmd_http_requests_total" and sample.labels["route"] == ROUTE:
                out[sample.labels["status"]] = sample.value
    return out


async def read_then_hang_up(app: web.Application, until: bytes) -> dict[str, float]:
    """Serve `app` as `serve` does, read the stream until `until`, close the connection, and
    return the counter once the request is counted."""
    runner = make_runner(app, SecurityConfig(), handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET {ROUTE} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await writer.drain()
        seen = b""
        while until not in seen:
            chunk = await asyncio.wait_for(reader.read(4096), 10)
            assert chunk, seen
            seen += chunk
        writer.close()
        for _ in range(200):
            if counted(app):
                break
            await asyncio.sleep(0.05)
        return counted(app)
    finally:
        await runner.cleanup()


async def test_a_stream_read_to_its_end_counts_as_answered_when_the_client_hangs_up_first() -> None:
    async def frames() -> AsyncIterator[bytes]:
        yield sse({"text": "hello"})
        yield sse("[DONE]")

    assert await read_then_hang_up(make_app(frames), b"[DONE]") == {"200": 1.0}


async def test_a_client_that_leaves_mid_stream_counts_as_499() -> None:
    async def frames() -> AsyncIterator[bytes]:
        yield sse({"text": "hello"})
        await asyncio.sleep(30)  # the generation goes on; the client does not wait for it
        yield sse("[DONE]")

    assert await read_then_hang_up(make_app(frames), b"hello") == {"499": 1.0}
