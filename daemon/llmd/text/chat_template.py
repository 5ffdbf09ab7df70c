"""Chat templates rendered the way Hugging Face renders them, in a Jinja2 sandbox.

The template comes from the model itself (GGUF ``tokenizer.chat_template`` or
``tokenizer_config.json``); the sandbox keeps a hostile template from touching the daemon.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import Template, TemplateError, nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llmd.errors import bad_request


class TemplateRaised(Exception):
    """A template called ``raise_exception`` (e.g. roles that do not alternate)."""


def _raise(message: str) -> None:
    raise TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes and sorts keys; templates are written against HF's.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _Generation(Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks in HF;
    for inference the body simply renders."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


@lru_cache(maxsize=16)
def _compile(source: str) -> Template:
    """One sandboxed environment per template source, configured as transformers does."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_Generation, "jinja2.ext.loopcontrols"],
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
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
    """The prompt text for `messages`; a template's refusal or failure is the client's 400."""
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


def fold_inner_system_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """`messages` with each system message after the first turn folded into a user turn, for
    templates that refuse a system role anywhere but first (None when there is none).

    Where it goes: in front of the next user turn, else (a trailing system message, as Claude
    Code sends its environment block) after the last user turn before it, separated by a
    blank line. A user turn keeps its place in the history, so the prefix cache still serves
    the conversation's earlier turns on the next request."""
    inner = [i for i, m in enumerate(messages) if m["role"] == "system" and i > 0]
    if not inner:
        return None
    out = [dict(m) for m in messages]
    for i in inner:
        text = out[i]["content"] or ""
        after = next((j for j in range(i + 1, len(out)) if out[j]["role"] == "user"), None)
        before = next((j for j in range(i - 1, -1, -1) if out[j]["role"] == "user"), None)
        if after is not None:
            out[after]["content"] = f"{text}\n\n{out[after]['content'] or ''}"
        elif before is not None:
            out[before]["content"] = f"{out[before]['content'] or ''}\n\n{text}"
        else:
            out.insert(i + 1, {"role": "user", "content": text})
    return [m for i, m in enumerate(out) if i not in set(inner)]
