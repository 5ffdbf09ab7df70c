"""Sampling controls, logprobs, echo, n and structured output through the real server, worker
and model: each is checked by what it does to the model's real output."""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from typing import Any

import jsonschema
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.integration.test_chat_api import get, post

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def client(server) -> OpenAI:  # type: ignore[no-untyped-def]
    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def ask(client: OpenAI, content: str, **extra: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        temperature=0,
        **extra,
    )


def first_token_logprobs(client: OpenAI, content: str, **extra: Any) -> Any:
    out = ask(client, content, max_tokens=1, logprobs=True, top_logprobs=5, **extra)
    return out.choices[0].logprobs.content[0]


def test_logprobs_are_the_models_distribution(client: OpenAI) -> None:
    out = ask(client, "Name a fruit.", max_tokens=6, logprobs=True, top_logprobs=5)
    entries = out.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == out.choices[0].message.content
    for e in entries:
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True)
        assert all(lp <= 0 for lp in tops)
        assert sum(math.exp(lp) for lp in tops) <= 1.0 + 1e-4
        # Greedy: the sampled token is the likeliest one.
        assert e.top_logprobs[0].token == e.token and e.logprob == pytest.approx(tops[0])
        assert bytes(e.bytes).decode() == e.token


def test_streamed_logprobs_equal_the_non_streamed_ones(client: OpenAI) -> None:
    whole = ask(client, "Name a fruit.", max_tokens=6, logprobs=True, top_logprobs=2)
    stream = ask(client, "Name a fruit.", max_tokens=6, logprobs=True, top_logprobs=2, stream=True)
    streamed = [
        e
        for chunk in stream
        if chunk.choices and chunk.choices[0].logprobs
        for e in chunk.choices[0].logprobs.content or []
    ]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [
        (e.token, round(e.logprob, 4)) for e in whole.choices[0].logprobs.content
    ]


def test_logit_bias_removes_and_forces_tokens(client: OpenAI, text_model) -> None:  # type: ignore[no-untyped-def]
    question = "What is the capital of France?"
    first = first_token_logprobs(client, question)
    [token_id] = text_model.tokenizer.encode(first.token, add_special_tokens=False).ids
    banned = first_token_logprobs(client, question, logit_bias={str(token_id): -100})
    assert banned.token != first.token
    # The model's own logprobs are reported, bias or not.
    assert banned.top_logprobs[0].token == first.token
    [forced_id] = text_model.tokenizer.encode(" banana", add_special_tokens=False).ids
    forced = ask(client, question, max_tokens=1, logit_bias={str(forced_id): 100})
    assert forced.choices[0].message.content.strip() == "banana"


def test_penalties_change_a_repetitive_answer(client: OpenAI) -> None:
    prompt = "Repeat the word 'cat' twenty times."
    plain = ask(client, prompt, max_tokens=40).choices[0].message.content
    penalised = ask(client, prompt, max_tokens=40, frequency_penalty=2.0).choices[0].message.content
    repetition = (
        ask(client, prompt, max_tokens=40, extra_body={"repetition_penalty": 1.8})
        .choices[0]
        .message.content
    )
    assert plain.lower().count("cat") > penalised.lower().count("cat")
    assert repetition != plain


def test_echo_scores_the_prompt_with_max_tokens_zero(server) -> None:  # type: ignore[no-untyped-def]
    prompt = "The capital of France is Paris"
    status, body = post(
        server,
        "/v1/completions",
        {"model": MODEL, "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 2},
    )
    assert status == 200
    [choice] = body["choices"]
    lp = choice["logprobs"]
    assert choice["text"] == prompt and "".join(lp["tokens"]) == prompt
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(x < 0 for x in lp["token_logprobs"][1:])
    assert lp["text_offset"] == [prompt.index(t) if i else 0 for i, t in enumerate(lp["tokens"])]
    # " Paris" after "The capital of France is" is the model's favourite.
    assert max(lp["top_logprobs"][-1], key=lp["top_logprobs"][-1].get) == " Paris"
    assert body["usage"]["completion_tokens"] == 0


def test_echo_logprobs_match_the_generated_tokens_logprobs(server) -> None:  # type: ignore[no-untyped-def]
    prompt = "The capital of France is"
    status, gen = post(
        server,
        "/v1/completions",
        {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0, "logprobs": 0},
    )
    assert status == 200
    text = gen["choices"][0]["text"]
    status, scored = post(
        server,
        "/v1/completions",
        {"model": MODEL, "prompt": prompt + text, "max_tokens": 0, "echo": True, "logprobs": 0},
    )
    assert text == " Paris."  # two tokens that re-tokenize the same way after the prompt
    generated = gen["choices"][0]["logprobs"]["token_logprobs"]
    rescored = scored["choices"][0]["logprobs"]["token_logprobs"][-len(generated) :]
    assert rescored == pytest.approx(generated, abs=0.01)  # decode vs teacher forcing


def test_n_choices_share_the_prompt_and_differ_when_sampled(server, client: OpenAI) -> None:  # type: ignore[no-untyped-def]
    long_prompt = (
        f"Here is story {uuid.uuid4().hex}. " + "The lighthouse keeper watched the sea. " * 30
    )
    client.chat.completions.create(  # the model is loaded before its counters are read
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1
    )
    before = get(server, "/status")["models"][0]["engine"]
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": long_prompt + " Continue it."}],
        max_tokens=12,
        temperature=1.0,
        seed=11,
        n=3,
    )
    after = get(server, "/status")["models"][0]["engine"]
    texts = [c.message.content for c in out.choices]
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert len(set(texts)) == 3  # seeds seed, seed+1, seed+2
    # The prompt was prefilled once: choices 1 and 2 started from choice 0's KV and logits.
    assert after["forked_sequences"] - before["forked_sequences"] == 2
    prefilled = after["prompt_tokens_processed"] - before["prompt_tokens_processed"]
    assert prefilled == out.usage.prompt_tokens - out.usage.prompt_tokens_details.cached_tokens
    assert out.usage.completion_tokens == 36 or all(
        c.finish_reason in ("stop", "length") for c in out.choices
    )
    greedy = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi!"}], max_tokens=8, temperature=0, n=2
    )
    assert greedy.choices[0].message.content == greedy.choices[1].message.content


def test_n_choices_stream_with_their_indexes(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=10,
        temperature=0,
        n=2,
        stream=True,
    )
    texts = {0: "", 1: ""}
    finishes = {}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts[0] == texts[1] != "" and set(finishes) == {0, 1}


SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    (
        "Describe a person.",
        {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
    ),
    (
        "Pick a primary color.",
        {
            "type": "object",
            "properties": {"color": {"enum": ["red", "green", "blue"]}},
            "required": ["color"],
        },
    ),
    (
        "Is Paris the capital of France?",
        {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]},
    ),
    (
        "What is the temperature in Paris today?",
        {
            "type": "object",
            "properties": {"celsius": {"type": "number"}},
            "required": ["celsius"],
        },
    ),
    (
        "List some fruits.",
        {
            "type": "object",
            "properties": {
                "fruits": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 20},
                    "minItems": 1,
                    "maxItems": 3,
                }
            },
            "required": ["fruits"],
        },
    ),
    (
        "Where is the Eiffel Tower?",
        {
            "type": "object",
            "properties": {
                "place": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 30},
                        "country": {"type": "string", "maxLength": 30},
                    },
                    "required": ["city", "country"],
                }
            },
            "required": ["place"],
        },
    ),
    (
        "Rate the movie Titanic from 1 to 5.",
        {
            "type": "object",
            "properties": {"rating": {"type": "integer", "minimum": 1, "maximum": 5}},
            "required": ["rating"],
        },
    ),
    (
        "Suggest a title for a blog post about cats.",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 40},
                "subtitle": {"type": "string", "maxLength": 40},
            },
            "required": ["title"],
        },
    ),
    (
        "Write a shopping list.",
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "maxItems": 3,
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "maxLength": 20},
                            "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                        },
                        "required": ["name", "qty"],
                        "additionalProperties": False,
                    },
                }
            },
            "required": ["items"],
        },
    ),
    (
        "Which version is this?",
        {"type": "object", "properties": {"version": {"const": "1.0"}}, "required": ["version"]},
    ),
    (
        "Give me a value.",
        {
            "type": "object",
            "properties": {"value": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}},
            "required": ["value"],
        },
    ),
    (
        "What is the zip code of the White House?",
        {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["zip"],
        },
    ),
    (
        "When did World War II end?",
        {
            "type": "object",
            "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
            "required": ["date"],
        },
    ),
    (
        "Give me a small matrix of numbers.",
        {
            "type": "object",
            "properties": {
                "matrix": {
                    "type": "array",
                    "maxItems": 2,
                    "items": {
                        "type": "array",
                        "maxItems": 2,
                        "items": {"type": "integer", "minimum": 0, "maximum": 9},
                    },
                }
            },
            "required": ["matrix"],
        },
    ),
    (
        "How difficult is chess, on a level of 1, 2 or 3?",
        {"type": "object", "properties": {"level": {"enum": [1, 2, 3]}}, "required": ["level"]},
    ),
    (
        "What is Barack Obama's middle name?",
        {
            "type": "object",
            "properties": {"middle_name": {"type": ["string", "null"], "maxLength": 20}},
            "required": ["middle_name"],
        },
    ),
    (
        "Tell me about a famous book.",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 40},
                "author": {"type": "string", "maxLength": 30},
                "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
            },
            "required": ["title", "author", "year"],
            "additionalProperties": False,
        },
    ),
    (
        "Create a todo item.",
        {
            "type": "object",
            "properties": {
                "task": {"type": "string", "maxLength": 40},
                "done": {"type": "boolean"},
                "tags": {"type": "array", "items": {"enum": ["home", "work"]}, "maxItems": 2},
            },
            "required": ["task", "done", "tags"],
        },
    ),
    (
        "Describe the weather.",
        {
            "type": "object",
            "properties": {
                "sky": {"enum": ["sunny", "cloudy", "rainy"]},
                "wind_kmh": {"type": "integer", "minimum": 0, "maximum": 200},
                "warning": {"type": ["boolean", "null"]},
            },
            "required": ["sky", "wind_kmh"],
        },
    ),
    (
        "Convert 2 hours to minutes.",
        {
            "type": "object",
            "properties": {
                "hours": {"type": "number"},
                "minutes": {"type": "integer", "minimum": 0, "maximum": 100000},
                "unit": {"const": "min"},
            },
            "required": ["hours", "minutes", "unit"],
        },
    ),
]


async def test_twenty_schemas_every_answer_parses_and_validates(server) -> None:  # type: ignore[no-untyped-def]
    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=300)

    async def one(question: str, schema: dict[str, Any]) -> tuple[str, Any]:
        out = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question + " Answer in JSON."}],
            max_tokens=120,
            temperature=0,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema, "strict": True},
            },
        )
        return out.choices[0].finish_reason, out.choices[0].message.content

    results = await asyncio.gather(*(one(q, s) for q, s in SCHEMAS))
    assert len(SCHEMAS) == 20
    for (question, schema), (finish, text) in zip(SCHEMAS, results, strict=True):
        assert finish == "stop", (question, text)
        jsonschema.validate(json.loads(text), schema)


def test_json_object_mode_gives_a_json_object(client: OpenAI) -> None:
    out = ask(
        client,
        "Give the name and age of a cat as JSON.",
        max_tokens=120,
        response_format={"type": "json_object"},
    )
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(out.choices[0].message.content), dict)


def test_an_unsupported_strict_schema_is_a_400_naming_it(server) -> None:  # type: ignore[no-untyped-def]
    status, body = post(
        server,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "strict": True,
                    "schema": {"type": "object", "properties": {"a": {"type": "wat"}}},
                },
            },
        },
    )
    assert status == 400
    assert body["error"]["param"] == "response_format.json_schema.schema"
