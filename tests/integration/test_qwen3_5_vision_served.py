"""Qwen3.5 sees, through `llmd serve` as a user reaches it (issue 26): a tiny random
Qwen3_5MoeForConditionalGeneration directory (tests/native/tiny_models.py) pulled into the
running daemon and asked about two images of different shapes with the OpenAI client. The
first generated token's log-probabilities equal transformers'
(tests/fixtures/qwen3_5_vision_transformers.npz, recorded by
tests/fixtures/record_qwen3_5_vision.py for the same prompt and images): the daemon resized
and patched each image as transformers' processor does, laid out one `<|image_pad|>` per
merged token, and the worker encoded them and placed their rows at M-RoPE positions.
Anthropic's image blocks get transformers' greedy answer; Ollama's `images` reach the same
layout.

The tiny tokenizer maps word `wN` to id N; its chat template writes
`<|vision_start|><|image_pad|><|vision_end|>` for each image part, as the released template
does."""

from __future__ import annotations

import json

import numpy as np
import pytest

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
from tests.native.tiny_models import CONFIGS, QWEN3_5_MULTIMODAL, write_qwen3_5_moe_multimodal

ollama = pytest.importorskip("ollama")
pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

# The served worker keeps KV in float16 (2^-11 relative rounding per key and value).
F16_TOLERANCE = 2e-3

TEMPLATE = chat_template("<|vision_start|><|image_pad|><|vision_end|>")


MODEL = "tiny-qwen3.5-vision"
REF = np.load(FIXTURES / "qwen3_5_vision_transformers.npz")
CASES = json.loads(REF["cases"].tobytes())
PROMPT = REF["prompt_ids"].tolist()


@pytest.fixture(scope="module")
def vocab(server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """The tiny multimodal Qwen3.5 (its preprocessor_config.json beside it) pulled into the
    daemon; its vocabulary."""
    mm = QWEN3_5_MULTIMODAL
    return pull_tiny_vision(
        server,
        tmp_path_factory.mktemp("tiny-qwen3.5-vision"),
        MODEL,
        write_qwen3_5_moe_multimodal,
        CONFIGS["qwen3_5_moe_text"]["vocab_size"],
        {
            "<|video_pad|>": mm["video_token_id"],
            "<|vision_start|>": mm["vision_start_token_id"],
            "<|vision_end|>": mm["vision_end_token_id"],
            "<|image_pad|>": mm["image_token_id"],
        },
        TEMPLATE,
    )


def test_openai_image_url_answers_like_transformers(server, vocab: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    # The fixture's prompt: w5 w17 w33, image 1 (12 tokens), w40 w41, image 2 (10), w9 w60 w61.
    out = openai_two_image_answer(server.base_url, MODEL, CASES)
    first, scale = assert_first_token_matches(
        out, vocab, REF["logits"][-1], len(PROMPT), F16_TOLERANCE
    )
    # Without M-RoPE (every row at its index) the answer would be measurably different.
    plain = _log_softmax(REF["text_position_logits"][-1])
    assert max(abs(a.logprob - plain[vocab[a.token]]) for a in first.top_logprobs) / scale > 1e-2


def test_anthropic_image_blocks_answer_like_transformers(server, vocab: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    """Anthropic's base64 image blocks in the fixture's order: the same prompt, and greedy
    decoding gives transformers' first two tokens (the second one decoded at its M-RoPE
    position after the images)."""
    assert_anthropic_answers_greedy(server.base_url, MODEL, REF, vocab, len(PROMPT))


def test_ollama_images_are_seen(server, vocab: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    """Ollama's `images` (base64) on /api/chat and /api/generate: placed before the message's
    text, as Ollama does, each laid out as its markers and one row per merged token (12 and
    10 here: the images' own shapes, not a fixed count)."""
    assert_ollama_images_seen(server.base_url, MODEL, CASES, 1 + (2 + 12) + (2 + 10) + 3)
