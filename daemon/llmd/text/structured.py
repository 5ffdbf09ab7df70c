"""`response_format` -> the llguidance grammar the worker enforces token by token.

json_object: any JSON object. json_schema: that schema; with `strict: true` a keyword the
grammar compiler does not implement is a 400 (nothing is silently relaxed), and objects
admit only their declared properties (OpenAI's strict mode demands `additionalProperties:
false`; llmd applies it where the schema leaves it out, rather than refusing the schema).
Without `strict`, unknown keywords are ignored (as OpenAI's non-strict mode only "tries"). JSON is
generated compactly on one line (", " and ": " separators, no free whitespace): a small model
given free whitespace can loop on newlines until max_tokens, and the answer would not parse.
"""

from __future__ import annotations

import json
from typing import Any

from llmd.errors import bad_request

_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


# Deepest schema nesting (dicts and lists) accepted: real schemas nest a few levels.
MAX_SCHEMA_DEPTH = 64
_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def _closed(schema: Any, *, param: str = "response_format") -> Any:
    """`schema` with `additionalProperties: false` on every object that does not say.
    Built with an explicit stack (no recursion): a schema nested deeper than
    MAX_SCHEMA_DEPTH is a 400 naming `param`."""

    def shell(node: Any) -> Any:
        return {} if isinstance(node, dict) else [] if isinstance(node, list) else node

    root = shell(schema)
    # (source node, its copy, depth, whether the node is a name -> schema map)
    stack: list[tuple[Any, Any, int, bool]] = [(schema, root, 0, False)]
    while stack:
        node, out, depth, is_map = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise bad_request(
                f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels", param=param
            )
        if isinstance(node, list):
            for item in node:
                copy = shell(item)
                out.append(copy)
                if isinstance(item, (dict, list)):
                    stack.append((item, copy, depth + 1, False))
            continue
        for key, value in node.items():
            copy = shell(value)
            out[key] = copy
            if isinstance(value, (dict, list)):
                child_is_map = not is_map and key in _MAPS and isinstance(value, dict)
                stack.append((value, copy, depth + 1, child_is_map))
        if not is_map:
            is_object = node.get("type") == "object" or "properties" in node
            if is_object and "additionalProperties" not in node:
                out["additionalProperties"] = False
    return root


def json_schema_grammar(schema: dict[str, Any], *, strict: bool, param: str) -> str:
    """The grammar for `schema`; 400 naming `param` when it cannot be compiled."""
    import llguidance

    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(_closed(schema, param=param) if strict else schema),
            defaults={**_LAYOUT, "lenient": not strict},
        )
    except RecursionError as exc:
        raise bad_request("the JSON schema nests too deeply", param=param) from exc
    except ValueError as exc:
        raise bad_request(f"invalid JSON schema: {exc}", param=param) from exc
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error and not error.startswith("WARNING"):
        raise bad_request(f"unsupported JSON schema: {error}", param=param)
    return grammar


def response_format_grammar(response_format: Any) -> str | None:
    """None for text; a grammar for json_object / json_schema."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return json_schema_grammar({"type": "object"}, strict=False, param="response_format")
    spec = response_format.json_schema
    if spec is None:
        raise bad_request(
            "response_format of type json_schema needs a json_schema object",
            param="response_format.json_schema",
        )
    return json_schema_grammar(
        spec.schema_ or {}, strict=bool(spec.strict), param="response_format.json_schema.schema"
    )
