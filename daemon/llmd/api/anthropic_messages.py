"""Anthropic's Messages API: `POST /v1/messages` (whole or streamed) and
`POST /v1/messages/count_tokens`, as a thin translation over chat_pipeline.py (the request
side lives in anthropic_schemas.py).

The pipeline's OpenAI deltas become Anthropic content blocks: a change of kind (reasoning ->
text -> tool call N) closes the open block and opens the next with the next `index`. The
whole answer is assembled from the same events as the stream, so both always agree and the
matched stop sequence (which only the end event carries) is reported in both.

Usage: `input_tokens` counts the prompt tokens that were computed, `cache_read_input_tokens`
those reused from llmd's prefix cache (input + cache_read = the whole prompt, which is what
count_tokens returns); `cache_creation_input_tokens` is always 0 (caching is automatic). A
stream's `message_start` is sent once the engine has admitted the request, so it carries the
split already (agents show it); if admission waits longer than FIRST_EVENT_WAIT (every
sequence slot busy), it goes out without the split, which `message_delta` then reports. While
the model prefills, `ping` events keep the stream alive (http_common.relay).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from llmd.api.anthropic_schemas import (
    ThinkingDisplay,
    Translated,
    anthropic_error,
    translate_count_tokens,
    translate_messages,
)
from llmd.api.http_common import (
    REGISTRY,
    add_error_shape,
    parsed_body,
    pipeline_context,
    relay,
    sse,
)
from llmd.api.remote_routes import count_remote, remote_for, start_remote
from llmd.errors import ApiError, bad_request
from llmd.text.chat_pipeline import (
    ChatEvent,
    ChatRun,
    ChoiceDelta,
    ChoiceEnd,
    ChoiceStarted,
    chat_prompt,
    request_images,
    start_chat,
)
from llmd.text.generation import Finished, require_generation
from llmd.text.remote_chat import AnyRun

SSE = "text/event-stream"
PING = b'event: ping\ndata: {"type": "ping"}\n\n'
FIRST_EVENT_WAIT = 5.0  # seconds message_start waits for the engine's cache split
# Thinking blocks carry a signature field; llmd's thinking needs no verification, so it is
# empty (clients may send it back: thinking in the history is dropped anyway).
SIGNATURE = ""

Event = tuple[str, dict[str, Any]]


# ---------------------------------------------------------------------- blocks


@dataclass
class _Open:
    kind: str  # "thinking", "text" or "tool:<pipeline index>"
    block: dict[str, Any]
    arguments: list[str] = field(default_factory=list)


class BlockAssembler:
    """One answer's OpenAI deltas -> Anthropic content blocks, both as stream events
    (`feed` / `close` return them) and as the final `content` list.

    A text block never consists of whitespace alone and never starts with it (the newlines a
    model writes between its thinking or tool-call markup and its answer), matching what
    Anthropic returns and accepts back. Thinking is shown only when the request enabled it.
    """

    def __init__(self, thinking: ThinkingDisplay = "hidden") -> None:
        self.thinking = thinking
        self.content: list[dict[str, Any]] = []
        self._open: _Open | None = None

    def feed(self, delta: dict[str, Any]) -> list[Event]:
        if "reasoning_content" in delta:
            return self._thinking(delta["reasoning_content"] or "")
        if "content" in delta:
            return self._text(delta["content"] or "")
        events: list[Event] = []
        for call in delta.get("tool_calls") or []:
            events += self._tool(call)
        return events

    def close(self) -> list[Event]:
        """Close the open block (the answer is complete)."""
        opened, self._open = self._open, None
        if opened is None:
            return []
        index = len(self.content) - 1
        events: list[Event] = []
        if opened.kind == "thinking":
            opened.block["signature"] = SIGNATURE
            events.append(_delta(index, {"type": "signature_delta", "signature": SIGNATURE}))
        elif opened.kind.startswith("tool:"):
            opened.block["input"] = _tool_input("".join(opened.arguments))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        return events

    def _start(self, kind: str, block: dict[str, Any]) -> list[Event]:
        events = self.close()
        self._open = _Open(kind, block)
        self.content.append(block)
        start = {"type": "content_block_start", "index": len(self.content) - 1}
        # The start event carries the block empty; its text arrives as deltas.
        events.append(("content_block_start", {**start, "content_block": dict(block)}))
        return events

    def _thinking(self, text: str) -> list[Event]:
        if self.thinking == "hidden" or not text:
            return []
        events: list[Event] = []
        if self._open is None or self._open.kind != "thinking":
            events += self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        if self.thinking == "omitted":
            return events
        self._open.block["thinking"] += text  # type: ignore[union-attr]
        return [
            *events,
            _delta(len(self.content) - 1, {"type": "thinking_delta", "thinking": text}),
        ]

    def _text(self, text: str) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self._open.kind != "text":
            text = text.lstrip()
            if not text:
                return []
            events += self._start("text", {"type": "text", "text": ""})
        self._open.block["text"] += text  # type: ignore[union-attr]
        return [*events, _delta(len(self.content) - 1, {"type": "text_delta", "text": text})]

    def _tool(self, call: dict[str, Any]) -> list[Event]:
        kind = f"tool:{call.get('index', 0)}"
        fn = call.get("function") or {}
        events: list[Event] = []
        if call.get("id") or self._open is None or self._open.kind != kind:
            block = {
                "type": "tool_use",
                "id": tool_use_id(call.get("id") or ""),
                "name": fn.get("name") or "",
                "input": {},
            }
            events += self._start(kind, block)
        fragment = fn.get("arguments") or ""
        if not fragment:
            return events
        self._open.arguments.append(fragment)  # type: ignore[union-attr]
        delta = {"type": "input_json_delta", "partial_json": fragment}
        return [*events, _delta(len(self.content) - 1, delta)]


def _delta(index: int, delta: dict[str, Any]) -> Event:
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def _tool_input(arguments: str) -> dict[str, Any]:
    """The pipeline validates a call's JSON before it reports the call; an object with no
    arguments is `{}`."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:  # a streamed call cut by max_tokens: its partial JSON went out
        return {}
    return value if isinstance(value, dict) else {"value": value}


def tool_use_id(pipeline_id: str) -> str:
    """`call_X` -> `toolu_X`: Anthropic's spelling; tool_result blocks quote it back."""
    if pipeline_id.startswith("call_"):
        return "toolu_" + pipeline_id[len("call_") :]
    return pipeline_id or f"toolu_{uuid.uuid4().hex[:24]}"


# ---------------------------------------------------------------------- message


def stop_reason(finish_reason: str, stop_sequence: str | None) -> tuple[str, str | None]:
    """The pipeline's finish reason -> Anthropic's `stop_reason` and `stop_sequence`."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if stop_sequence is not None:
        return "stop_sequence", stop_sequence
    return "end_turn", None


def usage(finished: Finished | ChoiceStarted | None, prompt_tokens: int) -> dict[str, int]:
    """Anthropic's usage from the end of the run (or its admission, for message_start)."""
    cached = finished.cached_tokens if finished else 0
    prompt = finished.prompt_tokens if finished else prompt_tokens
    return {
        "input_tokens": prompt - cached,
        "output_tokens": finished.completion_tokens if isinstance(finished, Finished) else 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def message_envelope(mid: str, model: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": None,
        "stop_sequence": None,
    }


# ---------------------------------------------------------------------- routes


async def create_message(request: web.Request) -> web.StreamResponse:
    tr = await parsed_body(request, translate_messages)
    req = tr.chat
    remote = await remote_for(request, req.model)
    if remote is not None:  # the same translation, answered by the remote's upstream
        return await _answer(request, tr, await start_remote(request, remote, req))
    async with request.app[REGISTRY].use(req.model, req.keep_alive_seconds()) as model:
        return await _answer(request, tr, await start_chat(pipeline_context(request), req, model))


async def _answer(request: web.Request, tr: Translated, run: AnyRun) -> web.StreamResponse:
    """The run's events as an Anthropic message, whole or streamed; closes the run."""
    req = tr.chat
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    blocks = BlockAssembler(tr.thinking)
    try:
        if not req.stream:
            end: ChoiceEnd | None = None
            async for event in run.events():
                if isinstance(event, ChoiceDelta):
                    blocks.feed(event.delta)
                else:
                    end = event
            blocks.close()
            assert end is not None
            reason, sequence = stop_reason(end.finish_reason, end.finished.stop_sequence)
            body = message_envelope(mid, req.model, blocks.content)
            body.update(
                stop_reason=reason,
                stop_sequence=sequence,
                usage=usage(end.finished, run.prompt_tokens),
            )
            return web.json_response(body)

        async def frames() -> AsyncIterator[bytes]:
            events = run.events(started=True)
            # A remote's run reports no admission: its first event is already the answer.
            admitted, first = (
                await _first_event(events) if isinstance(run, ChatRun) else (None, None)
            )
            start = message_envelope(mid, req.model, [])
            start["usage"] = usage(admitted, run.prompt_tokens)
            yield sse({"type": "message_start", "message": start}, event="message_start")
            yield PING
            end: ChoiceEnd | None = None
            async for event in _resume(first, events):
                if isinstance(event, ChoiceDelta):
                    for name, payload in blocks.feed(event.delta):
                        yield sse(payload, event=name)
                elif isinstance(event, ChoiceEnd):
                    end = event
            for name, payload in blocks.close():
                yield sse(payload, event=name)
            assert end is not None
            reason, sequence = stop_reason(end.finish_reason, end.finished.stop_sequence)
            yield sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage(end.finished, run.prompt_tokens),
                },
                event="message_delta",
            )
            yield sse({"type": "message_stop"}, event="message_stop")

        return await relay(
            request,
            run.accepted(),
            frames(),
            content_type=SSE,
            error_frame=_error_event,
            keepalive=PING,
            keepalive_after_first=True,  # message_start comes first
        )
    finally:
        await run.aclose()


async def _first_event(
    events: AsyncIterator[ChatEvent],
) -> tuple[ChoiceStarted | None, asyncio.Future[ChatEvent] | None]:
    """The run's admission (its cache split), waited for up to FIRST_EVENT_WAIT; otherwise
    None and the still pending first event, which `_resume` hands on."""
    first = asyncio.ensure_future(anext(events))
    done, _ = await asyncio.wait({first}, timeout=FIRST_EVENT_WAIT)
    if done and isinstance(event := first.result(), ChoiceStarted):
        return event, None
    return None, first


async def _resume(
    first: asyncio.Future[ChatEvent] | None, events: AsyncIterator[ChatEvent]
) -> AsyncIterator[ChatEvent]:
    """The events after `_first_event`, its pending one first."""
    if first is not None:
        try:
            yield await first
        except StopAsyncIteration:
            return
    async for event in events:
        yield event


async def count_tokens(request: web.Request) -> web.Response:
    """The rendered prompt's length in tokens: the same rendering as a generation (template,
    tools prompt), so it equals that request's input + cache_read tokens."""
    req = await parsed_body(request, translate_count_tokens)
    remote = await remote_for(request, req.model)
    if remote is not None:
        return web.json_response({"input_tokens": await count_remote(request, remote, req)})
    async with request.app[REGISTRY].use(req.model, req.keep_alive_seconds()) as model:
        require_generation(model)
        if not model.text.chat_template:
            raise bad_request(f"model '{req.model}' has no chat template", param="model")
        images = await request_images(pipeline_context(request), req, model)
        prompt = await asyncio.to_thread(chat_prompt, req, model, images)
    return web.json_response({"input_tokens": len(prompt.ids)})


def _error_event(err: ApiError) -> bytes:
    """A started stream's error: an `error` event in Anthropic's shape, then the end."""
    return sse(anthropic_error(err), event="error")


def add_anthropic_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages", create_message)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
    add_error_shape(app, "/v1/messages", anthropic_error)
