"""Anthropic's Messages API through the official `anthropic` client, the real server, worker
and model. The 2.x client takes sampling parameters through the body (`extra_body`), as
users of it send them. Tool calls are forced (a named tool), which llmd enforces by grammar,
so even a 135M model makes a valid one."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

MODEL = "smollm2-135m"
GREEDY = {"temperature": 0}
HELLO = [{"role": "user", "content": "Say hi"}]
WEATHER = {
    "name": "get_weather",
    "description": "Get the weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
PARIS = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(server) -> anthropic.Anthropic:  # type: ignore[no-untyped-def]
    return anthropic.Anthropic(
        base_url=server.base_url, api_key="unused", max_retries=0, timeout=120
    )


def test_a_plain_answer(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(
        model=MODEL, max_tokens=12, messages=HELLO, system="You are friendly.", extra_body=GREEDY
    )
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert msg.model == MODEL
    [block] = msg.content
    assert block.type == "text" and block.text.strip()
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.stop_sequence is None
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > 10
    assert 0 < msg.usage.output_tokens <= 12
    assert msg.usage.cache_creation_input_tokens == 0


def test_streaming_accumulates_to_the_same_message(client: anthropic.Anthropic) -> None:
    whole = client.messages.create(model=MODEL, max_tokens=12, messages=HELLO, extra_body=GREEDY)
    with client.messages.stream(
        model=MODEL, max_tokens=12, messages=HELLO, extra_body=GREEDY
    ) as stream:
        kinds = [event.type for event in stream]
        text = stream.get_final_text()
        final = stream.get_final_message()
    assert text == final.content[0].text == whole.content[0].text  # type: ignore[union-attr]
    raw = [k for k in kinds if k not in ("text",)]  # `text` is the helper's own event
    assert raw[:2] == ["message_start", "content_block_start"]
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) == {"content_block_delta"}
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_the_wire_names_every_event_and_pings(server) -> None:  # type: ignore[no-untyped-def]
    body = {"model": MODEL, "max_tokens": 4, "messages": HELLO, "stream": True}
    headers = {"anthropic-version": "2023-06-01"}
    with httpx.stream("POST", f"{server.base_url}/v1/messages", json=body, headers=headers) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        frames = [f for f in r.read().decode().split("\n\n") if f.strip()]
    names = []
    for frame in frames:
        event, data = frame.splitlines()
        name = event.removeprefix("event: ")
        assert json.loads(data.removeprefix("data: "))["type"] == name
        names.append(name)
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-2:] == ["message_delta", "message_stop"]


def test_forced_tool_use_round_trip(client: anthropic.Anthropic) -> None:
    tools: Any = [WEATHER]
    msg = client.messages.create(
        model=MODEL,
        max_tokens=60,
        messages=PARIS,
        tools=tools,
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY,
    )
    assert msg.stop_reason == "tool_use"
    [call] = [b for b in msg.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    assert isinstance(call.input, dict) and set(call.input) == {"city"}

    history: Any = [
        *PARIS,
        {"role": "assistant", "content": msg.content},  # sent back as received
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 C"}],
        },
    ]
    answer = client.messages.create(
        model=MODEL,
        max_tokens=40,
        messages=history,
        tools=tools,
        tool_choice={"type": "none"},
        extra_body=GREEDY,
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in answer.content] == ["text"]
    assert "24" in answer.content[0].text  # type: ignore[union-attr]  # it read the result


def test_a_streamed_tool_call_arrives_as_input_json(client: anthropic.Anthropic) -> None:
    tools: Any = [WEATHER]
    with client.messages.stream(
        model=MODEL,
        max_tokens=60,
        messages=PARIS,
        tools=tools,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body=GREEDY,
    ) as stream:
        partial = "".join(e.partial_json for e in stream if e.type == "input_json")
        final = stream.get_final_message()
    [call] = final.content
    assert call.type == "tool_use" and call.name == "get_weather"
    assert call.input == json.loads(partial) and "city" in call.input
    assert final.stop_reason == "tool_use"


def test_a_stop_sequence_is_reported(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(
        model=MODEL,
        max_tokens=40,
        messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
        stop_sequences=["4"],
        extra_body=GREEDY,
    )
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "4"
    text = msg.content[0].text  # type: ignore[union-attr]
    assert "3" in text and "4" not in text


def test_count_tokens_matches_the_input_of_the_same_request(client: anthropic.Anthropic) -> None:
    request: Any = {
        "model": MODEL,
        "system": "You answer about weather.",
        "messages": PARIS,
        "tools": [WEATHER],
    }
    counted = client.messages.count_tokens(**request)
    msg = client.messages.create(max_tokens=5, extra_body=GREEDY, **request)
    assert counted.input_tokens == msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)
    plain = client.messages.count_tokens(model=MODEL, messages=PARIS)
    assert plain.input_tokens < counted.input_tokens  # the tools prompt is counted


def test_bad_requests_get_anthropic_errors(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as missing:
        client.post("/v1/messages", cast_to=object, body={"model": MODEL, "messages": HELLO})
    with pytest.raises(anthropic.BadRequestError) as hot:
        client.messages.create(
            model=MODEL, max_tokens=5, messages=HELLO, extra_body={"temperature": 1.5}
        )
    with pytest.raises(anthropic.BadRequestError) as image:
        client.messages.create(
            model=MODEL,
            max_tokens=5,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                        }
                    ],
                }
            ],
        )
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(model="no-such-model", max_tokens=5, messages=HELLO)
    for err, words in [
        (missing, "max_tokens"),
        (hot, "temperature"),
        (image, "image"),
        (unknown, "no-such-model"),
    ]:
        body: Any = err.value.body
        assert body["type"] == "error" and words in body["error"]["message"]
    assert missing.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert unknown.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def _agent_turn(client: anthropic.Anthropic, build: str) -> tuple[Any, Any]:
    """One request shaped as Claude Code sends it (2.1.x): a per-request billing header as the
    first system block, a long system prompt, effort, adaptive thinking, context_management,
    a system message inside `messages`, a deferred tool, max_tokens far past the context."""
    policy = " ".join(f"Rule {i}: keep answers short and exact." for i in range(150))
    with client.messages.stream(
        model=MODEL,
        max_tokens=32000,  # clamped to the room left; the stop sequence keeps the answer short
        stop_sequences=[" "],
        system=[
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version={build};"},
            {"type": "text", "text": "You are a careful agent. " + policy},
        ],
        messages=[
            {"role": "user", "content": "Say hi"},
            {"role": "system", "content": [{"type": "text", "text": "# Environment\nlinux"}]},  # type: ignore[list-item]
        ],
        tools=[WEATHER, {**WEATHER, "name": "deferred", "defer_loading": True}],  # type: ignore[list-item]
        extra_body={
            **GREEDY,
            "thinking": {"type": "adaptive", "display": "omitted"},
            "output_config": {"effort": "high"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "metadata": {"user_id": '{"session_id": "s"}'},
        },
        extra_headers={"anthropic-beta": "claude-code-20250219,effort-2025-11-24"},
    ) as stream:
        start = next(e for e in stream if e.type == "message_start")
        for _ in stream:
            pass
        return start.message.usage, stream.get_final_message()


def test_claude_code_shaped_requests_run_and_turn_two_is_served_from_the_cache(
    client: anthropic.Anthropic,
) -> None:
    first_start, first = _agent_turn(client, "2.1.332.461")
    second_start, second = _agent_turn(client, "2.1.332.999")  # the header changed
    prompt = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert prompt > 1000 and first.stop_reason in ("end_turn", "stop_sequence", "tool_use")
    # The whole prompt but its last turn comes from the cache, and message_start says so.
    assert second_start.cache_read_input_tokens >= 0.9 * prompt
    assert second_start.cache_read_input_tokens == second.usage.cache_read_input_tokens
    assert second_start.input_tokens + second_start.cache_read_input_tokens == prompt


def test_a_prompt_too_long_is_worded_as_claude_code_parses_it(client: anthropic.Anthropic) -> None:
    words = "lorem ipsum " * 9000
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model=MODEL, max_tokens=100, messages=[{"role": "user", "content": words}]
        )
    message = info.value.body["error"]["message"]  # type: ignore[index]
    import re

    m = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", message)
    assert m is not None and int(m.group(1)) > int(m.group(2))
