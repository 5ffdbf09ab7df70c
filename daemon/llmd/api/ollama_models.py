"""Ollama's model-management API over llmd's store, registry and pull manager:
``GET /api/tags``, ``POST /api/show``, ``GET /api/ps``, ``POST /api/pull``,
``DELETE /api/delete``, ``POST /api/copy``, ``GET /api/version``, and ``GET``/``HEAD /``
(what tools probe to find a server: it answers ``llmd is running``).

Names are llmd's (``smollm2-135m``, ``hf.co/ORG/REPO:QUANT``); a ``:latest`` tag that Ollama
clients add to an untagged name is understood. ``/api/pull`` pulls what ``llmd pull`` pulls
(catalog names, Hugging Face repos, absolute local paths), reporting progress in Ollama's
lines. Not implemented, answered 501 in Ollama's error shape: ``/api/create``, ``/api/push``
and ``/api/blobs`` (no Modelfiles, no registry to push to). ``/api/embed`` and
``/api/embeddings`` live in ollama_embed.py.

``add_ollama_routes`` registers these and the generation routes of ollama_api.py, and makes
every error under ``/api`` Ollama's ``{"error": "message"}``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import Field

from llmd import __version__
from llmd.api.http_common import REGISTRY, STORE, add_error_shape, json_body, stream_ndjson
from llmd.api.model_cards import facts_of, sees_images, served_context
from llmd.api.ollama_api import (
    OllamaSchema,
    chat,
    error_body,
    generate,
    parse_body,
    require_model,
    resolve_model_name,
    rfc3339,
    template_thinks,
)
from llmd.api.pull_routes import start_pull
from llmd.api.remote_routes import ollama_remote_show, ollama_remote_tags, remote_for
from llmd.errors import ApiError, bad_request
from llmd.store.catalog import load_catalog
from llmd.store.gguf_layout import GGUFFormatError, read_layout
from llmd.store.manifests import ModelRecord, StoreError
from llmd.store.model_kind import record_kind

# ---------------------------------------------------------------------- facts


def human_number(n: int) -> str:
    """Ollama's parameter counts: 135M, 134.52M, 7.6B, 8B."""
    for scale, unit, decimals in ((1e9, "B", 1), (1e6, "M", 2)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.{decimals}f}{unit}"
    return f"{n / 1e3:.0f}K" if n >= 1000 else str(n)


def details(record: ModelRecord) -> dict[str, Any]:
    facts = facts_of(record)
    family = facts.get("architecture") or record.architecture or ""
    parameters = facts.get("parameters")
    return {
        "parent_model": "",
        "format": record.format,
        "family": family,
        "families": [family] if family else [],
        "parameter_size": human_number(parameters) if parameters else "",
        "quantization_level": facts.get("quantization") or record.quantization or "",
    }


def _digest(record: ModelRecord) -> str:
    return record.digest.removeprefix("sha256:")


def model_info(record: ModelRecord, *, verbose: bool = False) -> dict[str, Any]:
    """GGUF metadata as Ollama's model_info (arrays only when verbose, as Ollama); for a
    Hugging Face directory, the same keys from its config."""
    facts = facts_of(record)
    arch = facts.get("architecture") or record.architecture or ""
    if record.format == "gguf":
        try:
            layout = read_layout(Path(record.path))
        except (OSError, GGUFFormatError):
            layout = None
        if layout is not None:
            info: dict[str, Any] = {}
            for key, entry in layout.kv.items():
                value = entry.value
                if isinstance(value, list):
                    value = value if verbose else []
                elif isinstance(value, bytes):
                    continue
                info[key] = value
            info.setdefault("general.parameter_count", layout.parameters)
            return info
    info = {"general.architecture": arch}
    for key, fact in (
        ("context_length", "context_length"),
        ("embedding_length", "embedding_length"),
        ("block_count", "layers"),
    ):
        if facts.get(fact) is not None:
            info[f"{arch}.{key}"] = facts[fact]
    if facts.get("parameters"):
        info["general.parameter_count"] = facts["parameters"]
    return info


def capabilities(template: str, kind: str = "generate", vision: bool = False) -> list[str]:
    """completion for generation models (tools for every chat model: llmd offers tools
    natively or through its fallback prompt, and enforces a forced call by grammar; thinking
    for reasoning templates; vision where llmd runs the model's vision tower); embedding for
    embedding models, as Ollama lists them; rerank for rerankers (not an Ollama capability:
    llmd's own word)."""
    if kind == "embed":
        return ["embedding"]
    if kind == "rerank":
        return ["rerank"]
    caps = ["completion", *(["vision"] if vision else [])]
    if template:
        caps.append("tools")
        if template_thinks(template):
            caps.append("thinking")
    return caps


# ---------------------------------------------------------------------- routes


class _NameRequest(OllamaSchema):
    model: str | None = None
    name: str | None = None  # Ollama's older spelling of `model`

    def target(self) -> str:
        name = self.model or self.name
        if not name:
            raise bad_request("model is required", param="model")
        return name


class ShowRequest(_NameRequest):
    verbose: bool = False
    # Older clients send these to preview a Modelfile; llmd has none to change.
    system: str | None = None
    template: str | None = None
    options: dict[str, Any] | None = None


class PullRequest(_NameRequest):
    insecure: bool | None = None  # llmd always verifies TLS and checksums
    stream: bool = True
    username: str | None = None
    password: str | None = None


class CopyRequest(OllamaSchema):
    source: str = Field(min_length=1)
    destination: str = Field(min_length=1)


async def root(request: web.Request) -> web.Response:
    return web.Response(text="llmd is running")


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": __version__})


async def tags(request: web.Request) -> web.Response:
    records = await asyncio.to_thread(request.app[STORE].served)
    models = []
    for r in records:
        models.append(
            {
                "name": r.name,
                "model": r.name,
                "modified_at": rfc3339(r.modified),
                "size": r.size,
                "digest": _digest(r),
                "details": await asyncio.to_thread(details, r),
            }
        )
    models += await ollama_remote_tags(request.app)
    return web.json_response({"models": models})


async def show(request: web.Request) -> web.Response:
    req = parse_body(await json_body(request), ShowRequest)
    store = request.app[STORE]
    target = req.target()
    for candidate in dict.fromkeys((target, target.removesuffix(":latest"))):
        remote = await remote_for(request, candidate)
        if remote is not None:
            return web.json_response(ollama_remote_show(request.app, remote))
    name = require_model(store, target)
    record = store.resolve(name)
    assert record is not None
    facts = await asyncio.to_thread(facts_of, record)
    template = facts.get("template") or ""
    info = await asyncio.to_thread(model_info, record, verbose=req.verbose)
    # The context it is served with, where Ollama clients read it (model_info) and as the
    # Modelfile parameter a user sees; the trained length stays in llmd's own key.
    served = await asyncio.to_thread(served_context, request.app[REGISTRY], record)
    arch = info.get("general.architecture") or facts.get("architecture") or ""
    parameters = ""
    if served:
        trained = info.get(f"{arch}.context_length")
        info[f"{arch}.context_length"] = served
        info["llmd.trained_context_length"] = trained
        parameters = f"num_ctx                        {served}"
    body = {
        "modelfile": f"# Modelfile generated by llmd\nFROM {record.path}\n",
        "parameters": parameters,
        "template": template,
        "license": facts.get("license") or "",
        "details": await asyncio.to_thread(details, record),
        "model_info": info,
        "capabilities": capabilities(
            template, record_kind(record).kind, await asyncio.to_thread(sees_images, record)
        ),
        "modified_at": rfc3339(record.modified),
    }
    return web.json_response(body)


def _expires(at: float) -> str:
    """keep_alive -1 never expires: Ollama shows a date centuries ahead; so does llmd."""
    return rfc3339(at if math.isfinite(at) else time.time() + 290 * 365 * 86400)


async def ps(request: web.Request) -> web.Response:
    models = []
    for m in request.app[REGISTRY].loaded():
        ready = m.worker.ready if m.worker is not None else None
        size = m.footprint_bytes()
        on_gpu = ready is not None and not ready.backend.endswith("-cpu")  # llmd-cpu, mlx-cpu
        entry: dict[str, Any] = {
            "name": m.name,
            "model": m.name,
            "size": size,
            "digest": _digest(m.record),
            "details": await asyncio.to_thread(details, m.record),
            "expires_at": _expires(m.expires_at()),
            "size_vram": size if on_gpu else 0,
        }
        if ready is not None:
            entry["context_length"] = ready.context_length
        models.append(entry)
    return web.json_response({"models": models})


def progress_line(event: dict[str, Any]) -> dict[str, Any]:
    """A pull event of llmd's -> Ollama's progress line (status, digest, total, completed),
    or ``{"error": message}``."""
    if "error" in event:
        err = event["error"]
        return {"error": err.get("message", str(err)) if isinstance(err, dict) else str(err)}
    line = {"status": event.get("status", "")}
    for key in ("digest", "total", "completed"):
        if event.get(key) is not None:
            line[key] = event[key]
    return line


async def pull(request: web.Request) -> web.StreamResponse:
    req = parse_body(await json_body(request), PullRequest)
    if req.username or req.password:
        raise bad_request("registry credentials are not supported; set HF_TOKEN for llmd")
    name = req.target()
    if name.endswith(":latest") and name.removesuffix(":latest") in load_catalog():
        name = name.removesuffix(":latest")  # Ollama clients tag untagged names
    job = start_pull(request, name)
    if not req.stream:
        final = progress_line(await job.wait())
        if "error" in final:
            return web.json_response(final, status=job.status_code)
        return web.json_response({"status": "success"})

    async def lines() -> AsyncIterator[dict[str, Any]]:
        async for event in job.follow():
            line = progress_line(event)
            yield {"status": "success"} if line.get("status") == "success" else line

    return await stream_ndjson(request, lines())


async def delete(request: web.Request) -> web.Response:
    req = parse_body(await json_body(request), _NameRequest)
    store = request.app[STORE]
    name = resolve_model_name(store, req.target())
    try:
        await asyncio.to_thread(store.remove, name)
    except StoreError as exc:
        raise ApiError(exc.status, str(exc), param="model", code=exc.code) from exc
    registry = request.app[REGISTRY]
    for model in registry.loaded():  # an idle copy of deleted weights is not kept loaded
        if model.name == name and model.active == 0:
            await registry.unload(name, why="deleted")
    return web.json_response({})


async def copy(request: web.Request) -> web.Response:
    req = parse_body(await json_body(request), CopyRequest)
    store = request.app[STORE]
    source = resolve_model_name(store, req.source)
    try:
        await asyncio.to_thread(store.copy, source, req.destination)
    except StoreError as exc:
        raise ApiError(exc.status, str(exc), code=exc.code) from exc
    return web.json_response({})


def _not_supported(what: str, why: str) -> Any:
    async def handler(request: web.Request) -> web.Response:
        raise ApiError(501, f"{what} is not supported by llmd: {why}", code="not_implemented")

    return handler


_ABSENT = (
    ("POST", "/api/create", "/api/create", "there are no Modelfiles; use `llmd pull`"),
    ("POST", "/api/push", "/api/push", "there is no registry to push to"),
    ("POST", "/api/blobs/{digest}", "/api/blobs", "there are no Modelfiles; use `llmd pull`"),
    ("HEAD", "/api/blobs/{digest}", "/api/blobs", "there are no Modelfiles; use `llmd pull`"),
)


def add_ollama_routes(app: web.Application) -> None:
    """Ollama's API under /api (and the `/` probe), errors in Ollama's shape."""
    add_error_shape(app, "/api", error_body)
    router = app.router
    router.add_post("/api/chat", chat)
    router.add_post("/api/generate", generate)
    router.add_get("/api/tags", tags)
    router.add_post("/api/show", show)
    router.add_get("/api/ps", ps)
    router.add_post("/api/pull", pull)
    router.add_delete("/api/delete", delete)
    router.add_post("/api/copy", copy)
    router.add_get("/api/version", version)
    for method, path, what, why in _ABSENT:
        router.add_route(method, path, _not_supported(what, why))
    taken = any(
        getattr(r.resource, "canonical", None) == "/" and r.method == "GET" for r in router.routes()
    )
    if not taken:
        router.add_get("/", root)
