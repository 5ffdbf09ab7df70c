"""Grammar-constrained tool calls stream their arguments while they are generated: several
fragments per call, whose concatenation is the call's ``arguments`` whether streamed or not;
a call cut mid-arguments stays a call and the finish reason says ``length``; and the
Anthropic and Responses adapters relay many fragments."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmd.api.anthropic_messages import BlockAssembler
from llmd.text.chat_output import ChatOutputPlan
from llmd.text.tools import (
    ContentDelta,
    ToolCallArguments,
    ToolCallStart,
    ToolParserFactory,
    openai_delta,
)

NAMES = ["get_weather", "now"]
SCHEMAS = {
    "get_weather": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    },
    "now": {"type": "object", "properties": {}},
}
# Calls as the grammars let a model write them (a brace and a marker inside a string value).
ARGS = '{"city": "Par}is \\"</tool_call>\\"", "days": 2}'
OUTPUTS = {
    "hermes": (
        f'Let me look.\n<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n'
        '</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    ),
    "llama3": (
        f'<|python_tag|>{{"name": "get_weather", "parameters": {ARGS}}}; '
        '{"name": "now", "parameters": {}}'
    ),
    "mistral": (
        f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {ARGS}}}, '
        '{"name": "now", "arguments": {}}]'
    ),
    "mistral_v11": f"[TOOL_CALLS]get_weather[ARGS]{ARGS}[TOOL_CALLS]now[ARGS]{{}}",
    "qwen_xml": (
        "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
        'Par}is "</tool_call>"\n</parameter>\n<parameter=days>\n2\n</parameter>\n'
        "</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>"
    ),
}
CONTENT = {"hermes": "Let me look.", "qwen_xml": "Let me look."}


def _stream(family: str, pieces: list[str], **kwargs: Any) -> tuple[Any, list[Any]]:
    parser = ToolParserFactory(family)(NAMES, schemas=SCHEMAS, **kwargs)
    events: list[Any] = []
    for piece in pieces:
        events += parser.feed(piece)
    return parser, events + parser.flush()


def _fragments(events: list[Any]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, ToolCallArguments):
            out.setdefault(e.index, []).append(e.fragment)
    return out


@pytest.mark.parametrize("family", sorted(OUTPUTS))
def test_arguments_stream_in_fragments_that_make_the_whole(family: str) -> None:
    text = OUTPUTS[family]
    whole, whole_events = _stream(family, [text], stream=True)
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == [
        ("get_weather", {"city": 'Par}is "</tool_call>"', "days": 2}),
        ("now", {}),
    ]
    expected = [(c.name, c.arguments) for c in whole.calls]
    content = "".join(e.text for e in whole_events if isinstance(e, ContentDelta)) or None
    assert content == CONTENT.get(family)
    splits = [list(text)] + [[text[:i], text[i:]] for i in range(0, len(text) + 1, 7)]
    for pieces in splits:
        parser, events = _stream(family, pieces, stream=True)
        assert [(c.name, c.arguments) for c in parser.calls] == expected, pieces
        got = "".join(e.text for e in events if isinstance(e, ContentDelta)) or None
        assert got == content
        fragments = _fragments(events)
        for index, call in enumerate(parser.calls):
            assert "".join(fragments[index]) == call.arguments
        starts = [e for e in events if isinstance(e, ToolCallStart)]
        assert [s.id for s in starts] == [c.id for c in parser.calls]
        assert not parser.incomplete
    parser, events = _stream(family, list(text), stream=True)
    assert len(_fragments(events)[0]) > 1  # while generated, not at the call's end
    # A call's start goes out before its arguments are complete.
    first_args = next(i for i, e in enumerate(events) if isinstance(e, ToolCallArguments))
    assert isinstance(events[first_args - 1], ToolCallStart)


@pytest.mark.parametrize("family", sorted(OUTPUTS))
def test_unconstrained_calls_still_go_out_whole(family: str) -> None:
    plain = OUTPUTS[family].replace('Par}is \\"</tool_call>\\"', "Paris")
    plain = plain.replace('Par}is "</tool_call>"', "Paris")  # a whole-block parser's limits
    parser, events = _stream(family, list(plain))
    assert all(len(v) == 1 for v in _fragments(events).values())
    assert [c.name for c in parser.calls] == ["get_weather", "now"]


def test_a_call_cut_mid_arguments_stays_a_call_and_says_length() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    plan = ChatOutputPlan(
        tools=ToolParserFactory("hermes"), function_names=tuple(NAMES), stream_arguments=True
    )
    message, reason = plan.whole(text, "length")
    assert reason == "length"
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Pa'}
    stream = plan.stream()
    deltas = [d for ch in text for d in stream.feed(ch)]
    tail, streamed_reason = stream.finish("length")
    args = "".join(
        tc["function"]["arguments"] for d in deltas + tail for tc in d.get("tool_calls", [])
    )
    assert args == '{"city": "Pa' and streamed_reason == "length"
    # Complete calls, then the limit: still tool_calls.
    done = 'Sure.\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    assert plan.whole(done, "length")[1] == "tool_calls"
    assert plan.whole(done[:-5], "length")[1] == "tool_calls"  # the closing marker cut


def test_constrained_parsers_keep_the_rules_for_what_is_not_a_constrained_call() -> None:
    # A function not on offer (no grammar would allow it) is judged whole: text.
    text = '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>'
    parser, events = _stream("hermes", list(text), stream=True)
    assert not parser.calls and "".join(e.text for e in events) == text
    # parallel_tool_calls false: the first call streams, later ones are dropped.
    parser, events = _stream("hermes", list(OUTPUTS["hermes"]), stream=True, parallel=False)
    assert [c.name for c in parser.calls] == ["get_weather"]
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == "Let me look."
    # Llama 3: an answer that starts with JSON but is no call is still content.
    parser, events = _stream("llama3", list('{"answer": 42}'), stream=True)
    assert not parser.calls and "".join(e.text for e in events) == '{"answer": 42}'


def _streamed_deltas() -> list[dict[str, Any]]:
    parser, events = _stream("hermes", list(OUTPUTS["hermes"]), stream=True)
    return [openai_delta(e) for e in events]


def test_anthropic_relays_many_fragments_as_input_json_deltas() -> None:
    blocks = BlockAssembler()
    events = [ev for d in _streamed_deltas() for ev in blocks.feed(d)] + blocks.close()
    partial = [
        e[1]["delta"]["partial_json"]
        for e in events
        if e[0] == "content_block_delta" and e[1]["delta"]["type"] == "input_json_delta"
    ]
    assert len(partial) > 2
    uses = [b for b in blocks.content if b["type"] == "tool_use"]
    assert [u["name"] for u in uses] == ["get_weather", "now"]
    assert uses[0]["input"] == {"city": 'Par}is "</tool_call>"', "days": 2}
    # A call cut mid-arguments does not break the message: its input is empty.
    deltas = _streamed_deltas()
    start = next(i for i, d in enumerate(deltas) if d.get("tool_calls"))
    blocks = BlockAssembler()
    for d in deltas[: start + 5]:
        blocks.feed(d)
    blocks.close()
    assert blocks.content[-1]["type"] == "tool_use" and blocks.content[-1]["input"] == {}


def test_responses_relays_many_fragments_as_argument_deltas() -> None:
    from tests.unit.test_responses_mapping import _run

    out, events = _run(_streamed_deltas(), "tool_calls")
    deltas = [e["delta"] for e in out if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) > 2
    done = [e for e in out if e["type"] == "response.function_call_arguments.done"]
    assert [json.loads(e["arguments"]) for e in done] == [
        {"city": 'Par}is "</tool_call>"', "days": 2},
        {},
    ]
