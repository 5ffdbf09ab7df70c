"""Ollama's ``POST /api/embed`` (a string or list of strings in, ``embeddings`` out) and the
older ``POST /api/embeddings`` (``prompt`` in, ``embedding`` out), answered from embedding.py
in Ollama's shapes (errors as ``{"error": ...}``: the /api error shape applies).

As Ollama: ``truncate`` defaults to true (an input longer than the context keeps its first
tokens; ``false`` makes it a 400), ``/api/embed`` vectors are L2-normalised, ``options`` are
accepted (none changes an embedding llmd computes) and durations are in nanoseconds. An empty
``input`` loads the model and answers no embeddings, as Ollama does.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from llmd.api.embedding_schemas import OllamaEmbeddingsRequest, OllamaEmbedRequest
from llmd.api.http_common import REGISTRY, STORE, parsed_body
from llmd.api.ollama_api import parse_body, require_model
from llmd.errors import ApiError
from llmd.store.model_kind import record_kind
from llmd.text.embedding import (
    check_kind_before_load,
    embedding_tokens,
    fit_context,
    l2_normalized,
    require_kind,
    run_pooled,
    truncated,
)


async def embed(request: web.Request) -> web.Response:
    started = time.perf_counter_ns()
    req = await parsed_body(request, parse_body, OllamaEmbedRequest)
    name = require_model(request.app[STORE], req.model)
    check_kind_before_load(request.app[STORE], name, "embed", "/api/embed")
    if isinstance(req.input, str):
        texts = [req.input] if req.input else []
    else:
        texts = list(req.input)
    async with request.app[REGISTRY].use(name, req.keep_alive_seconds()) as model:
        require_kind(model, "embed", "/api/embed")
        kind = record_kind(model.record)
        truncated([], req.dimensions, kind, req.model)  # refused before any work
        await model.ensure_ready()
        loaded = time.perf_counter_ns()
        if "" in texts:
            raise ApiError(400, f"input.[{texts.index('')}] is empty: there is nothing to embed")
        prompts = [
            fit_context(
                embedding_tokens(model.text, t, model.context_length if req.truncate else None),
                model.context_length,
                truncate=req.truncate,
                param="input" if isinstance(req.input, str) else f"input.[{i}]",
            )
            for i, t in enumerate(texts)
        ]
        pooled = await run_pooled(model, prompts) if prompts else None
    vectors = [l2_normalized(v) for v in pooled.values] if pooled else []
    vectors = truncated(vectors, req.dimensions, kind, req.model)
    body: dict[str, Any] = {
        "model": req.model,
        "embeddings": vectors,
        "total_duration": time.perf_counter_ns() - started,
        "load_duration": loaded - started,
        "prompt_eval_count": pooled.prompt_tokens if pooled else 0,
    }
    return web.json_response(body)


async def embeddings(request: web.Request) -> web.Response:
    req = await parsed_body(request, parse_body, OllamaEmbeddingsRequest)
    name = require_model(request.app[STORE], req.model)
    check_kind_before_load(request.app[STORE], name, "embed", "/api/embeddings")
    async with request.app[REGISTRY].use(name, req.keep_alive_seconds()) as model:
        require_kind(model, "embed", "/api/embeddings")
        if not req.prompt:
            return web.json_response({"embedding": []})
        ids = fit_context(
            embedding_tokens(model.text, req.prompt, model.context_length),
            model.context_length,
            truncate=True,
            param="prompt",
        )
        pooled = await run_pooled(model, [ids])
    return web.json_response({"embedding": pooled.values[0]})


def add_ollama_embed_routes(app: web.Application) -> None:
    app.router.add_post("/api/embed", embed)
    app.router.add_post("/api/embeddings", embeddings)
