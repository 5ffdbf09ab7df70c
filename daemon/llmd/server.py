"""HTTP API (aiohttp): OpenAI-compatible routes on TCP and a Unix socket.

Routes: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``,
``POST /v1/completions`` (streaming as SSE ending in ``data: [DONE]``, or one JSON body).
Handlers only translate between HTTP and the generation pipeline (generation.py); errors
always leave in the OpenAI envelope with the right status, and an error after a stream has
started is one ``data: {"error": ...}`` event, then the stream ends. A client that goes away
mid-generation cancels its request in the worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from . import __version__
from . import protocol as p
from .catalog import load_catalog
from .chat_template import render_chat
from .errors import ApiError, bad_request, server_error
from .generation import Finished, generate_text, token_budget
from .instance import AlreadyRunning, InstanceLock, lock_path
from .keep_alive import DEFAULT_KEEP_ALIVE
from .limits import DEFAULT_MAX_LOADED, DEFAULT_QUEUE_LIMIT
from .model_registry import ModelRegistry
from .openai_schemas import ChatCompletionRequest, CompletionRequest, SamplingFields, parse_request
from .paths import Paths, ensure_private_dir
from .security import SecurityConfig, install_cors, make_runner, security_middlewares
from .sessions import DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_TTL, Session, SessionTable
from .store import ModelStore
from .supervisor import ModelSupervisor, RestartPolicy
from .worker_client import Accepted, WorkerError, WorkerLauncher

log = logging.getLogger("llmd.server")

DEFAULT_MAX_BODY = 16 * 1024 * 1024
REGISTRY = web.AppKey("registry", ModelRegistry)
SESSIONS = web.AppKey("sessions", SessionTable)
STARTED = web.AppKey("started", float)
DRAINING = web.AppKey("draining", asyncio.Event)
ADDRESSES = web.AppKey("addresses", list)
SECURITY = web.AppKey("security", SecurityConfig)
_SESSION_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
STORE = web.AppKey("store", ModelStore)


# ---------------------------------------------------------------------- errors


def _error_response(err: ApiError) -> web.Response:
    return web.json_response(err.envelope(), status=err.status)


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        return _error_response(err)
    except web.HTTPException as exc:
        if exc.status == 413:
            return _error_response(
                ApiError(413, "request body too large", code="request_too_large")
            )
        if exc.status < 400:
            raise
        kind = "not_found" if exc.status == 404 else "invalid_request_error"
        return _error_response(ApiError(exc.status, exc.reason or "error", type=kind))
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - the daemon keeps serving whatever went wrong
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _error_response(server_error(f"internal error: {exc}"))


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from exc


# ---------------------------------------------------------------------- helpers


def _sampling(req: SamplingFields) -> p.SamplingParams:
    return p.SamplingParams(
        temperature=req.temperature,
        top_k=req.top_k,
        top_p=req.top_p,
        min_p=req.min_p,
        seed=req.seed,
    )


def _usage(done: Finished) -> dict[str, Any]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    }


async def _sse_start(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await resp.prepare(request)
    return resp


async def _sse_send(resp: web.StreamResponse, payload: Any) -> None:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    await resp.write(f"data: {data}\n\n".encode())


async def _stream(
    request: web.Request,
    pieces: AsyncIterator[Accepted | str | Finished],
    make_chunk: Callable[[str | None, str | None], dict[str, Any]],
    include_usage: bool,
    first: dict[str, Any] | None,
) -> web.StreamResponse:
    try:
        # Until the worker has the request (429 when full), errors are plain HTTP statuses.
        if not isinstance(await anext(pieces), Accepted):
            raise RuntimeError("generation did not start with ACCEPTED")
        resp = await _sse_start(request)
        try:
            if first is not None:
                await _sse_send(resp, first)
            async for piece in pieces:
                if isinstance(piece, Finished):
                    await _sse_send(resp, make_chunk(None, piece.finish_reason))
                    if include_usage:
                        final = make_chunk(None, None)
                        final["choices"] = []
                        final["usage"] = _usage(piece)
                        await _sse_send(resp, final)
                elif isinstance(piece, str):
                    await _sse_send(resp, make_chunk(piece, None))
            await _sse_send(resp, "[DONE]")
        except ApiError as err:
            # The stream has started: the error travels as one SSE event, then it ends.
            await _sse_send(resp, err.envelope())
        except ConnectionResetError:  # aiohttp's ClientConnectionResetError is one too
            # The client went away; closing `pieces` (below) cancels the request in the worker.
            log.info("client disconnected from %s mid-stream", request.path)
            return resp
        except Exception as exc:  # noqa: BLE001 - a started stream can only report, not re-status
            log.exception("error while streaming %s", request.path)
            await _sse_send(resp, server_error(f"internal error: {exc}").envelope())
    finally:
        await pieces.aclose()  # type: ignore[attr-defined]
    await resp.write_eof()
    return resp


async def _collect(pieces: AsyncIterator[Accepted | str | Finished]) -> tuple[str, Finished]:
    text: list[str] = []
    done: Finished | None = None
    try:
        async for piece in pieces:
            if isinstance(piece, Finished):
                done = piece
            elif isinstance(piece, str):
                text.append(piece)
    finally:
        await pieces.aclose()  # type: ignore[attr-defined]  # client gone: cancel in worker
    assert done is not None
    return "".join(text), done


# ---------------------------------------------------------------------- routes


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "version": __version__})


async def status(request: web.Request) -> web.Response:
    """What the daemon is doing: each loaded model (state, worker, backend, device, memory,
    last use and unload deadline, restarts and last error, warmup, its engine's live
    counters) and the named sessions. `llmd status` and `llmd ps` read the same."""
    models = []
    for model in request.app[REGISTRY].loaded():
        entry = model.describe()
        worker = model.worker
        if worker is not None and worker.dead is None:
            try:
                stats = await worker.stats(timeout=5.0)
                entry["engine"] = {**stats.model_dump(exclude={"type", "extra"}), **stats.extra}
            except Exception as exc:  # noqa: BLE001 - a busy or dead worker is reported
                entry["engine_error"] = str(exc)
        models.append(entry)
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
        }
    )


async def list_models(request: web.Request) -> web.Response:
    """Installed models plus catalog models served from an installed package."""
    store = request.app[STORE]
    names = {r.name: r for r in store.list()}
    for name in load_catalog():
        if name not in names:
            record = store.resolve(name)
            if record is not None:
                names[name] = record
    data = [
        {"id": name, "object": "model", "created": int(r.modified), "owned_by": "llmd"}
        for name, r in sorted(names.items())
    ]
    return web.json_response({"object": "list", "data": data})


def _session_pieces(
    request: web.Request,
    req: SamplingFields,
    model: ModelSupervisor,
    make_pieces: Callable[[str], AsyncIterator[Accepted | str | Finished]],
) -> AsyncIterator[Accepted | str | Finished]:
    """The generation, inside the request's named session if it has one (`session_id` in the
    body or an `X-Session-Id` header): its KV stays pinned in the worker after it ends."""
    sid = req.session_id or request.headers.get("X-Session-Id")
    if not sid:
        return make_pieces("")
    if not _SESSION_ID.match(sid):
        raise bad_request("X-Session-Id must be 1-128 letters, digits or ._:@-", param="session_id")
    table = request.app[SESSIONS]
    session = table.begin(sid, req.model, model, req.session_ttl)
    return _in_session(make_pieces(sid), table, session)


async def _in_session(
    pieces: AsyncIterator[Accepted | str | Finished], table: SessionTable, session: Session
) -> AsyncIterator[Accepted | str | Finished]:
    try:
        async for piece in pieces:
            yield piece
    finally:
        await pieces.aclose()  # type: ignore[attr-defined]
        await table.end(session)


async def list_sessions(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": request.app[SESSIONS].list()})


async def delete_session(request: web.Request) -> web.Response:
    sid = request.match_info["session_id"]
    if not await request.app[SESSIONS].delete(sid):
        raise ApiError(404, f"no session '{sid}'", param="session_id", code="session_not_found")
    return web.json_response({"id": sid, "object": "session", "deleted": True})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    req: ChatCompletionRequest = parse_request(await _json_body(request), ChatCompletionRequest)
    async with request.app[REGISTRY].use(req.model, req.keep_alive_seconds()) as model:
        return await _chat(request, req, model)


async def _chat(
    request: web.Request, req: ChatCompletionRequest, model: ModelSupervisor
) -> web.StreamResponse:
    if not model.text.chat_template:
        raise bad_request(
            f"model '{req.model}' has no chat template; use /v1/completions", param="model"
        )
    messages = [m.for_template() for m in req.messages]
    template = model.text.chat_template

    def build_prompt() -> list[int]:
        rendered = render_chat(
            template, messages, bos_token=model.text.bos_token, eos_token=model.text.eos_token
        )
        return model.text.encode_rendered_chat(rendered)

    # Off the event loop: a long prompt must not stall other clients' streams.
    prompt = await asyncio.to_thread(build_prompt)
    requested, limit_param = req.token_limit()
    max_tokens = token_budget(
        len(prompt),
        requested,
        model.context_length,
        limit_param=limit_param,
        prompt_param="messages",
    )
    pieces = _session_pieces(
        request,
        req,
        model,
        lambda sid: generate_text(
            model,
            prompt,
            max_tokens=max_tokens,
            sampling=_sampling(req),
            stops=req.stop_list(),
            session=sid,
        ),
    )
    cid = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())

    if req.stream:
        include_usage = req.include_usage()

        def chunk(content: str | None, finish: str | None) -> dict[str, Any]:
            delta = {} if content is None else {"content": content}
            out: dict[str, Any] = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": req.model,
                "system_fingerprint": f"llmd-{__version__}",
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if include_usage:
                out["usage"] = None
            return out

        first = chunk(None, None)
        first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
        return await _stream(request, pieces, chunk, include_usage, first)

    text, done = await _collect(pieces)
    return web.json_response(
        {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": req.model,
            "system_fingerprint": f"llmd-{__version__}",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": done.finish_reason,
                }
            ],
            "usage": _usage(done),
        }
    )


async def completions(request: web.Request) -> web.StreamResponse:
    req: CompletionRequest = parse_request(await _json_body(request), CompletionRequest)
    async with request.app[REGISTRY].use(req.model, req.keep_alive_seconds()) as model:
        return await _complete(request, req, model)


async def _complete(
    request: web.Request, req: CompletionRequest, model: ModelSupervisor
) -> web.StreamResponse:
    prompt = await asyncio.to_thread(model.text.encode, req.prompt_text())
    if not prompt:
        raise bad_request("the prompt is empty", param="prompt")
    max_tokens = token_budget(
        len(prompt),
        req.max_tokens,
        model.context_length,
        limit_param="max_tokens",
        prompt_param="prompt",
    )
    pieces = _session_pieces(
        request,
        req,
        model,
        lambda sid: generate_text(
            model,
            prompt,
            max_tokens=max_tokens,
            sampling=_sampling(req),
            stops=req.stop_list(),
            session=sid,
        ),
    )
    cid = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())

    def chunk(text: str | None, finish: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": req.model,
            "choices": [
                {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            ],
        }
        if req.include_usage():
            out["usage"] = None
        return out

    if req.stream:
        return await _stream(request, pieces, chunk, req.include_usage(), None)
    text, done = await _collect(pieces)
    body = chunk(text, done.finish_reason)
    body["usage"] = _usage(done)
    return web.json_response(body)


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
    restart_policy: RestartPolicy | None = None,
    preload: tuple[str, ...] = (),
    security: SecurityConfig | None = None,
) -> web.Application:
    """The aiohttp app; `worker_launcher` replaces the real worker (tests use a fake one)."""
    security = security or SecurityConfig()
    app = web.Application(
        client_max_size=max_body,
        middlewares=[error_middleware, *security_middlewares(security), drain_middleware],
    )
    app[SECURITY] = security
    install_cors(app, security)
    store = ModelStore(paths)
    app[STORE] = store
    registry = ModelRegistry(
        store,
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
    )
    app[REGISTRY] = registry
    app[STARTED] = time.time()
    app[DRAINING] = asyncio.Event()
    app[ADDRESSES] = []
    app.router.add_get("/health", health)
    app.router.add_get("/status", status)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/sessions", list_sessions)
    app.router.add_delete("/v1/sessions/{session_id}", delete_session)
    sessions = SessionTable(default_ttl=session_ttl, max_sessions=max_sessions)
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
    while registry.in_flight() and time.monotonic() < deadline:
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
