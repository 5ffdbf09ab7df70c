"""Grammars that make ``tool_choice`` ``required`` (or a named function) a guarantee, and
that hold an ``auto`` call to its schema once the model opens it (:func:`lazy_tool_call_grammar`).

The worker enforces a grammar with llguidance as a token mask at every step; this module
writes that grammar in llguidance's Lark dialect, in the model's own markup (out-of-
distribution markup makes small models ramble, see llguidance's docs/toolcalls.md), with
each call's arguments held to the function's JSON schema by an inline ``%json { ... }``.

Arguments may only be the properties a function declares, unless its schema allows more
(see :func:`_closed`). JSON is forced into the spacing templates render it with
(``json.dumps`` defaults, ``{"name": "f", "arguments": {"a": 1}}``): what models saw in
training, and no room to loop on whitespace. Markers that are control tokens in the model's
vocabulary (``[TOOL_CALLS]``) must be written as tokens: pass their ids in `special_tokens`
(:func:`marker_token_ids`).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal, cast

from llmd.text.tools.qwen_xml import schema_types
from llmd.text.tools.select import ToolParserFactory
from llmd.text.tools.specs import FunctionSpec, ToolChoice, function_specs, resolve_tool_choice

ReasoningPrefix = Literal["optional", "open"] | None

_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_MARKERS = {
    "hermes": ("<tool_call>", "</tool_call>"),
    "mistral": ("[TOOL_CALLS]",),
    "mistral_v11": ("[TOOL_CALLS]", "[ARGS]"),
    "llama3": (),
    "gemma": (),
    "gemma4": ("<|tool_call>", "<tool_call|>", '<|"|>'),
    "qwen_xml": ("<tool_call>", "</tool_call>"),
}
THINK_TAGS = ("<think>", "</think>")


def marker_token_ids(
    family: str | ToolParserFactory,
    token_to_id: Callable[[str], int | None],
    special_ids: Collection[int],
    reasoning_tokens: Sequence[str] = THINK_TAGS,
) -> dict[str, int]:
    """The family's markers that are special (control) tokens in this vocabulary, with their
    ids: those must be forced as tokens, since a special token never matches text.
    `reasoning_tokens`: the reasoning markers' token pieces (Gemma 4's ``<|channel>``...)."""
    fam = family.family if isinstance(family, ToolParserFactory) else family
    ids = {m: token_to_id(m) for m in (*_MARKERS[fam], *reasoning_tokens)}
    return {m: i for m, i in ids.items() if i is not None and i in special_ids}


def _rebase_refs(schema: Any, pointer: str) -> Any:
    """Local ``$ref``s (``#/$defs/X``) of a schema embedded at `pointer` in a larger one."""
    if isinstance(schema, dict):
        out = {}
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#"):
                out[key] = pointer + value[1:]
            else:
                out[key] = _rebase_refs(value, pointer)
        return out
    if isinstance(schema, list):
        return [_rebase_refs(item, pointer) for item in schema]
    return schema


_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def _closed(schema: Any) -> Any:
    """Objects that declare ``properties`` and say nothing about others accept only those
    (as OpenAI's strict mode does): a forced call cannot invent arguments the function does
    not take. Members of ``allOf`` are left open, since closing them would make their
    intersection unsatisfiable."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _closed(v) for k, v in out["properties"].items()}
        if not any(key in out for key in _OPEN_KEYS):
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties", "contains", "not", "if", "then", "else"):
        if isinstance(out.get(key), dict):
            out[key] = _closed(out[key])
    for key in ("anyOf", "oneOf", "prefixItems"):
        if isinstance(out.get(key), list):
            out[key] = [_closed(item) for item in out[key]]
    for key in ("$defs", "definitions", "patternProperties"):
        if isinstance(out.get(key), dict):
            out[key] = {k: _closed(v) for k, v in out[key].items()}
    return out


def _call_schema(spec: FunctionSpec, args_key: str, pointer: str = "#") -> dict[str, Any]:
    """``{"name": <const>, args_key: <parameters>}``, keys in that order."""
    return {
        "type": "object",
        "properties": {
            "name": {"const": spec.name},
            args_key: _rebase_refs(_closed(spec.parameters), f"{pointer}/properties/{args_key}"),
        },
        "required": ["name", args_key],
        "additionalProperties": False,
    }


def _json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": _JSON_STYLE}, ensure_ascii=False)


class _Lark:
    """Rules of one grammar; literals become tokens where the vocabulary has them special.

    `lazy`: the grammar of ``tool_choice`` ``auto``: :meth:`open` makes a call's opening
    marker the trigger that ends free text (``TEXT``), instead of a plain literal.
    `not_after`: a regex of text that free text ending in a trigger must not start with (a
    reasoning block written as text: a marker inside the thinking is not a call)."""

    def __init__(
        self, special_tokens: Mapping[str, int], *, lazy: bool = False, not_after: str = ""
    ) -> None:
        self.rules: list[str] = []
        self.special = special_tokens
        self.lazy = lazy
        self.not_after = not_after
        self._heads: dict[str, str] = {}

    def lit(self, text: str) -> str:
        """`text` as a literal; special tokens inside it (``<|channel>`` of
        ``<|channel>thought``) as tokens, the text around them as strings."""
        if text in self.special:
            return f"<[{self.special[text]}]>"
        for marker in self.special:
            at = text.find(marker)
            if marker and at >= 0:
                parts = (text[:at], marker, text[at + len(marker) :])
                return " ".join(self.lit(part) for part in parts if part)
        return json.dumps(text, ensure_ascii=False)

    def rule(self, name: str, body: str, options: str = "") -> str:
        self.rules.append(f"{name}{options}: {body}")
        return name

    def open(self, marker: str) -> str:
        """A call's opening marker. Lazy: free text up to and including it, one lexeme that
        ends at the marker's first occurrence (llguidance's lazy lexemes), so from there on
        only a valid call can follow; a special-token marker ends free text as a token."""
        if not self.lazy:
            return self.lit(marker)
        if marker not in self._heads:
            k = len(self._heads)
            if marker in self.special:
                body = f"TEXT {self.lit(marker)}"
                self._heads[marker] = self.rule(f"head{k}", body)
            else:
                term = f"/(.|\\n)*{_regex(marker)}/"
                if self.not_after:
                    term += f" & ~/{self.not_after}(.|\\n)*/"
                self.rule(f"HEAD{k}", term)
                self._heads[marker] = self.rule(f"head{k}", f"HEAD{k}", "[lazy]")
        return self._heads[marker]


def _regex(text: str) -> str:
    """`text` matched literally inside a Lark ``/.../`` regex."""
    return re.escape(text).replace("/", "\\/")


# A family's grammar: (one call block, the separator between blocks when several may follow
# one another, as a Lark expression: "" for none, None when calls share one block instead).
Block = tuple[str, str | None]


def _hermes(g: _Lark, specs: Sequence[FunctionSpec], parallel: bool) -> Block:
    alts = [g.rule(f"call{i}", _json(_call_schema(s, "arguments"))) for i, s in enumerate(specs)]
    body = g.rule("call_json", " | ".join(alts))
    one = g.rule("call", f'{g.open("<tool_call>")} "\\n" {body} "\\n" {g.lit("</tool_call>")}')
    return one, '"\\n"'


def _llama3(g: _Lark, specs: Sequence[FunctionSpec], parallel: bool) -> Block:
    alts = [g.rule(f"call{i}", _json(_call_schema(s, "parameters"))) for i, s in enumerate(specs)]
    return g.rule("call", " | ".join(alts)), '"; "'


def _mistral(g: _Lark, specs: Sequence[FunctionSpec], parallel: bool) -> Block:
    items = [_call_schema(s, "arguments", f"#/items/anyOf/{i}") for i, s in enumerate(specs)]
    array: dict[str, Any] = {"type": "array", "items": {"anyOf": items}, "minItems": 1}
    if not parallel:
        array["maxItems"] = 1
    return g.rule("call", f"{g.open('[TOOL_CALLS]')} {g.rule('calls', _json(array))}"), None


def _mistral_v11(g: _Lark, specs: Sequence[FunctionSpec], parallel: bool) -> Block:
    alts = [
        g.rule(f"call{i}", f"{g.lit(s.name)} {g.lit('[ARGS]')} " + _json(_closed(s.parameters)))
        for i, s in enumerate(specs)
    ]
    return g.rule("call", f"{g.open('[TOOL_CALLS]')} ({' | '.join(alts)})"), ""


def _value_schema(prop: Any, parameters: dict[str, Any]) -> dict[str, Any]:
    """A property's schema as a root of its own, keeping the definitions its refs point to."""
    schema = copy.deepcopy(prop) if isinstance(prop, dict) else {}
    for defs in ("$defs", "definitions"):
        if defs in parameters:
            schema.setdefault(defs, parameters[defs])
    return _closed(schema)


def _ordered_args(
    g: _Lark, tag: str, spec: FunctionSpec, item: Callable[[str, dict[str, Any]], str], sep: str
) -> str:
    """Keyword arguments in schema order, `sep` between them, required ones mandatory: the
    rule for all of them ("" when the function takes none). `item(name, schema)` is the body
    of one argument."""
    props = spec.parameters.get("properties") or {}
    required = set(spec.parameters.get("required") or [])
    names = list(props)
    items = [
        g.rule(f"{tag}_arg{k}", item(name, _value_schema(props[name], spec.parameters)))
        for k, name in enumerate(names)
    ]
    # tail(k): the arguments from k on, after one was written; head(k): before any was.
    tail: list[str] = [""] * (len(names) + 1)
    head: list[str] = [""] * (len(names) + 1)
    for k in range(len(names) - 1, -1, -1):
        rest = f" {tail[k + 1]}" if tail[k + 1] else ""
        if names[k] in required:
            tail[k] = g.rule(f"{tag}_t{k}", f"{sep} {items[k]}{rest}")
            head[k] = g.rule(f"{tag}_h{k}", f"{items[k]}{rest}")
        else:
            tail[k] = g.rule(f"{tag}_t{k}", f"({sep} {items[k]})?{rest}")
            first = f"{items[k]}{rest}"
            head[k] = g.rule(
                f"{tag}_h{k}", f"{first} | {head[k + 1]}" if head[k + 1] else f"({first})?"
            )
    return head[0] if head else ""


def _gemma_call(g: _Lark, i: int, spec: FunctionSpec) -> str:
    """``name(a=<json>, b=<json>)``: properties in schema order, required ones mandatory."""
    args = _ordered_args(
        g, f"g{i}", spec, lambda name, schema: f"{g.lit(name + '=')} {_json(schema)}", '", "'
    )
    args = f" {args}" if args else ""
    return g.rule(f"call{i}", f'{g.lit(spec.name + "(")}{args} ")"')


def _gemma(g: _Lark, specs: Sequence[FunctionSpec], parallel: bool) -> Block:
    one = g.rule("call", " | ".join(_gemma_call(g, i, s) for i, s in enumerate(specs)))
    calls = f'{one} ("\\n" {one})*' if parallel else one
    return g.rule("block", f'{g.open("```tool_code")} "\\n" {calls} "\\n```"'), None


_G4_QUOTE = '<|"|>'


def _gemma4_generic(g: _Lark) -> str:
    """Any value of Gemma 4's call syntax (for arguments whose schema is not a plain
    scalar): strings between quote tokens, bare-key objects, arrays, numbers, literals."""
    q = g.lit(_G4_QUOTE)
    if _G4_QUOTE in g.special:
        text = g.rule("g4_text", f"/(.|\\n)*/ {q}")
    else:
        text = g.rule("g4_text", r'/(.|\n)*<\|"\|>/', "[lazy]")
    g.rule("g4_string", f"{q} {text}")
    g.rule("g4_int", r"/-?(0|[1-9][0-9]*)/")
    g.rule("g4_number", r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/")
    g.rule("g4_bool", '"true" | "false"')
    g.rule("g4_pair", r'/[A-Za-z0-9_.$\-]+/ ":" g4_value')
    g.rule("g4_object", '"{" (g4_pair ("," g4_pair)*)? "}"')
    g.rule("g4_array", '"[" (g4_value ("," g4_value)*)? "]"')
    return g.rule("g4_value", 'g4_string | g4_number | g4_bool | "null" | g4_object | g4_array')


def _gemma4_typed(schema: dict[str, Any], g: _Lark) -> str:
    """The value rule for one argument: scalars and string enums by their schema, anything
    else as a generic value (its inner structure is checked by the parser, not forced)."""
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        q = g.lit(_G4_QUOTE)
        return "(" + " | ".join(f"{q} {g.lit(v)} {q}" for v in enum) + ")"
    kind = schema.get("type")
    return {
        "string": "g4_string",
        "integer": "g4_int",
        "number": "g4_number",
        "boolean": "g4_bool",
        "null": '"null"',
    }.get(kind if isinstance(kind, str) else "", "g4_value")


def _gemma4(g: _Lark, specs: Sequence[FunctionSpec], parallel: bool) -> Block:
    """``<|tool_call>call:name{key:value,...}<tool_call|>`` per call."""
    _gemma4_generic(g)
    alts = []
    for i, s in enumerate(specs):
        args = _ordered_args(
            g,
            f"g4c{i}",
            s,
            lambda name, schema: f"{g.lit(name + ':')} {_gemma4_typed(schema, g)}",
            '","',
        )
        inner = f" {args}" if args else ""
        alts.append(g.rule(f"call{i}", f'{g.lit("call:" + s.name + "{")}{inner} "}}"'))
    body = g.rule("call_body", " | ".join(alts))
    return g.rule("call", f"{g.open('<|tool_call>')} {body} {g.lit('<tool_call|>')}"), ""


def _xml_value(g: _Lark, schema: dict[str, Any]) -> str:
    """One ``<parameter=...>`` value with its closing tag: string enums as their values,
    string (or untyped) parameters as free text up to ``</parameter>``, anything else as
    JSON held to its schema."""
    end = g.lit("\n</parameter>\n")
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return "(" + " | ".join(g.lit(v) for v in enum) + f") {end}"
    types = schema_types(schema)
    if not types or "string" in types:
        return "xml_text"
    return f"{_json(schema)} {end}"


def _qwen_xml(g: _Lark, specs: Sequence[FunctionSpec], parallel: bool) -> Block:
    """``<tool_call>\\n<function=name>\\n<parameter=key>\\nvalue\\n</parameter>\\n...
    </function>\\n</tool_call>`` per call, spaced as Qwen3.5's template renders them."""
    g.rule("xml_text", r"/(.|\n)*\n<\/parameter>\n/", "[lazy]")
    alts = []
    for i, s in enumerate(specs):
        args = _ordered_args(
            g,
            f"x{i}",
            s,
            lambda name, schema: g.lit(f"<parameter={name}>" + "\n") + " " + _xml_value(g, schema),
            "",
        )
        inner = f"{args} " if args else ""
        head = g.lit(f"<function={s.name}>\n")
        alts.append(g.rule(f"call{i}", f"{head} {inner}{g.lit('</function>')}"))
    body = g.rule("call_body", " | ".join(alts))
    one = g.rule("call", f'{g.open("<tool_call>")} "\\n" {body} "\\n" {g.lit("</tool_call>")}')
    return one, '"\\n"'


def _think_rest(g: _Lark, close: str = "</think>") -> str:
    """Reasoning text up to and including the first `close` (lazy: it cannot run past it).
    A special-token `close` ends the text as a token instead."""
    if close in g.special:
        return g.rule("think_text", f"/(.|\\n)*/ {g.lit(close)}")
    pattern = re.escape(close).replace("/", "\\/")
    return g.rule("think_text", "/(.|\\n)*" + pattern + "/", "[lazy]")


_FAMILIES = {
    "hermes": _hermes,
    "llama3": _llama3,
    "mistral": _mistral,
    "mistral_v11": _mistral_v11,
    "gemma": _gemma,
    "gemma4": _gemma4,
    "qwen_xml": _qwen_xml,
}


def _as_specs(tools: Sequence[dict[str, Any]] | Sequence[FunctionSpec]) -> list[FunctionSpec]:
    if all(isinstance(t, FunctionSpec) for t in tools):
        return list(cast(Sequence[FunctionSpec], tools))
    return function_specs(cast(Sequence[dict[str, Any]], tools))


def tool_call_grammar(
    tools: Sequence[dict[str, Any]] | Sequence[FunctionSpec],
    choice: Any,
    family: str | ToolParserFactory,
    parallel: bool = True,
    *,
    special_tokens: Mapping[str, int] | None = None,
    reasoning: ReasoningPrefix = None,
    reasoning_markers: tuple[str, str] = THINK_TAGS,
) -> str | None:
    """The llguidance Lark grammar for `choice`, or None when nothing is forced (``auto``,
    ``none``).

    ``required``: one call (or, with `parallel`, one or more) to any of `tools`; a named
    function: exactly one call to it. Nothing but the calls may be written; after them only
    the end of the turn. `reasoning`: ``optional`` lets a thinking model write its
    ``<think>...</think>`` block first; ``open`` is for a prompt that already opened it (the
    output must close it first); `reasoning_markers` are the family's (open, close) tags. Raises :class:`~.specs.ToolSpecError` for an unusable
    `tools`/`choice`; a schema llguidance cannot compile shows in :func:`grammar_error`."""
    specs = _as_specs(tools)
    resolved = choice if isinstance(choice, ToolChoice) else resolve_tool_choice(choice, specs)
    if not resolved.forces_call:
        return None
    if resolved.function is not None:
        specs = [s for s in specs if s.name == resolved.function]
        parallel = False
    fam = family.family if isinstance(family, ToolParserFactory) else family
    g = _Lark(special_tokens or {})
    one, sep = _FAMILIES[fam](g, specs, parallel)
    if parallel and sep is not None:
        calls = f"{one}+" if not sep else f"{one} ({sep} {one})*"
    else:
        calls = one
    if reasoning is not None:
        think = _think_rest(g, reasoning_markers[1])
        if reasoning == "optional":
            start = f"({g.lit(reasoning_markers[0])} {think} /[ \\n]*/)? {calls}"
        else:
            start = f"{think} /[ \\n]*/ {calls}"
    else:
        start = calls
    return _grammar(start, g)


def _grammar(start: str, g: _Lark) -> str:
    return "\n".join(["%llguidance {}", f"start: {start}", *g.rules]) + "\n"


def lazy_tool_call_grammar(
    tools: Sequence[dict[str, Any]] | Sequence[FunctionSpec],
    family: str | ToolParserFactory,
    parallel: bool = True,
    *,
    special_tokens: Mapping[str, int] | None = None,
    reasoning: ReasoningPrefix = None,
    reasoning_markers: tuple[str, str] = THINK_TAGS,
) -> str:
    """The grammar of ``tool_choice`` ``auto`` (llama.cpp's "lazy grammar"): free text until
    the family's opening marker, then only a call to one of `tools` with arguments valid for
    its schema, spaced as :func:`tool_call_grammar` spaces it, then free text again (with
    `parallel`, more calls too; without, the turn ends after the call). llguidance computes
    the free text's masks from a cached lexer state (microseconds a step, see
    tests/unit/test_lazy_tool_grammar.py).

    The trigger is a lazy lexeme (``/(.|\\n)*<tool_call>/``, ending at the marker's first
    occurrence) where the marker is text, or the marker's token where it is a special token
    (free text cannot contain special tokens). Llama 3's markup has no marker: an output
    that starts with ``{`` (or ``<|python_tag|>``) is calls, anything else is free text.
    `reasoning` as in :func:`tool_call_grammar`: ``optional`` lets a thinking block come
    first, inside which a marker is only text; ``open`` requires the opened block's close.
    A marker written as text inside free text (code that quotes ``<tool_call>``) starts a
    call all the same: that is the cost of a trigger."""
    specs = _as_specs(tools)
    fam = family.family if isinstance(family, ToolParserFactory) else family
    special = special_tokens or {}
    open_tag, close_tag = reasoning_markers
    text_block = reasoning == "optional" and not any(m in open_tag for m in special)
    g = _Lark(special, lazy=True, not_after=_regex(open_tag) if text_block else "")
    g.rule("TEXT", "/(.|\\n)*/")
    prefix = ""
    if reasoning == "open":
        prefix = _think_rest(g, close_tag) + " "
    elif reasoning == "optional" and text_block and close_tag not in special:
        think = g.rule("think_block", f"/{_regex(open_tag)}(.|\\n)*{_regex(close_tag)}/", "[lazy]")
        prefix = f"{think}? "
    elif reasoning == "optional":
        prefix = f"({g.lit(open_tag)} {_think_rest(g, close_tag)})? "
    one, sep = _FAMILIES[fam](g, specs, parallel)
    if fam == "llama3":
        calls = f"{one} ({sep} {one})*" if parallel else one
        tag = "<|python_tag|>"
        plain = "/[ \\t\\r\\n]*/ | /[ \\t\\r\\n]*[^{ \\t\\r\\n](.|\\n)*/"
        if tag not in special:
            plain = f"({plain}) & ~/[ \\t\\r\\n]*{_regex(tag)}(.|\\n)*/"
        g.rule("PLAIN", plain)
        g.rule("LEAD", "/[ \\t\\r\\n]*/")
        return _grammar(f"{prefix}(PLAIN | LEAD {g.lit(tag)}? {calls})", g)
    free = f"{one}* TEXT" if parallel else f"(TEXT | {one})"
    return _grammar(prefix + free, g)


def grammar_error(grammar: str, tokenizer: Any = None) -> str | None:
    """Why llguidance would refuse `grammar` (e.g. a tool schema using an unsupported
    keyword), or None: lets the daemon answer 400 before the request reaches a worker.
    `tokenizer`: an ``llguidance.LLTokenizer``, needed to check special-token references."""
    from llguidance import LLMatcher

    message = LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(grammar), tokenizer)
    return message or None
