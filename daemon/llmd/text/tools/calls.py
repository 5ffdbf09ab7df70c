"""Tool calls as the OpenAI API shows them: parsed calls, streaming events, ids, finish reason.

Parsers of every model family produce the same events, so the server turns them into
``tool_calls`` deltas (or a ``message.tool_calls`` list) in one place:
``ToolCallStart`` then ``ToolCallArguments`` per call, ``ContentDelta`` for ordinary text.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

_ID_ALPHABET = string.ascii_letters + string.digits


def new_call_id() -> str:
    """``call_`` + 24 random letters and digits, OpenAI's shape; made once per call, so the
    id a client sees in the first streamed delta is the id of the finished call."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True)
class ToolCall:
    """One validated call. `arguments` is the JSON text of an object, as OpenAI sends it."""

    name: str
    arguments: str
    id: str = field(default_factory=new_call_id)

    def to_openai(self) -> dict[str, Any]:
        """The entry of ``message.tool_calls`` in a non-streaming response."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    def arguments_dict(self) -> dict[str, Any]:
        return json.loads(self.arguments)


@dataclass(frozen=True)
class ContentDelta:
    """Ordinary answer text (including markup that turned out not to be a valid call)."""

    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """A call begins: its index in this response's ``tool_calls``, stable id, and name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArguments:
    """A piece of the call's arguments JSON; the pieces of one call concatenate to it."""

    index: int
    fragment: str


ToolEvent = ContentDelta | ToolCallStart | ToolCallArguments


def openai_delta(event: ToolEvent) -> dict[str, Any]:
    """The ``choices[0].delta`` object for one event of a streamed chat completion."""
    if isinstance(event, ContentDelta):
        return {"content": event.text}
    if isinstance(event, ToolCallStart):
        entry: dict[str, Any] = {
            "index": event.index,
            "id": event.id,
            "type": "function",
            "function": {"name": event.name, "arguments": ""},
        }
    else:
        entry = {"index": event.index, "function": {"arguments": event.fragment}}
    return {"tool_calls": [entry]}


def tool_finish_reason(engine_reason: str, calls: int, incomplete: bool = False) -> str:
    """The response's ``finish_reason``: ``tool_calls`` once at least one valid call was
    produced, whether the model then ended its turn (``stop``) or ran into ``max_tokens``
    after a complete call (``length``); anything else (errors, cancellation) is kept, and so
    is the engine's reason when a streamed call was cut mid-arguments (`incomplete`: its
    fragments went out and cannot be withdrawn, so ``length`` says they are partial)."""
    if calls > 0 and engine_reason in ("stop", "length") and not incomplete:
        return "tool_calls"
    return engine_reason
