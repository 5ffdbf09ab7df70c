"""OpenAI's ``POST /v1/embeddings`` and the rerank routes (``POST /v1/rerank``, with
llama-server's aliases ``/rerank`` and ``/v1/reranking``), answered from embedding.py, or by
the upstream of a remote model (the request as validated here, the upstream's answer as given).

Decisions: ``dimensions`` truncates and renormalises only models trained for it (their model
card says so: model_kind.py); other models answer 400, as cutting an embedding that was not
trained for it silently degrades it. Rerank results are sorted by ``relevance_score``
descending (ties keep input order), cut to ``top_n``, with ``document: {"text"}`` when
``return_documents`` is true, as Jina and Cohere answer.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from aiohttp import web

from llmd.api.embedding_schemas import EmbeddingRequest, RerankRequest
from llmd.api.http_common import REGISTRY, STORE, parsed_body
from llmd.api.remote_routes import forward_if_remote
from llmd.errors import bad_request
from llmd.runtime.supervisor import ModelSupervisor
from llmd.store.model_kind import record_kind
from llmd.text import cross_encoder
from llmd.text.embedding import (
    MAX_INPUTS,
    Pooled,
    check_kind_before_load,
    embedding_tokens,
    fit_context,
    require_kind,
    run_pooled,
    truncated,
)
from llmd.text.openai_schemas import parse_request
from llmd.text.rerank import relevance, rerank_tokens, yes_no_ids


def _inputs(req: EmbeddingRequest) -> list[str] | list[list[int]]:
    """The request's inputs as a list of texts or a list of token-id lists."""
    value = req.input
    if isinstance(value, str):
        return [value]
    if all(isinstance(v, int) for v in value):
        return [value]  # type: ignore[list-item]  # one input given as token ids
    return value  # type: ignore[return-value]


def _prompts(req: EmbeddingRequest, model: ModelSupervisor) -> list[list[int]]:
    inputs = _inputs(req)
    if len(inputs) > MAX_INPUTS:
        raise bad_request(f"input has {len(inputs)} items; at most {MAX_INPUTS}", param="input")
    context = model.context_length
    prompts = []
    for i, item in enumerate(inputs):
        param = "input" if len(inputs) == 1 else f"input.[{i}]"
        if not item:  # before tokenizing: a tokenizer may add an end token to nothing
            raise bad_request(f"{param} is empty: there is nothing to embed", param=param)
        if isinstance(item, str):
            ids = embedding_tokens(model.text, item, context if req.truncate else None)
        else:
            ids = list(item)
        prompts.append(fit_context(ids, context, truncate=req.truncate, param=param))
    return prompts


def encode_vector(values: list[float], encoding: str) -> list[float] | str:
    """float: the list; base64: little-endian float32 bytes, as OpenAI's API sends them."""
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
    return values


async def embeddings(request: web.Request) -> web.StreamResponse:
    req = await parsed_body(request, parse_request, EmbeddingRequest)
    if (answer := await forward_if_remote(request, req, "/v1/embeddings")) is not None:
        return answer
    check_kind_before_load(request.app[STORE], req.model, "embed", "/v1/embeddings")
    async with request.app[REGISTRY].use(req.model, req.keep_alive_seconds()) as model:
        require_kind(model, "embed", "/v1/embeddings")
        kind = record_kind(model.record)
        truncated([], req.dimensions, kind, req.model)  # refused before any work
        pooled = await run_pooled(model, _prompts(req, model))
    vectors = truncated(pooled.values, req.dimensions, kind, req.model)
    data = [
        {"object": "embedding", "index": i, "embedding": encode_vector(v, req.encoding_format)}
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": pooled.prompt_tokens, "total_tokens": pooled.prompt_tokens}
    return web.json_response({"object": "list", "data": data, "model": req.model, "usage": usage})


def _rerank_body(body: Any) -> RerankRequest:
    req = parse_request(body, RerankRequest)  # type: ignore[type-var]
    try:
        req.texts()
    except ValueError as exc:
        raise bad_request(str(exc), param="documents") from exc
    return req


async def _yes_no(model: ModelSupervisor, req: RerankRequest, documents: list[str]) -> Pooled:
    """A Qwen3-Reranker-style decoder: the "yes"/"no" logits after each document's prompt."""
    yes, no = yes_no_ids(model.text)
    prompts = [
        rerank_tokens(
            model.text,
            req.query,
            doc,
            instruction=req.instruction,
            context_length=model.context_length,
            truncate=req.truncate,
            param=f"documents.[{i}]",
        )
        for i, doc in enumerate(documents)
    ]
    return await run_pooled(model, prompts, output="token_logits", logit_tokens=[yes, no])


async def _cross_encode(model: ModelSupervisor, req: RerankRequest, documents: list[str]) -> Pooled:
    """A cross-encoder: the classifier's logits on each (query, document) pair."""
    if req.instruction is not None:
        raise bad_request(
            f"model '{req.model}' is a cross-encoder: it takes no instruction",
            param="instruction",
        )
    prompts = [
        cross_encoder.pair_tokens(
            model.text,
            req.query,
            doc,
            context_length=model.context_length,
            truncate=req.truncate,
            param=f"documents.[{i}]",
        )
        for i, doc in enumerate(documents)
    ]
    return await run_pooled(model, prompts)


async def rerank(request: web.Request) -> web.StreamResponse:
    req = await parsed_body(request, _rerank_body)
    # One upstream path whichever alias the client used: vLLM, llama-server and llmd all
    # serve /v1/rerank.
    if (answer := await forward_if_remote(request, req, "/v1/rerank")) is not None:
        return answer
    documents = req.texts()
    check_kind_before_load(request.app[STORE], req.model, "rerank", request.path)
    async with request.app[REGISTRY].use(req.model, req.keep_alive_seconds()) as model:
        kind = require_kind(model, "rerank", request.path)
        if kind.pooling == "cls":
            pooled = await _cross_encode(model, req, documents)
            scores = [cross_encoder.relevance(v) for v in pooled.values]
        else:
            pooled = await _yes_no(model, req, documents)
            scores = [relevance(v[0], v[1]) for v in pooled.values]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: req.top_n or len(scores)]
    results = []
    for i in order:
        item: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if req.return_documents:
            item["document"] = {"text": documents[i]}
        results.append(item)
    usage = {"prompt_tokens": pooled.prompt_tokens, "total_tokens": pooled.prompt_tokens}
    return web.json_response(
        {"object": "list", "model": req.model, "results": results, "usage": usage}
    )


def add_embedding_routes(app: web.Application) -> None:
    app.router.add_post("/v1/embeddings", embeddings)
    for path in ("/v1/rerank", "/rerank", "/v1/reranking"):
        app.router.add_post(path, rerank)
