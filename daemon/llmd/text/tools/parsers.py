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
- Unless the call is grammar-constrained (``stream=True``: ``tool_choice`` ``auto`` with the
  lazy grammar, or a forced call; see ``grammar.py``): then whatever follows the opening
  marker is known to be a valid call, so ``ToolCallStart`` goes out as soon as the name is
  known and the arguments stream as they are generated: for JSON markups (Hermes, Llama 3,
  Mistral) the raw text of the arguments object, piece by piece; for Qwen's XML, one
  ``"key": value`` member per finished parameter; Gemma and Gemma 4 calls still go out whole
  at their closing marker. The call's ``arguments`` is the concatenation of its fragments,
  streamed or not. Only a call whose head (marker, name) matched the constrained shape
  streams; anything else falls back to the rule above.
- A streamed call cut before its arguments close (``max_tokens``, a stop string) cannot be
  withdrawn: it stays a call whose ``arguments`` are the partial text (as OpenAI does), and
  :attr:`ToolCallParser.incomplete` is set so the finish reason says ``length`` (or the
  engine's reason), not ``tool_calls`` (:func:`~.calls.tool_finish_reason`).
- A call cut by ``max_tokens`` (``flush(cut=True)``) before it went out is dropped: a piece
  of an opening marker, a block cut before its head is whole (``<tool_call>\n{"name":``),
  and, unconstrained, a block cut anywhere before its closing marker whose text is not a
  whole call. Its markup is never content, and :attr:`incomplete` is set, so complete calls
  before it finish with ``length``, not ``tool_calls``. So: a call whose start was sent
  (streamed, constrained) is kept with partial arguments; any other unfinished call is
  dropped. Only a cut closing marker after a whole call leaves that call complete. Without
  `cut` (the model stopped), an unterminated block is judged as it is, as above.
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

from llmd.text.markers import split_held
from llmd.text.tools.calls import (
    ContentDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
    ToolEvent,
    new_call_id,
)
from llmd.text.tools.pycall import parse_python_calls

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


def leading_calls(text: str, separator: str = ",") -> ParsedCalls | None:
    """The whole call objects at the start of an output cut by the limit: a list (``[``) or
    a run of objects joined by `separator`, read up to the first one that is cut; None when
    there is none (or an item that is whole is no call)."""
    body = text.strip()
    pos = 1 if body.startswith("[") else 0
    decoder = json.JSONDecoder()
    calls: ParsedCalls = []
    while True:
        pos = _skip_ws(body, pos)
        try:
            obj, pos = decoder.raw_decode(body, pos)
        except _UNDECODABLE:
            return calls or None
        call = call_from_json(obj)
        if call is None:
            return None
        calls.append(call)
        pos = _skip_ws(body, pos)
        if not body.startswith(separator, pos):
            return calls
        pos += len(separator)


_JSON_STRING = r'"((?:[^"\\]|\\.)*)"'
_NAME_THEN_ARGS = (
    r'\{\s*"name"\s*:\s*' + _JSON_STRING + r'\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)'
)
# Where a constrained call's arguments object begins, per markup: (the first call of a
# block, a further call in the same block). Group 1 is the name.
_HERMES_HEADS = (re.compile(r"\s*" + _NAME_THEN_ARGS), None)
_MISTRAL_HEADS = (
    re.compile(r"\s*\[\s*" + _NAME_THEN_ARGS),
    re.compile(r"\s*\}\s*,\s*" + _NAME_THEN_ARGS),
)
_MISTRAL_V11_HEAD = re.compile(
    r"\s*([A-Za-z0-9_.:\-]+)\s*(?:\[CALL_ID\]\s*\S*?\s*)?\[ARGS\]\s*(?=\{)"
)
_LLAMA3_HEADS = (
    re.compile(r"\s*(?:<\|python_tag\|>)?\s*" + _NAME_THEN_ARGS),
    re.compile(r"\s*\}\s*;\s*" + _NAME_THEN_ARGS),
)


class _ObjectEnd:
    """Where a JSON object that arrives in pieces ends: brackets counted outside strings."""

    def __init__(self) -> None:
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def scan(self, text: str) -> int | None:
        """The index just past the object's closing brace in `text`, or None when all of
        `text` is still inside the object."""
        for i, ch in enumerate(text):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return None


class ToolCallParser:
    """Shared machinery: content whitespace around calls, validation, ids, call indices.
    Subclasses implement :meth:`_feed` and :meth:`_flush` with :meth:`_content` and
    :meth:`_block` (a whole call block) or :meth:`_start_call`, :meth:`_arguments` and
    :meth:`_end_call` (a call streamed while it is generated, when `stream`)."""

    def __init__(
        self,
        function_names: Iterable[str] | None = None,
        *,
        parallel: bool = True,
        stream: bool = False,
    ):
        self._names = None if function_names is None else frozenset(function_names)
        self._max_calls = None if parallel else 1
        self._stream = stream
        self._events: list[ToolEvent] = []
        self._calls: list[ToolCall] = []
        self._open: tuple[int, str, str, list[str]] | None = None  # a streaming call
        self._phase: str | None = None  # of a streaming call: head | args | tail (| params)
        self._scanner = _ObjectEnd()
        self._incomplete = False
        self._cut = False  # set by flush: the output was cut by max_tokens
        self._ws = ""  # trailing whitespace of the content: dropped at the end if calls came
        self._text_started = False  # non-whitespace content was sent
        self._flushed = False

    @property
    def calls(self) -> list[ToolCall]:
        """The valid calls produced so far (for ``message.tool_calls`` and the finish reason)."""
        return list(self._calls)

    @property
    def incomplete(self) -> bool:
        """A streamed call was cut before its arguments were complete (see the module doc)."""
        return self._incomplete

    def feed(self, delta: str) -> list[ToolEvent]:
        if delta:
            self._feed(delta)
        return self._take()

    def flush(self, *, cut: bool = False) -> list[ToolEvent]:
        """End of output: held text is released, an unterminated call is judged as it is.
        `cut`: the output ended at ``max_tokens`` (the engine's ``length``), so markup left
        open at the end is an unfinished call, not text (see the module doc)."""
        if not self._flushed:
            self._flushed = True
            self._cut = cut
            self._flush()
            if self._open is not None:  # cut mid-arguments: streamed, so it stays a call
                self._incomplete = True
                self._end_call()
            if not self._calls and self._ws:
                self._events.append(ContentDelta(self._ws))
            self._ws = ""
        return self._take()

    def parse(self, text: str, *, cut: bool = False) -> tuple[str | None, list[ToolCall]]:
        """A whole output as (content or None when there is none, calls); `cut` as for
        :meth:`flush`."""
        events = self.feed(text) + self.flush(cut=cut)
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

    def _unfinished(self) -> None:
        """The output was cut inside a call's markup before the call was whole and before it
        went out (or a held piece of an opening marker): the unfinished call is dropped,
        neither content nor call, and the finish reason says ``length``."""
        self._incomplete = True

    def _can_stream(self) -> bool:
        """Whether a call starting now may stream (constrained, and not beyond the limit)."""
        return self._stream and (self._max_calls is None or len(self._calls) < self._max_calls)

    def _start_call(self, name: str) -> bool:
        """A constrained call's name is known: announce it. False (nothing sent) when it is
        not a function on offer, or no more calls are wanted."""
        if not self._can_stream() or (self._names is not None and name not in self._names):
            return False
        if not self._text_started:
            self._ws = ""
        call_id = new_call_id()
        index = len(self._calls)
        self._open = (index, call_id, name, [])
        self._events.append(ToolCallStart(index, call_id, name))
        return True

    def _arguments(self, fragment: str) -> None:
        if fragment and self._open is not None:
            self._open[3].append(fragment)
            self._events.append(ToolCallArguments(self._open[0], fragment))

    def _end_call(self) -> None:
        if self._open is not None:
            _, call_id, name, fragments = self._open
            self._open = None
            self._calls.append(ToolCall(name, "".join(fragments), call_id))

    def _stream_json(self, buf: str, head: re.Match[str] | None) -> str | None:
        """Streams a constrained JSON call whose head matched in `buf` (None: the call's
        arguments are under way): returns what is left of `buf` once the arguments object
        closed (the state is then "tail"), or "" with the state still "args"; None when
        the head's call is not one to stream (not offered, or beyond the limit)."""
        if head is not None:
            try:
                name = json.loads(f'"{head.group(1)}"')  # a JSON string's content, or a bare name
            except ValueError:
                name = None
            if not isinstance(name, str) or not self._start_call(name):
                if self._phase == "head":
                    self._phase = None  # judged whole at its end; a later one is dropped
                return None
            buf = buf[head.end() :]
            self._scanner = _ObjectEnd()
            self._phase = "args"
        end = self._scanner.scan(buf)
        if end is None:
            self._arguments(buf)
            return ""
        self._arguments(buf[:end])
        self._end_call()
        self._phase = "tail"
        return buf[end:]

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
    ``CLOSE = None``: a call runs to the next opening marker or the end of the output.
    ``HEADS``: for markups that can stream a constrained call, the regexes of where its
    arguments begin (first in a block, further in the same block)."""

    OPEN: str = ""
    CLOSE: str | None = None
    HEADS: tuple[re.Pattern[str] | None, re.Pattern[str] | None] = (None, None)

    def __init__(
        self,
        function_names: Iterable[str] | None = None,
        *,
        parallel: bool = True,
        stream: bool = False,
    ):
        super().__init__(function_names, parallel=parallel, stream=stream)
        self._buf = ""
        self._inside = False
        self._scanned = 0  # how much of an open block's buffer has been searched already

    def _parse_body(self, body: str) -> ParsedCalls | None:
        raise NotImplementedError

    def _streams(self) -> bool:
        return self.HEADS[0] is not None

    def _stream_step(self) -> bool:
        """Advances a streamed block in ``_buf``; True while it needs more text, False when
        the closing marker decides the rest (its calls are done, or it does not stream)."""
        while self._phase is not None:
            if self._phase == "args":
                self._buf = self._stream_json(self._buf, None) or ""
                self._scanned = 0
                if self._phase == "args":
                    return True
                continue
            first, more = self.HEADS
            pattern = first if self._phase == "head" else more
            head = pattern.match(self._buf) if pattern is not None else None
            if head is None:
                if self._phase == "head" and (self.CLOSE or self.OPEN) not in self._buf:
                    return True  # the head may still come
                if self._phase == "head":
                    self._phase = None
                return False
            if not self._advance(head):
                return False
        return False

    def _advance(self, head: re.Match[str]) -> bool:
        """Starts streaming the call whose head matched; False when it is not one to."""
        rest = self._stream_json(self._buf, head)
        if rest is None:
            return False
        self._buf, self._scanned = rest, 0
        return True

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
                self._phase = "head" if self._streams() and self._can_stream() else None
            else:
                if self._phase is not None and self._stream_step():
                    return
                end_marker = self.CLOSE or self.OPEN
                end = self._buf.find(end_marker, self._scanned)
                if end < 0:
                    self._scanned = max(0, len(self._buf) - len(end_marker) + 1)
                    return
                body = self._buf[:end]
                streamed, self._phase = self._phase == "tail", None  # its call went out
                if self.CLOSE is None:  # the next call's marker: it stays for the next round
                    self._buf = self._buf[end:]
                    self._inside = False
                    if not streamed:
                        self._block(self.OPEN + body, self._parse_body(body))
                else:
                    self._buf = self._buf[end + len(self.CLOSE) :]
                    self._inside = False
                    if not streamed:
                        self._block(self.OPEN + body + self.CLOSE, self._parse_body(body))

    def _flush(self) -> None:
        held, self._buf = self._buf, ""
        phase, self._phase = self._phase, None
        if phase == "args":
            self._arguments(held)  # cut mid-arguments: the call ends incomplete
        elif phase in ("tail", "params"):
            self._flush_streamed(held)
        elif self._inside and self._cut:
            # A marker cut after a whole call: its closing one, or the next call's opening.
            held, marker = split_held(held, self.CLOSE or self.OPEN)
            parsed = self._parse_body(held) if self._whole_at_cut(held) else None
            if parsed is not None and self._valid(parsed):
                self._block(self.OPEN + held, parsed)
                if marker and self.CLOSE is None:
                    self._unfinished()  # the next call had begun
            else:
                self._unfinished()
                leading = self._parse_cut(held)
                if leading is not None and self._valid(leading):
                    self._block(self.OPEN + held, leading)  # the calls whole before the cut
        elif self._inside:
            self._block(self.OPEN + held, self._parse_body(held))
        elif held and self._cut and self.OPEN.startswith(held):
            self._unfinished()  # a call's opening marker, cut
        elif held:
            self._content(held)
        self._inside = False

    def _flush_streamed(self, held: str) -> None:
        """The end of the output inside a streamed block whose arguments are not open."""

    def _parse_cut(self, body: str) -> ParsedCalls | None:
        """The calls that are whole in a block the limit cut (a JSON list's first items)."""
        return None

    def _whole_at_cut(self, body: str) -> bool:
        """Whether a block the limit cut may hold whole calls (a lenient `_parse_body` may
        read a cut call as whole; the markup says it is not)."""
        return True


class HermesParser(_DelimitedParser):
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per call
    (Hermes 2 Pro, Qwen2.5, Qwen3, and llmd's fallback prompt); a JSON list inside one block
    (SmolLM2's training format) is several calls. An unterminated block at the end of the
    output still counts if its JSON is complete (models often stop right after the ``}``)."""

    OPEN, CLOSE = HERMES_OPEN, HERMES_CLOSE
    HEADS = _HERMES_HEADS

    def _parse_body(self, body: str) -> ParsedCalls | None:
        return calls_from_json_text(body.strip())

    def _parse_cut(self, body: str) -> ParsedCalls | None:
        return leading_calls(body) if body.lstrip().startswith("[") else None


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
    HEADS = _MISTRAL_HEADS

    def _stream_step(self) -> bool:
        if self._phase == "head" and self._buf.strip() and not self._buf.lstrip()[0] == "[":
            head = _MISTRAL_V11_HEAD.match(self._buf)  # v11's name[ARGS]{...}
            if head is None:
                if self.OPEN in self._buf:
                    self._phase = None
                    return False
                return True
            if not self._advance(head):
                return False
        return super()._stream_step()

    def _flush_streamed(self, held: str) -> None:
        rest = held.strip()
        if self._cut and ("," in rest or (rest and self.OPEN.startswith(rest))):
            self._unfinished()  # the next call in the list (or its marker) had begun

    def _parse_cut(self, body: str) -> ParsedCalls | None:
        return leading_calls(body) if body.lstrip().startswith("[") else None

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
    call, the whole output is content. Constrained (`stream`), each call streams instead."""

    def __init__(
        self,
        function_names: Iterable[str] | None = None,
        *,
        parallel: bool = True,
        stream: bool = False,
    ):
        super().__init__(function_names, parallel=parallel, stream=stream)
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
                self._phase = "head" if self._can_stream() else None
            elif head and not LLAMA3_PYTHON_TAG.startswith(head):
                self._release()
                return
        if self._mode == "call" and self._phase is not None:
            self._stream_calls()
        elif self._mode == "call" and "}" in delta and self._first_object_is_not_a_call():
            self._release()

    def _stream_calls(self) -> None:
        while self._phase is not None:
            if self._phase == "args":
                self._buf = self._stream_json(self._buf, None) or ""
                if self._phase == "args":
                    return
                continue
            head = _LLAMA3_HEADS[0 if self._phase == "head" else 1].match(self._buf)
            if head is None:
                if self._phase == "head" and self._first_object_is_not_a_call():
                    self._phase = None
                    self._release()
                return
            rest = self._stream_json(self._buf, head)
            if rest is None:
                return  # not offered: held and judged whole (a first call) or dropped
            self._buf = rest

    def _flush(self) -> None:
        phase, self._phase = self._phase, None
        if phase == "args":
            self._arguments(self._buf)  # cut mid-arguments: the call ends incomplete
        elif phase == "tail":
            if self._cut and ";" in self._buf:
                self._unfinished()  # the next call had begun
        elif self._mode == "call" and self._cut and self._looks_like_calls(self._buf):
            parsed = self._parse_all(self._buf)
            if parsed is not None and self._valid(parsed):
                self._block(self._buf, parsed)
            else:
                self._unfinished()
                leading = leading_calls(self._body(self._buf), ";")
                if leading is not None and self._valid(leading):
                    self._block(self._buf, leading)  # the calls whole before the cut
        elif self._mode == "call":
            self._block(self._buf, self._parse_all(self._buf))
        elif self._buf and self._cut and LLAMA3_PYTHON_TAG.startswith(self._buf.lstrip()):
            self._unfinished()  # `<|python_tag|>`, cut
        elif self._buf:
            self._content(self._buf)
        self._buf = ""

    def _looks_like_calls(self, text: str) -> bool:
        """Held output cut by the limit that is call markup as far as it goes: after
        ``<|python_tag|>``, or ``{"name"`` (or a start of it); other JSON is content."""
        if text.lstrip().startswith(LLAMA3_PYTHON_TAG):
            return True
        body = self._body(text).lstrip()
        if not body.startswith("{"):
            return False
        rest = body[1:].lstrip()
        return rest.startswith('"name"') or '"name"'.startswith(rest)

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
