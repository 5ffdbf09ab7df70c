"""Issue 30: a call cut by ``max_tokens`` is never content text, and the finish reason says
the limit cut the answer, at every cut point, streamed or not, in every protocol.

Two calls, the second cut anywhere: the first call stays whole; the unfinished one is either
kept with partial arguments (its start was streamed: a constrained call) or dropped, never
content; the finish reason is ``length`` unless the second call is whole too (only its
closing marker cut). The Anthropic, Responses and Ollama mappings follow."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmd.api.anthropic_messages import BlockAssembler, stop_reason
from llmd.api.ollama_api import ToolCallBuffer, done_reason
from llmd.api.responses_api import status_of
from llmd.text.chat_output import ChatOutputPlan
from llmd.text.tools import ToolParserFactory

NAMES = ("get_weather", "now")
SCHEMAS = {
    "get_weather": {"type": "object", "properties": {"city": {"type": "string"}}},
    "now": {"type": "object", "properties": {}},
}
FIRST_ARGS = {"city": "Paris"}
SECOND_ARGS = {"city": "Lyon"}
# (text before the second call, the second call); the prose is the answer's content.
CASES = {
    "hermes": (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call>\n",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>',
    ),
    "hermes_list": (  # SmolLM2's own format: a list in one block
        '<tool_call>\n[{"name": "get_weather", "arguments": {"city": "Paris"}}, ',
        '{"name": "get_weather", "arguments": {"city": "Lyon"}}]\n</tool_call>',
    ),
    "qwen_xml": (
        "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n</function>\n</tool_call>\n",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n"
        "</function>\n</tool_call>",
    ),
    "llama3": (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; ',
        '{"name": "get_weather", "parameters": {"city": "Lyon"}}',
    ),
    "mistral": (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, ',
        '{"name": "get_weather", "arguments": {"city": "Lyon"}}]',
    ),
    "mistral_v11": (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}',
    ),
}
CONTENT = {"hermes": "Let me look.", "qwen_xml": "Let me look."}
FAMILY = {"hermes_list": "hermes"}


def _plan(case: str, stream_arguments: bool) -> ChatOutputPlan:
    return ChatOutputPlan(
        tools=ToolParserFactory(FAMILY.get(case, case)),
        function_names=NAMES,
        schemas=SCHEMAS,
        stream_arguments=stream_arguments,
    )


def _streamed(plan: ChatOutputPlan, text: str, reason: str) -> tuple[list[dict[str, Any]], str]:
    stream = plan.stream()
    deltas = [d for ch in text for d in stream.feed(ch)]
    tail, finish = stream.finish(reason)
    return deltas + tail, finish


def _calls_of(deltas: list[dict[str, Any]]) -> list[tuple[str, str]]:
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            entry = calls.setdefault(tc["index"], ["", ""])
            entry[0] = tc["function"].get("name") or entry[0]
            entry[1] += tc["function"].get("arguments") or ""
    return [(calls[i][0], calls[i][1]) for i in sorted(calls)]


@pytest.mark.parametrize("stream_arguments", [True, False], ids=["constrained", "free"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_second_call_cut_anywhere_is_never_content(case: str, stream_arguments: bool) -> None:
    before, second = CASES[case]
    plan = _plan(case, stream_arguments)
    for cut in range(len(second) + 1):
        text = before + second[:cut]
        message, reason = plan.whole(text, "length")
        deltas, streamed_reason = _streamed(plan, text, "length")
        where = f"{case} cut at {second[:cut]!r}"
        # Never the unfinished markup as content, streamed or not.
        assert message["content"] == CONTENT.get(case), where
        streamed_text = "".join(d.get("content") or "" for d in deltas) or None
        assert streamed_text == CONTENT.get(case), where
        # Streamed and whole agree on the calls and the finish reason.
        calls = [
            (c["function"]["name"], c["function"]["arguments"])
            for c in message.get("tool_calls", [])
        ]
        assert _calls_of(deltas) == calls, where
        assert streamed_reason == reason, where
        # The first call is whole; a second one is whole, or partial and streamed.
        assert calls and (calls[0][0], json.loads(calls[0][1])) == ("get_weather", FIRST_ARGS)
        assert len(calls) <= 2, where
        whole_second = len(calls) == 2 and _decodes(calls[1][1]) == SECOND_ARGS
        if reason == "tool_calls":
            assert whole_second or cut == 0, where  # only the closing marker was cut
        else:
            assert reason == "length", where
            if len(calls) == 2 and not whole_second:
                assert stream_arguments, where  # partial arguments only once streamed
    # Not cut at all: two whole calls.
    message, reason = plan.whole(before + second, "stop")
    assert reason == "tool_calls" and len(message["tool_calls"]) == 2


def _decodes(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


@pytest.mark.parametrize("stream_arguments", [True, False], ids=["constrained", "free"])
def test_the_issue_30_cut_right_after_the_name_key(stream_arguments: bool) -> None:
    """The reported answer: a whole call, then `<tool_call>\\n{"name":` at the limit."""
    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name":'
    )
    plan = _plan("hermes", stream_arguments)
    message, reason = plan.whole(text, "length")
    assert message["content"] is None and reason == "length"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    deltas, streamed_reason = _streamed(plan, text, "length")
    assert not any(d.get("content") for d in deltas) and streamed_reason == "length"
    # Anthropic: a tool_use block and no text block; stop_reason max_tokens.
    blocks = BlockAssembler()
    for d in deltas:
        blocks.feed(d)
    blocks.close()
    assert [b["type"] for b in blocks.content] == ["tool_use"]
    assert blocks.content[0]["input"] == FIRST_ARGS
    assert stop_reason(streamed_reason, None) == ("max_tokens", None)
    # Responses: incomplete, for max_output_tokens; no output_text item.
    from llmd.api.responses_api import output_items

    items = output_items(message, reason)
    assert [i["type"] for i in items] == ["function_call"]
    assert status_of(reason) == ("incomplete", {"reason": "max_output_tokens"})
    # Ollama: the call, and done_reason length.
    buffer = ToolCallBuffer()
    for d in deltas:
        buffer.feed(d.get("tool_calls") or [])
    [call] = buffer.flush()
    assert call["function"]["arguments"] == FIRST_ARGS
    assert done_reason(streamed_reason) == "length"


def test_a_stop_keeps_the_rule_that_a_malformed_block_is_text() -> None:
    """Not cut by the limit (the model stopped): an unterminated, unparsable block is the
    model's text, as before."""
    text = 'Here: <tool_call>\n{"name": "get_weather", "argu'
    message, reason = _plan("hermes", False).whole(text, "stop")
    assert message["content"] == text and reason == "stop"


def test_a_cut_opening_marker_alone_is_dropped_and_says_length() -> None:
    plan = _plan("hermes", True)
    message, reason = plan.whole("<tool_c", "length")
    assert message["content"] is None and "tool_calls" not in message and reason == "length"
    # Text cut by the limit is still text.
    message, reason = plan.whole("The weather is", "length")
    assert message["content"] == "The weather is" and reason == "length"


def test_responses_marks_the_cut_call_incomplete_streamed_or_not() -> None:
    from llmd.api.responses_api import output_items
    from tests.unit.test_responses_mapping import _run

    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    plan = _plan("hermes", True)
    message, reason = plan.whole(text, "length")
    [item] = output_items(message, reason)
    assert (item["type"], item["status"], item["arguments"]) == (
        "function_call",
        "incomplete",
        '{"city": "Pa',
    )
    deltas, streamed_reason = _streamed(plan, text, "length")
    out, _ = _run(deltas, streamed_reason)
    done = [e["item"] for e in out if e["type"] == "response.output_item.done"]
    assert [(i["type"], i["status"]) for i in done] == [("function_call", "incomplete")]
    assert out[-1]["type"] == "response.incomplete"
