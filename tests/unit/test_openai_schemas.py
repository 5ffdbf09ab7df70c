"""Request validation policy (DESIGN §6): harmless parameters accepted, anything that would
change the output and is not implemented is a 400 naming it, bad values name their param."""

from __future__ import annotations

from typing import Any

import pytest

from llmd.errors import ApiError
from llmd.text.openai_schemas import ChatCompletionRequest, image_refs, parse_request

USER = [{"role": "user", "content": "hi"}]


def chat(**extra: Any) -> ChatCompletionRequest:
    return parse_request({"model": "m", "messages": USER, **extra}, ChatCompletionRequest)


def rejected(**extra: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        chat(**extra)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    "extra",
    [
        {"user": "me"},
        {"metadata": {"k": "v"}},
        {"store": False},
        {"service_tier": "auto"},
        {"n": 1},
        {"logprobs": False},
        {"parallel_tool_calls": True},
        {"frequency_penalty": 0},
        {"response_format": {"type": "text"}},
        {"stream": True, "stream_options": {"include_usage": True}},
    ],
)
def test_harmless_parameters_are_accepted(extra: dict[str, Any]) -> None:
    chat(**extra)


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"verbosity": "low"}, "verbosity"),
    ],
)
def test_output_changing_parameters_are_not_supported_yet(
    extra: dict[str, Any], param: str
) -> None:
    err = rejected(**extra)
    assert err.param == param and err.code == "unsupported_parameter"
    assert param in err.message and "not supported yet" in err.message


def test_unknown_parameter_is_named() -> None:
    err = rejected(temprature=0.5)
    assert err.param == "temprature" and err.code == "unknown_parameter"


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"stop": ["a"] * 17}, "stop"),
        ({"seed": "x"}, "seed"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"42": 101}}, "logit_bias"),
        ({"n": 0}, "n"),
        ({"n": 17}, "n"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.[0].content"),
    ],
)
def test_invalid_values_name_their_parameter(extra: dict[str, Any], param: str) -> None:
    assert rejected(**extra).param == param


def test_stream_options_need_stream() -> None:
    assert rejected(stream_options={"include_usage": True}).param == "stream_options"


def test_conflicting_token_limits_are_refused_equal_ones_accepted() -> None:
    assert rejected(max_tokens=5, max_completion_tokens=9).param == "max_tokens"
    assert chat(max_tokens=7, max_completion_tokens=7).token_limit() == 7
    assert chat(max_completion_tokens=9).token_limit() == 9
    assert chat(max_tokens=7).token_limit() == 7 and chat().token_limit() is None


def test_tool_turns_and_images_are_accepted_and_audio_is_not_supported_yet() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    req = chat(
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
        ]
    )
    turns = [m.for_template() for m in req.messages]
    assert turns[1]["tool_calls"][0]["function"]["name"] == "f" and turns[1]["content"] is None
    assert turns[2] == {"role": "tool", "content": "42", "tool_call_id": "c1"}
    err = rejected(messages=[{"role": "tool", "content": "42"}])
    assert err.param == "messages.[0]"
    image = {"type": "image_url", "image_url": {"url": "data:,", "detail": "low"}}
    req = chat(messages=[{"role": "user", "content": [{"type": "text", "text": "see"}, image]}])
    assert req.messages[0].for_template()["content"] == [
        {"type": "text", "text": "see"},
        {"type": "image"},
    ]
    assert image_refs(req.messages) == [("data:,", "messages.[0].content.[1]")]
    audio = {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}
    err = rejected(messages=[{"role": "user", "content": [audio]}])
    assert err.param == "messages.[0].content.[0].type" and "input_audio" in err.message


def test_message_content_is_flattened_for_the_template() -> None:
    req = chat(
        messages=[
            {
                "role": "developer",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "user", "content": "q", "name": "ada"},
            {"role": "assistant", "content": None, "refusal": None, "tool_calls": []},
        ]
    )
    assert [m.for_template() for m in req.messages] == [
        {"role": "system", "content": "ab"},
        {"role": "user", "content": "q", "name": "ada"},
        {"role": "assistant", "content": ""},
    ]


def test_repeat_last_n_sets_the_repetition_window() -> None:
    from llmd.text.chat_pipeline import sampling_params

    def sampling(**extra: object):  # type: ignore[no-untyped-def]
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
        return sampling_params(parse_request(body, ChatCompletionRequest), 0, -1)

    assert sampling(repetition_penalty=1.3).repetition_window == 0  # the whole context
    windowed = sampling(repetition_penalty=1.3, repeat_last_n=64)
    assert (windowed.repetition_penalty, windowed.repetition_window) == (1.3, 64)
    assert sampling(repetition_penalty=1.3, repeat_last_n=0).repetition_penalty == 1.0  # off
    with pytest.raises(ApiError) as bad:
        sampling(repeat_last_n=-2)
    assert bad.value.param == "repeat_last_n"
