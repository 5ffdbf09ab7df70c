"""OpenAI's Responses API through the official `openai` client against a live `llmd serve`
with the real model: plain and streamed answers, structured output, a forced function call and
its result, a three-turn `previous_response_id` chain that reuses the cached prefix, stored
responses (GET, input_items, DELETE) and OpenAI's error envelope; and what coding agents send
(a captured Codex CLI request replayed: namespace tools, hosted tools dropped, a custom tool held
to its grammar, `prompt_cache_key` caching turn 2's prefix)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

MODEL = "smollm2-135m"
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def client(server) -> OpenAI:  # type: ignore[no-untyped-def]
    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_plain_answer_has_output_text_and_usage(client: OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL,
        instructions="You are a helpful assistant.",
        input="What is the capital of France? Answer in one sentence.",
        temperature=0,
        max_output_tokens=30,
        metadata={"run": "t1"},
    )
    assert resp.id.startswith("resp_") and resp.object == "response"
    assert resp.status in ("completed", "incomplete")
    assert "Paris" in resp.output_text
    [message] = resp.output
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text"
    u = resp.usage
    assert u is not None and u.output_tokens > 0
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.output_tokens_details.reasoning_tokens == 0
    assert resp.instructions == "You are a helpful assistant."
    assert resp.metadata == {"run": "t1"} and resp.store is True


def test_length_cut_is_incomplete(client: OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL, input="Write a long story about a dragon.", max_output_tokens=5
    )
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage is not None and resp.usage.output_tokens == 5


def test_stream_events_are_ordered_and_deltas_make_the_text(client: OpenAI) -> None:
    events = list(
        client.responses.create(
            model=MODEL,
            input="Name three colors.",
            temperature=0,
            max_output_tokens=20,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        kinds[-1],
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text and final.output_text == text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == text
    # The streamed response was stored and reads back the same.
    assert client.responses.retrieve(final.id).output_text == text


def test_stream_helper_accumulates_the_final_response(client: OpenAI) -> None:
    with client.responses.stream(
        model=MODEL, input="Say hello in one short sentence.", temperature=0, max_output_tokens=60
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(deltas)


class City(BaseModel):
    name: str
    country: str


def test_structured_output_with_json_schema_parses(client: OpenAI) -> None:
    resp = client.responses.parse(
        model=MODEL,
        input="Give me a city in Japan as JSON.",
        text_format=City,
        temperature=0,
        max_output_tokens=60,
    )
    assert resp.status == "completed"
    city = resp.output_parsed
    assert isinstance(city, City) and city.name and city.country
    assert resp.text.format.type == "json_schema"


def test_forced_function_call_then_its_output_gives_an_answer(client: OpenAI) -> None:
    first = client.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=60,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) >= 1
    call = calls[0]
    assert call.name == "get_weather" and call.call_id and call.id.startswith("fc_")
    assert isinstance(json.loads(call.arguments)["city"], str)
    assert first.tools[0].name == "get_weather"

    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": json.dumps({"city": "Paris", "forecast": "sunny, 24 C"}),
            }
        ],
        tools=[WEATHER_TOOL],
        tool_choice="none",
        temperature=0,
        max_output_tokens=64,
    )
    assert second.previous_response_id == first.id
    assert [item.type for item in second.output] == ["message"]
    assert second.output_text.strip()
    # The answer draws on the tool's result ("sunny, 24 C"), which only the continued
    # conversation holds (the 135M model words it differently on each CPU path's rounding).
    answer = second.output_text.lower()
    assert "sun" in answer or "24" in answer, second.output_text


def test_streamed_function_call_events(client: OpenAI) -> None:
    events = list(
        client.responses.create(
            model=MODEL,
            input="What is the weather in Rome?",
            tools=[WEATHER_TOOL],
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=0,
            max_output_tokens=60,
            stream=True,
            store=False,
        )
    )
    added = [e for e in events if e.type == "response.output_item.added"]
    assert added and added[0].item.type == "function_call"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == args and json.loads(args)["city"]
    final = events[-1].response
    [call] = [i for i in final.output if i.type == "function_call"]
    assert call.arguments == args and call.status == "completed"
    with pytest.raises(openai.NotFoundError):  # store: false is not kept
        client.responses.retrieve(final.id)


LONG_CONTEXT = (
    "You are helping me plan a small vegetable garden. The garden is four meters long and "
    "two meters wide, gets sun in the morning, and the soil is sandy. I want to grow tomatoes, "
    "carrots, lettuce, beans and basil. Tomatoes need support and lots of sun, carrots like "
    "loose soil, lettuce tolerates some shade, beans climb and fix nitrogen, and basil grows "
    "well next to tomatoes. My favourite vegetable is the carrot. I water the garden every "
    "evening with a hose, and I would like to harvest something every week from June to "
    "September. Please keep answers short. "
)


def test_previous_response_chain_reuses_cached_prefix(client: OpenAI) -> None:
    turn1 = client.responses.create(
        model=MODEL,
        input=LONG_CONTEXT + "Which vegetable should go next to the tomatoes?",
        temperature=0,
        max_output_tokens=10,
    )
    turn2 = client.responses.create(
        model=MODEL,
        previous_response_id=turn1.id,
        input="And which one likes loose soil?",
        temperature=0,
        max_output_tokens=10,
    )
    turn3 = client.responses.create(
        model=MODEL,
        previous_response_id=turn2.id,
        input="What is my favourite vegetable? Answer with one word.",
        temperature=0,
        max_output_tokens=10,
    )
    u1, u2, u3 = turn1.usage, turn2.usage, turn3.usage
    assert u1 is not None and u2 is not None and u3 is not None
    assert u1.input_tokens > 128
    # Each turn's prompt holds the previous turns: input plus output of the one before.
    assert u2.input_tokens > u1.input_tokens + u1.output_tokens
    assert u3.input_tokens > u2.input_tokens + u2.output_tokens
    assert u2.input_tokens_details.cached_tokens > 0
    assert u3.input_tokens_details.cached_tokens > 0
    assert u3.input_tokens_details.cached_tokens >= u2.input_tokens_details.cached_tokens


def test_stored_response_get_input_items_and_delete(client: OpenAI) -> None:
    resp = client.responses.create(model=MODEL, input="Say yes.", max_output_tokens=5)
    got = client.responses.retrieve(resp.id)
    assert got.id == resp.id and got.output_text == resp.output_text
    items = client.responses.input_items.list(resp.id)
    [item] = items.data
    assert item.type == "message" and item.role == "user"
    assert item.content[0].text == "Say yes."
    deleted = client.responses.delete(resp.id)
    assert deleted is None or getattr(deleted, "deleted", True)  # the SDK returns None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(
            model=MODEL, previous_response_id=resp.id, input="Again.", max_output_tokens=5
        )


def test_unknown_previous_response_id_is_404(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(
            model=MODEL, previous_response_id="resp_missing", input="Hi", max_output_tokens=5
        )
    err = info.value.body
    assert isinstance(err, dict) and err["param"] == "previous_response_id"
    assert err["code"] == "previous_response_not_found"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"tools": [{"type": "hologram"}]}, "tools"),
        ({"include": ["file_search_call.results"]}, "include"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",  # neither a data: URL nor http(s)
        ),
    ],
)
def test_bad_parameters_are_400_naming_them(
    client: OpenAI, kwargs: dict[str, Any], param: str
) -> None:
    args: dict[str, Any] = {"model": MODEL, "input": "Hi", "max_output_tokens": 5, **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(**args)
    err = info.value.body
    assert isinstance(err, dict) and err["param"] == param and err["message"]


# ---------------------------------------------------------------------- coding agents

AGENTS = Path(__file__).parent.parent / "fixtures" / "agents"


def _codex_turn_one() -> dict[str, Any]:
    """The request Codex 0.169.0 sent for `codex exec` (long texts trimmed), unstreamed."""
    body = json.loads((AGENTS / "codex_0.169.0_exec_request.json").read_text())
    return {**body, "stream": False, "temperature": 0, "max_output_tokens": 16}


def test_codex_turn_two_reuses_the_cached_prefix(client: OpenAI) -> None:
    """Codex sends `store: false` and the whole history each turn, keyed by
    `prompt_cache_key`: turn 2 must come mostly from the prefix cache."""
    body = _codex_turn_one()
    first = client.post("/responses", cast_to=object, body=body)
    assert isinstance(first, dict) and first["status"] in ("completed", "incomplete")
    assert first["store"] is False and first["prompt_cache_key"] == body["prompt_cache_key"]
    history = [{k: v for k, v in item.items() if k != "id"} for item in first["output"]]
    follow_up = {"role": "user", "content": [{"type": "input_text", "text": "Thanks."}]}
    second = client.post(
        "/responses",
        cast_to=object,
        body={**body, "input": body["input"] + history + [follow_up]},
    )
    assert isinstance(second, dict)
    usage = second["usage"]
    assert usage["input_tokens"] > first["usage"]["input_tokens"]
    assert usage["input_tokens_details"]["cached_tokens"] >= 0.9 * usage["input_tokens"]


def test_hosted_tools_are_dropped_not_refused(client: OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL,
        input="Say hello.",
        tools=[{"type": "web_search"}],  # type: ignore[list-item]
        max_output_tokens=8,
        temperature=0,
    )
    assert resp.output[0].type == "message" and resp.output_text


def test_forced_custom_tool_call_input_matches_its_grammar(client: OpenAI) -> None:
    pattern = r"(add|remove) [a-z]{1,8}\.txt"
    tool = {
        "type": "custom",
        "name": "edit",
        "description": "Edit a file.",
        "format": {"type": "grammar", "syntax": "regex", "definition": pattern},
    }
    resp = client.responses.create(
        model=MODEL,
        input="Create the file notes.txt.",
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "custom", "name": "edit"},
        max_output_tokens=20,
        temperature=0,
    )
    [call] = resp.output
    assert call.type == "custom_tool_call" and call.name == "edit"
    assert re.fullmatch(pattern, call.input)
    # Its result goes back as a custom_tool_call_output (store: true chain).
    follow = client.responses.create(
        model=MODEL,
        previous_response_id=resp.id,
        input=[{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "done"}],
        max_output_tokens=8,
        temperature=0,
    )
    assert follow.status in ("completed", "incomplete")


def test_forced_namespace_call_comes_back_with_its_namespace(client: OpenAI) -> None:
    body = {
        "model": MODEL,
        "input": "Close agent 7.",
        "tools": [
            {
                "type": "namespace",
                "name": "agents",
                "description": "Sub-agents.",
                "tools": [
                    {
                        "type": "function",
                        "name": "close_agent",
                        "description": "Close an agent.",
                        "parameters": {
                            "type": "object",
                            "properties": {"id": {"type": "string"}},
                            "required": ["id"],
                        },
                    }
                ],
            }
        ],
        "tool_choice": {"type": "function", "name": "close_agent"},
        "max_output_tokens": 60,
        "temperature": 0,
    }
    resp = client.post("/responses", cast_to=object, body=body)
    assert isinstance(resp, dict)
    [call] = [item for item in resp["output"] if item["type"] == "function_call"]
    assert call["name"] == "close_agent" and call["namespace"] == "agents"
    if resp["status"] == "completed":  # a cut answer's arguments are cut too
        assert "id" in json.loads(call["arguments"])
