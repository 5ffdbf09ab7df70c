"""OpenAI request bodies as pydantic models, plus the policy for parameters llmd does not
implement (DESIGN §6): harmless ones are accepted and ignored, anything that would change the
output is a 400 naming it - never silently ignored."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import ApiError, bad_request


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # e.g. `refusal: null` echoed back by clients
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """Text parts are joined; null content is empty (DESIGN §6)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class SamplingFields(_Strict):
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop sequences")
        return v

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def token_limit(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )


class CompletionRequest(SamplingFields):
    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=1)

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("exactly one prompt per request is supported")
        return v

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


# Accepted and ignored: they cannot change the generated text (value predicates say when).
_HARMLESS: dict[str, Any] = {
    "user": lambda v: True,
    "metadata": lambda v: True,
    "store": lambda v: v in (False, None),
    "service_tier": lambda v: True,
    "n": lambda v: v in (1, None),
    "logprobs": lambda v: v in (False, None),
    "frequency_penalty": lambda v: v in (0, 0.0, None),
    "presence_penalty": lambda v: v in (0, 0.0, None),
    "logit_bias": lambda v: not v,
    "tool_choice": lambda v: v in ("none", None),
    "response_format": lambda v: v is None or v == {"type": "text"},
    "echo": lambda v: v in (False, None),
    "best_of": lambda v: v in (1, None),
}
# Changes the output and is not implemented yet.
_NOT_YET = {
    "tools",
    "tool_choice",
    "response_format",
    "logprobs",
    "top_logprobs",
    "n",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "echo",
    "best_of",
    "suffix",
    "functions",
    "function_call",
    "audio",
    "modalities",
    "prediction",
    "reasoning_effort",
    "web_search_options",
}


def _screen_unknown(body: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    fields = set(model.model_fields)
    kept: dict[str, Any] = {}
    unsupported: list[str] = []
    unknown: list[str] = []
    for key, value in body.items():
        if key in fields:
            kept[key] = value
        elif key == "parallel_tool_calls" and not body.get("tools"):
            continue
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
            f"unrecognized request argument(s): {', '.join(unknown)}",
            param=unknown[0],
            code="unknown_parameter",
        )
    return kept


def parse_request(body: Any, model: type[SamplingFields]) -> Any:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return model.model_validate(_screen_unknown(body, model))
    except ValidationError as exc:
        problems = []
        params = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"] if not isinstance(p, int) or True)
            params.append(loc)
            problems.append(f"{loc}: {err['msg']}")
        raise ApiError(
            400, "invalid request: " + "; ".join(problems), param=params[0] if params else None
        ) from exc
