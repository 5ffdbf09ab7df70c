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
from pathlib import Path

import anthropic
import numpy as np
import pytest

from tests.conftest import run_llmd
from tests.integration.vision_served import (
    FIXTURES,
    assert_first_token_matches,
    chat_template,
    openai_two_image_answer,
    write_word_tokenizer,
)
from tests.integration.vision_served import log_softmax as _log_softmax
from tests.integration.vision_served import png_b64 as _png
from tests.native.tiny_models import CONFIGS, QWEN3_5_MULTIMODAL, write_qwen3_5_moe_multimodal

ollama = pytest.importorskip("ollama")
pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

# The served worker keeps KV in float16 (2^-11 relative rounding per key and value).
F16_TOLERANCE = 2e-3

TEMPLATE = chat_template("<|vision_start|><|image_pad|><|vision_end|>")


def _tokenizer(directory: Path) -> dict[str, int]:
    """Words wN -> N, Qwen's vision tokens at the config's ids, as special tokens. Returns the vocabulary."""
    mm = QWEN3_5_MULTIMODAL
    return write_word_tokenizer(
        directory,
        CONFIGS["qwen3_5_moe_text"]["vocab_size"],
        {
            "<|video_pad|>": mm["video_token_id"],
            "<|vision_start|>": mm["vision_start_token_id"],
            "<|vision_end|>": mm["vision_end_token_id"],
            "<|image_pad|>": mm["image_token_id"],
        },
        TEMPLATE,
    )


MODEL = "tiny-qwen3.5-vision"
REF = np.load(FIXTURES / "qwen3_5_vision_transformers.npz")
CASES = json.loads(REF["cases"].tobytes())
PROMPT = REF["prompt_ids"].tolist()


@pytest.fixture(scope="module")
def vocab(server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """The tiny multimodal Qwen3.5 (its preprocessor_config.json beside it) pulled into the
    daemon; its vocabulary."""
    path = tmp_path_factory.mktemp("tiny-qwen3.5-vision")
    write_qwen3_5_moe_multimodal(path)
    words = _tokenizer(path)
    pulled = run_llmd(server.env, "pull", str(path), "--name", MODEL, timeout=300)
    assert pulled.returncode == 0, pulled.stderr
    return words


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
    token = {i: t for t, i in vocab.items()}
    claude = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)

    def image(name: str) -> dict:
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": _png(name)},
        }

    out = claude.messages.create(
        model=MODEL,
        max_tokens=2,
        extra_body={"temperature": 0},
        messages=[
            {
                "role": "user",
                "content": [  # type: ignore[list-item]
                    {"type": "text", "text": "w5 w17 w33"},
                    image(CASES[0]),
                    {"type": "text", "text": "w40 w41"},
                    image(CASES[1]),
                    {"type": "text", "text": "w9 w60 w61"},
                ],
            }
        ],
    )
    assert out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0) == len(PROMPT)
    first, second = int(REF["next_token"][0]), int(np.argmax(REF["next_logits"]))
    assert out.content[0].text.split() == [token[first], token[second]]  # type: ignore[union-attr]


def test_ollama_images_are_seen(server, vocab: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    """Ollama's `images` (base64) on /api/chat and /api/generate: placed before the message's
    text, as Ollama does, each laid out as its markers and one row per merged token (12 and
    10 here: the images' own shapes, not a fixed count)."""
    olla = ollama.Client(host=server.base_url)
    pngs = [_png(CASES[0]), _png(CASES[1])]
    chat = olla.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "w5 w17 w33", "images": pngs}],
        options={"num_predict": 1, "temperature": 0},
    )
    assert chat.prompt_eval_count == 1 + (2 + 12) + (2 + 10) + 3
    gen = olla.generate(model=MODEL, prompt="w5 w17 w33", images=pngs, options={"num_predict": 1})
    assert gen.prompt_eval_count == 1 + (2 + 12) + (2 + 10) + 3
