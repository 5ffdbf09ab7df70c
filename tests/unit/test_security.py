"""Security defaults (llmd/security.py) on a minimal app with the daemon's own error
middleware: what a client sees when its Host, Origin or API key is refused, what a browser
page of an allowed origin gets, and how slow clients are cut off - without cutting slow
responses or slow-but-moving uploads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmd.api.security import (
    SecurityConfig,
    host_name,
    install_cors,
    is_loopback_name,
    make_runner,
    security_middlewares,
)
from llmd.api.server import error_middleware

ORIGIN = "http://localhost:3000"
KEY = "sk-local-secret"
RAN = web.AppKey("ran", list)  # one entry per handler run: refused requests must add none

# ---------------------------------------------------------------------- the app


def make_app(config: SecurityConfig, *, max_body: int = 1 << 20) -> web.Application:
    """/health, /v1/models, a POST echoing its JSON body, and an SSE stream of `n` events
    `gap` seconds apart. app[RAN] records handler runs, to show refused requests did nothing."""
    app = web.Application(
        client_max_size=max_body, middlewares=[error_middleware, *security_middlewares(config)]
    )
    install_cors(app, config)
    app[RAN] = []

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(request: web.Request) -> web.Response:
        request.app[RAN].append(request.path)
        return web.json_response({"object": "list", "data": []})

    async def echo(request: web.Request) -> web.Response:
        request.app[RAN].append(request.path)
        return web.json_response({"echo": await request.json()})

    async def stream(request: web.Request) -> web.StreamResponse:
        request.app[RAN].append(request.path)
        n, gap = int(request.query.get("n", "3")), float(request.query.get("gap", "0"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            await asyncio.sleep(gap)
            await resp.write(f"data: {i}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/echo", echo)
    app.router.add_get("/v1/stream", stream)
    return app


@asynccontextmanager
async def client_for(config: SecurityConfig, **app_kw: Any) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(make_app(config, **app_kw))) as client:
        yield client


@asynccontextmanager
async def tcp_server(config: SecurityConfig) -> AsyncIterator[tuple[int, web.Application]]:
    """The app on 127.0.0.1 behind `make_runner`, as `serve` runs it; yields the port."""
    app = make_app(config)
    runner = make_runner(app, config, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
        yield port, app
    finally:
        await runner.cleanup()


async def envelope(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    body = await resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


# ---------------------------------------------------------------------- raw HTTP


def parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return status, headers, body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status, headers, _ = parse_response(head)
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5)
    return status, headers, body


async def closed_within(reader: asyncio.StreamReader, limit: float) -> float:
    """Seconds until the server closed the connection (EOF or reset); fails after `limit`."""
    start = time.monotonic()
    try:
        while await asyncio.wait_for(reader.read(1024), limit):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - start


GET_MODELS = b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n"


# ---------------------------------------------------------------------- Host (DNS rebinding)


async def test_rebinding_host_is_refused_with_the_envelope_and_runs_nothing() -> None:
    async with client_for(SecurityConfig()) as client:
        resp = await client.post("/v1/echo", json={"x": 1}, headers={"Host": "evil.example:7477"})
        assert resp.status == 403
        err = await envelope(resp)
        assert client.app[RAN] == []
    assert err["type"] == "invalid_request_error"
    assert err["code"] == "host_not_allowed"
    assert "evil.example" in err["message"] and "--allow-host" in err["message"]


@pytest.mark.parametrize(
    "host",
    ["localhost:7477", "localhost", "LocalHost.", "127.0.0.1", "127.1.2.3:80", "[::1]:7477",
     "[::1]", "app.localhost:3000"],
)  # fmt: skip
async def test_loopback_hosts_pass(host: str) -> None:
    async with client_for(SecurityConfig()) as client:
        resp = await client.get("/v1/models", headers={"Host": host})
        assert resp.status == 200, await resp.text()


@pytest.mark.parametrize(
    "host",
    ["evil.example", "0.0.0.0:7477", "localhost.evil.example", "127.0.0.1.nip.io",
     "[::1", "[::1]x", "192.168.1.5:7477", "[::ffff:10.0.0.1]:7477"],
)  # fmt: skip
async def test_other_hosts_are_refused(host: str) -> None:
    async with client_for(SecurityConfig()) as client:
        resp = await client.get("/v1/models", headers={"Host": host})
        assert resp.status == 403
        assert (await envelope(resp))["code"] == "host_not_allowed"


async def test_a_configured_host_passes_and_others_still_do_not() -> None:
    config = SecurityConfig(allowed_hosts=("MyBox.lan:7477", "10.0.0.7"))
    async with client_for(config) as client:
        assert (await client.get("/v1/models", headers={"Host": "mybox.lan:7477"})).status == 200
        assert (await client.get("/v1/models", headers={"Host": "mybox.lan"})).status == 200
        assert (await client.get("/v1/models", headers={"Host": "10.0.0.7:80"})).status == 200
        assert (await client.get("/v1/models", headers={"Host": "other.lan"})).status == 403


async def test_star_allows_any_host() -> None:
    async with client_for(SecurityConfig(allowed_hosts=("*",))) as client:
        assert (await client.get("/v1/models", headers={"Host": "anything.example"})).status == 200


async def test_a_request_without_host_passes() -> None:
    """Only browsers can be rebound, and they always send Host; an HTTP/1.0 tool may not."""
    async with tcp_server(SecurityConfig()) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/models HTTP/1.0\r\n\r\n")
        status, _, body = await read_response(reader)
        writer.close()
    assert status == 200 and json.loads(body)["object"] == "list"


async def test_unix_socket_is_exempt_from_host_and_key_but_tcp_is_not() -> None:
    config = SecurityConfig(api_key=KEY)
    app = make_app(config)
    runner = make_runner(app, config)
    await runner.setup()
    tmp = Path(tempfile.mkdtemp(prefix="llmd-sec-"))  # short: Unix socket paths are limited
    try:
        sock = str(tmp / "s")
        await web.UnixSite(runner, sock).start()
        tcp = web.TCPSite(runner, "127.0.0.1", 0)
        await tcp.start()
        port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as s:
            async with s.get("http://llmd/v1/models") as resp:  # Host: llmd, no key
                assert resp.status == 200, await resp.text()
            async with s.post("http://llmd/v1/echo", json={"a": 1}) as resp:
                assert resp.status == 200 and await resp.json() == {"echo": {"a": 1}}
        async with aiohttp.ClientSession() as s:
            headers = {"Host": "llmd", "Authorization": f"Bearer {KEY}"}
            async with s.get(f"http://127.0.0.1:{port}/v1/models", headers=headers) as resp:
                assert resp.status == 403
                assert (await envelope(resp))["code"] == "host_not_allowed"
            async with s.get(f"http://127.0.0.1:{port}/v1/models") as resp:
                assert resp.status == 401
    finally:
        await runner.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------- API key


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer nope"}, {"x-api-key": "nope"}, {"Authorization": KEY},
     {"Authorization": "Bearer "}, {"Authorization": f"Basic {KEY}"}],
)  # fmt: skip
async def test_missing_or_wrong_key_is_401_in_openai_shape(headers: dict[str, str]) -> None:
    async with client_for(SecurityConfig(api_key=KEY)) as client:
        resp = await client.post("/v1/echo", json={"x": 1}, headers=headers)
        assert resp.status == 401
        err = await envelope(resp)
        assert client.app[RAN] == []
    assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
    assert "nope" not in err["message"]


@pytest.mark.parametrize(
    "headers",
    [{"Authorization": f"Bearer {KEY}"}, {"Authorization": f"bearer  {KEY} "}, {"x-api-key": KEY}],
)
async def test_the_right_key_passes(headers: dict[str, str]) -> None:
    async with client_for(SecurityConfig(api_key=KEY)) as client:
        resp = await client.post("/v1/echo", json={"x": 1}, headers=headers)
        assert resp.status == 200 and await resp.json() == {"echo": {"x": 1}}


async def test_health_needs_no_key_and_nothing_needs_one_when_unset() -> None:
    async with client_for(SecurityConfig(api_key=KEY)) as client:
        assert (await client.get("/health")).status == 200
        assert (await client.get("/v1/models")).status == 401
    async with client_for(SecurityConfig()) as client:
        assert (await client.get("/v1/models")).status == 200


def test_an_empty_key_is_a_configuration_error() -> None:
    with pytest.raises(ValueError):
        SecurityConfig(api_key="  ")
    with pytest.raises(ValueError):
        SecurityConfig(cors_origins=("localhost:3000",))


# ---------------------------------------------------------------------- CORS


async def test_allowed_origin_gets_cors_headers_on_a_json_response() -> None:
    async with client_for(SecurityConfig(cors_origins=(ORIGIN + "/",))) as client:
        resp = await client.get("/v1/models", headers={"Origin": ORIGIN})
        assert resp.status == 200
    assert resp.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "Origin" in resp.headers["Vary"]


async def test_allowed_origin_gets_cors_headers_on_an_sse_stream() -> None:
    async with client_for(SecurityConfig(cors_origins=(ORIGIN,))) as client:
        resp = await client.get("/v1/stream?n=3", headers={"Origin": ORIGIN})
        body = await resp.text()
    assert resp.status == 200
    assert resp.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert body.endswith("data: 2\n\ndata: [DONE]\n\n")


async def test_allowed_origin_can_read_errors_too() -> None:
    async with client_for(SecurityConfig(cors_origins=(ORIGIN,), api_key=KEY)) as client:
        resp = await client.get("/v1/models", headers={"Origin": ORIGIN})
        assert resp.status == 401
    assert resp.headers["Access-Control-Allow-Origin"] == ORIGIN


async def test_preflight_of_an_allowed_origin_needs_no_key() -> None:
    config = SecurityConfig(cors_origins=(ORIGIN,), api_key=KEY)
    requested = "authorization, content-type, x-stainless-os"
    async with client_for(config) as client:
        resp = await client.options(
            "/v1/echo",
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": requested,
            },
        )
        assert resp.status == 204
        # and the real request that follows, with the key
        real = await client.post(
            "/v1/echo", json={"x": 1}, headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"}
        )
        assert real.status == 200 and real.headers["Access-Control-Allow-Origin"] == ORIGIN
    h = resp.headers
    assert h["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in h["Access-Control-Allow-Methods"]
    assert h["Access-Control-Allow-Headers"] == requested
    assert int(h["Access-Control-Max-Age"]) > 0
    assert "Origin" in h["Vary"]


async def test_preflight_without_requested_headers_lists_the_api_headers() -> None:
    async with client_for(SecurityConfig(cors_origins=("*",))) as client:
        resp = await client.options(
            "/v1/echo",
            headers={"Origin": "https://chat.example", "Access-Control-Request-Method": "POST"},
        )
    assert resp.status == 204
    assert resp.headers["Access-Control-Allow-Origin"] == "https://chat.example"
    allowed = resp.headers["Access-Control-Allow-Headers"].lower()
    assert "authorization" in allowed and "content-type" in allowed


async def test_a_disallowed_origin_is_refused_without_cors_headers() -> None:
    async with client_for(SecurityConfig(cors_origins=(ORIGIN,))) as client:
        pre = await client.options(
            "/v1/echo",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        # a "simple" cross-site POST needs no preflight: it must not run either
        post = await client.post(
            "/v1/echo",
            data=b'{"x": 1}',
            headers={"Origin": "https://evil.example", "Content-Type": "text/plain"},
        )
        err = await envelope(post)
        ran = client.app[RAN]
    for resp in (pre, post):
        assert resp.status == 403
        assert "Access-Control-Allow-Origin" not in resp.headers
    assert err["code"] == "origin_not_allowed" and "--cors-origin" in err["message"]
    assert ran == []


async def test_no_cors_headers_without_an_origin_or_configuration() -> None:
    async with client_for(SecurityConfig(cors_origins=(ORIGIN,))) as client:
        resp = await client.get("/v1/models")
        assert resp.status == 200 and "Access-Control-Allow-Origin" not in resp.headers
    async with client_for(SecurityConfig()) as client:
        resp = await client.get("/v1/models", headers={"Origin": ORIGIN})
        assert resp.status == 403 and "Access-Control-Allow-Origin" not in resp.headers


# ---------------------------------------------------------------------- slow clients

SLOW = SecurityConfig(header_timeout=0.5, body_timeout=0.5)


async def test_a_half_sent_request_head_is_closed() -> None:
    async with tcp_server(SLOW) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        assert await closed_within(reader, 5) < 5
        writer.close()


async def test_a_trickled_head_does_not_extend_the_deadline() -> None:
    async with tcp_server(SLOW) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n")

        async def trickle() -> None:  # one byte every 0.1 s, of a header line never ended
            with contextlib.suppress(ConnectionError, OSError):
                for _ in range(100):
                    writer.write(b"X")
                    await writer.drain()
                    await asyncio.sleep(0.1)

        task = asyncio.create_task(trickle())
        try:
            assert await closed_within(reader, 5) < 5
        finally:
            task.cancel()
            writer.close()


async def test_an_idle_keep_alive_connection_outlives_the_head_timeout() -> None:
    """Waiting between requests is keep-alive's business (75 s), not the head timeout's;
    once the next request has begun, its head is timed again."""
    async with tcp_server(SLOW) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GET_MODELS)
        assert (await read_response(reader))[0] == 200
        await asyncio.sleep(1.2)  # idle: more than twice the head timeout
        writer.write(GET_MODELS)
        assert (await read_response(reader))[0] == 200
        writer.write(b"GET /v1/models HTTP/1.1\r\n")  # then a head that stalls
        assert await closed_within(reader, 5) < 5
        writer.close()


async def test_a_long_stream_is_not_cut() -> None:
    async with tcp_server(SLOW) as (port, _), aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{port}/v1/stream?n=4&gap=0.4") as resp:
            body = await resp.text()
    assert resp.status == 200
    assert body == "".join(f"data: {i}\n\n" for i in range(4)) + "data: [DONE]\n\n"


async def test_a_slow_but_moving_body_is_accepted() -> None:
    payload = json.dumps({"text": "y" * 40}).encode()
    async with tcp_server(SLOW) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/echo HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(payload)
        )
        for i in range(0, len(payload), 10):  # ~1.2 s in all, never 0.5 s without a byte
            writer.write(payload[i : i + 10])
            await writer.drain()
            await asyncio.sleep(0.2)
        status, _, body = await read_response(reader)
        writer.close()
    assert status == 200 and json.loads(body) == {"echo": {"text": "y" * 40}}


async def test_a_stalled_body_is_408_in_the_envelope() -> None:
    async with tcp_server(SLOW) as (port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/echo HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"text": "'
        )
        status, _, body = await read_response(reader)
        writer.close()
        ran = app[RAN]
    assert status == 408
    err = json.loads(body)["error"]
    assert err["code"] == "request_timeout" and err["type"] == "invalid_request_error"
    assert ran == []


async def test_body_size_limit_still_answers_413() -> None:
    async with client_for(SecurityConfig(), max_body=1000) as client:
        resp = await client.post("/v1/echo", json={"x": "z" * 5000})
        assert resp.status == 413
        assert (await envelope(resp))["code"] == "request_too_large"


# ---------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("value", "name"),
    [("[::1]:7477", "::1"), ("LocalHost.:80", "localhost"), ("::1", "::1"), ("a.b:1", "a.b")],
)
def test_host_name(value: str, name: str) -> None:
    assert host_name(value) == name


def test_loopback_names() -> None:
    assert all(map(is_loopback_name, ["localhost", "x.localhost", "127.9.9.9", "::1"]))
    assert not any(map(is_loopback_name, ["0.0.0.0", "localhost.com", "10.0.0.1", "::"]))
