"""HTTP routes for pulls: ``POST /v1/models/pull`` streams a pull's progress, and
``GET /v1/models/pulls`` lists the running ones.

Request: ``{"model": NAME, "name": INSTALL_AS?, "kind": KIND?, "stream": true?}`` (``"model"``
may also be spelled ``"source"``; ``"kind"``, generate / embed / rerank, overrides what a Hugging
Face directory's files say, model_kind.py). NAME is a catalog name, ``hf.co/ORG/REPO[:QUANT]`` or an absolute local
path. Optional ``"endpoint"`` and ``"token"`` carry the caller's ``HF_ENDPOINT`` / ``HF_TOKEN``
(the CLI sends them when set in its shell, which a daemon started earlier does not see); a
token the daemon holds itself is never sent to an endpoint a request names.

Response (decision: NDJSON, ``application/x-ndjson``, as Ollama's ``/api/pull``, rather than
SSE: every line is one complete JSON event, trivially read by ``curl`` and any HTTP client, and
the events are progress records, not chat deltas that SSE clients expect): one event per line
(see pulls.py), ending with ``{"status": "success", ...}`` or an OpenAI error envelope
``{"error": {...}}``. Errors knowable before the pull starts (bad JSON, unknown name,
unsupported architecture named by the catalog) are plain HTTP errors in the envelope. With
``"stream": false`` the final event is the whole response (its HTTP status is the error's).

A client that disconnects (Ctrl-C in ``llmd pull``) stops following, not the pull: it runs on
in the daemon and a later ``llmd pull`` of the same name joins it or finds it done.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from llmd.api.http_common import STORE, check_json_value, stream_ndjson
from llmd.api.security import read_body
from llmd.errors import ApiError, bad_request
from llmd.store.manifests import StoreError
from llmd.store.model_kind import KINDS
from llmd.store.model_store import ModelStore
from llmd.store.pulls import PullJob, PullManager

PULLS = web.AppKey("pulls", PullManager)


def add_pull_routes(app: web.Application, store: ModelStore | None = None) -> None:
    """Register the pull routes and the PullManager (stopped when the daemon shuts down).
    `store` defaults to the app's own (``app[STORE]``, set before this is called). Calling it
    twice changes nothing."""
    if PULLS in app:
        return
    manager = PullManager(store if store is not None else app[STORE])
    app[PULLS] = manager
    app.router.add_post("/v1/models/pull", pull)
    app.router.add_get("/v1/models/pulls", list_pulls)

    async def stop_pulls(app: web.Application) -> None:
        await manager.close()

    app.on_shutdown.append(stop_pulls)


async def pull(request: web.Request) -> web.StreamResponse:
    raw = await read_body(request)
    try:
        body: Any = json.loads(raw or b"{}")
    except RecursionError as exc:
        raise bad_request("the request body nests too deeply") from exc
    except ValueError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from exc
    check_json_value(body)
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    source = body.get("model") or body.get("source")
    if not isinstance(source, str) or not source.strip():
        raise bad_request("'model' (what to pull) is required", param="model")
    options = {}
    for key in ("name", "endpoint", "token"):
        value = body.get(key)
        if value is not None and not isinstance(value, str):
            raise bad_request(f"'{key}' must be a string", param=key)
        options[key] = value or None
    kind = body.get("kind")
    if kind is not None and kind not in KINDS:
        raise bad_request(f"'kind' must be one of {', '.join(KINDS)}", param="kind")
    stream = body.get("stream", True)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be true or false", param="stream")
    job = start_pull(
        request,
        source,
        options["name"],
        endpoint=options["endpoint"],
        token=options["token"],
        kind=kind,
    )
    if not stream:
        final = await job.wait()
        return web.json_response(final, status=job.status_code)
    return await stream_ndjson(request, job.follow())


def start_pull(request: web.Request, source: str, name: str | None = None, **hub: Any) -> PullJob:
    """Start (or join) a pull in the daemon's PullManager; store errors as API errors."""
    try:
        return request.app[PULLS].start(source, name, **hub)
    except StoreError as exc:
        raise ApiError(exc.status, str(exc), param="model", code=exc.code) from exc


async def list_pulls(request: web.Request) -> web.Response:
    jobs = [job.describe() for job in request.app[PULLS].jobs.values()]
    return web.json_response({"object": "list", "data": jobs})
