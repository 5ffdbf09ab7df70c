"""OpenAI's `POST /v1/chat/completions` and `POST /v1/completions`: request -> prompt ids ->
one or `n` generations -> OpenAI's JSON or SSE shapes (with logprobs, echo, usage).

Streaming answers are SSE ending in ``data: [DONE]``; an error after the stream started is
one ``data: {"error": ...}`` event, then the stream ends. A client that goes away cancels its
requests in the worker. With `n > 1`, choice 0 runs first; once its prompt is prefilled the
other choices start and reuse its KV through the prefix cache (only the last, partial KV
block of the prompt is computed again per choice).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from aiohttp import web

from . import __version__
from . import protocol as p
from .chat_output import ChatOutputPlan
from .chat_template import render_chat
from .errors import ApiError, bad_request, server_error
from .generation import Delta, Finished, generate_text, token_budget
from .http_common import REGISTRY, SESSION_ID, SESSIONS, json_body, start_stream
from .openai_schemas import ChatCompletionRequest, CompletionRequest, SamplingFields, parse_request
from .reasoning import ReasoningSupport, prompt_opens_reasoning, reasoning_support
from .sessions import Session, SessionTable
from .structured import response_format_grammar
from .supervisor import ModelSupervisor
from .tools import (
    ToolPlan,
    ToolSpecError,
    fallback_messages,
    function_specs,
    grammar_error,
    marker_token_ids,
    plan_tools,
    resolve_tool_choice,
    template_messages,
    tool_call_grammar,
)
from .worker_client import ACCEPTED, Accepted, WorkerError

log = logging.getLogger("llmd.api")

Piece = tuple[int, Delta | Finished]
MakeChoice = Callable[[int], AsyncIterator[Accepted | Delta | Finished]]


def _sampling(req: SamplingFields, index: int, top_logprobs: int) -> p.SamplingParams:
    """Choice `index` of a seeded request uses seed + index: choices differ, runs repeat."""
    seed = None if req.seed is None else (req.seed + index) % 2**64
    return p.SamplingParams(
        temperature=req.temperature,
        top_k=req.top_k,
        top_p=req.top_p,
        min_p=req.min_p,
        seed=seed,
        frequency_penalty=req.frequency_penalty,
        presence_penalty=req.presence_penalty,
        repetition_penalty=req.repetition_penalty,
        logit_bias=req.logit_bias_ids(),
        top_logprobs=top_logprobs,
    )


def _check_logit_bias(req: SamplingFields, model: ModelSupervisor) -> None:
    assert model.worker is not None and model.worker.ready is not None
    vocab = model.worker.ready.model.vocab_size
    for token in req.logit_bias_ids():
        if token >= vocab:
            raise bad_request(
                f"logit_bias names token {token}, outside this model's vocabulary of {vocab}",
                param="logit_bias",
            )


def _usage(finished: list[Finished]) -> dict[str, Any]:
    """The prompt counts once however many choices shared it (as OpenAI bills it)."""
    first = finished[0]
    completion = sum(f.completion_tokens for f in finished)
    return {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens},
    }


# ---------------------------------------------------------------------- choices


_END = object()


async def run_choices(make: MakeChoice, n: int) -> AsyncIterator[Accepted | Piece]:
    """ACCEPTED once choice 0's request is in the worker, then (index, piece) of every
    choice as they come. Raises the first choice error. Closing it cancels every choice."""
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    tasks: list[asyncio.Task[None]] = []

    async def pump(index: int) -> None:
        pieces = make(index)
        try:
            async for piece in pieces:
                queue.put_nowait((index, piece))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            queue.put_nowait((index, exc))
        finally:
            await pieces.aclose()  # type: ignore[attr-defined]
            queue.put_nowait((index, _END))

    def start_the_rest() -> None:
        tasks.extend(asyncio.create_task(pump(i)) for i in range(1, n))

    tasks.append(asyncio.create_task(pump(0)))
    rest_started = n == 1
    ended = 0
    try:
        while ended < len(tasks) or not rest_started:
            index, piece = await queue.get()
            if piece is _END:
                ended += 1
                if index == 0 and not rest_started:
                    rest_started = True
                    start_the_rest()
                continue
            if isinstance(piece, Exception):
                raise piece
            if isinstance(piece, Accepted):
                if index == 0:
                    yield ACCEPTED
                continue
            if not rest_started:  # choice 0's prompt KV is cached now: the rest reuse it
                rest_started = True
                start_the_rest()
            yield index, piece
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _choice_maker(
    request: web.Request,
    req: SamplingFields,
    model: ModelSupervisor,
    prompt: list[int],
    max_tokens: int,
    top_logprobs: int,
    grammar: str | None = None,
    show_tokens: frozenset[int] = frozenset(),
) -> MakeChoice:
    """Choice i's generation; choice 0 runs in the request's named session (`session_id` or
    an `X-Session-Id` header), whose KV then stays pinned in the worker. `grammar`: a forced
    tool call's (else the response_format's, if any)."""
    grammar = grammar or response_format_grammar(req.response_format)
    sid = req.session_id or request.headers.get("X-Session-Id") or ""
    if sid and not SESSION_ID.match(sid):
        raise bad_request("X-Session-Id must be 1-128 letters, digits or ._:@-", param="session_id")
    table = request.app[SESSIONS]
    session = table.begin(sid, req.model, model, req.session_ttl) if sid else None

    def make(index: int) -> AsyncIterator[Accepted | Delta | Finished]:
        pieces = generate_text(
            model,
            prompt,
            max_tokens=max_tokens,
            sampling=_sampling(req, index, top_logprobs),
            stops=req.stop_list(),
            session=sid if index == 0 else "",
            grammar=grammar,
            show_tokens=show_tokens,
        )
        if index == 0 and session is not None:
            return _in_session(pieces, table, session)
        return pieces

    return make


async def _in_session(
    pieces: AsyncIterator[Accepted | Delta | Finished], table: SessionTable, session: Session
) -> AsyncIterator[Accepted | Delta | Finished]:
    try:
        async for piece in pieces:
            yield piece
    finally:
        await pieces.aclose()  # type: ignore[attr-defined]
        await table.end(session)


# ---------------------------------------------------------------------- transport


@dataclass
class Collected:
    """One choice, gathered for a non-streaming answer."""

    text: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[p.TokenLogprob] = field(default_factory=list)
    finished: Finished | None = None


async def _collect(pieces: AsyncIterator[Accepted | Piece], n: int) -> list[Collected]:
    out = [Collected() for _ in range(n)]
    try:
        async for item in pieces:
            if isinstance(item, Accepted):
                continue
            index, piece = item
            if isinstance(piece, Finished):
                out[index].finished = piece
            else:
                out[index].text.append(piece.text)
                out[index].tokens += piece.tokens
                out[index].logprobs += piece.logprobs
    finally:
        await pieces.aclose()  # type: ignore[attr-defined]  # client gone: cancel in worker
    return out


async def _sse_send(resp: web.StreamResponse, payload: Any) -> None:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    await resp.write(f"data: {data}\n\n".encode())


async def _stream(
    request: web.Request,
    pieces: AsyncIterator[Accepted | Piece],
    chunks: Callable[[int, Delta | Finished | None], list[dict[str, Any]]],
    usage_base: dict[str, Any] | None,
    n: int,
) -> web.StreamResponse:
    """`chunks(index, None)` gives a choice's opening chunks (role, echo), sent before its
    first piece; `usage_base` the envelope of the final usage chunk when the client asked
    for one (`stream_options.include_usage`)."""
    try:
        # Until the worker has the request (429 when full), errors are plain HTTP statuses.
        if not isinstance(await anext(pieces), Accepted):
            raise RuntimeError("generation did not start with ACCEPTED")
        resp = await start_stream(request, "text/event-stream")
        finished: list[Finished | None] = [None] * n
        try:
            for index in range(n):
                for chunk in chunks(index, None):
                    await _sse_send(resp, chunk)
            async for item in pieces:
                assert not isinstance(item, Accepted)
                index, piece = item
                if isinstance(piece, Finished):
                    finished[index] = piece
                for chunk in chunks(index, piece):
                    await _sse_send(resp, chunk)
            if usage_base is not None:
                usage = _usage([f for f in finished if f is not None])
                await _sse_send(resp, {**usage_base, "choices": [], "usage": usage})
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


def _envelope(obj: str, cid: str, created: int, model: str) -> dict[str, Any]:
    return {"id": cid, "object": obj, "created": created, "model": model}


# ---------------------------------------------------------------------- chat


async def chat_completions(request: web.Request) -> web.StreamResponse:
    req = parse_request(await json_body(request), ChatCompletionRequest)
    async with request.app[REGISTRY].use(req.model, req.keep_alive_seconds()) as model:
        return await _chat(request, req, model)


@lru_cache(maxsize=32)
def _template_plans(template: str) -> tuple[ToolPlan, ReasoningSupport]:
    """How a template's model speaks tools and whether it thinks: read once per template."""
    return plan_tools(template, None), reasoning_support(template, None)


@dataclass
class ChatPrompt:
    ids: list[int]
    output: ChatOutputPlan
    grammar: str | None
    show_tokens: frozenset[int]


def _chat_prompt(req: ChatCompletionRequest, model: ModelSupervisor) -> ChatPrompt:
    """Render the conversation (with tools, natively or through llmd's fallback prompt),
    and decide how the answer is parsed and what, if anything, constrains it."""
    text = model.text
    template = text.chat_template
    assert template is not None
    plan, thinking = _template_plans(template)
    messages = [m.for_template() for m in req.messages]
    try:
        specs = function_specs(req.tools)
        choice = resolve_tool_choice(req.tool_choice, specs)
    except ToolSpecError as exc:
        raise bad_request(str(exc), param=exc.param) from exc
    offer_tools = bool(specs) and choice.mode != "none"
    has_tool_turns = any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    extra: dict[str, Any] = {}
    if (offer_tools or has_tool_turns) and plan.template_renders_tools:
        messages = template_messages(messages)
        if offer_tools:
            extra["tools"] = req.tools
    elif offer_tools or has_tool_turns:
        messages = fallback_messages(messages, req.tools if offer_tools else None, plan.family)
    rendered = render_chat(
        template, messages, bos_token=text.bos_token, eos_token=text.eos_token, **extra
    )
    ids = text.encode_rendered_chat(rendered)
    starts_in = thinking.is_reasoning_model and prompt_opens_reasoning(rendered)
    parallel = req.parallel_tool_calls is not False
    grammar = None
    if offer_tools and choice.forces_call:
        if req.response_format is not None and req.response_format.type != "text":
            raise bad_request(
                "a forced tool call and response_format cannot both constrain the answer",
                param="tool_choice",
            )
        special = marker_token_ids(plan.parser, text.tokenizer.token_to_id, text.special_ids)
        reasoning = ("open" if starts_in else "optional") if thinking.is_reasoning_model else None
        grammar = tool_call_grammar(
            specs, choice, plan.parser, parallel, special_tokens=special, reasoning=reasoning
        )
        if grammar is not None and (error := grammar_error(grammar)):
            raise bad_request(f"the tools cannot be enforced: {error}", param="tools")
    show: set[int] = set()
    if offer_tools:
        for marker in plan.parser.visible_tokens:
            token = text.tokenizer.token_to_id(marker)
            if token is not None:
                show.add(token)
    names = tuple(s.name for s in specs) if choice.function is None else (choice.function,)
    output = ChatOutputPlan(
        split_reasoning=thinking.is_reasoning_model,
        starts_in_reasoning=starts_in,
        keep_inline=req.reasoning_format == "none",
        tools=plan.parser if offer_tools else None,
        function_names=names,
        parallel=parallel,
    )
    return ChatPrompt(ids, output, grammar, frozenset(show))


async def _chat(
    request: web.Request, req: ChatCompletionRequest, model: ModelSupervisor
) -> web.StreamResponse:
    if not model.text.chat_template:
        raise bad_request(
            f"model '{req.model}' has no chat template; use /v1/completions", param="model"
        )
    _check_logit_bias(req, model)
    # Off the event loop: a long prompt must not stall other clients' streams.
    chat = await asyncio.to_thread(_chat_prompt, req, model)
    prompt = chat.ids
    requested, limit_param = req.token_limit()
    max_tokens = token_budget(
        len(prompt),
        requested,
        model.context_length,
        limit_param=limit_param,
        prompt_param="messages",
    )
    top_logprobs = req.engine_logprobs()
    make = _choice_maker(
        request, req, model, prompt, max_tokens, top_logprobs, chat.grammar, chat.show_tokens
    )
    pieces = run_choices(make, req.n)
    cid = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    texts = model.text.token_texts
    base = {**_envelope("chat.completion.chunk", cid, created, req.model)}
    base["system_fingerprint"] = f"llmd-{__version__}"

    def logprobs_of(tokens: list[int], lps: list[p.TokenLogprob]) -> dict[str, Any] | None:
        if top_logprobs < 0:
            return None
        return {
            "content": [texts.chat_entry(t, lp) for t, lp in zip(tokens, lps, strict=True)],
            "refusal": None,
        }

    if req.stream:
        include_usage = req.include_usage()
        streams = [chat.output.stream() for _ in range(req.n)]

        def chunk(index: int, delta: dict[str, Any], **fields: Any) -> dict[str, Any]:
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
            out = {**base, "choices": [{**choice, **fields}]}
            if include_usage:
                out["usage"] = None
            return out

        def chunks(index: int, piece: Delta | Finished | None) -> list[dict[str, Any]]:
            if piece is None:
                return [chunk(index, {"role": "assistant", "content": ""})]
            if isinstance(piece, Finished):
                deltas, reason = streams[index].finish(piece.finish_reason)
                return [chunk(index, d) for d in deltas] + [chunk(index, {}, finish_reason=reason)]
            deltas = streams[index].feed(piece.text)
            lp = logprobs_of(piece.tokens, piece.logprobs)
            if lp is not None and not deltas:
                deltas = [{"content": ""}]
            return [chunk(index, d, logprobs=lp if i == 0 else None) for i, d in enumerate(deltas)]

        return await _stream(request, pieces, chunks, base if include_usage else None, req.n)

    collected = await _collect(pieces, req.n)
    finished = [c.finished for c in collected if c.finished is not None]
    choices = []
    for i, c in enumerate(collected):
        message, reason = chat.output.whole(
            "".join(c.text), c.finished.finish_reason if c.finished else "stop"
        )
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": logprobs_of(c.tokens, c.logprobs),
                "finish_reason": reason,
            }
        )
    return web.json_response(
        {
            **_envelope("chat.completion", cid, created, req.model),
            "system_fingerprint": f"llmd-{__version__}",
            "choices": choices,
            "usage": _usage(finished),
        }
    )


# ---------------------------------------------------------------------- completions


async def completions(request: web.Request) -> web.StreamResponse:
    req = parse_request(await json_body(request), CompletionRequest)
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
    prompt_text = req.prompt_text()
    prompt = await asyncio.to_thread(model.text.encode, prompt_text)
    if not prompt:
        raise bad_request("the prompt is empty", param="prompt")
    _check_logit_bias(req, model)
    max_tokens = token_budget(
        len(prompt),
        req.max_tokens,
        model.context_length,
        limit_param="max_tokens",
        prompt_param="prompt",
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

    make = _choice_maker(request, req, model, prompt, max_tokens, top_logprobs)
    pieces = run_choices(make, req.n)
    echoed = prompt_text if req.echo else ""

    if req.stream:
        include_usage = req.include_usage()
        offsets = [len(echoed)] * req.n

        def chunk(index: int, text: str, logprobs: Any, finish: str | None) -> dict[str, Any]:
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
            out = {**base, "choices": [choice]}
            if include_usage:
                out["usage"] = None
            return out

        def chunks(index: int, piece: Delta | Finished | None) -> list[dict[str, Any]]:
            if piece is None:
                if not req.echo:
                    return []
                return [chunk(index, echoed, lp_object(prompt, echo_lps, 0), None)]
            if isinstance(piece, Finished):
                return [chunk(index, "", None, piece.finish_reason)]
            lp = lp_object(piece.tokens, piece.logprobs, offsets[index])
            offsets[index] += len(piece.text)
            return [chunk(index, piece.text, lp, None)] if piece.text or lp else []

        return await _stream(request, pieces, chunks, base if include_usage else None, req.n)

    collected = await _collect(pieces, req.n)
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
    return web.json_response({**base, "choices": choices, "usage": _usage(finished)})


def add_openai_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
