"""The glue from answer text to OpenAI message fields: reasoning first, then tool calls,
streamed or whole, with the same result either way."""

from __future__ import annotations

import json
from typing import Any

from llmd.text.chat_output import ChatOutputPlan
from llmd.text.tools import plan_tools

HERMES = plan_tools(None, None).parser
ANSWER = (
    "<think>\nThe user wants the weather.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)


def streamed(plan: ChatOutputPlan, text: str, step: int) -> tuple[list[dict[str, Any]], str]:
    s = plan.stream()
    deltas: list[dict[str, Any]] = []
    for i in range(0, len(text), step):
        deltas += s.feed(text[i : i + step])
    tail, reason = s.finish("stop")
    return deltas + tail, reason


def test_reasoning_then_a_tool_call_whole_and_streamed() -> None:
    plan = ChatOutputPlan(split_reasoning=True, tools=HERMES, function_names=("get_weather",))
    message, reason = plan.whole(ANSWER, "stop")
    assert reason == "tool_calls"
    assert message["reasoning_content"] == "The user wants the weather."
    assert not message["content"]
    [call] = message["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    for step in (1, 3, 7, len(ANSWER)):
        deltas, reason = streamed(plan, ANSWER, step)
        reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
        args = "".join(
            tc["function"].get("arguments", "") for d in deltas for tc in d.get("tool_calls", [])
        )
        assert reason == "tool_calls" and reasoning == "The user wants the weather."
        assert json.loads(args) == {"city": "Paris"}
        assert not "".join(d.get("content") or "" for d in deltas)


def test_inline_reasoning_and_no_tools_leave_the_text_alone() -> None:
    plan = ChatOutputPlan(split_reasoning=True, keep_inline=True)
    message, reason = plan.whole("<think>hm</think>Hi", "length")
    assert message["content"] == "<think>hm</think>Hi" and "reasoning_content" not in message
    assert reason == "length"
    plain = ChatOutputPlan()
    assert plain.whole("Hi there", "stop") == (
        {"role": "assistant", "content": "Hi there", "refusal": None},
        "stop",
    )


def test_a_call_to_an_unknown_function_stays_text() -> None:
    plan = ChatOutputPlan(tools=HERMES, function_names=("get_time",))
    message, reason = plan.whole(ANSWER.split("</think>\n\n")[1], "stop")
    assert "tool_calls" not in message and "<tool_call>" in message["content"]
    assert reason == "stop"
