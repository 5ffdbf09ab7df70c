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


def model_not_found(name: str, hint: str) -> ApiError:
    return ApiError(
        404,
        f"The model '{name}' is not installed. {hint}",
        param="model",
        code="model_not_found",
    )


def server_error(message: str, code: str = "internal_error", status: int = 500) -> ApiError:
    return ApiError(status, message, type="server_error", code=code)
