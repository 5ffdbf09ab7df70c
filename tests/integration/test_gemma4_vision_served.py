"""Gemma 4 sees, through `llmd serve` as a user reaches it (issue 26): a tiny random
Gemma4ForConditionalGeneration directory (tests/native/tiny_models.py) pulled into the
running daemon and asked about two images of different shapes with the OpenAI client. The
first generated token's log-probabilities equal transformers'
(tests/fixtures/gemma4_vision_transformers.npz, recorded by
tests/fixtures/record_gemma4_vision.py for the same prompt and images): the daemon resized and
patched each image as transformers' processor does (keeping its aspect ratio within the soft
token budget), laid out `<|image>`, one `<|image|>` per soft token and `<image|>`, and the
worker encoded them and let each image's rows see one another on the sliding layers.
Anthropic's image blocks get transformers' greedy answer; Ollama's `images` reach the same
layout; audio parts stay a 400.

The tiny tokenizer maps word `wN` to id N; its chat template writes `<|image|>` for each image
part, as the released template does."""

from __future__ import annotations

import json

import numpy as np
import openai
import pytest
from openai import OpenAI

from tests.integration.vision_served import (
    FIXTURES,
    assert_anthropic_answers_greedy,
    assert_first_token_matches,
    assert_ollama_images_seen,
    chat_template,
    openai_two_image_answer,
    pull_tiny_vision,
)
from tests.integration.vision_served import log_softmax as _log_softmax
from tests.native.tiny_models import CONFIGS, GEMMA4_MULTIMODAL, write_gemma4_multimodal

ollama = pytest.importorskip("ollama")
pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

# The served worker keeps KV in float16 (2^-11 relative rounding per key and value): on this
# model up to 2.7e-3 of the largest logit over the whole vocabulary (test_gemma4_vision.py).
F16_TOLERANCE = 4e-3

TEMPLATE = chat_template("<|image|>")


MODEL = "tiny-gemma4-vision"
REF = np.load(FIXTURES / "gemma4_vision_transformers.npz")
CASES = json.loads(REF["cases"].tobytes())
PROMPT = REF["prompt_ids"].tolist()
SOFT_TOKENS = 60  # each of the two images: 18x30 and 36x15 patches pooled 3x3


@pytest.fixture(scope="module")
def vocab(server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """The tiny multimodal Gemma 4 (its preprocessor_config.json beside it) pulled into the
    daemon; its vocabulary."""
    mm = GEMMA4_MULTIMODAL
    return pull_tiny_vision(
        server,
        tmp_path_factory.mktemp("tiny-gemma4-vision"),
        MODEL,
        write_gemma4_multimodal,
        CONFIGS["gemma4_text"]["vocab_size"],
        {
            "<|image>": mm["boi_token_id"],
            "<image|>": mm["eoi_token_id"],
            "<|image|>": mm["image_token_id"],
            "<|video|>": mm["video_token_id"],
            "<|audio|>": mm["audio_token_id"],
        },
        TEMPLATE,
    )


def test_openai_image_url_answers_like_transformers(server, vocab: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    # The fixture's prompt: w5 w17 w33, image 1 (60 tokens), w40 w41, image 2 (60), w9 w60 w61.
    out = openai_two_image_answer(server.base_url, MODEL, CASES)
    first, scale = assert_first_token_matches(
        out, vocab, REF["logits"][-1], len(PROMPT), F16_TOLERANCE
    )
    # With causal image rows the answer would be measurably different.
    causal = _log_softmax(REF["causal_logits"][-1])
    assert max(abs(a.logprob - causal[vocab[a.token]]) for a in first.top_logprobs) / scale > 1e-2


def test_anthropic_image_blocks_answer_like_transformers(server, vocab: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    """Anthropic's base64 image blocks in the fixture's order: the same prompt, and greedy
    decoding gives transformers' first two tokens."""
    assert_anthropic_answers_greedy(server.base_url, MODEL, REF, vocab, len(PROMPT))


def test_ollama_images_are_seen(server, vocab: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    """Ollama's `images` (base64) on /api/chat and /api/generate: placed before the message's
    text, as Ollama does, each laid out as its markers and one row per soft token."""
    assert_ollama_images_seen(server.base_url, MODEL, CASES, 1 + 2 * (2 + SOFT_TOKENS) + 3)


def test_audio_is_refused(server, vocab: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    """Gemma 4 checkpoints can carry an audio tower; llmd runs none, and says so rather than
    dropping the sound."""
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    audio = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": [{"type": "text", "text": "w5"}, audio]}],  # type: ignore[misc,list-item]
            max_tokens=1,
        )
    assert "input_audio" in str(err.value)
