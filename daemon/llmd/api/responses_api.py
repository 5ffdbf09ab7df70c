"""OpenAI's Responses API (`POST /v1/responses`, `GET`/`DELETE /v1/responses/{id}`,
`GET /v1/responses/{id}/input_items`): a thin translation into the one chat pipeline
(chat_pipeline.py) and back.

Request: `input` items (messages, `function_call`, `custom_tool_call` and their outputs;
`reasoning` items, whose `encrypted_content` llmd sealed is read back onto the assistant turn)
become chat messages, `instructions` a leading system message (without it, `developer`
messages are the system prompt, as Codex sends it), `tools` and `tool_choice` the chat ones
(responses_tools.py: function, `namespace` and freeform `custom` tools; hosted tools dropped),
`text.format` the `response_format`, `max_output_tokens` the completion limit. Anything that
would change the answer and that llmd cannot do (unknown tool types, images, `include` values
other than `reasoning.encrypted_content`, background runs, unknown parameters, ...) is a 400
naming it; `client_metadata` (Codex's tracing) is accepted and ignored.

Conversation state: a stored response keeps its whole conversation (response_store.py); a
request with `previous_response_id` appends its input to it and runs in the chain's named
session, so the worker keeps the chain's KV pinned and prefills only the new tokens (reported
as `usage.input_tokens_details.cached_tokens`). As OpenAI documents, the previous response's
`instructions` are not carried over. The first response of a chain runs without a session (most
responses are never continued, and each session pins memory); its KV still sits in the prefix
cache for the follow-up. When `--max-sessions` are all open, a chain runs without pinning
rather than failing. Clients that keep their own history (`store: false`, the whole
conversation each turn: Codex) name it with `prompt_cache_key`; requests with the same key
share one named session, so each turn prefills only what the last one did not.

`truncation: "auto"`: when the conversation does not fit the context, the oldest turns (up to
the next user message; leading system messages stay) are dropped until it does; the stored
conversation keeps them all. `"disabled"` (the default) answers 400 instead.

Output: `reasoning` items (a reasoning model's thinking, whole, as `summary_text`, and as
`encrypted_content` when `include` asks; `effort` and `summary` are accepted but the model
thinks as its template does), a `message` with one `output_text`, `function_call` items (with
`namespace` for a namespaced tool) and `custom_tool_call` items; `status: "incomplete"` with
`incomplete_details.reason: "max_output_tokens"` when the limit (or the context) cut it. A
custom tool's grammar is enforced: a forced call is generated under it; a call the model chose
whose input does not match is generated again under it (same prompt, cached prefix). Streaming
is OpenAI's typed SSE events, each with a `sequence_number` (custom tool calls are sent whole,
once checked); an error after the stream started is an `error` event followed by
`response.failed`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from llmd.api.http_common import (
    REGISTRY,
    SESSIONS,
    SSE_KEEPALIVE,
    parsed_body,
    pipeline_context,
    relay,
    sse,
)
from llmd.api.remote_routes import remote_for, start_remote
from llmd.api.response_store import ResponseStore, StoredResponse, open_reasoning, seal_reasoning
from llmd.api.responses_tools import (
    ToolEntry,
    ToolSet,
    call_item,
    custom_arguments,
    custom_call_item,
    custom_input,
    input_matches,
    model_name,
    read_tool_choice,
    read_tools,
)
from llmd.errors import ApiError, bad_request
from llmd.runtime.sessions import SESSION_ID
from llmd.runtime.supervisor import ModelSupervisor
from llmd.store.remotes import RemoteRecord
from llmd.text.chat_pipeline import ChoiceDelta, ChoiceEnd, start_chat, usage_of
from llmd.text.openai_schemas import (
    ChatCompletionRequest,
    ChatMessage,
    image_refs,
    name_image_parts,
)
from llmd.text.remote_chat import AnyRun, RemoteRun
from llmd.text.tools import new_call_id

RESPONSES = web.AppKey("responses", ResponseStore)
SSE = "text/event-stream"


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# ---------------------------------------------------------------------- request schema


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextFormat(BaseModel):
    """`text.format`: `{type: text}`, `{type: json_object}` or
    `{type: json_schema, name, schema, description, strict}` (flat, unlike chat's)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # deprecated alias
    context: Literal["auto", "current_turn", "all_turns"] | None = None


class ResponsesStreamOptions(_Strict):
    # Pads events against side channels on the wire; the text is the same. Accepted, ignored.
    include_obfuscation: bool | None = None


# llmd's sampling extensions, passed to the pipeline as on /v1/chat/completions.
EXTENSIONS = (
    "seed",
    "top_k",
    "min_p",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "keep_alive",
)
# `include` values llmd honours: reasoning items carry their thinking in `encrypted_content`
# (response_store.seal_reasoning), so a `store: false` client can send them back.
ENCRYPTED_REASONING = "reasoning.encrypted_content"
INCLUDABLE = frozenset({ENCRYPTED_REASONING})
# Known Responses parameters llmd does not implement: a 400 naming them.
NOT_SUPPORTED = {
    "conversation": "conversations are not supported; use previous_response_id",
    "prompt": "prompt templates are not supported; send input and instructions",
    "context_management": "context_management is not supported; see truncation",
}


class ResponsesRequest(_Strict):
    model: str = Field(min_length=1)
    input: str | list[Any] | None = None
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_output_tokens: int | None = Field(default=None, ge=1)
    stream: bool | None = False
    stream_options: ResponsesStreamOptions | None = None
    store: bool | None = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    # A cache hint: requests with the same key share a named session (their KV stays pinned).
    prompt_cache_key: str | None = Field(default=None, max_length=1024)
    # Harmless here: they cannot change the text (llmd has no hosted tools, no service tiers,
    # and caches prefixes on its own; client_metadata is Codex's tracing, like metadata).
    client_metadata: dict[str, Any] | None = None
    background: bool | None = None
    service_tier: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    max_tool_calls: int | None = Field(default=None, ge=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # llmd extensions (validated by the chat request they are passed to)
    seed: Any = None
    top_k: Any = None
    min_p: Any = None
    stop: Any = None
    frequency_penalty: Any = None
    presence_penalty: Any = None
    repetition_penalty: Any = None
    keep_alive: Any = None

    @model_validator(mode="after")
    def _unsupported_values(self) -> ResponsesRequest:
        if self.input is None:
            raise bad_request("input is required", param="input")
        if isinstance(self.input, list) and not self.input:
            raise bad_request("input must not be an empty list", param="input")
        if self.background:
            raise _unsupported("background responses are not supported by llmd", "background")
        unsupported = [v for v in self.include or [] if v not in INCLUDABLE]
        if unsupported:
            raise _unsupported(
                f"include values not supported by llmd: {', '.join(unsupported)}", "include"
            )
        if self.top_logprobs:
            raise _unsupported("top_logprobs is not supported on /v1/responses", "top_logprobs")
        if self.text is not None and self.text.verbosity not in (None, "medium"):
            raise _unsupported(
                "text.verbosity other than 'medium' is not supported", "text.verbosity"
            )
        if self.stream_options is not None and not self.stream:
            raise bad_request(
                "stream_options is only allowed when stream is true", param="stream_options"
            )
        if self.metadata is not None:
            if len(self.metadata) > 16:
                raise bad_request("metadata holds at most 16 pairs", param="metadata")
            for key, value in self.metadata.items():
                if len(key) > 64 or len(value) > 512:
                    raise bad_request(
                        "metadata keys are at most 64 characters, values at most 512",
                        param="metadata",
                    )
        return self

    def text_format(self) -> TextFormat | None:
        return self.text.format if self.text is not None else None


def _unsupported(message: str, param: str) -> ApiError:
    return bad_request(message, param=param, code="unsupported_parameter")


# Union members and validator names pydantic puts into error locations: they are no params.
_PYDANTIC_TAG = re.compile(r"^(str|int|float|bool|none|list|dict|function-.*|.*\[.*\].*)$")


def _validation_error(exc: ValidationError, rename: Callable[[str], str]) -> ApiError:
    problems: list[str] = []
    params: list[str] = []
    for err in exc.errors():
        parts: list[str] = []
        for item in err["loc"]:
            if isinstance(item, int):
                parts.append(f"[{item}]")
            elif not _PYDANTIC_TAG.match(item):
                parts.append(item)
        param = rename(".".join(parts).replace(".[", "["))
        if param not in params:
            params.append(param)
            problems.append(f"{param}: {err['msg']}" if param else err["msg"])
    return ApiError(
        400, "invalid request: " + "; ".join(problems), param=params[0] if params else None
    )


def parse_responses_request(body: Any) -> ResponsesRequest:
    """Validate a decoded JSON body; every problem is a 400 naming the parameter."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    for key in body:
        if key in NOT_SUPPORTED:
            raise _unsupported(NOT_SUPPORTED[key], key)
    unknown = [k for k in body if k not in ResponsesRequest.model_fields]
    if unknown:
        raise bad_request(
            f"unrecognized request argument(s) supplied: {', '.join(unknown)}",
            param=unknown[0],
            code="unknown_parameter",
        )
    try:
        return ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        raise _validation_error(exc, lambda p: p) from exc


# ---------------------------------------------------------------------- input -> messages


def _text_parts(content: Any, where: str, allowed: tuple[str, ...]) -> list[str]:
    """The texts of a message's content (a string or text parts); other parts are a 400."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of parts", param=where)
    return [_part_text(part, where, j, allowed) for j, part in enumerate(content)]


def _part_text(part: Any, where: str, j: int, allowed: tuple[str, ...]) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return str(part["refusal"])
    if kind not in allowed:
        raise _unsupported(
            f"content parts of type '{kind}' are not supported by llmd here (text"
            + (" and input_image" if "input_image" in allowed else "")
            + ")",
            f"{where}.content[{j}].type",
        )
    if not isinstance(part.get("text"), str):
        raise bad_request(f"{where}.content[{j}].text must be a string", param=where)
    return str(part["text"])


def _image_part(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An `input_image` part as `input_items` lists it back; its URL (a data URL, or http(s)
    under `--allow-remote-images`) is decoded by the pipeline, which names `where` if bad."""
    if part.get("file_id") is not None:
        raise _unsupported(
            "input_image with file_id is not supported by llmd (no Files API); send image_url "
            "as a base64 data URL",
            f"{where}.file_id",
        )
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        raise bad_request(f"{where}.image_url must be a non-empty string", f"{where}.image_url")
    detail = part.get("detail", "auto")
    if detail not in ("auto", "low", "high"):
        raise bad_request(f"{where}.detail must be auto, low or high", f"{where}.detail")
    return {"type": "input_image", "image_url": url, "detail": detail, "file_id": None}


def _message_parts(raw: dict[str, Any], role: str, where: str) -> list[dict[str, Any]]:
    """A message's content as normalized parts: its texts, and (not from the assistant) its
    images in place."""
    content = raw.get("content")
    texts_only = ("input_text", "output_text", "text")
    if role != "assistant" and isinstance(content, list):
        if any(isinstance(p, dict) and p.get("type") == "input_image" for p in content):
            parts = []
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") == "input_image":
                    parts.append(_image_part(part, f"{where}.content[{j}]"))
                else:
                    text = _part_text(part, where, j, (*texts_only, "input_image"))
                    parts.append({"type": "input_text", "text": text})
            return parts
    allowed = texts_only if role == "assistant" else (*texts_only, "input_image")
    texts = _text_parts(content, where, allowed)
    part_type = "output_text" if role == "assistant" else "input_text"
    parts = [{"type": part_type, "text": t} for t in texts]
    if role == "assistant":
        parts = [{**p, "annotations": []} for p in parts]
    return parts


def image_places(items: list[dict[str, Any]]) -> list[str]:
    """Where each image of normalized `items` is in the request (`input[i].content[j]`), in
    the order items_to_messages puts them into the conversation."""
    return [
        f"input[{i}].content[{j}]"
        for i, item in enumerate(items)
        if item["type"] == "message"
        for j, part in enumerate(item["content"])
        if part["type"] == "input_image"
    ]


def _string_field(raw: dict[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or (key != "arguments" and not value):
        raise bad_request(f"{where}.{key} must be a non-empty string", param=f"{where}.{key}")
    return value


def normalize_input(value: str | list[Any]) -> list[dict[str, Any]]:
    """`input` as OpenAI lists it back (`input_items`): typed items with ids."""
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    items: list[dict[str, Any]] = []
    for i, raw in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(raw, dict):
            raise bad_request(f"{where} must be an object", param=where)
        kind = raw.get("type", "message" if "role" in raw else None)
        if kind == "message":
            role = raw.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(
                    f"{where}.role must be user, system, developer or assistant",
                    param=f"{where}.role",
                )
            parts = _message_parts(raw, role, where)
            items.append(
                {
                    "type": "message",
                    "id": raw.get("id") or new_id("msg"),
                    "role": role,
                    "status": "completed",
                    "content": parts,
                }
            )
        elif kind == "function_call":
            arguments = raw.get("arguments")
            if isinstance(arguments, dict):
                arguments = json.dumps(arguments)
            item = {
                "type": "function_call",
                "id": raw.get("id") or new_id("fc"),
                "call_id": _string_field(raw, "call_id", where),
                "name": _string_field(raw, "name", where),
                "arguments": _string_field({"arguments": arguments}, "arguments", where),
                "status": "completed",
            }
            items.append(_with_namespace(item, raw, where))
        elif kind == "custom_tool_call":
            item = {
                "type": "custom_tool_call",
                "id": raw.get("id") or new_id("ctc"),
                "call_id": _string_field(raw, "call_id", where),
                "name": _string_field(raw, "name", where),
                "input": _string_field({"arguments": raw.get("input")}, "arguments", where),
                "status": "completed",
            }
            items.append(_with_namespace(item, raw, where))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            items.append(_call_output(raw, kind, where))
        elif kind == "reasoning":
            items.append(_reasoning_input(raw))
        else:
            raise _unsupported(
                f"input items of type '{kind}' are not supported by llmd (messages, "
                "function_call, custom_tool_call, their outputs and reasoning are)",
                f"{where}.type",
            )
    return items


def _with_namespace(item: dict[str, Any], raw: dict[str, Any], where: str) -> dict[str, Any]:
    """A call item keeps its tool's `namespace` (how the model saw the tool's name)."""
    namespace = raw.get("namespace")
    if namespace is None:
        return item
    if not isinstance(namespace, str) or not namespace:
        raise bad_request(f"{where}.namespace must be a non-empty string", f"{where}.namespace")
    return {**item, "namespace": namespace}


def _call_output(raw: dict[str, Any], kind: str, where: str) -> dict[str, Any]:
    """A tool's result (`function_call_output` or `custom_tool_call_output`); content-part
    outputs are joined as text."""
    output = raw.get("output")
    if not isinstance(output, str):
        texts = _text_parts(output, f"{where}.output", ("input_text", "output_text"))
        output = "".join(texts)
    return {
        "type": kind,
        "id": raw.get("id") or new_id("fco" if kind == "function_call_output" else "ctco"),
        "call_id": _string_field(raw, "call_id", where),
        "output": output,
        "status": "completed",
    }


def _reasoning_input(raw: dict[str, Any]) -> dict[str, Any]:
    """A reasoning item sent back: its summary is not replayed (templates drop earlier
    thinking); its `encrypted_content` is kept so the thinking llmd sealed can be read."""
    item: dict[str, Any] = {"type": "reasoning", "id": raw.get("id") or new_id("rs"), "summary": []}
    if isinstance(raw.get("encrypted_content"), str):
        item["encrypted_content"] = raw["encrypted_content"]
    return item


def _chat_parts(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A message's normalized parts as chat content parts (text and image_url)."""
    return [
        {"type": "image_url", "image_url": {"url": p["image_url"], "detail": p["detail"]}}
        if p["type"] == "input_image"
        else {"type": "text", "text": p["text"]}
        for p in parts
    ]


def items_to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normalized input items -> chat messages (the internal form). Calls join the assistant
    message right before them, as one assistant turn with `tool_calls`: a namespaced function
    under the name the model saw (`namespace.name`), a custom tool's call as its `input`
    argument. Thinking sealed in a reasoning item's `encrypted_content` goes back onto the
    assistant turn after it as `reasoning_content` (templates may drop it, as they drop
    earlier thinking)."""
    messages: list[dict[str, Any]] = []
    thinking: str | None = None
    for item in items:
        kind = item["type"]
        if kind == "message":
            if any(p["type"] == "input_image" for p in item["content"]):
                messages.append({"role": item["role"], "content": _chat_parts(item["content"])})
            else:
                text = "".join(p["text"] for p in item["content"])
                messages.append({"role": item["role"], "content": text})
        elif kind in ("function_call", "custom_tool_call"):
            name = model_name(item["name"], item.get("namespace"))
            arguments = (
                item["arguments"] if kind == "function_call" else custom_arguments(item["input"])
            )
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if not last["content"]:
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
        elif kind == "reasoning":
            thinking = open_reasoning(item.get("encrypted_content"))
            continue
        if thinking is not None and messages and messages[-1]["role"] == "assistant":
            messages[-1]["reasoning_content"] = thinking
        thinking = None
    return messages


# ---------------------------------------------------------------------- tools, text.format


def chat_response_format(fmt: TextFormat | None) -> dict[str, Any] | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise bad_request("text.format.schema is required for json_schema", "text.format.schema")
    if not fmt.name:
        raise bad_request("text.format.name is required for json_schema", "text.format.name")
    spec: dict[str, Any] = {"name": fmt.name, "schema": fmt.schema_}
    if fmt.description is not None:
        spec["description"] = fmt.description
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": spec}


# Chat parameter names -> this API's, for errors raised by the pipeline.
_RENAMES = (
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
)


def our_param(param: str | None) -> str | None:
    if param is None:
        return None
    if param == "messages" or param.startswith(("messages.", "messages[")):
        return "input"
    for chat, ours in _RENAMES:
        if param == chat or param.startswith(chat + "."):
            return ours + param[len(chat) :]
    return param


def renamed(err: ApiError) -> ApiError:
    """A pipeline error in this API's parameter names."""
    message = err.message
    for chat, ours in _RENAMES:
        message = message.replace(chat, ours)
    out = ApiError(err.status, message, type=err.type, param=our_param(err.param), code=err.code)
    out.retry_after = err.retry_after  # a busy remote's 429 says when to retry
    return out


def chat_request(
    req: ResponsesRequest,
    messages: list[dict[str, Any]],
    session_id: str | None,
    tools: ToolSet | None = None,
) -> ChatCompletionRequest:
    """The internal request: every sampling, tool and format setting mapped; 400 naming this
    API's parameter when a value does not validate. A forced custom tool call leaves the
    choice to the model here (`auto`): its grammar, passed beside, decides the answer, and the
    prompt stays the one an unforced request renders (so its prefix is cached alike)."""
    tools = tools if tools is not None else read_tools(req.tools)
    choice = read_tool_choice(req.tool_choice, tools)
    fmt = req.text_format()
    if choice.forced_custom is not None:
        if fmt is not None and fmt.type != "text":
            raise bad_request(
                "a forced custom tool call and text.format cannot both constrain the answer",
                param="tool_choice",
            )
        chat_choice: Any = "auto"
    else:
        chat_choice = choice.chat
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "max_completion_tokens": req.max_output_tokens,
        "tools": tools.chat_tools or None,
        "tool_choice": chat_choice,
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": chat_response_format(req.text_format()),
        "session_id": session_id,
    }
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["top_p"] = req.top_p
    for key in EXTENSIONS:
        if getattr(req, key) is not None:
            body[key] = getattr(req, key)
    body = {k: v for k, v in body.items() if v is not None}
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise _validation_error(exc, lambda p: our_param(p) or p) from exc


def drop_oldest_turn(messages: list[ChatMessage]) -> list[ChatMessage] | None:
    """`truncation: auto`: the conversation without its oldest turn (from the first
    non-system message up to the next user message); None when only the last turn is left."""
    head = 0
    while head < len(messages) and messages[head].role in ("system", "developer"):
        head += 1
    cut = head + 1
    while cut < len(messages) and messages[cut].role != "user":
        cut += 1
    if cut >= len(messages):
        return None
    return messages[:head] + messages[cut:]


# ---------------------------------------------------------------------- output mapping


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def reasoning_item(item_id: str, text: str, seal: bool = False) -> dict[str, Any]:
    """A reasoning item; with `seal` (`include: ["reasoning.encrypted_content"]`) it carries
    the thinking in `encrypted_content` for a `store: false` client to send back."""
    summary = [{"type": "summary_text", "text": text}] if text else []
    item: dict[str, Any] = {"type": "reasoning", "id": item_id, "summary": summary}
    if seal:
        item["encrypted_content"] = seal_reasoning(text)
    return item


def output_items(
    message: dict[str, Any],
    finish_reason: str,
    tools: ToolSet | None = None,
    forced: ToolEntry | None = None,
    seal: bool = False,
) -> list[dict[str, Any]]:
    """A whole chat answer -> output items: reasoning, the message (unless the answer is only
    tool calls), then one `function_call` or `custom_tool_call` per call. With `forced` (a
    forced custom tool), the answer's text is that tool's input."""
    tools = tools or ToolSet()
    items: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(new_id("rs"), message["reasoning_content"], seal))
    content = message.get("content") or ""
    if forced is not None:
        status = "incomplete" if finish_reason == "length" else "completed"
        call_id = new_call_id()
        items.append(custom_call_item(new_id("ctc"), call_id, forced, content, status))
        return items
    calls = message.get("tool_calls") or []
    if content or not calls:
        status = "incomplete" if finish_reason == "length" else "completed"
        items.append(message_item(new_id("msg"), content, status))
    for i, call in enumerate(calls):
        fn = call["function"]
        prefix = "ctc" if tools.custom(fn["name"]) else "fc"
        # The limit cut the answer after (or inside) its last call, as the stream says.
        cut = finish_reason == "length" and i == len(calls) - 1
        status = "incomplete" if cut else "completed"
        items.append(
            call_item(tools, new_id(prefix), call["id"], fn["name"], fn["arguments"], status)
        )
    return items


def assistant_message(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Output items -> the assistant turn stored in the conversation (thinking dropped, as
    chat templates drop it from history)."""
    text = "".join(
        part["text"]
        for item in items
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {
                "name": model_name(item["name"], item.get("namespace")),
                "arguments": item["arguments"]
                if item["type"] == "function_call"
                else custom_arguments(item["input"]),
            },
        }
        for item in items
        if item["type"] in ("function_call", "custom_tool_call")
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def responses_usage(chat_usage: dict[str, Any], reasoning_tokens: int) -> dict[str, Any]:
    prompt = chat_usage["prompt_tokens"]
    completion = chat_usage["completion_tokens"]
    cached = chat_usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, completion)},
        "total_tokens": prompt + completion,
    }


def status_of(finish_reason: str) -> tuple[str, dict[str, Any] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def _error_code(err: ApiError) -> str:
    return "rate_limit_exceeded" if err.status == 429 else "server_error"


@dataclass
class ResponseShell:
    """What a response object echoes of its request; `render` fills in the outcome."""

    req: ResponsesRequest
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def render(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        *,
        incomplete: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        req = self.req
        fmt = req.text_format()
        reasoning = req.reasoning
        done = status in ("completed", "incomplete", "failed")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": req.max_tool_calls,
            "model": req.model,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "prompt_cache_key": req.prompt_cache_key,
            "reasoning": {
                "effort": reasoning.effort if reasoning else None,
                "summary": (reasoning.summary or reasoning.generate_summary) if reasoning else None,
            },
            "safety_identifier": req.safety_identifier,
            "service_tier": "default",
            "store": req.store is not False,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {
                "format": fmt.model_dump(by_alias=True, exclude_none=True)
                if fmt
                else {"type": "text"},
                "verbosity": "medium",
            },
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": list(req.tools or []),
            "top_logprobs": 0,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": req.truncation or "disabled",
            "usage": usage if done else None,
            "user": req.user,
            "metadata": dict(req.metadata or {}),
        }


# ---------------------------------------------------------------------- streaming events


@dataclass
class _Open:
    """The output item being streamed."""

    index: int
    kind: str  # message / reasoning / function_call
    text: list[str] = field(default_factory=list)


class ResponseEvents:
    """One answer's chat deltas -> the Responses stream events, in OpenAI's order: every item
    is added, filled by deltas, then done, before the next one starts."""

    def __init__(
        self, shell: ResponseShell, tools: ToolSet | None = None, forced: ToolEntry | None = None
    ) -> None:
        self.shell = shell
        self.tools = tools or ToolSet()
        self.forced = forced
        self.seal = ENCRYPTED_REASONING in (shell.req.include or [])
        self.items: list[dict[str, Any]] = []
        self._open: _Open | None = None
        self._calls: dict[int, int] = {}  # chat tool-call index -> output index
        # Custom tool calls are held back until their input is known to match the grammar
        # (chat index -> [call_id, model function name, argument pieces]).
        self._custom: dict[int, list[Any]] = {}
        self._forced_text: list[str] = []
        self._seq = 0

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        snapshot = self.shell.render("in_progress", [])
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def reasoning_text(self) -> str:
        return "".join(
            part["text"]
            for item in self.items
            if item["type"] == "reasoning"
            for part in item["summary"]
        )

    def delta(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if delta.get("reasoning_content"):
            out += self._ensure("reasoning")
            assert self._open is not None
            self._open.text.append(delta["reasoning_content"])
            out.append(
                self._event(
                    "response.reasoning_summary_text.delta",
                    item_id=self.items[self._open.index]["id"],
                    output_index=self._open.index,
                    summary_index=0,
                    delta=delta["reasoning_content"],
                )
            )
        if delta.get("content") and self.forced is not None:
            self._forced_text.append(delta["content"])
        elif delta.get("content"):
            out += self._ensure("message")
            assert self._open is not None
            self._open.text.append(delta["content"])
            out.append(
                self._event(
                    "response.output_text.delta",
                    item_id=self.items[self._open.index]["id"],
                    output_index=self._open.index,
                    content_index=0,
                    delta=delta["content"],
                    logprobs=[],
                )
            )
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            if call.get("id") and self.tools.custom(fn.get("name", "")):
                self._custom[call["index"]] = [call["id"], fn["name"], []]
            if call["index"] in self._custom:
                self._custom[call["index"]][2].append(fn.get("arguments") or "")
                continue
            if call.get("id"):  # a call starts
                out += self._close("completed")
                index = len(self.items)
                self._calls[call["index"]] = index
                item = call_item(
                    self.tools, new_id("fc"), call["id"], fn.get("name", ""), "", "in_progress"
                )
                self.items.append(item)
                self._open = _Open(index, "function_call")
                out.append(self._event("response.output_item.added", output_index=index, item=item))
            index = self._calls[call["index"]]
            if fn.get("arguments") and self._open is not None and self._open.index == index:
                self._open.text.append(fn["arguments"])
                out.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=self.items[index]["id"],
                        output_index=index,
                        delta=fn["arguments"],
                    )
                )
        return out

    def held_calls(self) -> list[tuple[ToolEntry, str, str]]:
        """The custom tool calls held back: (tool, call_id, input as the model wrote it)."""
        held = []
        if self.forced is not None:
            held.append((self.forced, new_call_id(), "".join(self._forced_text)))
        for call_id, function, pieces in self._custom.values():
            entry = self.tools.custom(function)
            assert entry is not None
            held.append((entry, call_id, custom_input("".join(pieces))))
        return held

    def custom_call(self, entry: ToolEntry, call_id: str, text: str) -> list[dict[str, Any]]:
        """A whole custom tool call's events: added, its input (one delta), done."""
        out = self._close("completed")
        index = len(self.items)
        item_id = new_id("ctc")
        self.items.append(custom_call_item(item_id, call_id, entry, "", "in_progress"))
        out.append(
            self._event(
                "response.output_item.added", output_index=index, item=dict(self.items[index])
            )
        )
        ids = {"item_id": item_id, "output_index": index}
        out.append(self._event("response.custom_tool_call_input.delta", **ids, delta=text))
        out.append(self._event("response.custom_tool_call_input.done", **ids, input=text))
        self.items[index] = custom_call_item(item_id, call_id, entry, text, "completed")
        out.append(
            self._event("response.output_item.done", output_index=index, item=self.items[index])
        )
        return out

    def end(self, finish_reason: str, usage: dict[str, Any]) -> list[dict[str, Any]]:
        """The last item's done events, then `response.completed` (or `.incomplete`)."""
        status, incomplete = status_of(finish_reason)
        out = self._close(status)
        answers = ("message", "function_call", "custom_tool_call")
        if not any(item["type"] in answers for item in self.items):
            out += self._ensure("message") + self._close(status)  # an empty answer
        final = self.shell.render(status, self.items, usage, incomplete=incomplete)
        out.append(self._event(f"response.{status}", response=final))
        return out

    def fail(self, err: ApiError) -> list[dict[str, Any]]:
        """An error after the stream started: an `error` event, then `response.failed`."""
        error = {"code": _error_code(err), "message": err.message}
        failed = self.shell.render("failed", self.items, error=error)
        return [
            self._event("error", code=err.code, message=err.message, param=err.param),
            self._event("response.failed", response=failed),
        ]

    def _ensure(self, kind: str) -> list[dict[str, Any]]:
        if self._open is not None and self._open.kind == kind:
            return []
        out = self._close("completed")
        index = len(self.items)
        if kind == "message":
            item: dict[str, Any] = {**message_item(new_id("msg"), "", "in_progress"), "content": []}
        else:
            item = reasoning_item(new_id("rs"), "", self.seal)
        self.items.append(item)
        self._open = _Open(index, kind)
        ids = {"item_id": item["id"], "output_index": index}
        out.append(self._event("response.output_item.added", output_index=index, item=dict(item)))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(
                self._event("response.content_part.added", **ids, content_index=0, part=part)
            )
        else:
            part = {"type": "summary_text", "text": ""}
            out.append(
                self._event(
                    "response.reasoning_summary_part.added", **ids, summary_index=0, part=part
                )
            )
        return out

    def _close(self, status: str) -> list[dict[str, Any]]:
        """Done events for the open item, which gets its final form in `items`."""
        opened, self._open = self._open, None
        if opened is None:
            return []
        index = opened.index
        text = "".join(opened.text)
        item_id = self.items[index]["id"]
        ids = {"item_id": item_id, "output_index": index}
        out = []
        if opened.kind == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            self.items[index] = message_item(item_id, text, status)
            out.append(
                self._event(
                    "response.output_text.done", **ids, content_index=0, text=text, logprobs=[]
                )
            )
            out.append(self._event("response.content_part.done", **ids, content_index=0, part=part))
        elif opened.kind == "reasoning":
            part = {"type": "summary_text", "text": text}
            self.items[index] = reasoning_item(item_id, text, self.seal)
            out.append(
                self._event(
                    "response.reasoning_summary_text.done", **ids, summary_index=0, text=text
                )
            )
            out.append(
                self._event(
                    "response.reasoning_summary_part.done", **ids, summary_index=0, part=part
                )
            )
        else:
            item = self.items[index]
            item.update(arguments=text, status=status)  # incomplete: the limit cut it
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    **ids,
                    name=item["name"],
                    arguments=text,
                )
            )
        out.append(
            self._event("response.output_item.done", output_index=index, item=self.items[index])
        )
        return out


def event_frame(event: dict[str, Any]) -> bytes:
    return sse(event, event=event["type"])


# ---------------------------------------------------------------------- routes


def _store(request: web.Request) -> ResponseStore:
    return request.app[RESPONSES]


def _not_found(rid: str) -> ApiError:
    return ApiError(
        404, f"No response found with id '{rid}'.", param="response_id", code="not_found"
    )


def _chain_session(request: web.Request, sid: str) -> str | None:
    """The chain's session, unless every session slot is taken by others: then the follow-up
    runs unpinned (the prefix cache may still hold its history) instead of failing."""
    table = request.app[SESSIONS]
    open_ids = [s["id"] for s in table.list()]
    return sid if sid in open_ids or len(open_ids) < table.max_sessions else None


async def _start(
    request: web.Request,
    chat: ChatCompletionRequest,
    model: ModelSupervisor | RemoteRecord,
    auto: bool,
    grammar: str | None = None,
) -> AnyRun:
    """start_chat (or the remote's upstream), dropping the oldest turns while the conversation
    does not fit (with `truncation: auto`); errors in this API's parameter names."""
    while True:
        try:
            if isinstance(model, RemoteRecord):
                return await start_remote(request, model, chat)
            return await start_chat(pipeline_context(request), chat, model, grammar)
        except ApiError as err:
            shorter = drop_oldest_turn(chat.messages) if auto else None
            if not _too_long(err) or shorter is None:
                raise renamed(err) from err
            chat = chat.model_copy(update={"messages": shorter})


def _too_long(err: ApiError) -> bool:
    """A prompt beyond the context: llmd's code, or (from an upstream that sets no code, as
    vLLM) OpenAI's wording of it."""
    return err.code == "context_length_exceeded" or (
        err.status == 400 and "maximum context length" in err.message
    )


@asynccontextmanager
async def _served_by(
    request: web.Request, chat: ChatCompletionRequest, tools: ToolSet
) -> AsyncIterator[ModelSupervisor | RemoteRecord]:
    """The local model (loaded for the request) or the remote that answers `chat`. A remote
    cannot hold a custom tool's input to its grammar (llmd enforces grammars in its own
    engine only): such tools are a 400 there."""
    remote = await remote_for(request, chat.model)
    if remote is None:
        async with request.app[REGISTRY].use(chat.model, chat.keep_alive_seconds()) as model:
            yield model
        return
    for entry in tools.entries.values():
        if entry.kind == "custom" and entry.format is not None and entry.format.syntax:
            raise bad_request(
                f"'{chat.model}' is a remote model: custom tools with a grammar format "
                f"('{entry.name}') are only enforced on local models",
                param="tools",
                code="remote_model_unsupported_here",
            )
    yield remote


def _cache_session(request: web.Request, key: str) -> str | None:
    """`prompt_cache_key` -> the named session its requests share, so an agent's growing
    conversation keeps its KV pinned between turns even with `store: false` (a key that is no
    valid session id is hashed into one)."""
    if not SESSION_ID.match(key) or len(key) > 96:
        key = hashlib.sha256(key.encode()).hexdigest()[:32]
    return _chain_session(request, f"responses.key.{key}")


@dataclass
class _Regenerated:
    """Custom tool inputs generated again under their grammar, and what that cost."""

    inputs: dict[str, str] = field(default_factory=dict)  # call_id -> input
    usage: list[dict[str, Any]] = field(default_factory=list)


async def _grammar_inputs(
    request: web.Request,
    chat: ChatCompletionRequest,
    model: ModelSupervisor | RemoteRecord,
    calls: list[tuple[ToolEntry, str, str]],
) -> _Regenerated:
    """A custom tool call the model chose itself is held to its grammar after the fact: an
    input that does not match is generated again, on the same prompt (its prefix is cached),
    under the grammar. (A forced custom call was generated under it in the first place.)"""
    out = _Regenerated()
    for entry, call_id, text in calls:
        fmt = entry.format
        if fmt is None or fmt.syntax is None or isinstance(model, RemoteRecord):
            continue  # (a remote is never given a custom tool with a grammar: _served_by)
        if await asyncio.to_thread(input_matches, fmt, text, model.text):
            continue
        run = await start_chat(pipeline_context(request), chat, model, fmt.grammar())
        try:
            result = await run.result()
        finally:
            await run.aclose()
        out.inputs[call_id] = result.choices[0].message.get("content") or ""
        out.usage.append(result.usage)
    return out


def _add_usage(usage: dict[str, Any], more: list[dict[str, Any]]) -> dict[str, Any]:
    """Usage including the extra runs that generated custom tool inputs again."""
    for extra in more:
        cached = extra.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        usage["input_tokens"] += extra["prompt_tokens"]
        usage["input_tokens_details"]["cached_tokens"] += cached
        usage["output_tokens"] += extra["completion_tokens"]
        usage["total_tokens"] += extra["prompt_tokens"] + extra["completion_tokens"]
    return usage


async def create_response(request: web.Request) -> web.StreamResponse:
    req = await parsed_body(request, parse_responses_request)
    store = _store(request)
    previous: StoredResponse | None = None
    if req.previous_response_id is not None:
        previous = store.get(req.previous_response_id)
        if previous is None:
            raise ApiError(
                404,
                f"Previous response with id '{req.previous_response_id}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
    assert req.input is not None
    items = normalize_input(req.input)
    new_messages = items_to_messages(items)
    history = previous.messages if previous else []
    shell = ResponseShell(req)
    tools = read_tools(req.tools)
    forced = read_tool_choice(req.tool_choice, tools).forced_custom
    seal = ENCRYPTED_REASONING in (req.include or [])
    # Every response of a chain shares the first one's session; without a chain, requests
    # with the same prompt_cache_key share one.
    chain_sid = previous.session_id if previous else f"responses.{shell.id}"
    if previous:
        run_sid = _chain_session(request, chain_sid)
    else:
        run_sid = _cache_session(request, req.prompt_cache_key) if req.prompt_cache_key else None
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    chat = chat_request(req, system + history + new_messages, run_sid, tools)
    # Images of earlier turns were checked when they were sent; a failure now (a remote one
    # that cannot be fetched any more) is the chain's.
    earlier = len(image_refs(chat.messages)) - len(image_places(items))
    name_image_parts(chat.messages, ["previous_response_id"] * earlier + image_places(items))
    forced_grammar = forced.format.grammar() if forced and forced.format else None

    def remember(output: list[dict[str, Any]], response: dict[str, Any]) -> None:
        if req.store is False:
            return
        conversation = history + new_messages + [assistant_message(output)]
        store.put(StoredResponse(shell.id, response, items, conversation, chain_sid))

    async with _served_by(request, chat, tools) as model:

        async def reasoning_tokens(text: str) -> int:
            if not text:
                return 0
            if isinstance(run, RemoteRun):  # as the upstream counted them, if it did
                return run.reasoning_tokens
            assert isinstance(model, ModelSupervisor)
            return len(await asyncio.to_thread(model.text.encode, text, add_bos=False))

        run = await _start(request, chat, model, req.truncation == "auto", forced_grammar)
        try:
            if not req.stream:
                result = await run.result()
                choice = result.choices[0]
                output = output_items(choice.message, choice.finish_reason, tools, forced, seal)
                held = [
                    (
                        tools.custom(model_name(i["name"], i.get("namespace"))),
                        i["call_id"],
                        i["input"],
                    )
                    for i in output
                    if i["type"] == "custom_tool_call" and forced is None
                ]
                again = await _grammar_inputs(request, chat, model, held)  # type: ignore[arg-type]
                for item in output:
                    if item.get("call_id") in again.inputs:
                        item["input"] = again.inputs[item["call_id"]]
                reasoning = choice.message.get("reasoning_content") or ""
                usage = responses_usage(result.usage, await reasoning_tokens(reasoning))
                usage = _add_usage(usage, again.usage)
                status, incomplete = status_of(choice.finish_reason)
                body = shell.render(status, output, usage, incomplete=incomplete)
                remember(output, body)
                return web.json_response(body)

            events = ResponseEvents(shell, tools, forced)

            async def frames() -> AsyncIterator[bytes]:
                for event in events.start():
                    yield event_frame(event)
                async for ev in run.events():
                    if isinstance(ev, ChoiceDelta):
                        for event in events.delta(ev.delta):
                            yield event_frame(event)
                    elif isinstance(ev, ChoiceEnd):
                        held = events.held_calls()
                        again = await _grammar_inputs(
                            request, chat, model, held if forced is None else []
                        )
                        for entry, call_id, text in held:
                            text = again.inputs.get(call_id, text)
                            for event in events.custom_call(entry, call_id, text):
                                yield event_frame(event)
                        count = await reasoning_tokens(events.reasoning_text())
                        usage = responses_usage(usage_of([ev.finished]), count)
                        final = events.end(ev.finish_reason, _add_usage(usage, again.usage))
                        remember(events.items, final[-1]["response"])
                        for event in final:
                            yield event_frame(event)

            def error_frame(err: ApiError) -> bytes:
                return b"".join(event_frame(e) for e in events.fail(err))

            return await relay(
                request,
                run.accepted(),
                frames(),
                content_type=SSE,
                error_frame=error_frame,
                keepalive=SSE_KEEPALIVE,
            )
        finally:
            await run.aclose()


async def get_response(request: web.Request) -> web.Response:
    rid = request.match_info["response_id"]
    if request.query.get("stream", "false").lower() not in ("false", "0", ""):
        raise _unsupported("stream on GET /v1/responses/{id} is not supported", "stream")
    entry = _store(request).get(rid)
    if entry is None:
        raise _not_found(rid)
    return web.json_response(entry.response)


async def delete_response(request: web.Request) -> web.Response:
    """Deletes a stored response; the chain's pinned KV is released once no stored response
    of the chain is left."""
    rid = request.match_info["response_id"]
    store = _store(request)
    entry = store.delete(rid)
    if entry is None:
        raise _not_found(rid)
    if not store.session_in_use(entry.session_id):
        await request.app[SESSIONS].delete(entry.session_id)
    return web.json_response({"id": rid, "object": "response", "deleted": True})


async def list_input_items(request: web.Request) -> web.Response:
    """The response's own input items (`order` asc/desc, default desc; `limit` 1-100, default
    20; `after` an item id)."""
    rid = request.match_info["response_id"]
    entry = _store(request).get(rid)
    if entry is None:
        raise _not_found(rid)
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("order must be 'asc' or 'desc'", param="order")
    try:
        limit = int(request.query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise bad_request("limit must be an integer from 1 to 100", param="limit")
    items = entry.input_items if order == "asc" else entry.input_items[::-1]
    after = request.query.get("after")
    if after:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise bad_request(f"no input item with id '{after}'", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return web.json_response(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )


def add_responses_routes(app: web.Application, store: ResponseStore | None = None) -> None:
    app[RESPONSES] = store or ResponseStore()
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", list_input_items)
