"""Streaming tool-call parsers, one per markup family, all with the same contract.

Feed text deltas (split anywhere, even inside a marker); get :class:`~.calls.ContentDelta`
for ordinary text and ``ToolCallStart`` + ``ToolCallArguments`` for each valid call;
:meth:`ToolCallParser.flush` once at the end. :meth:`ToolCallParser.parse` runs the same
machine over one string, so a streamed response always equals the non-streamed one.

Contract, as the seeds handle it (a model's mistake is text, never a 500):

- Markup whose JSON (or Python) is malformed, or that calls a function not in ``tools``, is
  not a call: its text, markers included, becomes content. A block is judged as a whole.
- A call's text is held until its closing marker (or the end of the output), because only
  then can it be validated; its arguments are then sent as one fragment. Arguments therefore
  stream at call granularity: a client sees each call complete, never a call that is later
  withdrawn.
- Ordinary text streams as it arrives; only a tail that could be the start of an opening
  marker waits for the next delta.
- Content is the output with the call blocks taken out. Whitespace at its edges next to a
  call (before the first call, between calls, after the last) is markup and is dropped;
  whitespace between two pieces of text stays. When no call is produced the content is the
  output, byte for byte.
- ``parallel=False`` keeps the first call; later ones are dropped (the client asked for at
  most one, and their markup is not answer text either).

Arguments are checked to be a JSON object, not against the tool's schema: with
``tool_choice`` ``required`` or a named function the grammar (``grammar.py``) enforces the
schema during decoding.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from ..markers import split_held
from .calls import ContentDelta, ToolCall, ToolCallArguments, ToolCallStart, ToolEvent
from .pycall import parse_python_calls

ParsedCalls = list[tuple[str, dict[str, Any]]]
# Malformed JSON, or JSON nested deeper than the decoder recurses: text either way.
_UNDECODABLE = (ValueError, RecursionError)

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
LLAMA3_PYTHON_TAG = "<|python_tag|>"
MISTRAL_TOOL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
GEMMA_OPEN, GEMMA_CLOSE = "```tool_code", "```"
GEMMA4_OPEN, GEMMA4_CLOSE, GEMMA4_QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'


def call_from_json(obj: Any) -> tuple[str, dict[str, Any]] | None:
    """``{"name": ..., "arguments": {...}}`` (Hermes, Mistral) or ``"parameters"`` (Llama 3,
    Gemma's JSON form). Arguments given as a JSON string holding an object are accepted (some
    models double-encode); a function without arguments may leave them out."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except _UNDECODABLE:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], args


def calls_from_json_text(text: str) -> ParsedCalls | None:
    """One call object, or a non-empty list of them (SmolLM2 writes ``<tool_call>[...]``)."""
    try:
        value = json.loads(text)
    except _UNDECODABLE:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [call_from_json(item) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


class ToolCallParser:
    """Shared machinery: content whitespace around calls, validation, ids, call indices.
    Subclasses implement :meth:`_feed` and :meth:`_flush` with :meth:`_content` and
    :meth:`_block`."""

    def __init__(self, function_names: Iterable[str] | None = None, *, parallel: bool = True):
        self._names = None if function_names is None else frozenset(function_names)
        self._max_calls = None if parallel else 1
        self._events: list[ToolEvent] = []
        self._calls: list[ToolCall] = []
        self._ws = ""  # trailing whitespace of the content: dropped at the end if calls came
        self._text_started = False  # non-whitespace content was sent
        self._flushed = False

    @property
    def calls(self) -> list[ToolCall]:
        """The valid calls produced so far (for ``message.tool_calls`` and the finish reason)."""
        return list(self._calls)

    def feed(self, delta: str) -> list[ToolEvent]:
        if delta:
            self._feed(delta)
        return self._take()

    def flush(self) -> list[ToolEvent]:
        """End of output: held text is released, an unterminated call is judged as it is."""
        if not self._flushed:
            self._flushed = True
            self._flush()
            if not self._calls and self._ws:
                self._events.append(ContentDelta(self._ws))
            self._ws = ""
        return self._take()

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A whole output as (content or None when there is none, calls)."""
        events = self.feed(text) + self.flush()
        content = "".join(e.text for e in events if isinstance(e, ContentDelta))
        return (content or None), self.calls

    # -- for subclasses ------------------------------------------------------------------

    def _feed(self, delta: str) -> None:
        raise NotImplementedError

    def _flush(self) -> None:
        raise NotImplementedError

    def _content(self, text: str) -> None:
        if self._calls and not self._text_started:
            text = text.lstrip()  # whitespace between calls, or between a call and the text
            if not text:
                return
        text = self._ws + text
        body = text.rstrip()
        self._ws = text[len(body) :]
        if body:
            self._text_started = True
            self._events.append(ContentDelta(body))

    def _block(self, raw: str, parsed: ParsedCalls | None) -> None:
        """One call block: valid calls are emitted, anything else is content (`raw`)."""
        if parsed is None or not self._valid(parsed):
            self._content(raw)
            return
        if not self._text_started:
            self._ws = ""
        for name, args in parsed:
            if self._max_calls is not None and len(self._calls) >= self._max_calls:
                return
            call = ToolCall(name, json.dumps(args, ensure_ascii=False))
            index = len(self._calls)
            self._calls.append(call)
            self._events.append(ToolCallStart(index, call.id, call.name))
            self._events.append(ToolCallArguments(index, call.arguments))

    def _valid(self, parsed: ParsedCalls) -> bool:
        for name, args in parsed:
            if self._names is not None and name not in self._names:
                return False
            try:
                json.dumps(args, allow_nan=False)  # Infinity/NaN are not JSON
            except ValueError:
                return False
        return True

    def _take(self) -> list[ToolEvent]:
        events, self._events = self._events, []
        return events


class _DelimitedParser(ToolCallParser):
    """Calls between an opening and a closing marker, anywhere in the output, any number.
    ``CLOSE = None``: a call runs to the next opening marker or the end of the output."""

    OPEN: str = ""
    CLOSE: str | None = None

    def __init__(self, function_names: Iterable[str] | None = None, *, parallel: bool = True):
        super().__init__(function_names, parallel=parallel)
        self._buf = ""
        self._inside = False
        self._scanned = 0  # how much of an open block's buffer has been searched already

    def _parse_body(self, body: str) -> ParsedCalls | None:
        raise NotImplementedError

    def _feed(self, delta: str) -> None:
        self._buf += delta
        while True:
            if not self._inside:
                start = self._buf.find(self.OPEN)
                if start < 0:
                    ready, self._buf = split_held(self._buf, self.OPEN)
                    if ready:
                        self._content(ready)
                    return
                if start:
                    self._content(self._buf[:start])
                self._buf = self._buf[start + len(self.OPEN) :]
                self._inside, self._scanned = True, 0
            else:
                end_marker = self.CLOSE or self.OPEN
                end = self._buf.find(end_marker, self._scanned)
                if end < 0:
                    self._scanned = max(0, len(self._buf) - len(end_marker) + 1)
                    return
                body = self._buf[:end]
                if self.CLOSE is None:  # the next call's marker: it stays for the next round
                    self._buf = self._buf[end:]
                    self._inside = False
                    self._block(self.OPEN + body, self._parse_body(body))
                else:
                    self._buf = self._buf[end + len(self.CLOSE) :]
                    self._inside = False
                    self._block(self.OPEN + body + self.CLOSE, self._parse_body(body))

    def _flush(self) -> None:
        held, self._buf = self._buf, ""
        if self._inside:
            self._inside = False
            self._block(self.OPEN + held, self._parse_body(held))
        elif held:
            self._content(held)


class HermesParser(_DelimitedParser):
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per call
    (Hermes 2 Pro, Qwen2.5, Qwen3, and llmd's fallback prompt); a JSON list inside one block
    (SmolLM2's training format) is several calls. An unterminated block at the end of the
    output still counts if its JSON is complete (models often stop right after the ``}``)."""

    OPEN, CLOSE = HERMES_OPEN, HERMES_CLOSE

    def _parse_body(self, body: str) -> ParsedCalls | None:
        return calls_from_json_text(body.strip())


class GemmaParser(_DelimitedParser):
    """Gemma 3 has no tool tokens. llmd follows Google's documented convention (the Gemma
    function-calling guide): calls written as Python in a fenced block,
    ```` ```tool_code\\nget_weather(city="Paris")\\n``` ````, one call per line or a list;
    a JSON call object inside the block is accepted too. Other fenced code is content."""

    OPEN, CLOSE = GEMMA_OPEN, GEMMA_CLOSE

    def _parse_body(self, body: str) -> ParsedCalls | None:
        source = body.strip()
        return parse_python_calls(source) or calls_from_json_text(source)


_GEMMA4_CALL = re.compile(r"\s*call:([A-Za-z0-9_.:\-]+?)\s*(?=\{)")
_GEMMA4_BARE = re.compile(r"[A-Za-z0-9_.$\-]+")
_GEMMA4_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_GEMMA4_MAX_DEPTH = 64


def _after_member(text: str, pos: int, close: str) -> tuple[int, bool]:
    """After an object member or array item: the position past a ',' (False) or past `close`
    (True, the container ends); raises ValueError on anything else."""
    pos = _skip_ws(text, pos)
    if text.startswith(",", pos):
        return pos + 1, False
    if text.startswith(close, pos):
        return pos + 1, True
    raise ValueError(f"expected ',' or '{close}'")


def _gemma4_value(text: str, pos: int, depth: int = 0) -> tuple[Any, int]:
    """One value of Gemma 4's call syntax at `pos`: ``<|"|>string<|"|>``, ``{key:value,...}``
    (keys bare or quoted), ``[value,...]``, a number, true/false/null; JSON strings are taken
    too. Returns (value, end); raises ValueError where the text is no such value."""
    if depth > _GEMMA4_MAX_DEPTH:
        raise ValueError("nested too deeply")
    pos = _skip_ws(text, pos)
    if text.startswith(GEMMA4_QUOTE, pos):
        end = text.find(GEMMA4_QUOTE, pos + len(GEMMA4_QUOTE))
        if end < 0:
            raise ValueError("unterminated string")
        return text[pos + len(GEMMA4_QUOTE) : end], end + len(GEMMA4_QUOTE)
    if text.startswith('"', pos):
        return json.JSONDecoder().raw_decode(text, pos)
    if text.startswith("{", pos):
        obj: dict[str, Any] = {}
        pos = _skip_ws(text, pos + 1)
        if text.startswith("}", pos):
            return obj, pos + 1
        while True:
            pos = _skip_ws(text, pos)
            if text.startswith(GEMMA4_QUOTE, pos) or text.startswith('"', pos):
                key, pos = _gemma4_value(text, pos, depth + 1)
            else:
                m = _GEMMA4_BARE.match(text, pos)
                if m is None:
                    raise ValueError("expected a key")
                key, pos = m.group(0), m.end()
            pos = _skip_ws(text, pos)
            if not text.startswith(":", pos):
                raise ValueError("expected ':'")
            obj[key], pos = _gemma4_value(text, pos + 1, depth + 1)
            pos, closed = _after_member(text, pos, "}")
            if closed:
                return obj, pos
    if text.startswith("[", pos):
        items: list[Any] = []
        pos = _skip_ws(text, pos + 1)
        if text.startswith("]", pos):
            return items, pos + 1
        while True:
            item, pos = _gemma4_value(text, pos, depth + 1)
            items.append(item)
            pos, closed = _after_member(text, pos, "]")
            if closed:
                return items, pos
    for word, value in (("true", True), ("false", False), ("null", None)):
        if text.startswith(word, pos):
            return value, pos + len(word)
    m = _GEMMA4_NUMBER.match(text, pos)
    if m is None:
        raise ValueError("expected a value")
    number = m.group(0)
    return (float(number) if any(c in number for c in ".eE") else int(number)), m.end()


def parse_gemma4_calls(body: str) -> ParsedCalls | None:
    """``call:name{key:value,...}`` (one or more) as Gemma 4 writes inside ``<|tool_call>``."""
    calls: ParsedCalls = []
    pos = 0
    while True:
        pos = _skip_ws(body, pos)
        if pos == len(body):
            return calls or None
        m = _GEMMA4_CALL.match(body, pos)
        if m is None:
            return None
        try:
            args, pos = _gemma4_value(body, m.end())
        except _UNDECODABLE:
            return None
        if not isinstance(args, dict):
            return None
        calls.append((m.group(1), args))


class Gemma4Parser(_DelimitedParser):
    """Gemma 4's own tool tokens: ``<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}
    <tool_call|>`` (strings between ``<|"|>`` quote tokens, bare keys, nested objects and
    arrays, bare numbers and booleans), one block per call, or several ``call:`` in one
    block. The markers and the quote are special tokens: the detokenizer must show them."""

    OPEN, CLOSE = GEMMA4_OPEN, GEMMA4_CLOSE

    def _parse_body(self, body: str) -> ParsedCalls | None:
        return parse_gemma4_calls(body)


_MISTRAL_NAMED = re.compile(
    r"\s*([A-Za-z0-9_.:\-]+)\s*(?:"
    + re.escape(MISTRAL_CALL_ID)
    + r"\s*\S*?\s*)?"
    + re.escape(MISTRAL_ARGS)
    + r"(.*)",
    re.DOTALL,
)


class MistralParser(_DelimitedParser):
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (Mistral 7B v0.3, Nemo,
    Small 3.1) or, with the v11+ tokenizer, ``[TOOL_CALLS]name[ARGS]{...}`` repeated per call
    (optionally ``[CALL_ID]id`` before ``[ARGS]``). There is no closing marker: a call runs to
    the next ``[TOOL_CALLS]`` or to the end of the output, so it is released then.
    ``[TOOL_CALLS]`` is a control token: the detokenizer must show it (``visible_tokens``)."""

    OPEN, CLOSE = MISTRAL_TOOL_CALLS, None

    def _parse_body(self, body: str) -> ParsedCalls | None:
        text = body.strip()
        if text.startswith("["):
            return calls_from_json_text(text)
        match = _MISTRAL_NAMED.fullmatch(text)
        if match is None:
            return None
        try:
            args = json.loads(match.group(2))
        except _UNDECODABLE:
            return None
        return [(match.group(1), args)] if isinstance(args, dict) else None


class Llama3JsonParser(ToolCallParser):
    """Llama 3.1-3.3 JSON tool calling: the whole output is the call,
    ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``, several
    separated by ``;``. An output that starts otherwise is content, streamed as it comes. One
    that starts with ``{`` is held to the end (only then is it known to be calls), unless its
    first object already shows it is not a call. All or nothing: if any part is not a valid
    call, the whole output is content."""

    def __init__(self, function_names: Iterable[str] | None = None, *, parallel: bool = True):
        super().__init__(function_names, parallel=parallel)
        self._buf = ""
        self._mode = "start"  # start | call | content

    def _feed(self, delta: str) -> None:
        if self._mode == "content":
            self._content(delta)
            return
        self._buf += delta
        if self._mode == "start":
            head = self._buf.lstrip()
            if head.startswith(LLAMA3_PYTHON_TAG) or head.startswith("{"):
                self._mode = "call"
            elif head and not LLAMA3_PYTHON_TAG.startswith(head):
                self._release()
                return
        if self._mode == "call" and "}" in delta and self._first_object_is_not_a_call():
            self._release()

    def _flush(self) -> None:
        if self._mode == "call":
            self._block(self._buf, self._parse_all(self._buf))
        elif self._buf:
            self._content(self._buf)
        self._buf = ""

    def _release(self) -> None:
        self._mode = "content"
        text, self._buf = self._buf, ""
        self._content(text)

    @staticmethod
    def _body(text: str) -> str:
        text = text.lstrip()
        return text[len(LLAMA3_PYTHON_TAG) :] if text.startswith(LLAMA3_PYTHON_TAG) else text

    def _first_object_is_not_a_call(self) -> bool:
        body = self._body(self._buf).lstrip()
        try:
            obj, _ = json.JSONDecoder().raw_decode(body)
        except _UNDECODABLE:
            return False  # incomplete so far
        call = call_from_json(obj)
        return call is None or not self._valid([call])

    def _parse_all(self, text: str) -> ParsedCalls | None:
        body, pos, calls = self._body(text), 0, []
        decoder = json.JSONDecoder()
        while True:
            pos = _skip_ws(body, pos)
            try:
                obj, pos = decoder.raw_decode(body, pos)
            except _UNDECODABLE:
                return None
            call = call_from_json(obj)
            if call is None:
                return None
            calls.append(call)
            pos = _skip_ws(body, pos)
            if pos < len(body) and body[pos] == ";":
                pos = _skip_ws(body, pos + 1)
            elif pos < len(body):
                return None
            if pos == len(body):
                return calls


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos
