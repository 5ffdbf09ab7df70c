"""OpenAI's `POST /v1/chat/completions` and `POST /v1/completions`: request -> prompt ids ->
one or `n` generations -> OpenAI's JSON or SSE shapes (with logprobs, echo, usage).

Streaming answers are SSE ending in ``data: [DONE]``; an error after the stream started is
one ``data: {"error": ...}`` event, then the stream ends. A client that goes away cancels its
requests in the worker. With `n > 1` the prompt is prefilled once: the other choices start
from choice 0's KV and last logits (chat_pipeline.run_choices).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from llmd import __version__
from llmd.api.http_common import REGISTRY, SSE_KEEPALIVE, parsed_body, pipeline_context, relay, sse
from llmd.api.remote_routes import forward_if_remote
from llmd.errors import ApiError, server_error
from llmd.runtime import protocol as p
from llmd.runtime.supervisor import ModelSupervisor
from llmd.runtime.worker_client import Accepted, WorkerError
from llmd.text.chat_pipeline import (
    ChoiceDelta,
    ChoiceEnd,
    Piece,
    choice_maker,
    collect,
    encode_prompt,
    run_choices,
    start_chat,
    usage_of,
    wait_accepted,
)
from llmd.text.fim import completion_fim_prompt, with_fim_stops
from llmd.text.generation import Finished
from llmd.text.openai_schemas import ChatCompletionRequest, CompletionRequest, parse_request

SSE = "text/event-stream"


def _envelope(obj: str, cid: str, created: int, model: str) -> dict[str, Any]:
    return {"id": cid, "object": obj, "created": created, "model": model}


def _error_event(err: ApiError) -> bytes:
    """A started stream's error: one `data: {"error": ...}` event, then the stream ends."""
    return sse(err.envelope())


# ---------------------------------------------------------------------- chat


async def chat_completions(request: web.Request) -> web.StreamResponse:
    req = await parsed_body(request, parse_request, ChatCompletionRequest)
    if (remote := await forward_if_remote(request, req, "/v1/chat/completions")) is not None:
        return remote
    async with request.app[REGISTRY].use(req.model, req.keep_alive_seconds()) as model:
        return await _chat(request, req, model)


async def _chat(
    request: web.Request, req: ChatCompletionRequest, model: ModelSupervisor
) -> web.StreamResponse:
    run = await start_chat(pipeline_context(request), req, model)
    cid = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    fingerprint = f"llmd-{__version__}"
    try:
        if not req.stream:
            result = await run.result()
            choices = [
                {
                    "index": i,
                    "message": c.message,
                    "logprobs": c.logprobs,
                    "finish_reason": c.finish_reason,
                }
                for i, c in enumerate(result.choices)
            ]
            body = {
                **_envelope("chat.completion", cid, created, req.model),
                "system_fingerprint": fingerprint,
                "choices": choices,
                "usage": result.usage,
            }
            return web.json_response(body)

        base = {**_envelope("chat.completion.chunk", cid, created, req.model)}
        base["system_fingerprint"] = fingerprint
        include_usage = req.include_usage()

        def chunk(index: int, delta: dict[str, Any], **fields: Any) -> bytes:
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
            out = {**base, "choices": [{**choice, **fields}]}
            if include_usage:
                out["usage"] = None
            return sse(out)

        async def frames() -> AsyncIterator[bytes]:
            for index in range(req.n):
                yield chunk(index, {"role": "assistant", "content": ""})
            finished: list[Finished] = []
            async for event in run.events():
                if isinstance(event, ChoiceDelta):
                    yield chunk(event.index, event.delta, logprobs=event.logprobs)
                elif isinstance(event, ChoiceEnd):
                    finished.append(event.finished)
                    yield chunk(event.index, {}, finish_reason=event.finish_reason)
            if include_usage:
                yield sse({**base, "choices": [], "usage": usage_of(finished)})
            yield sse("[DONE]")

        return await relay(
            request,
            run.accepted(),
            frames(),
            content_type=SSE,
            error_frame=_error_event,
            keepalive=SSE_KEEPALIVE,
        )
    finally:
        await run.aclose()


# ---------------------------------------------------------------------- completions


async def completions(request: web.Request) -> web.StreamResponse:
    req = await parsed_body(request, parse_request, CompletionRequest)
    if (remote := await forward_if_remote(request, req, "/v1/completions")) is not None:
        return remote
    async with request.app[REGISTRY].use(req.model, req.keep_alive_seconds()) as model:
        return await _complete(request, req, model)


async def _score_prompt(
    model: ModelSupervisor, prompt: list[int], top_logprobs: int
) -> list[p.TokenLogprob | None]:
    """The prompt's own logprobs for `echo` (the first token has no context: None)."""
    worker = await model.ensure_ready()
    try:
        scored = await worker.score(prompt, max(0, top_logprobs))
    except WorkerError as exc:
        raise server_error(f"scoring the prompt failed: {exc.message}", code=exc.code) from exc
    return [None, *scored]


async def _complete(
    request: web.Request, req: CompletionRequest, model: ModelSupervisor
) -> web.StreamResponse:
    prompt_input = req.prompt_input()
    fim = None  # with `suffix`: the fill-in-the-middle prompt (fim.py); the answer is the middle
    if req.suffix:
        fim = await completion_fim_prompt(model, req.model, str(prompt_input), req.suffix)
    prompt, max_tokens = await encode_prompt(req, model, fim.ids if fim else prompt_input)
    prompt_text = (
        prompt_input
        if isinstance(prompt_input, str)
        else model.text.tokenizer.decode(prompt, skip_special_tokens=False)
    )
    top_logprobs = req.engine_logprobs()
    texts = model.text.token_texts
    cid = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    base = _envelope("text_completion", cid, created, req.model)
    echo_lps: list[p.TokenLogprob | None] = []
    if req.echo and top_logprobs >= 0:
        echo_lps = await _score_prompt(model, prompt, top_logprobs)

    def lp_object(tokens: list[int], lps: list[Any], offset: int) -> dict[str, Any] | None:
        return None if top_logprobs < 0 else texts.completion_logprobs(tokens, lps, offset)

    if max_tokens == 0:  # echo only: score the prompt, generate nothing
        prompt_tokens = len(prompt)
        body = {
            **base,
            "choices": [
                {
                    "index": i,
                    "text": prompt_text,
                    "logprobs": lp_object(prompt, echo_lps, 0),
                    "finish_reason": "length",
                }
                for i in range(req.n)
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 0,
                "total_tokens": prompt_tokens,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        }
        return web.json_response(body)

    make = choice_maker(
        pipeline_context(request),
        with_fim_stops(req, fim),
        model,
        prompt,
        max_tokens,
        top_logprobs,
        None,
        fim.show_tokens if fim else frozenset(),
    )
    pieces = run_choices(make, req.n)
    echoed = prompt_text if req.echo else ""
    try:
        if req.stream:
            return await _stream_completion(
                request, req, pieces, base, echoed, lp_object, prompt, echo_lps
            )
        collected = await collect(pieces, req.n)
    finally:
        await pieces.aclose()  # type: ignore[attr-defined]
    finished = [c.finished for c in collected if c.finished is not None]
    choices = []
    for i, c in enumerate(collected):
        logprobs = None
        if top_logprobs >= 0:
            tokens = (prompt if req.echo else []) + c.tokens
            lps: list[Any] = (echo_lps if req.echo else []) + list(c.logprobs)
            logprobs = lp_object(tokens, lps, 0)
        choices.append(
            {
                "index": i,
                "text": echoed + "".join(c.text),
                "logprobs": logprobs,
                "finish_reason": c.finished.finish_reason if c.finished else None,
            }
        )
    return web.json_response({**base, "choices": choices, "usage": usage_of(finished)})


async def _stream_completion(
    request: web.Request,
    req: CompletionRequest,
    pieces: AsyncIterator[Accepted | Piece],
    base: dict[str, Any],
    echoed: str,
    lp_object: Callable[[list[int], list[Any], int], dict[str, Any] | None],
    prompt: list[int],
    echo_lps: list[p.TokenLogprob | None],
) -> web.StreamResponse:
    include_usage = req.include_usage()
    offsets = [len(echoed)] * req.n

    def chunk(index: int, text: str, logprobs: Any, finish: str | None) -> bytes:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        out = {**base, "choices": [choice]}
        if include_usage:
            out["usage"] = None
        return sse(out)

    async def frames() -> AsyncIterator[bytes]:
        if req.echo:
            for index in range(req.n):
                yield chunk(index, echoed, lp_object(prompt, list(echo_lps), 0), None)
        finished: list[Finished] = []
        async for item in pieces:
            assert not isinstance(item, Accepted)
            index, piece = item
            if isinstance(piece, Finished):
                finished.append(piece)
                yield chunk(index, "", None, piece.finish_reason)
                continue
            lp = lp_object(piece.tokens, list(piece.logprobs), offsets[index])
            offsets[index] += len(piece.text)
            if piece.text or lp:
                yield chunk(index, piece.text, lp, None)
        if include_usage:
            yield sse({**base, "choices": [], "usage": usage_of(finished)})
        yield sse("[DONE]")

    return await relay(
        request,
        wait_accepted(pieces),
        frames(),
        content_type=SSE,
        error_frame=_error_event,
        keepalive=SSE_KEEPALIVE,
    )


def add_openai_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
