"""The Responses API's mapping into the chat pipeline and back, without a server: request
validation, input items -> messages, tools / tool_choice / text.format, truncation, output
items and usage, the stream's event sequence (checked against the openai SDK's own types), and
the bounded, expiring response store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from llmd.api.response_store import ResponseStore, StoredResponse
from llmd.api.responses_api import (
    ResponseEvents,
    ResponseShell,
    assistant_message,
    chat_request,
    drop_oldest_turn,
    items_to_messages,
    normalize_input,
    output_items,
    parse_responses_request,
    responses_usage,
)
from llmd.api.responses_tools import read_tool_choice, read_tools
from llmd.errors import ApiError
from llmd.text.openai_schemas import ChatMessage
from tests.unit.fake_api import MODEL, api, sent_to_worker

EVENT = TypeAdapter(ResponseStreamEvent)
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}


def parse(**body: Any) -> Any:
    return parse_responses_request({"model": "m", "input": "hi", **body})


def rejected(**body: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        req = parse(**body)
        chat_request(req, items_to_messages(normalize_input(req.input)), None)
    assert info.value.status == 400
    return info.value


# ---------------------------------------------------------------------- request


def test_full_request_maps_onto_the_chat_request() -> None:
    req = parse(
        instructions="Be brief.",
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        temperature=0.2,
        top_p=0.9,
        max_output_tokens=50,
        text={"format": {"type": "json_schema", "name": "city", "schema": {"type": "object"}}},
        reasoning={"effort": "low", "summary": "auto"},
        store=False,
        metadata={"k": "v"},
        user="u",
        truncation="auto",
        include=[],
        seed=7,
    )
    chat = chat_request(req, [{"role": "user", "content": "hi"}], "responses.x")
    assert chat.max_completion_tokens == 50 and chat.temperature == 0.2 and chat.top_p == 0.9
    assert chat.seed == 7 and chat.session_id == "responses.x"
    assert chat.parallel_tool_calls is False
    assert chat.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": TOOL["parameters"],
                "strict": True,
            },
        }
    ]
    assert chat.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert chat.response_format is not None and chat.response_format.json_schema is not None
    assert chat.response_format.json_schema.name == "city"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"tools": [{"type": "hologram"}]}, "tools"),
        ({"tools": [{"type": "function"}]}, "tools[0].name"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"truncation": "sometimes"}, "truncation"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"input": []}, "input"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0].image_url",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "input[0].content[0].file_id",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
        ({"seed": "x"}, "seed"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ],
)
def test_bad_parameters_are_400_naming_them(body: dict[str, Any], param: str) -> None:
    assert rejected(**body).param == param


def test_harmless_parameters_are_accepted() -> None:
    req = parse(
        service_tier="auto",
        prompt_cache_key="k",
        safety_identifier="s",
        background=False,
        top_logprobs=0,
        stream=True,
        stream_options={"include_obfuscation": False},
        text={"format": {"type": "text"}, "verbosity": "medium"},
        tool_choice="auto",  # without tools: nothing to choose
    )
    chat = chat_request(req, [{"role": "user", "content": "hi"}], None)
    assert chat.tool_choice is None and chat.response_format is None


def test_chat_limits_are_reported_in_responses_names() -> None:
    from llmd.api.responses_api import renamed

    err = renamed(
        ApiError(
            400,
            "the prompt is 9 tokens and max_completion_tokens asks for 99",
            param="max_completion_tokens",
            code="context_length_exceeded",
        )
    )
    assert err.param == "max_output_tokens" and "max_output_tokens asks" in err.message
    schema = renamed(ApiError(400, "bad", param="response_format.json_schema.schema"))
    assert schema.param == "text.format.schema"
    assert renamed(ApiError(400, "long", param="messages")).param == "input"


# ---------------------------------------------------------------------- input


def test_input_string_is_one_user_message() -> None:
    items = normalize_input("Hello")
    assert items[0]["type"] == "message" and items[0]["id"].startswith("msg_")
    assert items_to_messages(items) == [{"role": "user", "content": "Hello"}]


def test_input_items_become_chat_turns() -> None:
    items = normalize_input(
        [
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "two"}],
            },
        ]
    )
    messages = items_to_messages(items)
    assert messages == [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"a": 1}'},
                },
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    ]
    for m in messages:  # every one is a valid internal message
        ChatMessage.model_validate(m)
    assert [i["type"] for i in items].count("reasoning") == 1  # listed, not sent


def test_function_calls_alone_are_an_assistant_turn() -> None:
    messages = items_to_messages(
        normalize_input(
            [
                {"role": "user", "content": "x"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            ]
        )
    )
    assert messages[1]["role"] == "assistant" and messages[1]["content"] is None


def test_truncation_drops_whole_oldest_turns_and_keeps_system() -> None:
    msgs = [
        ChatMessage.model_validate(m)
        for m in [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "u2"},
            {"role": "assistant", "content": "a2"},
            {"role": "user", "content": "u3"},
        ]
    ]
    once = drop_oldest_turn(msgs)
    assert once is not None and [m.text() for m in once] == ["s", "u2", "a2", "u3"]
    twice = drop_oldest_turn(once)
    assert twice is not None and [m.text() for m in twice] == ["s", "u3"]
    assert drop_oldest_turn(twice) is None


def test_tools_and_tool_choice_mapping() -> None:
    assert read_tools(None).chat_tools == []
    tools = read_tools([{"type": "function", "name": "f"}])
    assert tools.chat_tools == [{"type": "function", "function": {"name": "f"}}]
    assert read_tool_choice("required", tools).chat == "required"
    assert read_tool_choice("none", read_tools(None)).chat is None
    with pytest.raises(ApiError):
        read_tools([{"type": "function", "name": "f", "cache_control": True}])


# ---------------------------------------------------------------------- output


def _response(req_body: dict[str, Any], status: str, items: list[dict[str, Any]]) -> Response:
    shell = ResponseShell(parse(**req_body))
    usage = responses_usage(
        {
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 3},
        },
        2,
    )
    return Response.model_validate(shell.render(status, items, usage))


def test_whole_answer_maps_to_items_the_sdk_reads() -> None:
    message = {
        "role": "assistant",
        "content": "Let me check.",
        "reasoning_content": "The user wants weather.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    items = output_items(message, "tool_calls")
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call"]
    resp = _response({"tools": [TOOL], "reasoning": {"summary": "auto"}}, "completed", items)
    assert resp.output_text == "Let me check."
    reasoning = resp.output[0]
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "The user wants weather."
    assert resp.usage is not None and resp.usage.input_tokens_details.cached_tokens == 3
    assert resp.usage.output_tokens_details.reasoning_tokens == 2
    assert resp.usage.total_tokens == 15
    stored = assistant_message(items)
    assert stored["content"] == "Let me check." and stored["tool_calls"][0]["id"] == "call_1"
    assert "reasoning_content" not in stored


def test_cut_answer_is_incomplete() -> None:
    items = output_items({"role": "assistant", "content": "Once upon"}, "length")
    assert items[0]["status"] == "incomplete"
    only_calls = output_items(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        "tool_calls",
    )
    assert [i["type"] for i in only_calls] == ["function_call"]
    assert assistant_message(only_calls)["content"] is None


# ---------------------------------------------------------------------- stream events

USAGE = {"prompt_tokens": 4, "completion_tokens": 6, "prompt_tokens_details": {"cached_tokens": 0}}


def _run(deltas: list[dict[str, Any]], reason: str = "stop") -> tuple[list[dict[str, Any]], Any]:
    events = ResponseEvents(ResponseShell(parse(tools=[TOOL])))
    out = events.start()
    for d in deltas:
        out += events.delta(d)
    out += events.end(reason, responses_usage(USAGE, 0))
    for e in out:
        EVENT.validate_python(e)  # every event is one the SDK knows, with its fields
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out, events


def test_stream_of_reasoning_text_and_a_call() -> None:
    out, events = _run(
        [
            {"reasoning_content": "Think"},
            {"reasoning_content": "ing."},
            {"content": "Hel"},
            {"content": "lo"},
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            },
            {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
            {"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]},
        ],
        "tool_calls",
    )
    assert [e["type"] for e in out] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = Response.model_validate(out[-1]["response"])
    assert final.output_text == "Hello"
    call = final.output[2]
    assert call.type == "function_call" and call.arguments == '{"city": "Oslo"}'
    assert call.call_id == "call_1"
    assert events.reasoning_text() == "Thinking."
    # item ids stay the same from added to done
    added = [e["item"]["id"] for e in out if e["type"] == "response.output_item.added"]
    done = [e["item"]["id"] for e in out if e["type"] == "response.output_item.done"]
    assert added == done == [i.id for i in final.output]


def test_stream_cut_by_the_limit_is_incomplete() -> None:
    out, _ = _run([{"content": "Once"}], "length")
    assert out[-1]["type"] == "response.incomplete"
    final = out[-1]["response"]
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"


def test_empty_stream_still_has_a_message() -> None:
    out, _ = _run([])
    assert out[-1]["response"]["output"][0]["content"][0]["text"] == ""


def test_error_after_start_is_an_error_event_then_failed() -> None:
    events = ResponseEvents(ResponseShell(parse()))
    events.start()
    events.delta({"content": "Hi"})
    failed = events.fail(ApiError(503, "worker died", type="server_error", code="worker_died"))
    for e in failed:
        EVENT.validate_python(e)
    assert [e["type"] for e in failed] == ["error", "response.failed"]
    assert failed[0]["message"] == "worker died"
    assert failed[1]["response"]["status"] == "failed"
    assert failed[1]["response"]["error"]["code"] == "server_error"


# ---------------------------------------------------------------------- store


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _entry(rid: str, session: str = "s") -> StoredResponse:
    return StoredResponse(rid, {"id": rid}, [], [{"role": "user", "content": rid}], session)


def test_store_evicts_least_recently_used_beyond_its_bound() -> None:
    store = ResponseStore(max_entries=2, ttl=60, clock=Clock())
    store.put(_entry("a"))
    store.put(_entry("b"))
    assert store.get("a") is not None  # a is now the most recently used
    store.put(_entry("c"))
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2


def test_store_expires_idle_entries_and_use_renews_them() -> None:
    clock = Clock()
    store = ResponseStore(max_entries=10, ttl=60, clock=clock)
    store.put(_entry("a"))
    store.put(_entry("b"))
    clock.now += 50
    assert store.get("a") is not None  # renewed
    clock.now += 20
    assert store.get("b") is None  # 70 s idle
    assert store.get("a") is not None  # 20 s idle


def test_store_delete_and_chain_sessions() -> None:
    store = ResponseStore(clock=Clock())
    store.put(_entry("a", "chain1"))
    store.put(_entry("b", "chain1"))
    assert store.delete("a") is not None and store.delete("a") is None
    assert store.session_in_use("chain1")
    store.delete("b")
    assert not store.session_in_use("chain1")


# ---------------------------------------------------------------------- through the app


async def test_chain_runs_in_its_session_and_delete_releases_it(llmd_home: Path) -> None:
    async with api(llmd_home) as client:
        r1 = await client.post("/v1/responses", json={"model": MODEL, "input": "hello there"})
        first = await r1.json()
        r2 = await client.post(
            "/v1/responses",
            json={"model": MODEL, "input": "and again", "previous_response_id": first["id"]},
        )
        second = await r2.json()
        generates = sent_to_worker(client, "generate")
        sessions = [s["id"] for s in (await (await client.get("/v1/sessions")).json())["data"]]
        items = await (await client.get(f"/v1/responses/{second['id']}/input_items")).json()
        d2 = await client.delete(f"/v1/responses/{second['id']}")
        deleted = await d2.json()
        kept = [s["id"] for s in (await (await client.get("/v1/sessions")).json())["data"]]
        await client.delete(f"/v1/responses/{first['id']}")
        left = [s["id"] for s in (await (await client.get("/v1/sessions")).json())["data"]]
        gone = await client.get(f"/v1/responses/{first['id']}")
        gone_error = (await gone.json())["error"]
    chain = f"responses.{first['id']}"
    assert r1.status == r2.status == 200 and second["previous_response_id"] == first["id"]
    assert [g["session"] for g in generates] == ["", chain]  # the first turn is not pinned
    assert len(generates[1]["prompt"]) > len(generates[0]["prompt"])  # history included
    assert second["usage"]["input_tokens_details"]["cached_tokens"] >= 0
    assert sessions == [chain]
    assert [i["content"][0]["text"] for i in items["data"]] == ["and again"]
    assert d2.status == 200 and deleted == {
        "id": second["id"],
        "object": "response",
        "deleted": True,
    }
    assert kept == [chain]  # the first response still belongs to the chain
    assert left == [] and gone.status == 404
    assert gone_error["type"] == "invalid_request_error"


async def test_truncation_auto_drops_old_turns_to_fit_the_context(llmd_home: Path) -> None:
    words = "word " * 110
    async with api(llmd_home, context=256) as client:
        r1 = await client.post(
            "/v1/responses", json={"model": MODEL, "input": words, "max_output_tokens": 4}
        )
        first = await r1.json()
        body = {
            "model": MODEL,
            "input": words,
            "max_output_tokens": 4,
            "previous_response_id": first["id"],
        }
        refused = await client.post("/v1/responses", json=body)
        error = (await refused.json())["error"]
        fitted = await client.post("/v1/responses", json={**body, "truncation": "auto"})
        answer = await fitted.json()
    assert r1.status == 200
    assert refused.status == 400 and error["code"] == "context_length_exceeded"
    assert error["param"] == "input"
    assert fitted.status == 200 and answer["truncation"] == "auto"
    assert answer["usage"]["input_tokens"] < 256


async def test_stream_over_the_app_is_typed_sse(llmd_home: Path) -> None:
    async with api(llmd_home) as client:
        resp = await client.post(
            "/v1/responses",
            json={"model": MODEL, "input": "abc", "stream": True, "max_output_tokens": 3},
        )
        raw = (await resp.read()).decode()
    blocks = [b for b in raw.split("\n\n") if b.strip()]
    for block in blocks:
        event_line, data_line = block.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {data['type']}"
        EVENT.validate_python(data)
    assert "[DONE]" not in raw
