"""The daemon's HTTP app (aiohttp) on TCP and a Unix socket, and its life from start to
drained stop.

Routes here: ``GET /health``, ``GET /status``, ``GET /v1/models`` (and ``/v1/models/{id}``),
``GET /v1/sessions``,
``DELETE /v1/sessions/{id}``, ``GET /metrics`` (metrics.py); the OpenAI generation routes live
in openai_routes.py. Errors always leave in the OpenAI envelope with the right status.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from llmd import __version__
from llmd.api.anthropic_messages import add_anthropic_routes
from llmd.api.embedding_routes import add_embedding_routes
from llmd.api.http_common import (
    ADDRESSES,
    BODY_READ_ERRORS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_STREAM_KEEPALIVE,
    DRAINING,
    IMAGE_POLICY,
    REGISTRY,
    SECURITY,
    SESSIONS,
    STARTED,
    STORE,
    STREAM_KEEPALIVE,
    body_read_error,
    error_shape_for,
)
from llmd.api.infill_api import add_infill_routes
from llmd.api.instance import AlreadyRunning, InstanceLock, lock_path
from llmd.api.memory_trim import trim_after_big_bodies
from llmd.api.metrics import add_metrics, metrics_middleware
from llmd.api.model_cards import openai_model
from llmd.api.ollama_embed import add_ollama_embed_routes
from llmd.api.ollama_models import add_ollama_routes
from llmd.api.openai_routes import add_openai_routes
from llmd.api.pull_routes import add_pull_routes
from llmd.api.remote_routes import (
    GATE,
    add_remote_routes,
    find_remote,
    openai_remote_models,
    remote_model_entry,
    remote_status,
)
from llmd.api.responses_api import add_responses_routes
from llmd.api.security import SecurityConfig, install_cors, make_runner, security_middlewares
from llmd.errors import ApiError, server_error
from llmd.limits import DEFAULT_MAX_LOADED, DEFAULT_QUEUE_LIMIT
from llmd.paths import Paths, ensure_private_dir
from llmd.runtime.counters import Metrics
from llmd.runtime.keep_alive import DEFAULT_KEEP_ALIVE
from llmd.runtime.model_registry import ModelRegistry
from llmd.runtime.sessions import DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_TTL, SessionTable
from llmd.runtime.supervisor import ModelSupervisor, RestartPolicy
from llmd.runtime.worker_client import WorkerError, WorkerLauncher
from llmd.store.model_store import ModelStore
from llmd.text.images import ImagePolicy
from llmd.text.text_model import load_served_text_model

log = logging.getLogger("llmd.server")

DEFAULT_MAX_BODY = 16 * 1024 * 1024


# ---------------------------------------------------------------------- errors


def _error_response(err: ApiError, request: web.Request) -> web.Response:
    """In the envelope of the protocol the path belongs to (OpenAI's unless a protocol
    registered its own shape for its routes)."""
    render = error_shape_for(request)
    resp = web.json_response(render(err), status=err.status)
    if err.retry_after is not None:
        resp.headers["Retry-After"] = str(err.retry_after)
    if err.close_connection:
        resp.force_close()
    return resp


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        return _error_response(err, request)
    except web.HTTPException as exc:
        if exc.status == 413:
            return _error_response(
                ApiError(413, "request body too large", code="request_too_large"), request
            )
        if exc.status < 400:
            raise
        kind = "not_found" if exc.status == 404 else "invalid_request_error"
        return _error_response(ApiError(exc.status, exc.reason or "error", type=kind), request)
    except asyncio.CancelledError:
        raise
    except BODY_READ_ERRORS as exc:  # read outside json_body (the security middleware's read)
        return _error_response(body_read_error(request, exc), request)
    except RecursionError:
        log.warning("too deeply nested request on %s %s", request.method, request.path)
        return _error_response(
            ApiError(400, "the request nests too deeply", code="too_deeply_nested"), request
        )
    except Exception as exc:  # noqa: BLE001 - the daemon keeps serving whatever went wrong
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _error_response(server_error(f"internal error: {exc}"), request)


# ---------------------------------------------------------------------- routes


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "version": __version__})


# How long /status waits for a worker's counters: a stopped or wedged worker (SIGSTOP, a long
# GIL-holding call) is reported as such instead of stalling the answer; workers are asked at
# once, so the wait does not grow with the number of models.
STATUS_STATS_TIMEOUT = 1.0


async def _describe(model: ModelSupervisor) -> dict[str, Any]:
    entry = model.describe()
    worker = model.worker
    if worker is not None and worker.dead is None:
        try:
            stats = await worker.stats(timeout=STATUS_STATS_TIMEOUT)
            entry["engine"] = {**stats.model_dump(exclude={"type", "extra"}), **stats.extra}
        except asyncio.TimeoutError:  # not the builtin before Python 3.11
            entry["engine_error"] = f"the worker did not answer within {STATUS_STATS_TIMEOUT} s"
        except Exception as exc:  # noqa: BLE001 - a busy or dead worker is reported
            entry["engine_error"] = str(exc)
    return entry


async def status(request: web.Request) -> web.Response:
    """What the daemon is doing: each loaded model (state, worker, backend, device, memory,
    last use and unload deadline, restarts and last error, warmup, its engine's live
    counters) and the named sessions. `llmd status` and `llmd ps` read the same."""
    models = await asyncio.gather(*(_describe(m) for m in request.app[REGISTRY].loaded()))
    queued = sum(m.get("engine", {}).get("queued_requests", 0) for m in models)
    return web.json_response(
        {
            "version": __version__,
            "pid": os.getpid(),
            "addresses": request.app[ADDRESSES],
            "uptime_s": round(time.time() - request.app[STARTED], 1),
            "draining": request.app[DRAINING].is_set(),
            "requests_in_flight": request.app[REGISTRY].in_flight(),
            "queued_requests": queued,
            "models": models,
            "sessions": request.app[SESSIONS].list(),
            "remotes": await asyncio.to_thread(remote_status, request.app),
        }
    )


async def list_models(request: web.Request) -> web.Response:
    """Installed models plus catalog models served from an installed package, each with its
    served context and capabilities (model_cards.py); off the event loop, as it reads the
    weights' headers the first time."""
    registry = request.app[REGISTRY]

    def entries() -> list[dict[str, Any]]:
        return [openai_model(registry, r) for r in request.app[STORE].served()]

    data = await asyncio.to_thread(entries) + await openai_remote_models(request.app)
    return web.json_response({"object": "list", "data": data})


async def get_model(request: web.Request) -> web.Response:
    """`GET /v1/models/{id}`: one entry of the list, or OpenAI's 404."""
    name = request.match_info["model_id"]
    record = await asyncio.to_thread(request.app[STORE].resolve, name)
    remote = None if record else await asyncio.to_thread(find_remote, request.app, name)
    if remote is not None:
        return web.json_response(remote_model_entry(request.app, remote))
    if record is None:
        raise ApiError(
            404, f"The model '{name}' does not exist", param="model", code="model_not_found"
        )
    entry = await asyncio.to_thread(openai_model, request.app[REGISTRY], record)
    return web.json_response(entry)


async def list_sessions(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": request.app[SESSIONS].list()})


async def delete_session(request: web.Request) -> web.Response:
    sid = request.match_info["session_id"]
    if not await request.app[SESSIONS].delete(sid):
        raise ApiError(404, f"no session '{sid}'", param="session_id", code="session_not_found")
    return web.json_response({"id": sid, "object": "session", "deleted": True})


# ---------------------------------------------------------------------- app


@web.middleware
async def drain_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """While the daemon drains (llmd stop, SIGTERM), running requests finish and new work is
    refused with 503, so a client retries elsewhere instead of being cut off half-way."""
    if request.app[DRAINING].is_set() and request.method == "POST":
        raise server_error(
            "llmd is shutting down; retry once it is back", code="shutting_down", status=503
        )
    return await handler(request)


def create_app(
    paths: Paths,
    *,
    max_body: int = DEFAULT_MAX_BODY,
    context_length: int | None = None,
    threads: int | None = None,
    worker_launcher: WorkerLauncher | None = None,
    queue_limit: int | None = DEFAULT_QUEUE_LIMIT,
    kv_budget_bytes: int | None = None,
    max_sequences: int | None = None,
    session_ttl: float = DEFAULT_SESSION_TTL,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    session_sweep_interval: float = 1.0,
    keep_alive: float = DEFAULT_KEEP_ALIVE,
    max_loaded: int = DEFAULT_MAX_LOADED,
    memory_budget: int | None = None,
    speculative_max_draft: int = 0,
    speculative_drafter: str = "ngram",
    draft_model: str | None = None,
    restart_policy: RestartPolicy | None = None,
    preload: tuple[str, ...] = (),
    security: SecurityConfig | None = None,
    stream_keepalive: float = DEFAULT_STREAM_KEEPALIVE,
    default_max_tokens: int | None = None,
    kv_type: str | None = None,
    kv_disk_bytes: int = 0,
    allow_remote_images: bool = False,
) -> web.Application:
    """The aiohttp app; `worker_launcher` replaces the real worker (tests use a fake one)."""
    security = security or SecurityConfig()
    app = web.Application(
        client_max_size=max_body,
        middlewares=[
            metrics_middleware,  # outermost: it counts the statuses the others produce
            error_middleware,
            *security_middlewares(security),
            drain_middleware,
            trim_after_big_bodies,
        ],
    )
    app[SECURITY] = security
    install_cors(app, security)
    store = ModelStore(paths)
    app[STORE] = store
    add_remote_routes(app)
    registry = ModelRegistry(
        store,
        load_text=load_served_text_model,
        context_length=context_length,
        threads=threads,
        launcher=worker_launcher,
        queue_limit=queue_limit,
        kv_budget_bytes=kv_budget_bytes,
        max_sequences=max_sequences,
        policy=restart_policy,
        keep_alive=keep_alive,
        max_loaded=max_loaded,
        memory_budget=memory_budget,
        speculative_max_draft=speculative_max_draft,
        speculative_drafter=speculative_drafter,
        draft_model=draft_model,
        kv_type=kv_type,
        kv_disk_bytes=kv_disk_bytes,
        kv_disk_dir=str(paths.kv_disk),
    )
    app[REGISTRY] = registry
    registry.metrics = Metrics()
    add_metrics(app, registry.metrics)
    app[STARTED] = time.time()
    app[STREAM_KEEPALIVE] = stream_keepalive
    app[DEFAULT_MAX_TOKENS] = default_max_tokens
    app[IMAGE_POLICY] = ImagePolicy(allow_remote=allow_remote_images)
    app[DRAINING] = asyncio.Event()
    app[ADDRESSES] = []
    app.router.add_get("/health", health)
    app.router.add_get("/status", status)
    app.router.add_get("/v1/models", list_models)
    add_openai_routes(app)
    add_pull_routes(app)
    add_responses_routes(app)
    add_ollama_routes(app)
    add_anthropic_routes(app)
    add_infill_routes(app)
    add_embedding_routes(app)
    add_ollama_embed_routes(app)
    # After the routes it would shadow (GET /v1/models/pulls): names may hold slashes.
    app.router.add_get("/v1/models/{model_id:.+}", get_model)
    app.router.add_get("/v1/sessions", list_sessions)
    app.router.add_delete("/v1/sessions/{session_id}", delete_session)
    sessions = SessionTable(
        default_ttl=session_ttl, max_sessions=max_sessions, saved=paths.data / "sessions.json"
    )
    if restored := sessions.restore():
        log.info("%d named session(s) restored; their KV loads from the disk tier", restored)
    app[SESSIONS] = sessions
    registry.pinned_until = sessions.pinned_until

    async def background(app: web.Application) -> AsyncIterator[None]:
        tasks = [
            asyncio.create_task(sessions.run_expiry(session_sweep_interval)),
            asyncio.create_task(registry.run_keep_alive(session_sweep_interval)),
            *(asyncio.create_task(_preload(registry, name)) for name in preload),
        ]
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        sessions.save()

    app.cleanup_ctx.append(background)

    async def close_workers(app: web.Application) -> None:
        await registry.close()

    app.on_cleanup.append(close_workers)
    return app


async def _preload(registry: ModelRegistry, name: str) -> None:
    """`--preload NAME`: load and warm up at start; kept loaded until the daemon stops."""
    try:
        await registry.get(name, keep_alive=math.inf)
    except ApiError as exc:
        log.error("preloading %s failed: %s", name, exc.message)


async def drain(app: web.Application, timeout: float) -> None:
    """Refuse new work, let running requests finish for up to `timeout` seconds, then end
    the rest with a clear error (an SSE error event or a 503) by stopping the workers."""
    app[DRAINING].set()
    registry = app[REGISTRY]
    deadline = time.monotonic() + timeout
    if registry.in_flight():
        log.info("draining %d request(s) for up to %.0f s", registry.in_flight(), timeout)
    while (registry.in_flight() or app[GATE].in_flight()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if registry.in_flight():
        log.warning(
            "%d request(s) still running after %.0f s: ending them", registry.in_flight(), timeout
        )
    await registry.close(
        WorkerError("shutting_down", "llmd is shutting down; retry once it is back")
    )
    for _ in range(40):  # the handlers deliver those errors before connections close
        if not registry.in_flight():
            break
        await asyncio.sleep(0.05)


def _socket_answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def prepare_socket(paths: Paths) -> str:
    """The socket path, in a private (0700) directory, with any stale socket removed. A live
    daemon's socket is never taken over."""
    sock = paths.socket
    ensure_private_dir(sock.parent)
    if sock.exists() or sock.is_symlink():
        if _socket_answers(str(sock)):
            raise AlreadyRunning(f"another llmd is already serving on unix:{sock}")
        sock.unlink()
    return str(sock)


async def serve(
    paths: Paths, host: str, port: int, *, drain_timeout: float = 30.0, **app_options: Any
) -> None:
    """Run until SIGINT/SIGTERM: TCP on host:port and the Unix socket (0600 in a 0700 dir).
    One daemon per home (an exclusive lock). Shutdown drains running requests for up to
    `drain_timeout` seconds (a second signal cuts that short), stops every worker and removes
    the socket."""
    lock = InstanceLock(lock_path(paths)).acquire()
    try:
        await _serve_locked(paths, host, port, drain_timeout, app_options)
    finally:
        lock.release()


async def _serve_locked(
    paths: Paths, host: str, port: int, drain_timeout: float, app_options: dict[str, Any]
) -> None:
    sock = prepare_socket(paths)
    app = create_app(paths, **app_options)
    runner = make_runner(app, app[SECURITY], handler_cancellation=True, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():  # a second signal: stop waiting for running requests
            drain_timeout_cut.set()
        stop.set()

    drain_timeout_cut = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        tcp = web.TCPSite(runner, host, port)
        await tcp.start()
        # Created with a private umask so the socket is never briefly open to others.
        old_umask = os.umask(0o177)
        try:
            await web.UnixSite(runner, sock).start()
        finally:
            os.umask(old_umask)
        os.chmod(sock, 0o600)
        tcp_addresses = [a for a in runner.addresses if isinstance(a, tuple)]
        actual_port = tcp_addresses[0][1] if tcp_addresses else port  # --port 0 picks one
        url_host = f"[{host}]" if ":" in host else host
        app[ADDRESSES].extend([f"http://{url_host}:{actual_port}", f"unix:{sock}"])
        print(
            f"llmd {__version__} listening on http://{url_host}:{actual_port} and unix:{sock}",
            flush=True,
        )
        await stop.wait()
        log.info("shutting down")
        drain_task = asyncio.create_task(drain(app, drain_timeout))
        cut = asyncio.create_task(drain_timeout_cut.wait())
        await asyncio.wait({drain_task, cut}, return_when=asyncio.FIRST_COMPLETED)
        cut.cancel()
        if not drain_task.done():
            drain_task.cancel()
            await app[REGISTRY].close()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
        if os.path.exists(sock):
            os.unlink(sock)
