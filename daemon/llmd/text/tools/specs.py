"""The request's ``tools`` and ``tool_choice``, read once into plain values.

Parsers need the function names (a call to anything else is text), grammars need each
function's parameter schema, prompts need the definitions as the client wrote them.
Malformed input raises :class:`ToolSpecError`, which the server answers with a 400 naming
the parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

# A function without `parameters` takes no arguments; OpenAI treats it as an empty object.
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class ToolSpecError(ValueError):
    """The client's `tools` or `tool_choice` cannot be used; `param` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    description: str | None
    parameters: dict[str, Any]


def function_specs(tools: Sequence[dict[str, Any]] | None) -> list[FunctionSpec]:
    """The functions of an OpenAI ``tools`` list (``{"type": "function", "function": {...}}``
    entries), in order."""
    specs: list[FunctionSpec] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise ToolSpecError(f"tools[{i}] must be a function tool", "tools")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ToolSpecError(f"tools[{i}].function.name is required", "tools")
        params = fn.get("parameters")
        if params is None:
            params = EMPTY_PARAMETERS
        if not isinstance(params, dict):
            raise ToolSpecError(f"tools[{i}].function.parameters must be a JSON schema", "tools")
        if fn["name"] in seen:
            raise ToolSpecError(f"tools[{i}]: function '{fn['name']}' is defined twice", "tools")
        seen.add(fn["name"])
        specs.append(FunctionSpec(fn["name"], fn.get("description"), params))
    return specs


@dataclass(frozen=True)
class ToolChoice:
    """`mode` is none, auto or required; `function` names the one function a client forced
    (mode ``required`` then means "exactly that one")."""

    mode: Literal["none", "auto", "required"]
    function: str | None = None

    @property
    def forces_call(self) -> bool:
        """A call must be produced: enforced by constrained decoding, not hoped for."""
        return self.mode == "required"


def resolve_tool_choice(choice: Any, specs: Sequence[FunctionSpec]) -> ToolChoice:
    """OpenAI's ``tool_choice``: absent means auto with tools and none without; a named
    function (``{"type": "function", "function": {"name": ...}}``) must be one of `tools`."""
    if choice is None:
        return ToolChoice("auto" if specs else "none")
    if choice in ("none", "auto", "required"):
        if choice != "none" and not specs:
            raise ToolSpecError(f"tool_choice '{choice}' needs a non-empty tools list", "tools")
        return ToolChoice(choice)
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else choice.get("name")
        if not isinstance(name, str) or not name:
            raise ToolSpecError("tool_choice.function.name is required", "tool_choice")
        if name not in {s.name for s in specs}:
            raise ToolSpecError(
                f"tool_choice names function '{name}', which is not in tools", "tool_choice"
            )
        return ToolChoice("required", name)
    raise ToolSpecError(
        "tool_choice must be 'none', 'auto', 'required' or "
        '{"type": "function", "function": {"name": ...}}',
        "tool_choice",
    )
