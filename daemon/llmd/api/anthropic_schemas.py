"""Anthropic Messages request bodies (`POST /v1/messages`, `/v1/messages/count_tokens`) as
pydantic models, and their translation into the one internal request, a validated OpenAI
`ChatCompletionRequest` (chat_pipeline.py). Nothing here generates: this is schema + mapping.

Policy (as for OpenAI's routes): parameters that cannot change the generated text
(`metadata`, `service_tier`, `cache_control`, any `anthropic-beta` header, ...) are accepted
and ignored; ones that would and are not implemented (server tools, `container`,
`mcp_servers`, documents, prefill, ...) are a 400 naming them. `image` blocks (base64, or a
`url` source when the daemon allows remote images) become the internal request's image parts,
in messages and in tool results. Anthropic's own rules are kept
where a client relies on them: `max_tokens` is required, `temperature` is 0-1,
`budget_tokens` is at least 1024 and below `max_tokens`.

What coding agents send (Claude Code on every request), and what it means here:
- `context_management` edits of type `clear_thinking_*`: earlier thinking is dropped from
  the prompt, which every chat template does anyway (other edit types are a 400).
- `thinking` (`enabled` / `adaptive` / `disabled`, `display`) and `output_config.effort`
  become the model's reasoning switch, as `reasoning_effort` does on chat: `disabled` turns
  thinking off, `enabled`, `adaptive` or an effort turn it on. They are hints: a model without
  such a switch answers as it always does (no 400: clients send them by default).
- `system`-role messages inside `messages` (Claude Code's environment block) are rendered in
  place where the chat template allows it, else folded into the nearest user turn
  (chat_pipeline.py).
- Tools with `defer_loading: true` are not shown to the model, as Anthropic's API does not
  load them, until a `tool_reference` block in a tool result names them.
- System text that changes with every request without meaning anything to the model (Claude
  Code's `x-anthropic-billing-header: cc_version=...`) is dropped (prompt_hygiene.py): left in,
  it would defeat the prefix cache on the whole prompt.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from llmd.errors import ApiError, ContextOverflow, bad_request
from llmd.runtime.keep_alive import KeepAlive
from llmd.text.chunked_validation import prevalidated
from llmd.text.openai_schemas import ChatCompletionRequest, name_image_parts, parse_request
from llmd.text.prompt_hygiene import is_request_metadata

# ---------------------------------------------------------------------- content blocks


class _Block(BaseModel):
    # Blocks a client echoes back from a response carry bookkeeping fields (`citations`,
    # `caller`, `cache_control`, ...) that do not change what the model reads: ignored.
    model_config = ConfigDict(extra="ignore")


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class Base64ImageSource(_Block):
    type: Literal["base64"]
    media_type: str
    data: str = Field(min_length=1)


class UrlImageSource(_Block):
    type: Literal["url"]
    url: str = Field(min_length=1)


class ImageBlock(_Block):
    type: Literal["image"]
    source: Annotated[Base64ImageSource | UrlImageSource, Field(discriminator="type")]

    def url(self) -> str:
        """As the internal request's `image_url` reads it (images.py decodes it)."""
        if isinstance(self.source, UrlImageSource):
            return self.source.url
        return f"data:{self.source.media_type};base64,{self.source.data}"

    def part(self) -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"url": self.url()}}


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


class ToolReferenceBlock(_Block):
    """A tool search's answer: the named deferred tool is loaded from now on."""

    type: Literal["tool_reference"]
    tool_name: str = Field(min_length=1)


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: (
        str
        | list[Annotated[TextBlock | ToolReferenceBlock | ImageBlock, Field(discriminator="type")]]
        | None
    ) = None
    is_error: bool = False

    def images(self) -> list[ImageBlock]:
        if not isinstance(self.content, list):
            return []
        return [b for b in self.content if isinstance(b, ImageBlock)]

    def text(self) -> str:
        """What the model reads as the tool's answer. An error is marked as one: the chat
        templates have no field for it. A tool reference reads as the tool being loaded."""
        if self.content is None:
            body = ""
        elif isinstance(self.content, str):
            body = self.content
        else:
            body = "\n".join(
                b.text if isinstance(b, TextBlock) else f"Tool loaded: {b.tool_name}"
                for b in self.content
                if not isinstance(b, ImageBlock)
            )
        return f"Error: {body}" if self.is_error else body

    def referenced_tools(self) -> list[str]:
        if not isinstance(self.content, list):
            return []
        return [b.tool_name for b in self.content if isinstance(b, ToolReferenceBlock)]


class ThinkingBlock(_Block):
    """Earlier thinking, resent by clients: accepted and dropped (templates strip it too)."""

    type: Literal["thinking"]
    thinking: str = ""
    signature: str = ""


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str = ""


InputBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]
_BLOCK_TYPES = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")
_TOOL_RESULT_PARTS = ("text", "image", "tool_reference")


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # `system` inside `messages`: Claude Code sends its environment block so (text only).
    role: Literal["user", "assistant", "system"]
    content: str | list[InputBlock]

    def blocks(self) -> list[Any]:
        if isinstance(self.content, str):
            return [TextBlock(type="text", text=self.content)]
        return list(self.content)


# ---------------------------------------------------------------------- tools, thinking


class Tool(BaseModel):
    """A client tool. Server tools (`web_search_...`, `bash_...`) are refused before this."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["custom"] | None = None
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None
    # Caching, deferred loading and who may call a tool do not change what the model writes.
    cache_control: dict[str, Any] | None = None
    defer_loading: bool | None = None
    allowed_callers: list[Any] | None = None
    eager_input_streaming: bool | None = None

    def to_openai(self) -> dict[str, Any]:
        fn: dict[str, Any] = {"name": self.name, "parameters": self.input_schema}
        if self.description is not None:
            fn["description"] = self.description
        if self.strict is not None:
            fn["strict"] = self.strict
        return {"type": "function", "function": fn}


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("a name is given with (and only with) type 'tool'")
        return self

    def to_openai(self) -> str | dict[str, Any]:
        if self.type == "tool":
            return {"type": "function", "function": {"name": self.name}}
        return {"auto": "auto", "any": "required", "none": "none"}[self.type]


class Thinking(BaseModel):
    """`enabled` / `adaptive` show a reasoning model's thinking as `thinking` blocks;
    `budget_tokens` is checked but not enforced beyond `max_tokens` (llmd has no thinking
    budget). `display: "omitted"` keeps the blocks but empties their text."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1024)
    display: Literal["summarized", "omitted"] | None = None

    @model_validator(mode="after")
    def _budget(self) -> Thinking:
        if self.type == "enabled" and self.budget_tokens is None:
            raise ValueError("budget_tokens is required when thinking is enabled")
        return self


class OutputFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: OutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class ContextEdit(BaseModel):
    """One `context_management` edit. Only clearing earlier thinking is accepted: the chat
    templates leave it out of the prompt anyway."""

    model_config = ConfigDict(extra="allow")

    type: str

    @field_validator("type")
    @classmethod
    def _clears_thinking(cls, kind: str) -> str:
        if not kind.startswith("clear_thinking_"):
            raise ValueError(
                f"edits of type '{kind}' are not supported by llmd (only clear_thinking_*, "
                "which the chat templates do anyway)"
            )
        return kind


class ContextManagement(BaseModel):
    model_config = ConfigDict(extra="forbid")

    edits: list[ContextEdit] = []


# ---------------------------------------------------------------------- requests


class CountTokensRequest(BaseModel):
    """What `/v1/messages/count_tokens` reads: everything that goes into the prompt."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None

    def show_thinking(self) -> ThinkingDisplay:
        if self.thinking is None or self.thinking.type == "disabled":
            return "hidden"
        return "omitted" if self.thinking.display == "omitted" else "shown"

    def reasoning_effort(self) -> str | None:
        """The reasoning switch these ask for: off for disabled thinking, on for enabled or
        adaptive thinking or an effort level, else the template's default."""
        if self.thinking is not None and self.thinking.type == "disabled":
            return "none"
        effort = self.output_config.effort if self.output_config else None
        if effort is not None:
            return "high" if effort == "max" else effort
        return "medium" if self.thinking is not None else None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stream: bool = False
    # llmd extensions (as on its OpenAI routes): sessions, keep-alive, reproducible sampling.
    session_id: str | None = None
    session_ttl: float | None = None
    keep_alive: KeepAlive = None
    seed: int | None = None

    @model_validator(mode="after")
    def _budget_below_max(self) -> MessagesRequest:
        budget = self.thinking.budget_tokens if self.thinking else None
        if budget is not None and budget >= self.max_tokens:
            raise ValueError("thinking.budget_tokens must be less than max_tokens")
        return self


ThinkingDisplay = Literal["hidden", "shown", "omitted"]


@dataclass
class Translated:
    """An Anthropic request as the pipeline runs it, plus what only the response needs."""

    chat: ChatCompletionRequest
    thinking: ThinkingDisplay


# ---------------------------------------------------------------------- screening

# Accepted and ignored: they steer billing, routing, caching or attribution, not the text.
_HARMLESS = {
    "metadata",
    "service_tier",
    "speed",
    "inference_geo",
    "cache_control",
    "user_profile_id",
    "workspace_id",
}
# Would change the output (or add to it) and are not implemented: refused unless empty.
_NOT_SUPPORTED = {"container", "mcp_servers", "diagnostics"}


def _screen(body: Any, model: type[BaseModel]) -> dict[str, Any]:
    """Drop harmless extras, refuse what llmd does not implement, naming it."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    kept: dict[str, Any] = {}
    unsupported: list[str] = []
    for key, value in body.items():
        if key in _HARMLESS:
            continue
        if key in _NOT_SUPPORTED:
            if value not in (None, [], {}):
                unsupported.append(key)
            continue
        kept[key] = value
    if unsupported:
        raise bad_request(f"not supported by llmd: {', '.join(unsupported)}", param=unsupported[0])
    _screen_tools(kept.get("tools"))
    _screen_blocks(kept.get("messages"), kept.get("system"))
    return kept


def _screen_tools(tools: Any) -> None:
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in (None, "custom"):
            raise bad_request(
                f"server tools are not supported by llmd: tools.{i} has type '{kind}' "
                "(only client tools with name, description and input_schema)",
                param=f"tools.{i}.type",
            )


def _unsupported_block(kind: Any, where: str) -> ApiError:
    return bad_request(
        f"content blocks of type '{kind}' are not supported by llmd ({where}); supported: "
        + ", ".join(_BLOCK_TYPES),
        param=where,
    )


def _screen_blocks(messages: Any, system: Any) -> None:
    """Unsupported content (images, documents, server tool blocks) gets a 400 naming its type
    and place, instead of a pydantic error about union members."""
    if isinstance(system, list):
        for j, block in enumerate(system):
            if isinstance(block, dict) and block.get("type") != "text":
                raise _unsupported_block(block.get("type"), f"system.{j}")
    for i, msg in enumerate(messages if isinstance(messages, list) else []):
        content = msg.get("content") if isinstance(msg, dict) else None
        for j, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict):
                continue
            where = f"messages.{i}.content.{j}"
            if block.get("type") not in _BLOCK_TYPES:
                raise _unsupported_block(block.get("type"), where)
            _screen_image(block, where)
            inner = block.get("content") if block.get("type") == "tool_result" else None
            for k, part in enumerate(inner if isinstance(inner, list) else []):
                if isinstance(part, dict) and part.get("type") not in _TOOL_RESULT_PARTS:
                    raise _unsupported_block(part.get("type"), f"{where}.content.{k}")
                if isinstance(part, dict):
                    _screen_image(part, f"{where}.content.{k}")


_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def _screen_image(block: dict[str, Any], where: str) -> None:
    """An image's source in words a client can act on (not a pydantic discriminator error):
    base64 with one of Anthropic's four media types, or a URL; a file id is not served."""
    if block.get("type") != "image":
        return
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind not in ("base64", "url"):
        raise bad_request(
            f"image source of type '{kind}' is not supported by llmd: send "
            '{"type": "base64", "media_type": ..., "data": ...} or {"type": "url", "url": ...}',
            param=f"{where}.source",
        )
    assert isinstance(source, dict)
    if kind == "base64" and source.get("media_type") not in _MEDIA_TYPES:
        raise bad_request(
            f"image media_type must be one of {', '.join(_MEDIA_TYPES)}",
            param=f"{where}.source.media_type",
        )


_LOC_TAG = re.compile(r"^(str|int|float|bool|none|list\[.*|dict\[.*|function-.*|.*\[.*\].*)$")


def _validate(body: dict[str, Any], model: type[CountTokensRequest]) -> CountTokensRequest:
    try:
        return model.model_validate(prevalidated(body, "messages", InputMessage))
    except ValidationError as exc:
        problems: list[str] = []
        params: list[str] = []
        for err in exc.errors():
            loc = [str(x) for x in err["loc"] if isinstance(x, int) or not _LOC_TAG.match(x)]
            param = ".".join(loc)
            if param not in params:
                params.append(param)
                msg = err["msg"].removeprefix("Value error, ")
                problems.append(f"{param}: {msg}" if param else msg)
        raise bad_request("; ".join(problems), param=params[0] if params else None) from exc


# ---------------------------------------------------------------------- mapping


def _text_parts(blocks: list[TextBlock]) -> list[dict[str, str]]:
    return [{"type": "text", "text": b.text} for b in blocks if not is_request_metadata(b.text)]


def _user_parts(blocks: list[Any], where: str, wheres: list[str]) -> list[dict[str, Any]]:
    """A user turn's text and image blocks as content parts, in order; each image's place
    (`where`.j) is appended to `wheres`, in the order the parts come."""
    parts: list[dict[str, Any]] = []
    for j, b in enumerate(blocks):
        if isinstance(b, TextBlock) and not is_request_metadata(b.text):
            parts.append({"type": "text", "text": b.text})
        elif isinstance(b, ImageBlock):
            parts.append(b.part())
            wheres.append(f"{where}.{j}")
    return parts


def _tool_message(block: ToolResultBlock, where: str, wheres: list[str]) -> dict[str, Any]:
    """A tool result as a `tool` message: its text, and its images as image parts after it
    (a screenshot tool's answer)."""
    content: Any = block.text()
    if block.images():
        content = [{"type": "text", "text": content}] if content else []
        for k, b in enumerate(block.content or []):
            if isinstance(b, ImageBlock):
                content.append(b.part())
                wheres.append(f"{where}.{k}")
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": content}


def to_chat_messages(
    system: str | list[TextBlock] | None,
    messages: list[InputMessage],
    wheres: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Anthropic turns -> OpenAI chat messages: `system` becomes the first message, a user
    turn's `tool_result` blocks become `tool` messages (before its text, the order templates
    expect; a result's images become image parts of that message), an assistant turn's
    `tool_use` blocks become `tool_calls`, a `system` message stays one where it is; thinking
    is dropped, and so is per-request metadata text. `wheres` receives every image's place in
    the Anthropic request, in the order the image parts come out."""
    wheres = [] if wheres is None else wheres
    out: list[dict[str, Any]] = []
    if isinstance(system, str) and system and not is_request_metadata(system):
        out.append({"role": "system", "content": system})
    elif isinstance(system, list) and (parts := _text_parts(system)):
        out.append({"role": "system", "content": parts})
    for i, msg in enumerate(messages):
        blocks = msg.blocks()
        texts = [b for b in blocks if isinstance(b, TextBlock)]
        if msg.role == "system":
            out.append({"role": "system", "content": _text_parts(texts)})
            continue
        if msg.role == "user":
            where = f"messages.{i}.content"
            for j, b in enumerate(blocks):
                if isinstance(b, ToolResultBlock):
                    out.append(_tool_message(b, f"{where}.{j}.content", wheres))
            user = _user_parts(blocks, where, wheres)
            if texts or user or not any(isinstance(b, ToolResultBlock) for b in blocks):
                out.append({"role": "user", "content": user})
            continue
        calls = [
            {
                "id": b.id,
                "type": "function",
                "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
            }
            for b in blocks
            if isinstance(b, ToolUseBlock)
        ]
        message: dict[str, Any] = {"role": "assistant", "content": _text_parts(texts) or None}
        if calls:
            message["tool_calls"] = calls
        elif not texts:
            message["content"] = ""  # only thinking: an empty turn keeps the alternation
        out.append(message)
    return out


def _check_blocks_in_place(messages: list[InputMessage]) -> None:
    for i, msg in enumerate(messages):
        for j, b in enumerate(msg.blocks()):
            if msg.role == "system" and not isinstance(b, TextBlock):
                raise bad_request(
                    "system messages hold text blocks only", param=f"messages.{i}.content.{j}"
                )
            wrong = (msg.role == "user" and isinstance(b, ToolUseBlock | ThinkingBlock)) or (
                msg.role == "assistant" and isinstance(b, ToolResultBlock | ImageBlock)
            )
            if wrong:
                raise bad_request(
                    f"{b.type} blocks belong in {'assistant' if msg.role == 'user' else 'user'}"
                    " messages",
                    param=f"messages.{i}.content.{j}",
                )
    if messages[-1].role == "assistant":
        raise bad_request(
            "a final assistant message (prefill) is not supported by llmd: the answer always "
            "starts a new assistant turn",
            param=f"messages.{len(messages) - 1}",
        )


def visible_tools(tools: list[Tool], messages: list[InputMessage]) -> list[Tool]:
    """The tools the model is shown: deferred ones (`defer_loading`) only once a tool result
    has referenced them (a tool search loaded them), as Anthropic's API loads them."""
    loaded = {
        name
        for msg in messages
        for b in msg.blocks()
        if isinstance(b, ToolResultBlock)
        for name in b.referenced_tools()
    }
    return [t for t in tools if not t.defer_loading or t.name in loaded]


def _chat_fields(req: CountTokensRequest, wheres: list[str]) -> dict[str, Any]:
    """The internal request's fields; `wheres` receives the images' places (to_chat_messages)."""
    _check_blocks_in_place(req.messages)
    fields: dict[str, Any] = {
        "model": req.model,
        "messages": to_chat_messages(req.system, req.messages, wheres),
    }
    tools = visible_tools(req.tools or [], req.messages)
    if tools:
        fields["tools"] = [t.to_openai() for t in tools]
    if req.tool_choice is not None:
        if req.tool_choice.type in ("any", "tool") and not tools:
            raise bad_request(
                f"tool_choice type '{req.tool_choice.type}' needs tools", param="tool_choice"
            )
        if tools:
            fields["tool_choice"] = req.tool_choice.to_openai()
        if req.tool_choice.disable_parallel_tool_use:
            fields["parallel_tool_calls"] = False
    fmt = req.output_config.format if req.output_config else None
    if fmt is not None:
        fields["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": fmt.schema_},
        }
    fields["reasoning_effort"] = req.reasoning_effort()
    return fields


# Parameter names the OpenAI-side validation may report, in this protocol's words.
_PARAM_NAMES = {"stop": "stop_sequences", "response_format": "output_config.format"}


def _internal(fields: dict[str, Any], wheres: list[str]) -> ChatCompletionRequest:
    """The pipeline's request, its image parts named as the client sent them. Anthropic's
    thinking and effort are hints (see the module's docstring): a model without a reasoning
    switch ignores them rather than answering 400."""
    try:
        req = parse_request(fields, ChatCompletionRequest).with_reasoning_as_hint()
        name_image_parts(req.messages, wheres)
        return req
    except ApiError as err:
        err.message = err.message.removeprefix("invalid request: ").replace("Value error, ", "")
        for ours, theirs in _PARAM_NAMES.items():
            if err.param and (err.param == ours or err.param.startswith(ours + ".")):
                err.message = err.message.replace(ours, theirs, 1)
                err.param = theirs + err.param[len(ours) :]
        raise


def translate_messages(body: Any) -> Translated:
    """A `/v1/messages` body -> the pipeline's request (400 naming the parameter if not)."""
    req = _validate(_screen(body, MessagesRequest), MessagesRequest)
    assert isinstance(req, MessagesRequest)
    wheres: list[str] = []
    fields = _chat_fields(req, wheres)
    fields["max_tokens"] = req.max_tokens
    fields["stream"] = req.stream
    optional = {
        "stop": req.stop_sequences or None,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "seed": req.seed,
        "session_id": req.session_id,
        "session_ttl": req.session_ttl,
        "keep_alive": req.keep_alive,
    }
    fields.update({k: v for k, v in optional.items() if v is not None})
    return Translated(_internal(fields, wheres), req.show_thinking())


def translate_count_tokens(body: Any) -> ChatCompletionRequest:
    """A `/v1/messages/count_tokens` body -> the request whose prompt is counted."""
    req = _validate(_screen(body, CountTokensRequest), CountTokensRequest)
    wheres: list[str] = []
    return _internal(_chat_fields(req, wheres), wheres)


# ---------------------------------------------------------------------- errors

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error(err: ApiError) -> dict[str, Any]:
    """Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`, its type
    from the HTTP status."""
    kind = _ERROR_TYPES.get(err.status)
    if kind is None:
        kind = "invalid_request_error" if 400 <= err.status < 500 else "api_error"
    message = err.message
    if isinstance(err, ContextOverflow):
        # Claude Code compacts its history only on this exact wording, reading both numbers.
        message = (
            f"prompt is too long: {err.prompt_tokens} tokens > {err.context_length - 1} maximum"
        )
    return {"type": "error", "error": {"type": kind, "message": message}}
