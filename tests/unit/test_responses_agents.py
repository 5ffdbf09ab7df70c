"""What coding agents send to `/v1/responses` (OpenAI's Codex CLI, from real captured request
bodies in tests/fixtures/agents/) and what they must get back: namespace tools called under
their namespace, freeform `custom` tools answered as `custom_tool_call` under their grammar,
hosted tools dropped, `encrypted_content` reasoning that round-trips with `store: false`, and
`prompt_cache_key` requests sharing one session (their prefix stays cached)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import Response

from llmd.api.response_store import open_reasoning, seal_reasoning
from llmd.api.responses_api import (
    assistant_message,
    chat_request,
    items_to_messages,
    normalize_input,
    output_items,
    parse_responses_request,
)
from llmd.api.responses_tools import custom_format, input_matches, read_tool_choice, read_tools
from llmd.errors import ApiError
from tests.unit.fake_api import MODEL, api, sent_to_worker

FIXTURES = Path(__file__).parent.parent / "fixtures" / "agents"
CODEX_REQUEST = FIXTURES / "codex_0.169.0_exec_request.json"
APPLY_PATCH = json.loads((FIXTURES / "codex_apply_patch_tool.json").read_text())["tool"]
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"


def codex_body() -> dict[str, Any]:
    """The request Codex 0.169.0 sent on `codex exec` (long texts trimmed)."""
    return json.loads(CODEX_REQUEST.read_text())


def _call(name: str, arguments: str, call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# ---------------------------------------------------------------------- the Codex request


def test_codex_request_is_accepted_as_sent() -> None:
    body = codex_body()
    req = parse_responses_request(body)
    chat = chat_request(req, items_to_messages(normalize_input(body["input"])), None)
    names = [t["function"]["name"] for t in chat.tools or []]
    # Its namespace's five functions are offered under `namespace.name`; web_search is not.
    assert "multi_agent_v1.spawn_agent" in names and "exec_command" in names
    assert len([n for n in names if n.startswith("multi_agent_v1.")]) == 5
    assert not any("web_search" in n for n in names)
    # No instructions: its system prompt arrives as developer messages, kept first.
    assert req.instructions is None and chat.messages[0].role == "developer"
    assert chat.tool_choice == "auto"


def test_hosted_tools_are_dropped_and_unknown_ones_refused() -> None:
    tools = read_tools([{"type": "web_search", "external_web_access": False}, {"type": "mcp"}])
    assert tools.chat_tools == [] and tools.dropped == ["web_search", "mcp"]
    with pytest.raises(ApiError) as err:
        read_tools([{"type": "hologram"}])
    assert err.value.param == "tools"
    with pytest.raises(ApiError):  # forcing a tool that cannot run here cannot be honoured
        read_tool_choice({"type": "web_search"}, tools)


def test_sampling_changing_unknown_parameters_are_still_refused() -> None:
    with pytest.raises(ApiError) as err:
        parse_responses_request({**codex_body(), "mirostat": 2})
    assert err.value.param == "mirostat"
    with pytest.raises(ApiError) as err:
        parse_responses_request({**codex_body(), "include": ["file_search_call.results"]})
    assert err.value.param == "include"


# ---------------------------------------------------------------------- namespace tools


def test_namespace_call_comes_back_with_its_namespace_and_round_trips() -> None:
    tools = read_tools(codex_body()["tools"])
    message = {"content": None, "tool_calls": [_call("multi_agent_v1.wait_agent", '{"ids": []}')]}
    [item] = output_items(message, "tool_calls", tools)
    assert item["type"] == "function_call"
    assert item["name"] == "wait_agent" and item["namespace"] == "multi_agent_v1"
    Response.model_validate(_response_with([item]))  # the shape OpenAI's SDK reads
    # Sent back next turn (as Codex does with store: false), the model sees its own name again.
    [msg] = items_to_messages(normalize_input([{k: v for k, v in item.items() if k != "id"}]))
    assert msg["tool_calls"][0]["function"]["name"] == "multi_agent_v1.wait_agent"
    assert assistant_message([item])["tool_calls"][0]["function"]["name"] == (
        "multi_agent_v1.wait_agent"
    )


def test_tool_choice_can_force_a_namespaced_function() -> None:
    tools = read_tools(codex_body()["tools"])
    plain = read_tool_choice({"type": "function", "name": "close_agent"}, tools)
    scoped = read_tool_choice(
        {"type": "function", "name": "close_agent", "namespace": "multi_agent_v1"}, tools
    )
    assert (
        plain.chat
        == scoped.chat
        == {
            "type": "function",
            "function": {"name": "multi_agent_v1.close_agent"},
        }
    )


# ---------------------------------------------------------------------- custom tools


def test_custom_tool_is_offered_as_one_string_argument_with_its_grammar() -> None:
    tools = read_tools([APPLY_PATCH])
    [tool] = tools.chat_tools
    fn = tool["function"]
    assert fn["name"] == "apply_patch"
    assert fn["parameters"]["required"] == ["input"]
    assert "*** Begin Patch" in fn["description"]  # the model is shown the grammar


def test_custom_call_is_answered_as_custom_tool_call_and_round_trips() -> None:
    tools = read_tools([APPLY_PATCH])
    message = {"content": "", "tool_calls": [_call("apply_patch", json.dumps({"input": PATCH}))]}
    [item] = output_items(message, "tool_calls", tools)
    assert item["type"] == "custom_tool_call" and item["name"] == "apply_patch"
    assert item["input"] == PATCH and item["call_id"] == "call_1"
    Response.model_validate(_response_with([item]))
    back = normalize_input(
        [
            {
                "type": "custom_tool_call",
                "call_id": "call_1",
                "name": "apply_patch",
                "input": PATCH,
            },
            {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done"},
        ]
    )
    assistant, tool = items_to_messages(back)
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"input": PATCH}
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": "Done"}


def test_forced_custom_call_makes_the_whole_answer_its_input() -> None:
    tools = read_tools([APPLY_PATCH])
    choice = read_tool_choice({"type": "custom", "name": "apply_patch"}, tools)
    assert choice.forced_custom is not None
    [item] = output_items({"content": PATCH}, "stop", tools, choice.forced_custom)
    assert item["type"] == "custom_tool_call" and item["input"] == PATCH


def test_custom_grammars_compile_and_bad_ones_are_400() -> None:
    assert custom_format({"type": "grammar", "syntax": "regex", "definition": "[a-z]+"}, "t")
    assert custom_format(None, "t").grammar() is None
    with pytest.raises(ApiError):
        custom_format({"type": "grammar", "syntax": "lark", "definition": "start: ("}, "t")
    with pytest.raises(ApiError):
        custom_format({"type": "grammar", "syntax": "ebnf", "definition": "x"}, "t")


def test_input_matches_the_apply_patch_grammar(text_model) -> None:  # type: ignore[no-untyped-def]
    fmt = custom_format(APPLY_PATCH["format"], "tools[0]")
    assert input_matches(fmt, PATCH, text_model)
    assert not input_matches(fmt, "please add hello.txt", text_model)
    assert not input_matches(fmt, PATCH.removesuffix("*** End Patch\n"), text_model)  # unfinished


# ---------------------------------------------------------------------- encrypted reasoning


def test_encrypted_content_round_trips_onto_the_assistant_turn() -> None:
    blob = seal_reasoning("I should say hi.")
    assert open_reasoning(blob) == "I should say hi."
    assert open_reasoning("gAAAAB-someone-elses") is None and open_reasoning(None) is None
    items = normalize_input(
        [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "summary": [], "encrypted_content": blob},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        ]
    )
    assert items[1]["encrypted_content"] == blob
    messages = items_to_messages(items)
    assert messages[1] == {
        "role": "assistant",
        "content": "Hello!",
        "reasoning_content": "I should say hi.",
    }


def test_reasoning_items_carry_encrypted_content_when_included() -> None:
    message = {"content": "Hi", "reasoning_content": "thinking"}
    sealed = output_items(message, "stop", seal=True)
    assert open_reasoning(sealed[0]["encrypted_content"]) == "thinking"
    assert "encrypted_content" not in output_items(message, "stop")[0]


def _response_with(output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "model": MODEL,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


# ---------------------------------------------------------------------- through the app


@pytest.fixture
def small_codex_body() -> dict[str, Any]:
    """The Codex request, short enough for the fake worker's context."""
    body = codex_body()
    body["input"] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Be brief."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    ]
    body["tools"] = [t for t in body["tools"] if t["type"] in ("web_search",)] + [APPLY_PATCH]
    return body


async def test_codex_shaped_stream_is_200_and_cache_key_pins_a_session(
    llmd_home: Path, small_codex_body: dict[str, Any]
) -> None:
    async with api(llmd_home, context=4096) as client:
        first = await client.post("/v1/responses", json=small_codex_body)
        raw = (await first.read()).decode()
        again = copy.deepcopy(small_codex_body)
        again["input"].append(
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ok"}]}
        )
        second = await client.post("/v1/responses", json={**again, "stream": False})
        body = await second.json()
        generates = sent_to_worker(client, "generate")
    assert first.status == 200, raw
    assert "response.completed" in raw
    assert second.status == 200, body
    sessions = {g["session"] for g in generates}
    assert len(sessions) == 1 and sessions.pop().startswith("responses.key.")
    assert body["prompt_cache_key"] == small_codex_body["prompt_cache_key"]
    assert body["store"] is False


async def test_forced_custom_call_sends_its_grammar_to_the_worker(llmd_home: Path) -> None:
    async with api(llmd_home, context=4096) as client:
        resp = await client.post(
            "/v1/responses",
            json={
                "model": MODEL,
                "input": "add hello.txt",
                "tools": [APPLY_PATCH],
                "tool_choice": {"type": "custom", "name": "apply_patch"},
                "max_output_tokens": 8,
            },
        )
        body = await resp.json()
        [generate] = sent_to_worker(client, "generate")
    assert resp.status == 200, body
    assert "*** Begin Patch" in generate["grammar"]
    [item] = body["output"]
    assert item["type"] == "custom_tool_call" and item["name"] == "apply_patch"
