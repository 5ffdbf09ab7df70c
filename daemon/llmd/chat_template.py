"""Chat templates rendered the way Hugging Face renders them, in a Jinja2 sandbox.

The template comes from the model itself (GGUF ``tokenizer.chat_template`` or
``tokenizer_config.json``); the sandbox keeps a hostile template from touching the daemon.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import bad_request


class TemplateRaised(Exception):
    pass


def _raise(message: str) -> None:
    raise TemplateRaised(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


@lru_cache(maxsize=16)
def _compile(source: str):  # type: ignore[no-untyped-def]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    return env.from_string(source)


def render_chat(
    source: str,
    messages: list[dict[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
    **extra: Any,
) -> str:
    try:
        return _compile(source).render(
            messages=messages,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
            **extra,
        )
    except TemplateRaised as exc:
        raise bad_request(
            f"the model's chat template rejected the messages: {exc}", "messages"
        ) from exc
    except TemplateError as exc:
        raise bad_request(f"the model's chat template failed: {exc}", "messages") from exc
