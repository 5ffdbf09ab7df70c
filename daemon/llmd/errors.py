"""OpenAI-style API errors: one exception type carrying status, type, param and code, and the
envelope ``{"error": {"message", "type", "param", "code"}}`` every route answers with."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        # The connection cannot carry another request (the body was left unread): the
        # response says `Connection: close`.
        self.close_connection = False
        # Seconds (or an HTTP date) the client should wait before retrying: a Retry-After
        # header on the answer (a busy remote's 429, an upstream's 503).
        self.retry_after: int | str | None = None
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def envelope(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def shown_name(name: str, limit: int = 100) -> str:
    """`name` as an error message quotes it: a hostile 100 kB name is cut short."""
    return name if len(name) <= limit else f"{name[:limit]}... ({len(name)} characters)"


def model_not_found(name: str, hint: str) -> ApiError:
    if len(name) > 128:  # no model is called that: the hint would quote the name again
        hint = "Model names are at most 128 characters."
    name = shown_name(name)
    return ApiError(
        404,
        f"The model '{name}' is not installed. {hint}",
        param="model",
        code="model_not_found",
    )


def server_error(message: str, code: str = "internal_error", status: int = 500) -> ApiError:
    return ApiError(status, message, type="server_error", code=code)


class ContextOverflow(ApiError):
    """A prompt that leaves no room to generate in the served context. Each protocol words it
    as its clients parse it (agents compact their history on it): OpenAI's sentence here,
    Anthropic's `prompt is too long: N tokens > M maximum` in anthropic_schemas."""

    def __init__(
        self, prompt_tokens: int, context_length: int, param: str, *, at_least: bool = False
    ) -> None:
        # at_least: a lower bound counted from the prompt's length (TextModel.fewest_tokens).
        counted = f"at least {prompt_tokens}" if at_least else str(prompt_tokens)
        super().__init__(
            400,
            f"This model's maximum context length is {context_length} tokens. However, your "
            f"messages resulted in {counted} tokens (at least one token must be left to "
            "generate). Please reduce the length of the messages.",
            param=param,
            code="context_length_exceeded",
        )
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length
