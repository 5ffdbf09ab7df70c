"""Images through `llmd serve` with the official clients (issue 26): every protocol parses
its image parts, a bad image is a 400 naming the part in the client's own words, and an image
sent to a model that cannot see (the test model is text-only) is a 400 saying so, never
dropped. Remote URLs are refused unless the daemon runs with `--allow-remote-images`."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from openai import OpenAI
from PIL import Image

from tests.conftest import LiveServer, serving

ollama = pytest.importorskip("ollama")
pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

MODEL = "smollm2-135m"


def png(size: tuple[int, int] = (16, 12)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


B64 = base64.b64encode(png()).decode()
DATA_URL = f"data:image/png;base64,{B64}"
BROKEN = base64.b64encode(b"\x89PNG\r\n\x1a\n but not really").decode()


@pytest.fixture(scope="module")
def oai(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(server: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.base_url, api_key="unused", max_retries=0, timeout=120
    )


@pytest.fixture(scope="module")
def olla(server: LiveServer) -> Any:
    return ollama.Client(host=server.base_url)


def _openai_error(call: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    body = info.value.body
    assert isinstance(body, dict)
    return body


def _chat(oai: OpenAI, url: str, **extra: Any) -> Any:
    image = {"type": "image_url", "image_url": {"url": url, **extra}}
    return oai.chat.completions.create(
        model=MODEL,
        max_tokens=4,
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]},
        ],
    )


def test_openai_chat_image_to_a_text_only_model_says_it_cannot_see(oai: OpenAI) -> None:
    err = _openai_error(lambda: _chat(oai, DATA_URL, detail="high"))
    assert "cannot see images" in err["message"] and MODEL in err["message"]
    assert err["param"] == "messages.[2].content.[1]" and err["code"] == "model_cannot_see"


def test_openai_chat_bad_image_is_named(oai: OpenAI) -> None:
    err = _openai_error(lambda: _chat(oai, f"data:image/png;base64,{BROKEN}"))
    assert err["param"] == "messages.[2].content.[1]" and "PNG, JPEG, WebP or GIF" in err["message"]


def test_openai_remote_image_needs_the_switch(oai: OpenAI) -> None:
    err = _openai_error(lambda: _chat(oai, "https://example.com/cat.png"))
    assert "--allow-remote-images" in err["message"]


def test_openai_text_still_answers(oai: OpenAI) -> None:
    """Text parts alone are unchanged: the image machinery costs a text request nothing."""
    out = oai.chat.completions.create(
        model=MODEL,
        max_tokens=4,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say hi"}]}],
    )
    assert out.choices[0].message.content


def test_responses_input_image(oai: OpenAI) -> None:
    content: Any = [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": DATA_URL, "detail": "auto"},
    ]
    err = _openai_error(
        lambda: oai.responses.create(
            model=MODEL, max_output_tokens=4, input=[{"role": "user", "content": content}]
        )
    )
    assert "cannot see images" in err["message"] and err["param"] == "input[0].content[1]"
    content[1]["image_url"] = "data:image/png;base64,@@"
    err = _openai_error(
        lambda: oai.responses.create(
            model=MODEL, max_output_tokens=4, input=[{"role": "user", "content": content}]
        )
    )
    assert "base64" in err["message"] and err["param"] == "input[0].content[1]"


def _anthropic_error(claude: anthropic.Anthropic, content: list[dict[str, Any]]) -> Any:
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": content}]
        )
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    return body["error"]


def test_anthropic_image_blocks(claude: anthropic.Anthropic) -> None:
    source = {"type": "base64", "media_type": "image/png", "data": B64}
    err = _anthropic_error(
        claude, [{"type": "text", "text": "What is this?"}, {"type": "image", "source": source}]
    )
    assert err["type"] == "invalid_request_error" and "cannot see images" in err["message"]
    broken = {**source, "data": BROKEN}
    err = _anthropic_error(claude, [{"type": "image", "source": broken}])
    assert "messages.0.content.0" in err["message"]
    remote = {"type": "url", "url": "https://example.com/cat.png"}
    err = _anthropic_error(claude, [{"type": "image", "source": remote}])
    assert "--allow-remote-images" in err["message"]


def test_anthropic_screenshot_in_a_tool_result(claude: anthropic.Anthropic) -> None:
    """What an agent sends after a screenshot tool ran: the image inside the tool result."""
    source = {"type": "base64", "media_type": "image/png", "data": B64}
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(
            model=MODEL,
            max_tokens=4,
            tools=[{"name": "screenshot", "input_schema": {"type": "object"}}],
            messages=[
                {"role": "user", "content": "Take a screenshot."},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "t1", "name": "screenshot", "input": {}}
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "image", "source": source}],
                        }
                    ],
                },
            ],
        )
    assert "cannot see images" in str(info.value)


def test_anthropic_count_tokens_refuses_images_too(claude: anthropic.Anthropic) -> None:
    source = {"type": "base64", "media_type": "image/png", "data": B64}
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.count_tokens(
            model=MODEL,
            messages=[{"role": "user", "content": [{"type": "image", "source": source}]}],
        )
    assert "cannot see images" in str(info.value)


def test_ollama_chat_and_generate_images(olla: Any) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        olla.chat(
            model=MODEL,
            messages=[{"role": "user", "content": "What is this?", "images": [png()]}],
        )
    assert info.value.status_code == 400 and "cannot see images" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        olla.generate(model=MODEL, prompt="What is this?", images=[png()])
    assert info.value.status_code == 400 and "cannot see images" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        olla.chat(
            model=MODEL,
            messages=[{"role": "user", "content": "What is this?", "images": [BROKEN]}],
        )
    assert "messages[0].images[0]" in info.value.error


@pytest.fixture(scope="module")
def remote_server(model_path: Any) -> Iterator[LiveServer]:
    with serving("--allow-remote-images") as live:
        yield live


def test_with_the_switch_a_remote_url_reaches_the_model_check(remote_server: LiveServer) -> None:
    """With `--allow-remote-images` the URL is acceptable; the text-only model still cannot
    see it (and nothing is fetched for it: example.invalid does not resolve)."""
    oai = OpenAI(base_url=remote_server.base_url + "/v1", api_key="unused", max_retries=0)
    err = _openai_error(lambda: _chat(oai, "https://example.invalid/cat.png"))
    assert err["code"] == "model_cannot_see"
