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

from .errors import bad_request

_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _closed(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on every object that does not say."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        if isinstance(schema.get(key), dict):
            out[key] = {name: _closed(sub) for name, sub in schema[key].items()}
    is_object = schema.get("type") == "object" or "properties" in schema
    if is_object and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def json_schema_grammar(schema: dict[str, Any], *, strict: bool, param: str) -> str:
    """The grammar for `schema`; 400 naming `param` when it cannot be compiled."""
    import llguidance

    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(_closed(schema) if strict else schema),
            defaults={**_LAYOUT, "lenient": not strict},
        )
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
