"""Gemma 3 sees, through `llmd serve` as a user reaches it (issue 26): a tiny random
Gemma3ForConditionalGeneration directory (tests/native/tiny_models.py) pulled into the running
daemon, asked about two images with the OpenAI client. The first generated token's
log-probabilities equal transformers' (tests/fixtures/gemma3_vision_transformers.npz, recorded
by tests/fixtures/record_gemma3_vision.py for the same prompt and images), and the same
images asked about again come from the prefix cache.

The tiny tokenizer maps word `wN` to id N; its chat template writes Gemma 3's
`<start_of_image>` for each image part, as the released template does, and the daemon lays
each image out as transformers' processor does (gemma3_images.py)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from openai import OpenAI

from tests.conftest import run_llmd
from tests.native.tiny_models import CONFIGS, GEMMA3_MULTIMODAL, write_gemma3_multimodal

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

FIXTURES = Path(__file__).parents[1] / "fixtures"
# The served worker keeps KV in float16 (2^-11 relative rounding per key and value).
F16_TOLERANCE = 2e-3
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m.content is string %}{{ m.content }} "
    "{% else %}{% for c in m.content %}{% if c.type == 'image' %}<start_of_image>"
    "{% else %}{{ c.text }} {% endif %}{% endfor %}{% endif %}{% endfor %}"
)


def _tokenizer(directory: Path) -> dict[str, int]:
    """Words wN -> N, Gemma 3's image tokens at the config's ids, as special tokens. Returns
    the vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    mm = GEMMA3_MULTIMODAL
    images = {
        "<start_of_image>": mm["boi_token_index"],
        "<end_of_image>": mm["eoi_token_index"],
        "<image_soft_token>": mm["image_token_id"],
    }
    words = {f"w{i}": i for i in range(CONFIGS["gemma3_text"]["vocab_size"])}
    for special, i in {"<bos>": 1, "<eos>": 2, **images}.items():
        del words[f"w{i}"]
        words[special] = i
    tk = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.add_special_tokens(["<bos>", "<eos>", *images])
    tk.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": TEMPLATE,
                "bos_token": "<bos>",
                "eos_token": "<eos>",
                "add_bos_token": False,
            }
        )
    )
    return words


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def test_openai_image_url_answers_like_transformers(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ref = np.load(FIXTURES / "gemma3_vision_transformers.npz")
    images = np.load(FIXTURES / "gemma3_images_transformers.npz")
    cases = json.loads(ref["cases"].tobytes())
    configs = {c["name"]: c["config"] for c in json.loads(images["cases"].tobytes())}
    write_gemma3_multimodal(tmp_path)
    vocab = _tokenizer(tmp_path)
    token = {i: t for t, i in vocab.items()}
    # The 64x64 processor settings the fixture's images were preprocessed with.
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(configs[cases[0]]))
    pulled = run_llmd(
        server.env, "pull", str(tmp_path), "--name", "tiny-gemma3-vision", timeout=300
    )
    assert pulled.returncode == 0, pulled.stderr

    def url(name: str) -> str:
        return "data:image/png;base64," + base64.b64encode(images[f"{name}.png"].tobytes()).decode()

    # The fixture's prompt: w5 w17 w33, image 1, w40 w41, image 2, w9 w60 w61.
    content = [
        {"type": "text", "text": "w5 w17 w33"},
        {"type": "image_url", "image_url": {"url": url(cases[0])}},
        {"type": "text", "text": "w40 w41"},
        {"type": "image_url", "image_url": {"url": url(cases[1]), "detail": "high"}},
        {"type": "text", "text": "w9 w60 w61"},
    ]
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)

    def ask():  # type: ignore[no-untyped-def]
        return client.chat.completions.create(
            model="tiny-gemma3-vision",
            messages=[{"role": "user", "content": content}],  # type: ignore[misc,list-item]
            max_tokens=1,
            temperature=0,
            logprobs=True,
            top_logprobs=20,
        )

    out = ask()
    want = _log_softmax(ref["logits"][-1])
    scale = float(np.abs(ref["logits"][-1]).max())
    assert out.usage is not None and out.usage.prompt_tokens == len(ref["prompt_ids"])  # type: ignore[attr-defined]
    first = out.choices[0].logprobs.content[0]  # type: ignore[attr-defined]
    assert first.token == token[int(np.argmax(want))]
    assert len(first.top_logprobs) == 20
    for alt in first.top_logprobs:
        assert abs(alt.logprob - want[vocab[alt.token]]) / scale < F16_TOLERANCE, alt
    # The same images again: everything but the last prompt token comes from the cache.
    again = ask()
    details = again.usage.prompt_tokens_details  # type: ignore[attr-defined]
    assert details is not None and details.cached_tokens == len(ref["prompt_ids"]) - 1
    assert again.choices[0].logprobs.content[0].token == first.token  # type: ignore[attr-defined]
    # Another second image behind the same placeholder tokens: the cache stops where it
    # starts (the text and first image before it: 25 tokens).
    content[3] = {"type": "image_url", "image_url": {"url": url(cases[0])}}
    other = ask()
    details = other.usage.prompt_tokens_details  # type: ignore[attr-defined]
    assert details is not None and details.cached_tokens == 25
