"""Gemma 3 sees, through `llmd serve` as a user reaches it (issue 26): a tiny random
Gemma3ForConditionalGeneration directory (tests/native/tiny_models.py) pulled into the running
daemon, asked about two images with the OpenAI (chat and Responses), Anthropic and Ollama
clients. Through OpenAI's chat the first generated token's log-probabilities equal
transformers' (tests/fixtures/gemma3_vision_transformers.npz, recorded by
tests/fixtures/record_gemma3_vision.py for the same prompt and images); the same images asked
about again come from the prefix cache, another image does not; the other protocols reach
the same prompt, images included (its KV reused).

The tiny tokenizer maps word `wN` to id N; its chat template writes Gemma 3's
`<start_of_image>` for each image part, as the released template does, and the daemon lays
each image out as transformers' processor does (gemma3_images.py)."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import numpy as np
import pytest
from openai import OpenAI

from tests.integration.vision_served import (
    FIXTURES,
    IMAGES,
    anthropic_two_image_content,
    assert_ollama_images_seen,
    chat_template,
    pull_tiny_vision,
)
from tests.integration.vision_served import log_softmax as _log_softmax
from tests.integration.vision_served import png_b64 as _png
from tests.native.tiny_models import CONFIGS, GEMMA3_MULTIMODAL, write_gemma3_multimodal

ollama = pytest.importorskip("ollama")
pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

# The served worker keeps KV in float16 (2^-11 relative rounding per key and value).
F16_TOLERANCE = 2e-3


TEMPLATE = chat_template("<start_of_image>")


MODEL = "tiny-gemma3-vision"
REF = np.load(FIXTURES / "gemma3_vision_transformers.npz")
CASES = json.loads(REF["cases"].tobytes())
PROMPT = REF["prompt_ids"].tolist()


def _url(name: str) -> str:
    return "data:image/png;base64," + _png(name)


@pytest.fixture(scope="module")
def vocab(server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """The tiny multimodal Gemma 3 pulled into the daemon; its vocabulary."""
    configs = {c["name"]: c["config"] for c in json.loads(IMAGES["cases"].tobytes())}

    def write(path: Path) -> None:
        write_gemma3_multimodal(path)
        # The 64x64 processor settings the fixture's images were preprocessed with.
        (path / "preprocessor_config.json").write_text(json.dumps(configs[CASES[0]]))

    mm = GEMMA3_MULTIMODAL
    return pull_tiny_vision(
        server,
        tmp_path_factory.mktemp("tiny-gemma3-vision"),
        MODEL,
        write,
        CONFIGS["gemma3_text"]["vocab_size"],
        {
            "<start_of_image>": mm["boi_token_index"],
            "<end_of_image>": mm["eoi_token_index"],
            "<image_soft_token>": mm["image_token_id"],
        },
        TEMPLATE,
    )


def test_openai_image_url_answers_like_transformers(server, vocab: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    token = {i: t for t, i in vocab.items()}
    # The fixture's prompt: w5 w17 w33, image 1, w40 w41, image 2, w9 w60 w61.
    content = [
        {"type": "text", "text": "w5 w17 w33"},
        {"type": "image_url", "image_url": {"url": _url(CASES[0])}},
        {"type": "text", "text": "w40 w41"},
        {"type": "image_url", "image_url": {"url": _url(CASES[1]), "detail": "high"}},
        {"type": "text", "text": "w9 w60 w61"},
    ]
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)

    def ask():  # type: ignore[no-untyped-def]
        return client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": content}],  # type: ignore[misc,list-item]
            max_tokens=1,
            temperature=0,
            logprobs=True,
            top_logprobs=20,
        )

    out = ask()
    want = _log_softmax(REF["logits"][-1])
    scale = float(np.abs(REF["logits"][-1]).max())
    assert out.usage is not None and out.usage.prompt_tokens == len(PROMPT)
    first = out.choices[0].logprobs.content[0]  # type: ignore[union-attr,index]
    assert first.token == token[int(np.argmax(want))]
    assert len(first.top_logprobs) == 20
    for alt in first.top_logprobs:
        assert abs(alt.logprob - want[vocab[alt.token]]) / scale < F16_TOLERANCE, alt
    # The same images again: everything but the last prompt token comes from the cache.
    again = ask()
    details = again.usage.prompt_tokens_details  # type: ignore[union-attr]
    assert details is not None and details.cached_tokens == len(PROMPT) - 1
    assert again.choices[0].logprobs.content[0].token == first.token  # type: ignore[union-attr,index]
    # Another second image behind the same placeholder tokens: the cache stops where it
    # starts (the text and first image before it: 25 tokens).
    content[3] = {"type": "image_url", "image_url": {"url": _url(CASES[0])}}
    other = ask()
    details = other.usage.prompt_tokens_details  # type: ignore[union-attr]
    assert details is not None and details.cached_tokens == 25


def test_anthropic_image_blocks_reach_the_same_prompt(server, vocab: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    """Anthropic's base64 image blocks in the fixture's order make the same prompt, images
    included: the KV of the OpenAI test's identical request is reused (same ids, same image
    hashes), which it could not be if an image were dropped or read differently."""
    claude = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)

    content = anthropic_two_image_content(CASES)
    for _ in range(2):  # the first may follow the OpenAI test's turns or not: the second hits
        out = claude.messages.create(
            model=MODEL,
            max_tokens=1,
            messages=[{"role": "user", "content": content}],  # type: ignore[list-item]
        )
    usage = out.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == len(PROMPT)
    assert usage.cache_read_input_tokens == len(PROMPT) - 1


def test_ollama_images_are_seen(server, vocab: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    """Ollama's `images` (base64) on /api/chat and /api/generate: placed before the message's
    text, as Ollama does, each laid out as 18 tokens (markers and 16 image rows)."""
    assert_ollama_images_seen(server.base_url, MODEL, CASES, 1 + 2 * 18 + 3)


def test_responses_input_image_reaches_the_same_prompt(server, vocab: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    """The Responses API's input_image parts in the fixture's order: the same prompt, its
    KV reused from the earlier identical requests."""
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    content = [
        {"type": "input_text", "text": "w5 w17 w33"},
        {"type": "input_image", "image_url": _url(CASES[0]), "detail": "auto"},
        {"type": "input_text", "text": "w40 w41"},
        {"type": "input_image", "image_url": _url(CASES[1]), "detail": "auto"},
        {"type": "input_text", "text": "w9 w60 w61"},
    ]
    for _ in range(2):  # the second hits the cache whatever ran before
        out = client.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": content}],  # type: ignore[list-item,misc]
            max_output_tokens=1,
        )
    assert out.usage is not None and out.usage.input_tokens == len(PROMPT)
    assert out.usage.input_tokens_details.cached_tokens == len(PROMPT) - 1
