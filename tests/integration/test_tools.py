"""Tool calling and reasoning output through the real server, worker and model. SmolLM2's
template ignores `tools`, so llmd prompts them itself (Hermes markup) and parses the answer;
`required` and a named function are enforced by a grammar in the worker, so even a 135M
model produces a valid call."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai import OpenAI

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

MODEL = "smollm2-135m"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Get the time in a timezone",
            "parameters": {
                "type": "object",
                "properties": {"timezone": {"type": "string"}},
                "required": ["timezone"],
            },
        },
    },
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(server) -> OpenAI:  # type: ignore[no-untyped-def]
    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


# An assistant turn's call, as clients send it back with its result.
PARIS_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
}


def test_required_tool_choice_always_yields_a_valid_call(client: OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=80,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in ("get_weather", "get_time")
    args = json.loads(call.function.arguments)
    assert set(args) == ({"city"} if call.function.name == "get_weather" else {"timezone"})
    assert not choice.message.content


def test_a_named_function_is_the_one_called(client: OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
        max_tokens=80,
    )
    [call] = out.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    assert set(json.loads(call.function.arguments)) == {"timezone"}


def test_streamed_tool_calls_have_stable_ids_and_reassemble(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=80,
        stream=True,
    )
    ids, names, args, finish = set(), [], "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or []:
            assert tc.index == 0
            if tc.id:
                ids.add(tc.id)
            if tc.function and tc.function.name:
                names.append(tc.function.name)
            if tc.function and tc.function.arguments:
                args += tc.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert len(ids) == 1 and len(names) == 1 and finish == "tool_calls"
    assert isinstance(json.loads(args), dict)


def test_tool_choice_none_answers_in_text(client: OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=20,
    )
    assert out.choices[0].message.tool_calls is None and out.choices[0].message.content
    assert out.choices[0].finish_reason in ("stop", "length")


def test_a_tool_result_turn_is_accepted_and_answered(client: OpenAI) -> None:
    call = PARIS_CALL
    out = client.chat.completions.create(
        model=MODEL,
        messages=[
            *QUESTION,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 C"},
        ],
        tools=TOOLS,
        temperature=0,
        max_tokens=20,
    )
    assert out.choices[0].message.content or out.choices[0].message.tool_calls


def test_unknown_tool_choice_is_a_400_naming_it(client: OpenAI) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "launch_rockets"}},
        )
    assert info.value.response.json()["error"]["param"] == "tool_choice"


def _streamed_call(client: OpenAI, **kwargs: Any) -> tuple[list[str], list[str], str | None]:
    """(names, argument fragments of call 0, finish reason) of a streamed answer."""
    stream = client.chat.completions.create(model=MODEL, stream=True, **kwargs)
    names, fragments, finish = [], [], None
    for chunk in stream:
        if not chunk.choices:
            continue
        for tc in chunk.choices[0].delta.tool_calls or []:
            if tc.function and tc.function.name:
                names.append(tc.function.name)
            if tc.index == 0 and tc.function and tc.function.arguments:
                fragments.append(tc.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    return names, fragments, finish


def test_auto_tool_calls_stream_their_arguments_as_generated(client: OpenAI) -> None:
    """`auto`: the lazy grammar holds a call to its schema once the model opens one, so the
    arguments stream in several fragments that concatenate to valid JSON, and the same
    request not streamed gives the same call."""
    # The 135M model answers QUESTION in prose; asked for a call, it writes one (greedy).
    ask = [{"role": "user", "content": "Reply with a <tool_call> only: weather in Paris."}]
    request: dict[str, Any] = {
        "messages": ask,
        "tools": TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": 80,
    }
    names, fragments, finish = _streamed_call(client, **request)
    assert names == ["get_weather"], "the test model calls the weather tool for this question"
    assert finish == "tool_calls"
    assert len(fragments) > 1, fragments
    args = json.loads("".join(fragments))
    assert set(args) == {"city"} and isinstance(args["city"], str)
    out = client.chat.completions.create(model=MODEL, **request)
    [call] = out.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", "".join(fragments))


def test_a_call_cut_by_max_tokens_says_length(client: OpenAI) -> None:
    """Fragments already sent cannot be withdrawn: the call stays, and `length` says so."""
    request: dict[str, Any] = {
        "messages": QUESTION,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": 18,  # inside the arguments (greedy: {"city": "Paris"} at 15-20)
    }
    names, fragments, finish = _streamed_call(client, **request)
    assert len(names) == 1 and fragments and finish == "length"
    out = client.chat.completions.create(model=MODEL, **request)
    assert out.choices[0].finish_reason == "length"
    [call] = out.choices[0].message.tool_calls
    assert call.function.arguments == "".join(fragments)


# Issue 30: SmolLM2's template renders any role as `<|im_start|>{role}`, so a tool result is
# a `tool` turn of its own (as llama-server renders it), not `<tool_response>` in a user turn,
# which the model copied into its answer.
RESULTS = [
    ("What is the weather in Paris?", "Sunny, 24 C"),
    ("Is it raining in London?", "Light rain, 12 C"),
]


@pytest.mark.parametrize(("question", "result"), RESULTS)
def test_an_answer_after_a_tool_result_does_not_copy_the_result_tag(
    client: OpenAI, question: str, result: str
) -> None:
    call = PARIS_CALL
    out = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": question},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": result},
        ],
        tools=TOOLS,
        temperature=0,
        max_tokens=40,
    )
    message = out.choices[0].message
    assert message.content or message.tool_calls
    assert not (message.content or "").lstrip().startswith("<tool_response>"), message.content


@pytest.mark.parametrize(("question", "result"), RESULTS)
def test_an_anthropic_answer_after_a_tool_result_does_not_copy_the_result_tag(
    server, question: str, result: str
) -> None:  # type: ignore[no-untyped-def]
    import httpx

    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in TOOLS
    ]
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    body = {
        "model": MODEL,
        "max_tokens": 40,
        "temperature": 0,
        "tools": tools,
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": [use]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}],
            },
        ],
    }
    r = httpx.post(f"{server.base_url}/v1/messages", json=body, timeout=120)
    assert r.status_code == 200, r.text
    content = r.json()["content"]
    assert content
    texts = [b["text"] for b in content if b["type"] == "text"]
    assert not any(t.lstrip().startswith("<tool_response>") for t in texts), texts


def test_a_second_call_cut_by_max_tokens_is_not_content(client: OpenAI) -> None:
    """Forced parallel calls until the limit: the call the limit cuts never shows as
    content, and the finish reason says `length`, streamed or not."""
    request: dict[str, Any] = {
        "messages": QUESTION,
        "tools": TOOLS,
        "tool_choice": "required",
        "temperature": 0,
    }
    cut_after_a_call = 0
    for limit in range(22, 40):
        out = client.chat.completions.create(model=MODEL, max_tokens=limit, **request)
        choice = out.choices[0]
        calls = choice.message.tool_calls or []
        assert "<tool_call>" not in (choice.message.content or ""), (limit, choice.message)
        if choice.finish_reason == "tool_calls":  # whole calls (at most a marker cut)
            for c in calls:
                json.loads(c.function.arguments)
        else:
            assert choice.finish_reason == "length" and out.usage.completion_tokens == limit
            cut_after_a_call += bool(calls)
        stream = client.chat.completions.create(
            model=MODEL, max_tokens=limit, stream=True, **request
        )
        text, finish = "", None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        assert "<tool_call>" not in text and finish == choice.finish_reason, limit
    assert cut_after_a_call  # the case of the issue: a whole call, then one cut
