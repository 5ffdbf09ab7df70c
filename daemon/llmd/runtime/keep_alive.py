"""How long a model stays loaded after its last request: Ollama's `keep_alive`, so clients
written for Ollama keep working. A number is seconds; a string is a Go-style duration ("5m",
"1h30m", "90s", "500ms"); 0 unloads right after the request; a negative value keeps the model
loaded until the daemon stops."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, field_validator

DEFAULT_KEEP_ALIVE = 300.0  # seconds, as Ollama: long enough for a conversation's next turn
FOREVER = math.inf

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


_TYPE_ERROR = "keep_alive must be a duration such as '5m' or a number of seconds"


def parse_keep_alive(value: str | float | int) -> float:
    """Seconds (FOREVER for a negative value); ValueError for anything else (a boolean too:
    `true` is not one second)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(_TYPE_ERROR)
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:  # an integer beyond any float: longer than forever
            seconds = math.inf if value > 0 else -math.inf
    else:
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        try:
            seconds = sign * float(body)  # "300" as a string is seconds too
        except ValueError:
            parts = _PART.findall(body)
            if not body or "".join(n + u for n, u in parts) != body:
                raise ValueError(
                    f"'{value}' is not a duration (examples: 5m, 1h30m, 90s, 0, -1)"
                ) from None
            seconds = sign * sum(float(n) * _SECONDS[u] for n, u in parts)
    if math.isnan(seconds):
        raise ValueError("keep_alive must be a number")
    return FOREVER if seconds < 0 else seconds


def _exact_types(value: Any) -> Any:
    """Before pydantic's coercion (which would read `true` as 1.0): exactly what Ollama
    documents, a duration string or a number."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
        raise ValueError(_TYPE_ERROR)
    return value


# The `keep_alive` field of every protocol's request model.
KeepAlive = Annotated[str | float | None, BeforeValidator(_exact_types)]


class CheckedKeepAlive(BaseModel):
    """A request body whose `keep_alive` duration is parsed when the body is validated, so a
    bad one is a 400 naming the field (the OpenAI-shaped bodies: chat, completions,
    embeddings, rerank)."""

    keep_alive: KeepAlive = None

    @field_validator("keep_alive")
    @classmethod
    def _keep_alive(cls, v: str | float | None) -> str | float | None:
        if v is not None:
            parse_keep_alive(v)  # ValueError -> 400 naming keep_alive
        return v

    def keep_alive_seconds(self) -> float | None:
        return None if self.keep_alive is None else parse_keep_alive(self.keep_alive)


def describe_keep_alive(seconds: float) -> str:
    return "forever" if math.isinf(seconds) else f"{seconds:g}s"
