"""Black-box conformance with the official `openai` Python client against a live `llmd serve`
running the real model: what an application written for OpenAI relies on — model listing,
chat and completions streamed and not, multibyte streaming integrity, usage totals,
structured output, logprobs, and the error envelope for ten kinds of bad requests. Nothing
here looks inside llmd."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai import OpenAI

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def client(server) -> OpenAI:  # type: ignore[no-untyped-def]
    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_list_has_openai_shape(client: OpenAI) -> None:
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert MODEL in ids
    m = next(m for m in models.data if m.id == MODEL)
    assert m.object == "model" and isinstance(m.created, int) and m.owned_by


def test_chat_non_stream_has_openai_shape(client: OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France? Answer in one sentence."},
        ],
        temperature=0,
        max_tokens=30,
    )
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    [choice] = out.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    u = out.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens and u.completion_tokens > 0


def _stream_text(client: OpenAI, content: str, **extra: Any) -> tuple[str, list[Any]]:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": content}],
            temperature=0,
            stream=True,
            **extra,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def test_chat_stream_equals_non_stream_and_ends_with_usage(client: OpenAI) -> None:
    question = "Name three colors."
    whole = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], temperature=0, max_tokens=24
    )
    text, chunks = _stream_text(
        client, question, max_tokens=24, stream_options={"include_usage": True}
    )
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == [whole.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


@pytest.mark.parametrize(
    "content",
    [
        "请用中文介绍一下北京。",
        "Reply with three emoji about the sea: 🌊🐟🐚",
        "Écris « café » et « naïve » avec des accents combinés: e\u0301 a\u0300 n\u0303.",
    ],
)
def test_multibyte_streams_arrive_intact(client: OpenAI, content: str) -> None:
    """Every delta is valid UTF-8 text on its own and the stream adds up to the whole
    answer: no character is split across chunks or replaced."""
    whole = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], temperature=0, max_tokens=40
    )
    text, chunks = _stream_text(client, content, max_tokens=40)
    assert text == whole.choices[0].message.content
    assert "\ufffd" not in text
    for c in chunks:
        if c.choices and c.choices[0].delta.content:
            c.choices[0].delta.content.encode("utf-8")  # a lone surrogate would raise


def test_completions_stream_and_not(client: OpenAI) -> None:
    whole = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert whole.object == "text_completion" and whole.choices[0].text
    stream = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == whole.choices[0].text


def test_completions_take_token_ids_as_the_prompt(client: OpenAI, model_path) -> None:  # type: ignore[no-untyped-def]
    """A prompt of token ids (OpenAI's and vLLM's form, used by evaluation harnesses) runs as
    given and continues exactly like the same text; ids outside the vocabulary are a 400, and
    a long badly typed array gets a short error, not one line per element."""
    from llmd.text.text_model import load_gguf_text_model

    text = "The capital of France is"
    ids = load_gguf_text_model(model_path).encode(text)
    by_text = client.completions.create(model=MODEL, prompt=text, max_tokens=8, temperature=0)
    by_ids = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=8, temperature=0, echo=True
    )
    assert by_ids.choices[0].text.endswith(by_text.choices[0].text)
    assert by_ids.usage and by_ids.usage.prompt_tokens == len(ids)
    with pytest.raises(openai.BadRequestError, match="outside this model's vocabulary"):
        client.completions.create(model=MODEL, prompt=[*ids, 10**7], max_tokens=2)
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=MODEL, prompt=[0.5] * 300, max_tokens=2)  # type: ignore[arg-type]
    assert len(str(bad.value)) < 1000 and "more" in str(bad.value)


def test_structured_output_parses_into_a_pydantic_model(client: OpenAI) -> None:
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str

    out = client.beta.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a city in France as JSON."}],
        temperature=0,
        max_tokens=60,
        response_format=City,
    )
    city = out.choices[0].message.parsed
    assert isinstance(city, City) and city.name and city.country


def test_logprobs_shape(client: OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        temperature=0,
        max_tokens=3,
        logprobs=True,
        top_logprobs=3,
    )
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens or len(content) == 3
    assert all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in content)


BAD_REQUESTS: list[tuple[str, dict[str, Any], int, str | None]] = [
    ("unknown model", {"model": "no-such-model"}, 404, "model"),
    ("temperature out of range", {"temperature": 5}, 400, "temperature"),
    ("top_p zero", {"top_p": 0}, 400, "top_p"),
    ("negative max_tokens", {"max_tokens": -1}, 400, "max_tokens"),
    ("empty messages", {"messages": []}, 400, "messages"),
    ("bad role", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.[0].role"),
    ("unknown parameter", {"temprature": 0.2}, 400, "temprature"),
    ("too many stops", {"stop": ["x"] * 17}, 400, "stop"),
    ("n out of range", {"n": 0}, 400, "n"),
    # A prompt that does not fit (a max_tokens past the context is clamped, not refused).
    (
        "context overflow",
        {"messages": [{"role": "user", "content": "word " * 9000}]},
        400,
        "messages",
    ),
]


@pytest.mark.parametrize("name,change,status,param", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_raise_the_clients_errors_with_the_envelope(
    client: OpenAI, name: str, change: dict[str, Any], status: int, param: str | None
) -> None:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        **change,
    }
    known = set(type(client.chat.completions).create.__annotations__)
    extra = {k: body.pop(k) for k in list(body) if k not in known}  # as SDK users send them
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(**body, extra_body=extra or None)
    err = info.value
    assert err.status_code == status
    envelope = err.response.json()["error"]
    assert set(envelope) == {"message", "type", "param", "code"}
    assert envelope["param"] == param and envelope["message"]
    assert isinstance(err, openai.NotFoundError if status == 404 else openai.BadRequestError)
    json.dumps(envelope)


def test_tool_call_shape(client: OpenAI) -> None:
    from tests.integration.test_tools import TOOLS

    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=TOOLS[:1],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=60,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments), dict)
