"""The HTTP side of remote models (remotes.py): managing them (``GET``/``POST /v1/remotes``,
``DELETE /v1/remotes/{name}``), listing them with the local models, sending
`/v1/chat/completions` and `/v1/completions` for them to their upstream as they are
(remote_forward.py), handing the other generation protocols (Anthropic Messages, Responses,
Ollama's chat and generate) a pipeline-shaped run of the upstream's answer (remote_chat.py),
and a clear 400 on the protocols that have no remote counterpart (embeddings, reranking,
infill).

A local model always wins over a remote of the same name (adding such a remote is refused,
but a model pulled later under a remote's name takes it over): a name never silently starts
going to another machine.

Adding and removing remotes over HTTP is only accepted over the Unix socket (the CLI's way
in, private to the user; 403 over TCP). Where a model name's requests go, with the prompts in
them, is the owner's decision: over TCP anyone holding llmd's own key, or any local user when
there is none, could otherwise register a remote called like a model the user's agents ask for
and receive their prompts, or name an API-key variable and have the daemon send them the value
of any variable in its environment. Listing (GET) is open: it holds no secret.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from llmd.api.http_common import METRICS, STORE, json_body
from llmd.api.remote_forward import Forwarded, forward
from llmd.api.security import is_unix_socket_request
from llmd.errors import ApiError, bad_request
from llmd.runtime.remote_health import add_health_checks
from llmd.runtime.remote_upstream import RemoteGate
from llmd.store.remotes import RemoteError, RemoteRecord, RemoteStore, probe_new
from llmd.text.openai_schemas import ChatCompletionRequest, SamplingFields
from llmd.text.remote_chat import RemoteRun, count_remote_tokens, start_remote_chat

REMOTES = web.AppKey("remotes", RemoteStore)
GATE = web.AppKey("remote_gate", RemoteGate)

# Protocols that do not serve remote models (they need the model's own weights or tokenizer
# here, or an upstream endpoint llmd does not forward yet): a request for a remote model there
# is a 400 in the protocol's own error shape (the error middleware picks it from the path),
# never a local "model not found".
NOT_FORWARDED = frozenset(
    {
        "/api/embed",
        "/api/embeddings",
        "/infill",
    }
)


def _api_error(exc: RemoteError) -> ApiError:
    kind = "server_error" if exc.status >= 500 else "invalid_request_error"
    return ApiError(exc.status, exc.message, type=kind, code=exc.code)


def find_remote(app: web.Application, name: str) -> RemoteRecord | None:
    """The remote a request for `name` goes to: None for a local model (it wins) or an
    unknown name. Reads two small files at most: remotes are rare, lookups cheap."""
    remote = app[REMOTES].get(name)
    if remote is None or app[STORE].resolve(name) is not None:
        return None
    return remote


async def forward_if_remote(
    request: web.Request, req: Forwarded, path: str
) -> web.StreamResponse | None:
    """The answer for a validated OpenAI request when its model is remote, else None (the
    caller serves it locally)."""
    if not request.app[REMOTES].root.is_dir():  # no remote was ever added: no thread hop
        return None
    remote = await asyncio.to_thread(find_remote, request.app, req.model)
    if remote is None:
        return None
    return await forward(request, request.app[GATE], remote, req, path)


async def remote_for(request: web.Request, name: str) -> RemoteRecord | None:
    """The remote `name` is served by, for a protocol that translates its request into the
    pipeline's (Anthropic, Responses, Ollama), else None: the caller serves it locally."""
    if not request.app[REMOTES].root.is_dir():  # no remote was ever added: no thread hop
        return None
    return await asyncio.to_thread(find_remote, request.app, name)


async def start_remote(
    request: web.Request, remote: RemoteRecord, req: SamplingFields
) -> RemoteRun:
    """The pipeline-shaped run of a translated request on its remote (remote_chat.py)."""
    return await start_remote_chat(request.app[GATE], remote, req)


async def count_remote(
    request: web.Request, remote: RemoteRecord, req: ChatCompletionRequest
) -> int:
    """A translated request's prompt length, counted by the remote's upstream."""
    return await count_remote_tokens(request.app[GATE], remote, req)


# ---------------------------------------------------------------------- listings


def openai_entry(
    remote: RemoteRecord,
    context: int | None = None,
    capabilities: dict[str, bool] | None = None,
) -> dict[str, Any]:
    """A `/v1/models` entry for a remote: owner is the upstream's host, context and
    capabilities its own (the last health check's, else what it said when the remote was
    added; capabilities null when the upstream does not say, as vLLM's and SGLang's lists)."""
    context = context or remote.context_length
    return {
        "id": remote.name,
        "object": "model",
        "created": int(remote.added),
        "owned_by": remote.host,
        "context_length": context,
        "max_model_len": context,
        "capabilities": capabilities or remote.capabilities,
        "remote": {"url": remote.url, "upstream_model": remote.upstream_model},
    }


def served_remotes(app: web.Application) -> list[RemoteRecord]:
    """Remotes a request can reach (those a local model does not shadow)."""
    store = app[STORE]
    return [r for r in app[REMOTES].list() if store.resolve(r.name) is None]


def remote_model_entry(app: web.Application, remote: RemoteRecord) -> dict[str, Any]:
    return openai_entry(remote, _context(app, remote), _capabilities(app, remote))


def _context(app: web.Application, remote: RemoteRecord) -> int | None:
    return app[GATE].health(remote.name).context_length or remote.context_length


def _capabilities(app: web.Application, remote: RemoteRecord) -> dict[str, bool] | None:
    """The upstream's latest word (health checks), else what it said when the remote was
    added; None when it never said."""
    return app[GATE].health(remote.name).capabilities or remote.capabilities


# llmd's capability names -> Ollama's (`/api/show`'s list).
_OLLAMA_NAMES = {
    "completion": "completion",
    "tools": "tools",
    "reasoning": "thinking",
    "vision": "vision",
    "embeddings": "embedding",
    "rerank": "rerank",
}


def ollama_capabilities(capabilities: dict[str, bool] | None) -> list[str]:
    """`/api/show`'s list: the upstream's capabilities in Ollama's words; without any, what
    every forwarded generation request may use (completion and tools)."""
    if capabilities is None:
        return ["completion", "tools"]
    return [_OLLAMA_NAMES[k] for k, v in capabilities.items() if v and k in _OLLAMA_NAMES]


async def openai_remote_models(app: web.Application) -> list[dict[str, Any]]:
    remotes = await asyncio.to_thread(served_remotes, app)
    return [remote_model_entry(app, r) for r in remotes]


async def ollama_remote_tags(app: web.Application) -> list[dict[str, Any]]:
    """`/api/tags` entries: no local size or digest; the owner in `remote_host`, as Ollama
    marks its cloud models."""
    out = []
    for r in await asyncio.to_thread(served_remotes, app):
        out.append(
            {
                "name": r.name,
                "model": r.name,
                "modified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.added)),
                "size": 0,
                "digest": "",
                "remote_model": r.upstream_model,
                "remote_host": r.url,
                "details": {"format": "remote", "family": "", "context_length": _context(app, r)},
            }
        )
    return out


def ollama_remote_show(app: web.Application, remote: RemoteRecord) -> dict[str, Any]:
    """`/api/show` for a remote: where it lives (`remote_model`, `remote_host`, as Ollama
    shows its cloud models) and the context the upstream reports, where Ollama clients read
    it (`model_info`, the `num_ctx` parameter). No template or weights facts: the upstream
    holds them. Capabilities are those every forwarded request may use."""
    context = _context(app, remote)
    return {
        "modelfile": f"# Modelfile generated by llmd\n# remote: {remote.upstream_model} at "
        f"{remote.url}\n",
        "parameters": f"num_ctx                        {context}" if context else "",
        "template": "",
        "license": "",
        "details": {"format": "remote", "family": "", "context_length": context},
        "model_info": {"general.architecture": "remote", "remote.context_length": context},
        "capabilities": ollama_capabilities(_capabilities(app, remote)),
        "remote_model": remote.upstream_model,
        "remote_host": remote.url,
        "modified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(remote.added)),
    }


def remote_status(app: web.Application) -> list[dict[str, Any]]:
    """`/status`'s remotes: where each goes and its requests in flight and queued."""
    gate = app[GATE]
    return [
        {"name": r.name, "url": r.url, "upstream_model": r.upstream_model, **gate.status(r)}
        for r in app[REMOTES].list()
    ]


def _shown(remote: RemoteRecord, app: web.Application) -> dict[str, Any]:
    entry = remote.model_dump()
    entry["shadowed_by_local_model"] = app[STORE].resolve(remote.name) is not None
    entry.update(app[GATE].status(remote))
    return entry


# ---------------------------------------------------------------------- /v1/remotes


async def list_remotes(request: web.Request) -> web.Response:
    app = request.app
    entries = await asyncio.to_thread(lambda: [_shown(r, app) for r in app[REMOTES].list()])
    return web.json_response({"object": "list", "data": entries})


_ADD_FIELDS = {
    "name",
    "url",
    "model",
    "api_key_env",
    "max_concurrency",
    "queue_timeout",
    "connect_timeout",
    "read_timeout",
    "ca_bundle",
}


def _owner_only(request: web.Request, done: str) -> None:
    """403 unless the request came over the Unix socket (see the module docstring)."""
    if not is_unix_socket_request(request):
        raise ApiError(
            403,
            f"remotes can only be {done} over llmd's Unix socket (`llmd remote ...`): over "
            "TCP a client could send other clients' requests, or the daemon's environment, "
            "to a server of its choosing",
            type="permission_error",
            code="unix_socket_only",
        )


async def add_remote(request: web.Request) -> web.Response:
    """`POST /v1/remotes` {name, url, model?, api_key_env?, max_concurrency?, ...}: probes
    the upstream, then stores the remote; 201 with the record."""
    _owner_only(request, "added")
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    unknown = sorted(set(body) - _ADD_FIELDS)
    if unknown:
        raise bad_request(
            f"unrecognized field(s): {', '.join(unknown)}", param=unknown[0], code="unknown_field"
        )
    fields = {k: v for k, v in body.items() if k != "model"}
    fields["upstream_model"] = body.get("model")
    app = request.app
    try:
        if not isinstance(fields.get("name"), str) or not fields["name"]:
            raise RemoteError("name is required")
        await asyncio.to_thread(app[REMOTES].check_free, fields["name"], app[STORE])
        record = await probe_new(fields)
        record = await asyncio.to_thread(app[REMOTES].add, record, app[STORE])
    except RemoteError as exc:
        raise _api_error(exc) from exc
    return web.json_response(_shown(record, app), status=201)


async def delete_remote(request: web.Request) -> web.Response:
    _owner_only(request, "removed")
    name = request.match_info["name"]
    try:
        await asyncio.to_thread(request.app[REMOTES].remove, name)
    except RemoteError as exc:
        raise _api_error(exc) from exc
    return web.json_response({"id": name, "object": "remote", "deleted": True})


# ---------------------------------------------------------------------- other protocols

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _named_remote(app: web.Application, raw: bytes) -> str | None:
    """The remote a body's `model` names, if any (Ollama's `:latest` tag understood)."""
    try:
        model = json.loads(raw).get("model")
    except (ValueError, AttributeError):
        return None  # the protocol's own handler reports a bad body
    if not isinstance(model, str):
        return None
    for name in (model, model.removesuffix(":latest")):
        if find_remote(app, name) is not None:
            return name
    return None


@web.middleware
async def refuse_unforwarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A remote model asked for through a protocol phase 1 does not forward: 400 saying
    where it is served. Only bodies that could name a remote are decoded."""
    if request.method != "POST" or request.path not in NOT_FORWARDED:
        return await handler(request)
    if not request.app[REMOTES].root.is_dir():  # no remote was ever added
        return await handler(request)
    names = await asyncio.to_thread(lambda: [r.name for r in request.app[REMOTES].list()])
    if names:
        raw = await request.read()
        if any(n.encode() in raw for n in names) or b"\\" in raw:
            name = await asyncio.to_thread(_named_remote, request.app, raw)
            if name is not None:
                raise bad_request(
                    f"'{name}' is a remote model; {request.path} is served for local "
                    "models only (remote models answer generation requests: "
                    "/v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, "
                    "/api/chat, /api/generate, and /v1/embeddings and /v1/rerank)",
                    param="model",
                    code="remote_model_unsupported_here",
                )
    return await handler(request)


def add_remote_routes(app: web.Application) -> None:
    """Everything remote models need in the app: store, gate, routes, the refusal middleware
    (innermost: after the security checks and the body read), and closing the connections."""
    app[REMOTES] = RemoteStore(app[STORE].paths)  # beside the local store, created before
    app[GATE] = RemoteGate()
    app.router.add_get("/v1/remotes", list_remotes)
    app.router.add_post("/v1/remotes", add_remote)
    app.router.add_delete("/v1/remotes/{name:.+}", delete_remote)
    app.middlewares.append(refuse_unforwarded)
    add_health_checks(app, app[REMOTES], app[GATE])

    async def start(app: web.Application) -> None:
        app[GATE].metrics = app.get(METRICS)  # per-remote counters on /metrics

    async def close(app: web.Application) -> None:
        await app[GATE].close()

    app.on_startup.append(start)

    app.on_cleanup.append(close)
