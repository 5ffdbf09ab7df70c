"""Python-style calls (``get_weather(city="Paris", days=3)``) read as data, never executed.

Gemma 3 is prompted to answer with calls in a ```` ```tool_code ```` block, written as Python.
The text is parsed with :mod:`ast` and only literal values are accepted, so a model (or a
prompt injection) can never run code here. JSON spellings (``true``, ``false``, ``null``)
are accepted too: grammars write argument values as JSON, and models mix the two.
"""

from __future__ import annotations

import ast
import json
from typing import Any

_NAMED_CONSTANTS = {
    "True": True,
    "False": False,
    "None": None,
    "true": True,
    "false": False,
    "null": None,
}


class NotALiteral(ValueError):
    """The value is an expression (a variable, arithmetic, a call), not plain data."""


def literal(node: ast.expr) -> Any:
    """The JSON-compatible value a literal expression spells."""
    if isinstance(node, ast.Constant) and (
        node.value is None or isinstance(node.value, (str, int, float, bool))
    ):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMED_CONSTANTS:
        return _NAMED_CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = literal(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        out: dict[str, Any] = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:  # {**other}
                raise NotALiteral("dict unpacking")
            name = literal(key)
            if not isinstance(name, str):
                raise NotALiteral("non-string dict key")
            out[name] = literal(value)
        return out
    raise NotALiteral(ast.dump(node)[:80])


def _function_name(func: ast.expr) -> str | None:
    """``f`` or ``module.f`` (Gemini-style ``default_api.f``): the function's own name."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _call(node: ast.expr) -> tuple[str, dict[str, Any]] | None:
    # print(f(...)) is how Google's examples sometimes write a call to be run.
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
        and len(node.args) == 1
        and not node.keywords
    ):
        node = node.args[0]
    if not isinstance(node, ast.Call) or node.args:  # positional arguments have no names
        return None
    name = _function_name(node.func)
    if name is None:
        return None
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:  # **kwargs
            return None
        try:
            args[kw.arg] = literal(kw.value)
        except (NotALiteral, RecursionError):
            return None
    return name, args


def parse_python_calls(source: str) -> list[tuple[str, dict[str, Any]]] | None:
    """Calls written one per line, or as a list ``[f(a=1), g(b=2)]``; None when the text is
    anything else (a statement, a positional argument, a non-literal value)."""
    try:
        tree = ast.parse(source.strip(), mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    nodes: list[ast.expr] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            return None
        value = stmt.value
        nodes.extend(value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value])
    calls = [_call(node) for node in nodes]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def format_python_call(name: str, arguments: dict[str, Any]) -> str:
    """A call as the model writes it under llmd's grammar (for earlier assistant turns in a
    prompt): keyword arguments with JSON values, which :func:`parse_python_calls` reads."""
    parts = [f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in arguments.items()]
    return f"{name}({', '.join(parts)})"
