"""Ollama's API <-> the internal chat request and events: pure mapping, no server."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from llmd.api.ollama_api import (
    ChatRequest,
    GenerateRequest,
    ToolCallBuffer,
    chat_fields,
    check_generate,
    done_reason,
    generate_fields,
    image_places,
    map_format,
    map_messages,
    map_options,
    ollama_message,
    parse_body,
    rfc3339,
    thinking_mode,
    to_internal,
)
from llmd.api.ollama_models import human_number, progress_line
from llmd.errors import ApiError
from llmd.text.openai_schemas import image_refs


def _chat(**body: Any) -> ChatRequest:
    return parse_body({"model": "m", **body}, ChatRequest)


def _error(fn: Any, *args: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(*args)
    return info.value


# ---------------------------------------------------------------------- options


def test_options_map_to_the_pipelines_sampling_fields() -> None:
    fields = map_options(
        {
            "num_predict": 12,
            "temperature": 0,
            "top_k": 20,
            "top_p": 0.9,
            "min_p": 0.05,
            "seed": 7,
            "stop": ["\n", "user:"],
            "repeat_penalty": 1.2,
            "repeat_last_n": -1,
            "presence_penalty": 0.5,
            "frequency_penalty": 0.25,
        }
    )
    assert fields == {
        "max_tokens": 12,
        "temperature": 0,
        "top_k": 20,
        "top_p": 0.9,
        "min_p": 0.05,
        "seed": 7,
        "stop": ["\n", "user:"],
        "repetition_penalty": 1.2,
        "repeat_last_n": -1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
    }


def test_repeat_penalty_looks_at_ollamas_default_window() -> None:
    assert map_options({"repeat_penalty": 1.1}) == {"repetition_penalty": 1.1, "repeat_last_n": 64}
    assert map_options({"repeat_penalty": 1.1, "repeat_last_n": 0})["repeat_last_n"] == 0


@pytest.mark.parametrize("value", [-1, -2, 0])
def test_num_predict_unlimited_values_mean_until_the_model_stops(value: int) -> None:
    assert "max_tokens" not in map_options({"num_predict": value})


def test_random_seed_and_a_single_stop_string() -> None:
    assert map_options({"seed": -1, "stop": "END"}) == {"stop": ["END"]}


def test_load_and_speed_options_are_accepted_and_change_nothing() -> None:
    harmless = {
        "num_ctx": 2048,
        "num_thread": 8,
        "num_gpu": 1,
        "use_mmap": True,
        "num_batch": 2,
        "main_gpu": 0,
        "numa": False,
        "num_keep": 5,
        "mirostat": 0,
        "typical_p": 1.0,
        "tfs_z": 1.0,
        "repeat_last_n": 64,  # no penalty set: the window does not matter
    }
    assert map_options(harmless) == {}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"mirostat": 2}, "mirostat"),
        ({"typical_p": 0.7}, "typical_p"),
        ({"tfs_z": 0.5}, "tfs_z"),
        ({"not_an_option": 1}, "not_an_option"),
    ],
)
def test_options_that_would_change_the_answer_are_refused_by_name(
    options: dict[str, Any], named: str
) -> None:
    err = _error(map_options, options)
    assert err.status == 400
    assert named in err.message


def test_a_wrongly_typed_option_names_its_place() -> None:
    err = _error(map_options, {"temperature": "hot"})
    assert "options.temperature" in err.message


def test_out_of_range_values_are_reported_in_ollamas_names() -> None:
    fields = chat_fields(_chat(messages=[{"role": "user", "content": "hi"}]), "m")
    fields["temperature"] = 5
    err = _error(to_internal, fields)
    assert "options.temperature" in err.message
    assert ollama_message("the prompt is 9 tokens and max_tokens asks for 9") == (
        "the prompt is 9 tokens and options.num_predict asks for 9"
    )
    assert ollama_message("invalid JSON schema: x (response_format)") == (
        "invalid JSON schema: x (format)"
    )


# ---------------------------------------------------------------------- format


def test_format_json_and_schema() -> None:
    assert map_format(None) is None and map_format("") is None
    assert map_format("json") == {"type": "json_object"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert map_format(schema) == {
        "type": "json_schema",
        "json_schema": {"schema": schema, "strict": True},
    }
    assert _error(map_format, "yaml").status == 400


# ---------------------------------------------------------------------- messages


def test_tool_history_arguments_objects_become_json_strings_with_matching_ids() -> None:
    req = _chat(
        messages=[
            {"role": "user", "content": "weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"function": {"name": "weather", "arguments": {"city": "Paris"}}},
                    {"function": {"name": "time", "arguments": {"city": "Rome"}}},
                ],
            },
            {"role": "tool", "content": "11:00", "tool_name": "time"},
            {"role": "tool", "content": "18C", "tool_name": "weather"},
        ]
    )
    out = map_messages(req.messages)
    calls = out[1]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"city": "Paris"},
        {"city": "Rome"},
    ]
    ids = {c["function"]["name"]: c["id"] for c in calls}
    assert out[2]["tool_call_id"] == ids["time"] and out[2]["name"] == "time"
    assert out[3]["tool_call_id"] == ids["weather"]
    to_internal({"model": "m", "messages": out})  # the pipeline accepts the conversation


def test_tool_results_without_a_name_answer_the_calls_in_order() -> None:
    req = _chat(
        messages=[
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "a", "function": {"name": "f", "arguments": {}}},
                    {"id": "b", "function": {"name": "f", "arguments": {}}},
                ],
            },
            {"role": "tool", "content": "1"},
            {"role": "tool", "content": "2", "tool_call_id": "b"},
        ]
    )
    out = map_messages(req.messages)
    assert [out[1]["tool_call_id"], out[2]["tool_call_id"]] == ["a", "b"]


def test_images_become_image_parts_before_the_text_named_as_sent() -> None:
    req = _chat(
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "user", "content": "what is this?", "images": ["aGk=", "aGk="]},
        ]
    )
    internal = to_internal(chat_fields(req, "m"), images=image_places(req))
    assert image_refs(internal.messages) == [
        ("data:image/*;base64,aGk=", "messages[1].images[0]"),
        ("data:image/*;base64,aGk=", "messages[1].images[1]"),
    ]
    assert internal.messages[1].for_template()["content"] == [
        {"type": "image"},
        {"type": "image"},
        {"type": "text", "text": "what is this?"},
    ]


def test_generate_images_join_the_prompt_turn() -> None:
    req = parse_body({"model": "m", "prompt": "describe", "images": ["aGk="]}, GenerateRequest)
    internal = to_internal(generate_fields(req, "m"), images=image_places(req))
    assert image_refs(internal.messages) == [("data:image/*;base64,aGk=", "images[0]")]


def test_unknown_fields_are_refused_by_name() -> None:
    err = _error(parse_body, {"model": "m", "messages": [], "temprature": 1}, ChatRequest)
    assert "temprature" in err.message


def test_empty_tools_list_as_the_official_client_sends_it_offers_none() -> None:
    fields = chat_fields(_chat(messages=[{"role": "user", "content": "x"}], tools=[]), "m")
    assert "tools" not in fields


# ---------------------------------------------------------------------- generate


def test_generate_prompt_becomes_a_user_turn_after_the_system_message() -> None:
    req = parse_body({"model": "m", "prompt": "hi", "system": "be brief"}, GenerateRequest)
    assert generate_fields(req, "m")["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]


@pytest.mark.parametrize(
    "body",
    [
        {"suffix": "return x", "system": "s"},  # FIM has no system prompt
        {"template": "{{ .Prompt }}"},
        {"context": [1, 2, 3]},
        {"images": ["aGk="], "raw": True},  # only the chat template places images
        {"images": ["aGk="], "suffix": "x"},
        {"raw": True, "system": "s"},
    ],
)
def test_generate_refuses_what_llmd_does_not_do(body: dict[str, Any]) -> None:
    req = parse_body({"model": "m", "prompt": "x", **body}, GenerateRequest)
    assert _error(check_generate, req).status == 400


# ---------------------------------------------------------------------- thinking


def _model(template: str | None) -> Any:
    return SimpleNamespace(text=SimpleNamespace(chat_template=template))


THINKING = "{% for m in messages %}{{ m.content | split('</think>') | last }}{% endfor %}<think>"


def test_think_on_a_model_that_does_not_think_is_refused_as_ollama_does() -> None:
    plain = _model("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert thinking_mode(None, plain, "m") is False
    assert thinking_mode(False, plain, "m") is False
    assert _error(thinking_mode, True, plain, "m").message == '"m" does not support thinking'


def test_think_on_a_reasoning_model() -> None:
    model = _model(THINKING)
    assert thinking_mode(None, model, "m") is True
    assert thinking_mode(False, model, "m") is False
    assert "level" in _error(thinking_mode, "high", model, "m").message


# ---------------------------------------------------------------------- answers


def test_streamed_call_fragments_come_out_as_whole_calls_with_object_arguments() -> None:
    buf = ToolCallBuffer()
    start = {"index": 0, "id": "call_1", "function": {"name": "weather", "arguments": ""}}
    assert buf.feed([start]) == []
    assert buf.feed([{"index": 0, "function": {"arguments": '{"city": '}}]) == []
    assert buf.feed([{"index": 0, "function": {"arguments": '"Paris"}'}}]) == []
    second = {"index": 1, "id": "call_2", "function": {"name": "time", "arguments": "{}"}}
    first_done = buf.feed([second])
    assert first_done == [
        {
            "id": "call_1",
            "function": {"index": 0, "name": "weather", "arguments": {"city": "Paris"}},
        }
    ]
    assert buf.flush() == [
        {"id": "call_2", "function": {"index": 1, "name": "time", "arguments": {}}}
    ]
    assert buf.flush() == []


def test_done_reasons_and_timestamps() -> None:
    assert done_reason("tool_calls") == "stop"
    assert done_reason("length") == "length"
    assert rfc3339(0) == "1970-01-01T00:00:00.000000Z"


def test_pull_progress_lines() -> None:
    event = {
        "status": "pulling abc",
        "digest": "sha256:abc",
        "total": 10,
        "completed": 5,
        "file": "x",
    }
    assert progress_line(event) == {
        "status": "pulling abc",
        "digest": "sha256:abc",
        "total": 10,
        "completed": 5,
    }
    assert progress_line({"error": {"message": "boom", "code": "x"}}) == {"error": "boom"}


def test_parameter_sizes_as_ollama_prints_them() -> None:
    assert human_number(134_515_008) == "134.52M"
    assert human_number(8_000_000_000) == "8B"
    assert human_number(7_615_616_512) == "7.6B"
