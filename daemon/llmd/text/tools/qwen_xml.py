"""Qwen3.5 / Qwen3-Coder tool calls: XML-style parameters inside ``<tool_call>``.

Their templates ask for::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

not Hermes JSON. Values are bare text, so their JSON type comes from the tool's schema, as
vLLM's ``qwen3_coder`` parser does it: a ``string`` parameter keeps the text (one newline on
each side is markup and goes); integer, number, boolean, object and array parameters are read
as JSON, and text that does not parse stays a string (a model's mistake is data the client
can see, not a lost argument). Parameters the schema does not declare are strings.

Streaming, validation and content rules are the shared ones of :mod:`.parsers`: a block is
held to its ``</tool_call>`` and judged whole; markup that is not a valid call is content.
A grammar-constrained call (``stream=True``) streams instead: its start at ``<function=name>``,
then one ``{"key": value`` / ``, "key": value`` fragment per finished parameter, and ``}`` at
``</function>``; together they are ``json.dumps`` of the arguments, as the whole-block path
makes them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from llmd.text.tools.parsers import HERMES_CLOSE, HERMES_OPEN, ParsedCalls, _DelimitedParser

XML_FUNCTION, XML_FUNCTION_END = "<function=", "</function>"
XML_PARAMETER, XML_PARAMETER_END = "<parameter=", "</parameter>"
_FUNCTION_HEAD = re.compile(r"\s*<function=([^>\n]+)>")
_PARAMETER_HEAD = re.compile(r"\s*<parameter=([^>\n]+)>")

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def schema_types(schema: Any) -> set[str]:
    """The JSON types a property's schema admits (``type`` as a name or a list, the members
    of ``anyOf``/``oneOf``, or the kinds of its ``enum``/``const`` values); empty when the
    schema says nothing, which is read as a string."""
    if not isinstance(schema, Mapping):
        return set()
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    found: set[str] = set()
    for key in ("anyOf", "oneOf"):
        for member in schema.get(key) or []:
            found |= schema_types(member)
    values = list(schema.get("enum") or []) + ([schema["const"]] if "const" in schema else [])
    for value in values:
        found.add(_type_of(value))
    return found


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "object" if isinstance(value, dict) else "array"


def _fits(value: Any, types: set[str]) -> bool:
    if isinstance(value, bool):
        return "boolean" in types
    return any(isinstance(value, _JSON_TYPES[t]) for t in types if t in _JSON_TYPES)


def parameter_value(raw: str, schema: Any) -> Any:
    """One ``<parameter=...>`` body as its argument value, typed by the property's schema."""
    text = raw[1:] if raw.startswith("\n") else raw
    text = text[:-1] if text.endswith("\n") else text
    types = schema_types(schema)
    if not types or types == {"string"}:
        return text
    token = text.strip()
    if "boolean" in types and token.lower() in ("true", "false"):
        return token.lower() == "true"  # Python-style True/False, as models write it
    try:
        value = json.loads(token)
    except (ValueError, RecursionError):
        return text
    if "string" in types:  # a string-or-something parameter: the text unless it is the other
        return value if not isinstance(value, str) and _fits(value, types) else text
    return value


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _tag_name(text: str, pos: int) -> tuple[str, int] | None:
    """The ``name>`` after ``<function=`` / ``<parameter=``: (name, position after ``>``)."""
    end = text.find(">", pos)
    if end < 0 or "\n" in text[pos:end]:
        return None
    name = text[pos:end].strip()
    return (name, end + 1) if name else None


def parse_xml_calls(
    body: str, schemas: Mapping[str, Mapping[str, Any]] | None = None
) -> ParsedCalls | None:
    """The ``<function=name>`` blocks inside one ``<tool_call>`` (usually one), or None when
    the body is anything else. A missing ``</function>`` or ``</parameter>`` at the end of the
    body is forgiven (the model stopped right there); text between tags is not."""
    calls: ParsedCalls = []
    pos = _skip_ws(body, 0)
    while pos < len(body):
        if not body.startswith(XML_FUNCTION, pos):
            return None
        tag = _tag_name(body, pos + len(XML_FUNCTION))
        if tag is None:
            return None
        name, pos = tag
        params = (schemas or {}).get(name) or {}
        props = params.get("properties") if isinstance(params, Mapping) else None
        props = props if isinstance(props, Mapping) else {}
        args: dict[str, Any] = {}
        while True:
            pos = _skip_ws(body, pos)
            if pos == len(body):
                break
            if body.startswith(XML_FUNCTION_END, pos):
                pos += len(XML_FUNCTION_END)
                break
            if not body.startswith(XML_PARAMETER, pos):
                return None
            tag = _tag_name(body, pos + len(XML_PARAMETER))
            if tag is None:
                return None
            key, pos = tag
            end = body.find(XML_PARAMETER_END, pos)
            stop = len(body) if end < 0 else end
            if end < 0 and (fn_end := body.find(XML_FUNCTION_END, pos)) >= 0:
                stop = fn_end
            args[key] = parameter_value(body[pos:stop], props.get(key))
            pos = stop if end < 0 else end + len(XML_PARAMETER_END)
        calls.append((name, args))
        pos = _skip_ws(body, pos)
    return calls or None


class QwenXmlParser(_DelimitedParser):
    """``<tool_call><function=name><parameter=key>value</parameter></function></tool_call>``
    per call (Qwen3.5, Qwen3-Coder). `schemas` maps function names to their parameter
    schemas, for typing the values; without them every value is a string."""

    OPEN, CLOSE = HERMES_OPEN, HERMES_CLOSE

    def __init__(
        self,
        function_names: Iterable[str] | None = None,
        *,
        parallel: bool = True,
        stream: bool = False,
        schemas: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__(function_names, parallel=parallel, stream=stream)
        self._schemas = dict(schemas or {})
        self._props: Mapping[str, Any] = {}
        self._members = 0

    def _parse_body(self, body: str) -> ParsedCalls | None:
        return parse_xml_calls(body, self._schemas)

    def _streams(self) -> bool:
        return True

    def _stream_step(self) -> bool:
        if self._phase == "head":
            head = _FUNCTION_HEAD.match(self._buf)
            if head is None:
                if HERMES_CLOSE in self._buf or self._buf.strip()[:1] not in ("", "<"):
                    self._phase = None
                    return False
                return True  # <function=... may still come
            name = head.group(1).strip()
            if not self._start_call(name):
                self._phase = None
                return False
            params = self._schemas.get(name) or {}
            props = params.get("properties") if isinstance(params, Mapping) else None
            self._props = props if isinstance(props, Mapping) else {}
            self._members = 0
            self._buf = self._buf[head.end() :]
            self._phase = "params"
        while self._phase == "params":
            body = self._buf.lstrip()
            if body.startswith(XML_FUNCTION_END) or body.startswith(HERMES_CLOSE):
                if body.startswith(XML_FUNCTION_END):
                    body = body[len(XML_FUNCTION_END) :]
                self._close_arguments()
                self._buf = body
                break
            param = _PARAMETER_HEAD.match(self._buf)
            end = self._buf.find(XML_PARAMETER_END, param.end()) if param else -1
            if end < 0:
                return True  # a parameter under way (its value is sent once it is whole)
            assert param is not None
            key = param.group(1).strip()
            value = parameter_value(self._buf[param.end() : end], self._props.get(key))
            sep = ", " if self._members else "{"
            self._arguments(f"{sep}{json.dumps(key, ensure_ascii=False)}: ")
            self._arguments(json.dumps(value, ensure_ascii=False))
            self._members += 1
            self._buf = self._buf[end + len(XML_PARAMETER_END) :]
        self._scanned = 0
        return False

    def _close_arguments(self) -> None:
        self._arguments("}" if self._members else "{}")
        self._end_call()
        self._phase = "tail"

    def _flush_streamed(self, held: str) -> None:
        # Ended between parameters; cut by the limit, the call stays open (incomplete).
        if self._open is not None and not held.strip() and not self._cut:
            self._close_arguments()

    def _whole_at_cut(self, body: str) -> bool:
        return body.rstrip().endswith(XML_FUNCTION_END)
