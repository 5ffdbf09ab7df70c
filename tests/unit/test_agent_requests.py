"""The requests the real agent CLIs sent (captured from Claude Code 2.1.332, opencode 1.18.33
and Qwen Code 0.24.4 against llmd; tests/fixtures/agents/, bodies exact) pass llmd's request
validation as sent, and mean what they say. Codex's are in test_responses_agents.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmd.api.anthropic_schemas import translate_messages
from llmd.text.openai_schemas import ChatCompletionRequest, parse_request

FIXTURES = Path(__file__).parents[1] / "fixtures" / "agents"


def body_of(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())["body"]


def test_claude_code_request_is_accepted_without_its_billing_header() -> None:
    body = body_of("claude_messages_request.json")
    assert body["system"][0]["text"].startswith("x-anthropic-billing-header:")
    chat = translate_messages(body).chat
    system = chat.messages[0]
    assert system.role == "system" and "x-anthropic-billing-header" not in system.text()
    assert system.text().startswith("You are a Claude agent")
    # Its environment block, a system message after the user's, stays a system turn.
    assert [m.role for m in chat.messages] == ["system", "user", "system"]
    deferred = {t["name"] for t in body["tools"] if t.get("defer_loading")}
    offered = {t["function"]["name"] for t in chat.tools or []}
    assert deferred and not deferred & offered and offered
    assert chat.max_tokens == 32000  # clamped to the context when it runs, not refused


@pytest.mark.parametrize(
    "fixture",
    ["opencode_chat_request.json", "opencode_title_request.json", "qwen_chat_request.json"],
)
def test_openai_chat_agents_requests_are_accepted_as_sent(fixture: str) -> None:
    req = parse_request(body_of(fixture), ChatCompletionRequest)
    assert req.stream and req.messages
    assert req.session_id is None  # opencode's x-session-id header is not llmd's session
