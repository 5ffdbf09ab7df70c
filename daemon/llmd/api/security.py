"""Security defaults for the HTTP API: who may talk to the daemon, and how slowly.

llmd listens on loopback, so the threats are other things on this machine and web pages in
the user's browser, not the network:

* DNS rebinding - a page on ``evil.example`` re-resolves its own name to 127.0.0.1 and then
  reads our responses as *same-origin*. The browser still sends ``Host: evil.example``, so
  requests over TCP must name a loopback host (or one the operator allowed): `security_middlewares`.
* Cross-site requests - any page can POST to ``http://localhost:7477`` (a "simple" request
  needs no preflight) and burn the user's CPU, even though it cannot read the answer. Browsers
  mark such requests with ``Origin``; one from an origin the operator did not allow is refused
  with 403 before anything runs. Allowed origins get CORS headers (`install_cors`), on errors
  and SSE streams too, so their pages can read the answers.
* Other users on a shared machine - an optional API key (``Authorization: Bearer KEY`` or
  ``x-api-key: KEY``) for TCP. The Unix socket (0600 in a 0700 dir) is already private to
  its owner, so it is exempt from the key, the Host and the Origin checks: the CLI talks over
  it with ``Host: llmd`` and no key, and no browser can reach a Unix socket.
* Slow clients (slowloris) - aiohttp bounds idle keep-alive connections but not a request
  head or body that trickles in. `make_runner` closes a connection whose request head is not
  complete ``header_timeout`` seconds after it opened (or after its first byte, once a
  connection is reused); the middleware reads each request body up front and answers 408 when
  the client sends nothing for ``body_timeout`` seconds. Responses are never timed: an SSE
  stream may run for minutes.

Wiring (server.py)::

    app = web.Application(client_max_size=max_body,
                          middlewares=[error_middleware, *security_middlewares(cfg), ...])
    install_cors(app, cfg)
    runner = make_runner(app, cfg, handler_cancellation=True, access_log=None)
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from llmd.errors import ApiError

log = logging.getLogger("llmd.security")

DEFAULT_HEADER_TIMEOUT = 10.0
"""Seconds a client has to send a complete request head (Go's ReadHeaderTimeout idea)."""
DEFAULT_BODY_TIMEOUT = 30.0
"""Seconds a request body may stall (no bytes at all) before the request fails with 408."""
DEFAULT_KEEPALIVE_TIMEOUT = 75.0
"""Seconds an idle keep-alive connection stays open (aiohttp's own default is an hour)."""

CORS_METHODS = "GET, POST, DELETE, OPTIONS"
CORS_DEFAULT_HEADERS = (
    "Authorization, Content-Type, X-Llmd-Session-Id, x-api-key, anthropic-version, anthropic-beta"
)
CORS_MAX_AGE = "600"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class SecurityConfig:
    """What the operator chose (`llmd serve --allow-host/--cors-origin/--api-key`).

    allowed_hosts: Host names accepted over TCP besides loopback ones (compared without port,
        case-insensitively); ``*`` accepts any Host - for a deliberate exposure behind a proxy.
    cors_origins: exact browser origins (``http://localhost:3000``) whose pages may call the
        API, or ``*`` for any.
    api_key: when set, required on every TCP request except ``GET /health`` and CORS
        preflights; surrounding whitespace is dropped, as it is from what clients send. An
        empty key is a ValueError: no client could send it, so it would lock every TCP client
        out - map an empty ``LLMD_API_KEY`` to None instead.
    header_timeout, body_timeout, keepalive_timeout: see the module docstring; None turns the
        first two off.
    """

    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    api_key: str | None = None
    header_timeout: float | None = DEFAULT_HEADER_TIMEOUT
    body_timeout: float | None = DEFAULT_BODY_TIMEOUT
    keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key is empty; pass None for no key")
        for origin in self.cors_origins:
            if origin != "*" and "://" not in origin:
                raise ValueError(
                    f"CORS origin {origin!r} is not an origin like http://localhost:3000 or '*'"
                )
        # Normalised once, so each request is checked with plain membership tests.
        if self.api_key is not None:
            object.__setattr__(self, "api_key", self.api_key.strip())
        object.__setattr__(
            self,
            "allowed_hosts",
            tuple(h if h == "*" else host_name(h) for h in self.allowed_hosts),
        )
        object.__setattr__(
            self,
            "cors_origins",
            tuple(o if o == "*" else o.rstrip("/").lower() for o in self.cors_origins),
        )

    def host_allowed(self, host_header: str | None) -> bool:
        """Whether a TCP request with this Host header may proceed. An absent or empty Host
        passes: DNS rebinding needs a browser, and browsers always send the page's host."""
        if not host_header or "*" in self.allowed_hosts:
            return True
        name = host_name(host_header)
        return is_loopback_name(name) or name in self.allowed_hosts

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.cors_origins or origin.rstrip("/").lower() in self.cors_origins


def host_name(value: str) -> str:
    """The name in a Host header, lower-case, without port, IPv6 brackets or a trailing dot:
    ``[::1]:7477`` -> ``::1``, ``LocalHost.:80`` -> ``localhost``. A malformed bracket form is
    returned as is, so it matches nothing."""
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        if end == -1 or (v[end + 1 :] and not v[end + 1 :].startswith(":")):
            return v
        name = v[1:end]
    elif v.count(":") == 1:
        name = v.split(":", 1)[0]
    else:  # a bare name, or an unbracketed IPv6 literal
        name = v
    return name.rstrip(".")


def is_loopback_name(name: str) -> bool:
    """``localhost``, any ``*.localhost`` (RFC 6761: browsers resolve those to loopback
    themselves, so an attacker's DNS cannot point them elsewhere), 127.0.0.0/8 and ``::1``
    (also as ``::ffff:127.x.y.z``). Not ``0.0.0.0``: browsers have routed it to this machine,
    and no legitimate client names it."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def is_unix_socket_request(request: web.BaseRequest) -> bool:
    """Whether the request came over a Unix socket. The transport's socket family says so
    directly; its peer name (``''`` for an unnamed Unix client, a tuple for TCP) is the
    fallback for transports that expose no socket."""
    transport = request.transport
    if transport is None:  # the client is gone; treat it as the stricter TCP
        return False
    sock = transport.get_extra_info("socket")
    family = getattr(sock, "family", None)
    if family is not None:
        return bool(family == getattr(socket, "AF_UNIX", object()))
    return isinstance(transport.get_extra_info("peername"), str)


# ---------------------------------------------------------------------- middleware


def security_middlewares(config: SecurityConfig) -> list[Middleware]:
    """Middlewares to put right after the error middleware, which renders what they raise
    as the OpenAI envelope. In order, per request:

    1. Host (TCP only): not loopback and not allowed -> 403 ``host_not_allowed``.
    2. Origin (TCP only): an ``Origin`` not in ``cors_origins`` -> 403 ``origin_not_allowed``.
       The browser would hide the response from such a page anyway, so only requests whose
       effects (a generation) are the attack are lost. An allowed origin's preflight
       (``OPTIONS`` with ``Access-Control-Request-Method``) is answered here with 204, before
       the key check: browsers never send credentials on a preflight.
    3. API key (TCP only, when configured), except ``GET``/``HEAD /health`` -> 401
       ``invalid_api_key``.
    4. The body, read with `read_body` under ``body_timeout`` (408 ``request_timeout`` when it
       stalls) and cached by aiohttp, so handlers' ``request.read()``/``json()`` return it at
       once. Done after the checks, so refused clients cannot make us buffer anything.
    """

    @web.middleware
    async def security(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not is_unix_socket_request(request):
            _check_host(request, config)
            origin = request.headers.get("Origin")
            if origin is not None and not config.origin_allowed(origin):
                raise ApiError(
                    403,
                    f"Origin {origin[:200]!r} is not allowed to use this API. Start llmd with "
                    f"--cors-origin {origin[:200]} to let web pages from it call it.",
                    code="origin_not_allowed",
                )
            if origin is not None and _is_preflight(request):
                return _preflight_response(request, origin)
            _check_api_key(request, config)
        if request.body_exists and config.body_timeout is not None:
            await read_body(request, config.body_timeout)
        return await handler(request)

    return [security]


def _check_host(request: web.BaseRequest, config: SecurityConfig) -> None:
    host = request.headers.get("Host")
    if config.host_allowed(host):
        return
    assert host is not None
    shown = host_name(host)[:200]
    raise ApiError(
        403,
        f"Host {shown!r} is not allowed: llmd answers only requests addressed to localhost, "
        f"127.0.0.1 or ::1 (a defence against DNS rebinding). If you reach it under this name "
        f"on purpose, start it with --allow-host {shown}.",
        code="host_not_allowed",
    )


def _check_api_key(request: web.BaseRequest, config: SecurityConfig) -> None:
    if config.api_key is None:
        return
    if request.path == "/health" and request.method in ("GET", "HEAD"):
        return  # liveness probes and `llmd status` need no secret, and it reveals none
    sent = _sent_key(request)
    if sent is None:
        raise ApiError(
            401,
            "Missing API key: this llmd requires one. Send it as 'Authorization: Bearer KEY' "
            "(or 'x-api-key: KEY').",
            type="authentication_error",
            code="invalid_api_key",
        )
    # Compared as bytes in constant time: a str compare_digest rejects non-ASCII outright.
    if not hmac.compare_digest(sent.encode(), config.api_key.encode()):
        raise ApiError(
            401,
            "Incorrect API key provided.",
            type="authentication_error",
            code="invalid_api_key",
        )


def _sent_key(request: web.BaseRequest) -> str | None:
    auth = request.headers.get("Authorization")
    if auth is not None:
        scheme, _, value = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    key = request.headers.get("x-api-key")
    if key is not None and key.strip():
        return key.strip()
    return None


# ---------------------------------------------------------------------- CORS


def _is_preflight(request: web.BaseRequest) -> bool:
    return request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers


def _preflight_response(request: web.BaseRequest, origin: str) -> web.Response:
    """204 for an allowed origin's preflight. The requested headers are echoed rather than
    listed, because SDKs add their own (the OpenAI JS SDK sends ``x-stainless-*``) and the
    origin is trusted by configuration; a fixed list is the fallback."""
    requested = request.headers.get("Access-Control-Request-Headers", "").strip()
    headers = {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Methods": CORS_METHODS,
        "Access-Control-Allow-Headers": requested or CORS_DEFAULT_HEADERS,
        "Access-Control-Max-Age": CORS_MAX_AGE,
        "Vary": "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
    }
    # Chrome's Private Network Access: a public page calling localhost asks for this first.
    if request.headers.get("Access-Control-Request-Private-Network", "").lower() == "true":
        headers["Access-Control-Allow-Private-Network"] = "true"
    return web.Response(status=204, headers=headers)


def install_cors(app: web.Application, config: SecurityConfig) -> None:
    """Add ``Access-Control-Allow-Origin`` (the request's origin) and ``Vary: Origin`` to
    every response for an allowed origin, errors included: a page cannot even read a 401
    without them. A signal (``on_response_prepare``) rather than a middleware, because it
    runs as each response's headers are sent - after the outer error middleware has built
    its envelope, and before the first event of an SSE stream, whose headers a middleware
    could no longer touch. A no-op when no origin is configured. Call before the app starts."""
    if not config.cors_origins:
        return

    async def add_cors_headers(request: web.BaseRequest, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin is None or not config.origin_allowed(origin):
            return
        response.headers["Access-Control-Allow-Origin"] = origin
        vary = response.headers.get("Vary", "")
        if "origin" not in vary.lower():
            response.headers["Vary"] = f"{vary}, Origin" if vary else "Origin"

    app.on_response_prepare.append(add_cors_headers)


# ---------------------------------------------------------------------- slow clients


async def read_body(
    request: web.BaseRequest, timeout: float | None = DEFAULT_BODY_TIMEOUT
) -> bytes:
    """``request.read()`` that fails with 408 ``request_timeout`` once the client has sent no
    body bytes for `timeout` seconds. The clock restarts with every byte, so a large body on a
    slow link is fine; only a stall is not. The body size limit (413) is aiohttp's, and the
    bytes stay cached on the request, so later ``request.read()`` calls return them."""
    if timeout is None:
        return await request.read()
    loop = asyncio.get_running_loop()
    reader = asyncio.ensure_future(request.read())
    seen = request.content.total_bytes
    last_progress = loop.time()
    try:
        while True:
            # Polled rather than re-armed per chunk: request.read() does the reading (and the
            # size limit), and progress shows as the stream's byte count. A stall is noticed
            # between `timeout` and 1.25 x `timeout`.
            done, _ = await asyncio.wait({reader}, timeout=timeout / 4)
            if done:
                return reader.result()
            now_seen = request.content.total_bytes
            if now_seen != seen:
                seen, last_progress = now_seen, loop.time()
            elif loop.time() - last_progress >= timeout:
                raise ApiError(
                    408,
                    f"The request body stalled: nothing arrived for {timeout:g} s. "
                    "Send the whole body without pausing.",
                    code="request_timeout",
                )
    finally:
        if not reader.done():
            reader.cancel()


# aiohttp calls RequestHandler._handle_request once per request, from the complete head to
# the written response. The head timer needs that to know a request is under way; without
# it the timer could cut a running response, so make_runner then leaves the timer out.
_CAN_TIME_HEADS = callable(getattr(RequestHandler, "_handle_request", None))


class _HeadTimeoutHandler(RequestHandler):
    """aiohttp's connection protocol plus one timer: armed when the connection opens and at
    the first byte after each finished request, cancelled when a request head is complete;
    if it fires first the connection is closed. Bytes that arrive while a request runs (its
    body) never arm it, and it is never armed while a response is being produced, so long
    SSE responses are untouched. An idle keep-alive connection that sends nothing is left to
    ``keepalive_timeout``. Known gap: a partial head pipelined *behind* a running request is
    only bounded by aiohttp's keep-alive timer, which closes a connection that is still
    waiting for a head when it expires."""

    def __init__(self, manager: web.Server, *, head_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._llmd_head_timeout = head_timeout
        self._llmd_head_timer: asyncio.TimerHandle | None = None
        self._llmd_busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._llmd_arm()

    def data_received(self, data: bytes) -> None:
        if data and not self._llmd_busy and self._llmd_head_timer is None:
            self._llmd_arm()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._llmd_disarm()
        super().connection_lost(exc)

    async def _handle_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        self._llmd_busy = True
        self._llmd_disarm()
        try:
            return await super()._handle_request(request, *args, **kwargs)
        finally:
            self._llmd_busy = False

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request its HTTP parser refused (bad framing, an over-long
        header line), in the OpenAI error envelope instead of text/plain: the path of a
        request that could not be parsed is unknown, so no protocol's own shape applies."""
        resp = super().handle_error(request, status, exc, message)
        if status >= 500 or not isinstance(resp, web.Response):
            return resp
        detail = (message or (str(exc) if exc else "") or "bad request").strip()
        error = {"message": f"malformed HTTP request: {detail}", "type": "invalid_request_error"}
        json_resp = web.json_response(
            {"error": {**error, "param": None, "code": "bad_http_request"}}, status=status
        )
        json_resp.force_close()
        return json_resp

    def _llmd_arm(self) -> None:
        self._llmd_disarm()
        loop = asyncio.get_running_loop()
        self._llmd_head_timer = loop.call_later(self._llmd_head_timeout, self._llmd_expired)

    def _llmd_disarm(self) -> None:
        if self._llmd_head_timer is not None:
            self._llmd_head_timer.cancel()
            self._llmd_head_timer = None

    def _llmd_expired(self) -> None:
        self._llmd_head_timer = None
        if self._llmd_busy or getattr(self, "_request_in_progress", False):
            return
        log.debug("closing a connection that sent no complete request head in time")
        self.force_close()


class _HeadTimeoutServer(web.Server):
    """aiohttp's Server, making `_HeadTimeoutHandler` protocols. Never constructed: an
    existing Server's class is switched (see `GuardedAppRunner`)."""

    _llmd_head_timeout: float

    def __call__(self) -> RequestHandler:
        return _HeadTimeoutHandler(
            self, loop=self._loop, head_timeout=self._llmd_head_timeout, **self._kwargs
        )


class GuardedAppRunner(web.AppRunner):
    """``web.AppRunner`` whose connections have a request-head timeout. BaseRunner's
    ``_make_server`` is the hook subclasses implement; the Server that AppRunner builds is
    kept whole (its request factory, handler kwargs, cancellation setting) and only its
    protocol factory is swapped, by switching its class to a subclass with no state of its
    own. If a future aiohttp builds something else, the runner works without the timer."""

    def __init__(
        self, app: web.Application, *, header_timeout: float | None, **kwargs: Any
    ) -> None:
        super().__init__(app, **kwargs)
        self._llmd_header_timeout = header_timeout

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        if self._llmd_header_timeout is None:
            return server
        if type(server) is not web.Server or not _CAN_TIME_HEADS:
            log.warning("this aiohttp cannot time request heads; slow clients are unbounded")
            return server
        server.__class__ = _HeadTimeoutServer
        server._llmd_head_timeout = self._llmd_header_timeout  # type: ignore[attr-defined]
        return server


def make_runner(app: web.Application, config: SecurityConfig, **kwargs: Any) -> web.AppRunner:
    """The AppRunner for `app` with the slow-client limits of `config`: request heads within
    ``header_timeout``, idle keep-alive connections closed after ``keepalive_timeout``.
    Other AppRunner kwargs (``handler_cancellation``, ``access_log``) pass through."""
    kwargs.setdefault("keepalive_timeout", config.keepalive_timeout)
    return GuardedAppRunner(app, header_timeout=config.header_timeout, **kwargs)
