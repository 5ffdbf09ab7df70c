"""OpenAI request bodies as pydantic models, plus the policy for parameters llmd does not
implement (DESIGN §6): harmless ones are accepted and ignored, anything that would change the
output is a 400 naming it - never silently ignored.

Supported: model, messages/prompt, max_tokens, max_completion_tokens, temperature, top_p,
top_k, min_p, seed, stop, stream, stream_options, frequency/presence/repetition penalties,
logit_bias, n, logprobs/top_logprobs (chat) and logprobs/echo (completions), response_format.
Absent ``max_tokens`` means "until the model stops or the context is full" (llama-server's
default), on both routes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from llmd.errors import ApiError, bad_request
from llmd.runtime.keep_alive import CheckedKeepAlive
from llmd.runtime.protocol import INT32_MAX
from llmd.runtime.speculative import SpeculativeField
from llmd.text.chunked_validation import prevalidated


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    # Only pads chunks against side channels on the wire; the text is the same. Accepted,
    # ignored: llmd serves on loopback and its own socket.
    include_obfuscation: bool | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageUrl(_Strict):
    url: str = Field(min_length=1)
    # How finely OpenAI's models look; llmd's preprocessing is the model's own, whatever the
    # value (accepted so that clients sending it work).
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Strict):
    """An image: a `data:` URL, or `http(s)` when the daemon allows remote images (images.py).
    Every protocol's image parts arrive here; `where` names the part in the client's own
    protocol for errors (set by the protocol that translated it)."""

    type: Literal["image_url"]
    image_url: ImageUrl
    _where: str | None = PrivateAttr(default=None)


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCallEntry(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    # Echoed back by clients that resend an assistant message as they received it.
    refusal: None = None
    reasoning_content: str | None = None  # dropped: templates strip earlier thinking anyway
    tool_calls: list[ToolCallEntry] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: which call it answers

    @model_validator(mode="after")
    def _tool_turns(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    def text(self) -> str:
        """Text parts are joined; null content is empty (DESIGN §6)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))

    def images(self) -> list[ImagePart]:
        if not isinstance(self.content, list):
            return []
        return [part for part in self.content if isinstance(part, ImagePart)]

    def template_content(self) -> str | list[dict[str, str]]:
        """The content as a chat template reads it: text, or with images the list of
        `{"type": "text"}` and `{"type": "image"}` items that multimodal templates place
        their image markers from."""
        if not self.images():
            return self.text()
        assert isinstance(self.content, list)
        return [
            {"type": "text", "text": part.text} if isinstance(part, TextPart) else {"type": "image"}
            for part in self.content
        ]

    def for_template(self) -> dict[str, Any]:
        """The message as a chat template sees it (``developer`` is the system role for
        models that predate it)."""
        out: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self.template_content(),
        }
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
            if self.content is None:
                out["content"] = None
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(default="response", max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class SamplingFields(_Strict, CheckedKeepAlive):
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    # Bounded by what the engine's int32 holds: beyond, the worker could not take the request.
    top_k: int = Field(default=0, ge=0, le=INT32_MAX)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    # llama-server's extension: the latest tokens the repetition penalty covers (-1: the
    # whole context, the default; 0: the penalty is off).
    repeat_last_n: int = Field(default=-1, ge=-1, le=INT32_MAX)
    logit_bias: dict[str, float] | None = None
    # n choices from one prompt; its KV is prefilled once (the engine forks choice 0's).
    n: int = Field(default=1, ge=1, le=16)
    response_format: ResponseFormat | None = None
    # llmd extension: a named session keeps its KV pinned between turns (X-Llmd-Session-Id too).
    session_id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:@-]+$"
    )
    session_ttl: float | None = Field(default=None, gt=0, le=7 * 24 * 3600)
    # llmd extension: speculative decoding for this request ({"type": "ngram", "max_draft": k},
    # true, or false to turn `llmd serve --speculative` off); see speculative.py.
    speculative: SpeculativeField = None
    # Ollama's extension (`keep_alive`, from CheckedKeepAlive): how long the model stays loaded
    # after this request ("5m", 0, -1).

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not key.isdigit():
                raise ValueError(f"logit_bias keys are token ids; '{key}' is not one")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias values must be in [-100, 100]; got {bias}")
        return v

    def logit_bias_ids(self) -> dict[int, float]:
        return {int(k): b for k, b in (self.logit_bias or {}).items()}

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop sequences")
        return v

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise bad_request(
                "stream_options is only allowed when stream is true", param="stream_options"
            )
        return self

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


def image_refs(messages: list[ChatMessage]) -> list[tuple[str, str]]:
    """Every image part of a conversation, `(url, where)` in prompt order; `where` is the
    part's name in the client's protocol when its translation set one."""
    refs = []
    for i, msg in enumerate(messages):
        if not isinstance(msg.content, list):
            continue
        for j, part in enumerate(msg.content):
            if isinstance(part, ImagePart):
                where = part._where or f"messages.[{i}].content.[{j}]"
                refs.append((part.image_url.url, where))
    return refs


def name_image_parts(messages: list[ChatMessage], wheres: list[str]) -> None:
    """Names a translated conversation's image parts in the client's protocol (`wheres`, in
    prompt order), so an error about one points at what the client sent."""
    parts = [part for msg in messages for part in msg.images()]
    for part, where in zip(parts, wheres, strict=False):
        part._where = where


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # llama-server's switch: "none" keeps <think>...</think> inline in the content; "auto"
    # and "deepseek" put it in `reasoning_content` (the default for reasoning models).
    reasoning_format: Literal["auto", "deepseek", "none"] = "auto"
    # OpenAI's switch, passed to templates as enable_thinking: "none" off, any level on.
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    # Set by a protocol whose reasoning parameters are hints (Anthropic's thinking and
    # effort): a model without a reasoning switch then ignores them instead of a 400.
    _reasoning_is_hint: bool = PrivateAttr(default=False)

    def with_reasoning_as_hint(self) -> ChatCompletionRequest:
        self._reasoning_is_hint = True
        return self

    @property
    def reasoning_is_hint(self) -> bool:
        return self._reasoning_is_hint

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
        return self

    def engine_logprobs(self) -> int:
        """The worker's top_logprobs: -1 none, else the alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else -1

    @model_validator(mode="after")
    def _one_limit(self) -> ChatCompletionRequest:
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise bad_request(
                "max_tokens and max_completion_tokens disagree; send only max_completion_tokens",
                param="max_tokens",
            )
        return self

    def token_limit(self) -> int | None:
        """The requested completion limit (either parameter; they agree when both are set)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


class CompletionRequest(SamplingFields):
    # Text, or token ids used as they are (no BOS added), as OpenAI's API and vLLM take them;
    # a list of either is a batch, of which one per request is supported.
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=None, ge=0)  # 0: score the prompt (with echo)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    # Fill-in-the-middle: the prompt is the text before the insertion, `suffix` the text
    # after it; the answer is the middle, from the model's own FIM tokens (fim.py). Empty or
    # null: a plain completion.
    suffix: str | None = None

    @model_validator(mode="after")
    def _suffix_needs_text(self) -> CompletionRequest:
        if not self.suffix:
            return self
        if self.echo:
            raise bad_request(
                "echo cannot be used with suffix: the answer is inserted between the prompt "
                "and the suffix, not appended to the prompt",
                param="echo",
            )
        if not isinstance(self.prompt_input(), str):
            raise bad_request(
                "suffix needs the prompt as text (the code before the insertion), not token ids",
                param="suffix",
            )
        return self

    @model_validator(mode="after")
    def _zero_tokens_need_echo(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise bad_request(
                "max_tokens: 0 generates nothing; it is only useful with echo (to score the "
                "prompt)",
                param="max_tokens",
            )
        return self

    def engine_logprobs(self) -> int:
        return -1 if self.logprobs is None else self.logprobs

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and v and all(isinstance(t, int) for t in v):
            return v  # one prompt of token ids
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("exactly one prompt per request is supported")
        return v

    def prompt_input(self) -> str | list[int]:
        """The one prompt: its text, or its token ids."""
        if isinstance(self.prompt, str):
            return self.prompt
        first = self.prompt[0] if self.prompt else ""
        return self.prompt if isinstance(first, int) else first  # type: ignore[return-value]


# Accepted and ignored: with these values they cannot change the generated text.
_HARMLESS: dict[str, Callable[[Any], bool]] = {
    "user": lambda v: True,
    "metadata": lambda v: True,
    "store": lambda v: v in (False, None),
    "service_tier": lambda v: True,
    "best_of": lambda v: v in (1, None),
    "suffix": lambda v: v in ("", None),
}
# Change the output and are not implemented yet: a 400 naming them.
_NOT_YET = {
    "functions",
    "function_call",
    "audio",
    "modalities",
    "prediction",
    "verbosity",
    "web_search_options",
    "prompt_cache_key",
    "safety_identifier",
}
# The legacy (pre-tools) function-calling field of messages.
_MESSAGE_LEGACY_FIELDS = ("function_call",)


def _screen_unknown(body: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    fields = set(model.model_fields)
    kept: dict[str, Any] = {}
    unsupported: list[str] = []
    unknown: list[str] = []
    for key, value in body.items():
        if key in fields:
            kept[key] = value
        elif key in _HARMLESS and _HARMLESS[key](value):
            continue
        elif key in _NOT_YET or key in _HARMLESS:
            unsupported.append(key)
        else:
            unknown.append(key)
    if unsupported:
        raise bad_request(
            f"parameter(s) not supported yet by llmd: {', '.join(unsupported)}",
            param=unsupported[0],
            code="unsupported_parameter",
        )
    if unknown:
        raise bad_request(
            f"unrecognized request argument(s) supplied: {', '.join(unknown)}",
            param=unknown[0],
            code="unknown_parameter",
        )
    return kept


def _screen_messages(messages: Any) -> None:
    """Tool turns and non-text content get a 400 that says what is missing, instead of a
    pydantic error about union members."""
    if not isinstance(messages, list):
        return
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            continue
        for key in _MESSAGE_LEGACY_FIELDS:
            if msg.get(key):
                raise bad_request(
                    f"{key} in messages is the legacy function-calling API; use tool_calls",
                    param=f"messages.[{i}].{key}",
                    code="unsupported_parameter",
                )
            msg.pop(key, None)  # null/empty: harmless
        if msg.get("tool_calls") in ([], None):
            msg.pop("tool_calls", None)
        content = msg.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind is not None and kind not in ("text", "image_url"):
                    raise bad_request(
                        f"content parts of type '{kind}' are not supported yet (text and "
                        "image_url are)",
                        param=f"messages.[{i}].content.[{j}].type",
                        code="unsupported_parameter",
                    )


# pydantic puts union members and validator names into error locations; they are no params.
_LOC_TAG = re.compile(r"^(str|int|float|bool|none|list\[.*|dict\[.*|function-.*|.*\[.*\].*)$")


def _param_name(loc: tuple[int | str, ...]) -> str:
    parts = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif not _LOC_TAG.match(item):
            parts.append(item)
    return ".".join(parts)


Request = TypeVar("Request", bound=SamplingFields)


_MAX_PROBLEMS = 5


def parse_request(body: Any, model: type[Request]) -> Request:
    """Validate a decoded JSON body; every problem is an ApiError naming the parameter."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    kept = _screen_unknown(body, model)
    if "messages" in kept:
        _screen_messages(kept["messages"])
        kept = prevalidated(kept, "messages", ChatMessage)
    try:
        return model.model_validate(kept)
    except ValidationError as exc:
        problems: list[str] = []
        params: list[str] = []
        for err in exc.errors():
            param = _param_name(err["loc"])
            if param not in params:
                params.append(param)
                problems.append(f"{param}: {err['msg']}" if param else err["msg"])
        if len(problems) > _MAX_PROBLEMS:  # a long array with one bad type per element
            more = len(problems) - _MAX_PROBLEMS
            problems = [*problems[:_MAX_PROBLEMS], f"and {more} more"]
        raise ApiError(
            400, "invalid request: " + "; ".join(problems), param=params[0] if params else None
        ) from exc
