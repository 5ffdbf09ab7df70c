"""Anthropic Messages <-> the internal pipeline: requests become the OpenAI chat request llmd
runs (anthropic_schemas.py), its deltas become Anthropic content blocks and stream events
(anthropic_messages.py). Pure functions, plus the wire over the fake worker for what needs a
server (errors in Anthropic's shape, before and after a stream started)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmd.api.anthropic_messages import BlockAssembler, stop_reason, usage
from llmd.api.anthropic_schemas import anthropic_error, translate_count_tokens, translate_messages
from llmd.api.security import SecurityConfig
from llmd.errors import ApiError
from llmd.text.generation import Finished
from tests.unit.fake_api import MODEL, api

USER = [{"role": "user", "content": "hi"}]
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def translate(**body: Any) -> Any:
    return translate_messages({"model": "m", "max_tokens": 16, "messages": USER, **body})


def rejected(**body: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        translate_messages({"model": "m", "messages": USER, "max_tokens": 16, **body})
    assert info.value.status == 400
    return info.value


# ---------------------------------------------------------------------- requests


def test_sampling_parameters_map_onto_the_pipeline_request() -> None:
    chat = translate(temperature=0.2, top_p=0.9, top_k=40, stop_sequences=["END"], stream=True).chat
    assert (chat.temperature, chat.top_p, chat.top_k) == (0.2, 0.9, 40)
    assert chat.stop_list() == ["END"] and chat.max_tokens == 16 and chat.stream
    default = translate().chat
    assert default.temperature == 1.0 and default.stop_list() == []


def test_conversation_with_tool_turns_becomes_openai_messages() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "use the tool", "signature": "x"},
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    chat = translate(system=[{"type": "text", "text": "Be brief."}], messages=messages).chat
    turns = [m.for_template() for m in chat.messages]
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "tool", "user"]
    assert turns[0]["content"] == "Be brief."
    assert turns[2]["content"] == "Checking."  # the thinking is dropped
    [call] = turns[2]["tool_calls"]
    assert call["id"] == "toolu_1" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert turns[3] == {"role": "tool", "content": "Sunny", "tool_call_id": "toolu_1"}
    assert turns[4]["content"] == "And tomorrow?"


def test_tool_result_blocks_and_errors_reach_the_model() -> None:
    result = {
        "type": "tool_result",
        "tool_use_id": "t",
        "content": [{"type": "text", "text": "city not found"}],
        "is_error": True,
    }
    chat = translate(messages=[{"role": "user", "content": [result]}]).chat
    [tool] = [m.for_template() for m in chat.messages]
    assert tool["role"] == "tool" and tool["content"] == "Error: city not found"


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "none"}, "none", None),
        (
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            {"type": "function", "function": {"name": "get_weather"}},
            False,
        ),
    ],
)
def test_tools_and_tool_choice(choice: dict[str, Any], expected: Any, parallel: Any) -> None:
    chat = translate(tools=[WEATHER], tool_choice=choice).chat
    assert chat.tool_choice == expected and chat.parallel_tool_calls is parallel
    [tool] = chat.tools or []
    assert tool == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": WEATHER["input_schema"],
        },
    }


def test_output_format_and_thinking() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    tr = translate(
        output_config={"format": {"type": "json_schema", "schema": schema}},
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert tr.chat.response_format is not None
    assert tr.chat.response_format.json_schema.schema_ == schema  # type: ignore[union-attr]
    assert tr.thinking == "shown"
    assert translate(thinking={"type": "disabled"}).thinking == "hidden"
    assert translate().thinking == "hidden"
    assert translate(thinking={"type": "adaptive", "display": "omitted"}).thinking == "omitted"


def test_harmless_parameters_are_accepted() -> None:
    block = {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
    translate(
        metadata={"user_id": "u"},
        service_tier="auto",
        cache_control={"type": "ephemeral"},
        container=None,
        mcp_servers=[],
        messages=[{"role": "user", "content": [block]}],
    )


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"max_tokens": None}, "max_tokens", "max_tokens"),
        ({"temperature": 1.5}, "temperature", "less than or equal to 1"),
        ({"stop_sequences": ["x"] * 17}, "stop_sequences", "at most 16"),
        ({"container": "c1"}, "container", "container"),
        ({"mcp_servers": [{"url": "u"}]}, "mcp_servers", "mcp_servers"),
        ({"bogus": 1}, "bogus", "bogus"),
        ({"output_config": {"effort": "extreme"}}, "output_config.effort", "effort"),
        (
            {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
            "context_management.edits.0.type",
            "clear_tool_uses_20250919",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "s"}]}, "tools.0.type", "server"),
        ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens", "1024"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 1024}},
            "",
            "less than max_tokens",
        ),
        ({"tool_choice": {"type": "any"}}, "tool_choice", "needs tools"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages.0.content.0.source",
            "image source of type 'None'",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "document", "source": {"type": "text", "data": "x"}}],
                    }
                ]
            },
            "messages.0.content.0",
            "'document'",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [{"type": "image", "source": {"type": "file"}}],
                            }
                        ],
                    }
                ]
            },
            "messages.0.content.0.content.0.source",
            "image source of type 'file'",
        ),
        (
            {"messages": [*USER, {"role": "assistant", "content": "The answer is"}]},
            "messages.1",
            "prefill",
        ),
    ],
)
def test_what_would_change_the_output_is_refused(
    body: dict[str, Any], param: str, words: str
) -> None:
    if body.get("max_tokens", 0) is None:
        with pytest.raises(ApiError) as info:
            translate_messages({"model": "m", "messages": USER})
        err = info.value
    else:
        err = rejected(**body)
    assert words in err.message
    if param:
        assert err.param == param


def test_what_claude_code_sends_is_accepted_and_means_what_it_says() -> None:
    """Claude Code's first request shape (2.1.x): context_management, effort, adaptive
    thinking with display omitted, metadata, a billing header as the first system block, a
    system message inside `messages` (last, with cache_control), a deferred tool."""
    tr = translate_messages(
        {
            "model": "m",
            "max_tokens": 32000,
            "stream": True,
            "metadata": {"user_id": '{"device_id": "d", "session_id": "s"}'},
            "thinking": {"type": "adaptive", "display": "omitted"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "high"},
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3.4; e=cli;"},
                {
                    "type": "text",
                    "text": "You are an agent.",
                    "cache_control": {"type": "ephemeral"},
                },
            ],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Read notes.txt"}]},
                {
                    "role": "system",
                    "content": [
                        {
                            "type": "text",
                            "text": "# Environment",
                            "cache_control": {"type": "ephemeral"},
                        }
                    ],
                },
            ],
            "tools": [
                WEATHER,
                {**WEATHER, "name": "later", "defer_loading": True},
            ],
        }
    )
    chat = tr.chat
    roles = [(m.role, m.text()) for m in chat.messages]
    assert roles == [
        ("system", "You are an agent."),  # the billing header never reaches the prompt
        ("user", "Read notes.txt"),
        ("system", "# Environment"),
    ]
    assert [t["function"]["name"] for t in chat.tools or []] == ["get_weather"]
    assert chat.reasoning_effort == "high" and chat.reasoning_is_hint
    assert tr.thinking == "omitted"


def test_thinking_switch_follows_thinking_and_effort() -> None:
    assert translate(thinking={"type": "disabled"}).chat.reasoning_effort == "none"
    assert translate(thinking={"type": "adaptive"}).chat.reasoning_effort == "medium"
    assert translate(output_config={"effort": "max"}).chat.reasoning_effort == "high"
    assert translate().chat.reasoning_effort is None


def test_a_deferred_tool_is_shown_once_a_tool_search_referenced_it() -> None:
    messages = [
        {"role": "user", "content": "Find the weather tool"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "ToolSearch", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "tool_reference", "tool_name": "later"}],
                }
            ],
        },
    ]
    search = {**WEATHER, "name": "ToolSearch"}
    chat = translate(
        messages=messages, tools=[search, {**WEATHER, "name": "later", "defer_loading": True}]
    ).chat
    assert [t["function"]["name"] for t in chat.tools or []] == ["ToolSearch", "later"]
    assert chat.messages[2].role == "tool" and chat.messages[2].text() == "Tool loaded: later"


def test_a_prompt_that_does_not_fit_is_worded_as_claude_code_parses_it() -> None:
    from llmd.errors import ContextOverflow

    body = anthropic_error(ContextOverflow(9000, 8192, "messages"))
    assert body["error"]["message"] == "prompt is too long: 9000 tokens > 8191 maximum"
    assert body["error"]["type"] == "invalid_request_error"


def test_count_tokens_needs_no_max_tokens() -> None:
    chat = translate_count_tokens({"model": "m", "messages": USER, "system": "Be brief."})
    assert [m.role for m in chat.messages] == ["system", "user"]


# ---------------------------------------------------------------------- answers


def names(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [f"{n}:{p['delta']['type']}" if n == "content_block_delta" else n for n, p in events]


def test_kinds_of_output_become_consecutive_blocks() -> None:
    blocks = BlockAssembler("shown")
    events = []
    for delta in [
        {"reasoning_content": "Think"},
        {"reasoning_content": "ing."},
        {"content": "\n\n"},  # whitespace between thinking and answer: no block
        {"content": "Sure"},
        {"content": "."},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "f", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
        {
            "tool_calls": [
                {
                    "index": 1,
                    "id": "call_def",
                    "type": "function",
                    "function": {"name": "g", "arguments": "{}"},
                }
            ]
        },
        {"content": "\n"},
    ]:
        events += blocks.feed(delta)
    events += blocks.close()
    assert names(events) == [
        "content_block_start",
        "content_block_delta:thinking_delta",
        "content_block_delta:thinking_delta",
        "content_block_delta:signature_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta:text_delta",
        "content_block_delta:text_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta:input_json_delta",
        "content_block_delta:input_json_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta:input_json_delta",
        "content_block_stop",
    ]
    starts = [p for n, p in events if n == "content_block_start"]
    assert [p["index"] for p in starts] == [0, 1, 2, 3]
    assert starts[2]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_abc",
        "name": "f",
        "input": {},
    }
    assert blocks.content == [
        {"type": "thinking", "thinking": "Thinking.", "signature": ""},
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "toolu_abc", "name": "f", "input": {"a": 1}},
        {"type": "tool_use", "id": "toolu_def", "name": "g", "input": {}},
    ]


def test_thinking_is_shown_only_when_enabled() -> None:
    for display, content in [
        ("hidden", [{"type": "text", "text": "Hi"}]),
        (
            "omitted",
            [{"type": "thinking", "thinking": "", "signature": ""}, {"type": "text", "text": "Hi"}],
        ),
    ]:
        blocks = BlockAssembler(display)  # type: ignore[arg-type]
        events = blocks.feed({"reasoning_content": "hmm"}) + blocks.feed({"content": "Hi"})
        events += blocks.close()
        assert blocks.content == content
        assert "content_block_delta:thinking_delta" not in names(events)


def test_stop_reasons_and_usage() -> None:
    assert stop_reason("stop", None) == ("end_turn", None)
    assert stop_reason("stop", "3") == ("stop_sequence", "3")
    assert stop_reason("length", None) == ("max_tokens", None)
    assert stop_reason("tool_calls", None) == ("tool_use", None)
    counted = usage(Finished("stop", prompt_tokens=100, completion_tokens=7, cached_tokens=64), 0)
    assert counted == {
        "input_tokens": 36,
        "output_tokens": 7,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 64,
    }


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (405, "invalid_request_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "overloaded_error"),
    ],
)
def test_error_types_follow_the_status(status: int, kind: str) -> None:
    body = anthropic_error(ApiError(status, "boom"))
    assert body == {"type": "error", "error": {"type": kind, "message": "boom"}}


# ---------------------------------------------------------------------- over the fake worker


async def test_an_error_after_the_stream_started_is_an_anthropic_error_event(
    llmd_home: Path,
) -> None:
    async with api(llmd_home) as client:
        resp = await client.post(
            "/v1/messages",
            # seed 667: the fake worker fails after its first token
            json={"model": MODEL, "max_tokens": 50, "messages": USER, "stream": True, "seed": 667},
        )
        assert resp.status == 200
        text = await resp.text()
    frames = [f for f in text.split("\n\n") if f.strip()]
    assert frames[0].startswith("event: message_start\n")
    last = frames[-1].splitlines()
    assert last[0] == "event: error"
    error = json.loads(last[1].removeprefix("data: "))
    assert error["type"] == "error" and error["error"]["type"] == "api_error"


async def test_middleware_errors_use_the_anthropic_shape(llmd_home: Path) -> None:
    options = {"security": SecurityConfig(api_key="sekrit")}
    async with api(llmd_home, app_options=options) as client:
        body = {"model": MODEL, "max_tokens": 5, "messages": USER}
        denied = await client.post("/v1/messages", json=body, headers={"x-api-key": "wrong"})
        assert denied.status == 401
        assert (await denied.json())["error"]["type"] == "authentication_error"
        headers = {
            "x-api-key": "sekrit",
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "anything",
        }
        missing = await client.post(
            "/v1/messages", json={**body, "model": "nope-7b"}, headers=headers
        )
        assert missing.status == 404
        assert (await missing.json())["error"]["type"] == "not_found_error"
        ok = await client.post("/v1/messages", json=body, headers=headers)
        assert ok.status == 200 and (await ok.json())["type"] == "message"


async def test_a_slow_stream_keeps_alive_with_pings_after_message_start(llmd_home: Path) -> None:
    """A long prefill must not trip a client's idle timeout: `ping` events while nothing else
    comes, never before `message_start`, which already carries the cache split."""
    options = {"stream_keepalive": 0.05}
    async with api(llmd_home, app_options=options, token_delay=0.3) as client:
        resp = await client.post(
            "/v1/messages",
            json={"model": MODEL, "max_tokens": 3, "messages": USER, "stream": True},
        )
        text = await resp.text()
    names = [f.splitlines()[0] for f in text.split("\n\n") if f.strip()]
    assert names[0] == "event: message_start"
    first_delta = names.index("event: content_block_start")
    assert names[1:first_delta].count("event: ping") >= 3
    start = json.loads(text.split("\n\n")[0].splitlines()[1].removeprefix("data: "))
    usage_at_start = start["message"]["usage"]
    assert usage_at_start["cache_read_input_tokens"] == 0
    assert usage_at_start["input_tokens"] > 0
