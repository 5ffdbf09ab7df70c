"""What the served vision tests (Gemma 3, Gemma 4, Qwen3.5) share: the tiny checkpoints'
word-level tokenizer with a family's image markers as special tokens, and the fixture
images as base64 PNG. One writer, so a change to how tiny vision models are tokenized is
made once (the last review found three copies)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np

from tests.native.vision_scaffold import log_softmax

FIXTURES = Path(__file__).parents[1] / "fixtures"
IMAGES = np.load(FIXTURES / "gemma3_images_transformers.npz")


def chat_template(image_marker: str) -> str:
    """A chat template that writes each text part followed by a space and `image_marker` for
    each image part, as the released templates place an image's placeholder."""
    return (
        "{{ bos_token }}{% for m in messages %}{% if m.content is string %}{{ m.content }} "
        "{% else %}{% for c in m.content %}{% if c.type == 'image' %}"
        + image_marker
        + "{% else %}{{ c.text }} {% endif %}{% endfor %}{% endif %}{% endfor %}"
    )


def write_word_tokenizer(
    directory: Path, vocab_size: int, image_tokens: dict[str, int], template: str
) -> dict[str, int]:
    """Words wN -> N, `<bos>` 1, `<eos>` 2 and `image_tokens` at their config ids, all special
    tokens; writes tokenizer.json and tokenizer_config.json into `directory`. Returns the
    vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = {"<bos>": 1, "<eos>": 2, **image_tokens}
    words = {f"w{i}": i for i in range(vocab_size)}
    for special, i in specials.items():
        del words[f"w{i}"]
        words[special] = i
    tk = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.add_special_tokens(list(specials))
    tk.save(str(directory / "tokenizer.json"))
    config = {
        "chat_template": template,
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "add_bos_token": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return words


def png_b64(name: str) -> str:
    """The fixture image `name` as base64 PNG, as a client would send it."""
    return base64.b64encode(IMAGES[f"{name}.png"].tobytes()).decode()


def openai_two_image_answer(base_url: str, model: str, cases: list[str]) -> Any:
    """The fixtures' prompt (w5 w17 w33, image 1, w40 w41, image 2, w9 w60 w61) sent with the
    OpenAI client as `image_url` data URLs: one greedy token with its top 20 logprobs."""
    from openai import OpenAI

    url = "data:image/png;base64,"
    content = [
        {"type": "text", "text": "w5 w17 w33"},
        {"type": "image_url", "image_url": {"url": url + png_b64(cases[0])}},
        {"type": "text", "text": "w40 w41"},
        {"type": "image_url", "image_url": {"url": url + png_b64(cases[1])}},
        {"type": "text", "text": "w9 w60 w61"},
    ]
    client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": content}],  # type: ignore[misc,list-item]
        max_tokens=1,
        temperature=0,
        logprobs=True,
        top_logprobs=20,
    )


def assert_first_token_matches(
    out: Any, vocab: dict[str, int], logits: np.ndarray, prompt_tokens: int, tolerance: float
) -> tuple[Any, float]:
    """The answer's prompt length, greedy token and 20 top logprobs equal the reference's
    (within `tolerance` of its largest logit). Returns the first token's logprobs and that
    scale, for the caller's own check that the reference differs from an ablated one."""
    want = log_softmax(logits)
    scale = float(np.abs(logits).max())
    token = {i: t for t, i in vocab.items()}
    assert out.usage is not None and out.usage.prompt_tokens == prompt_tokens
    first = out.choices[0].logprobs.content[0]
    assert first.token == token[int(np.argmax(want))]
    assert len(first.top_logprobs) == 20
    for alt in first.top_logprobs:
        assert abs(alt.logprob - want[vocab[alt.token]]) / scale < tolerance, alt
    return first, scale


def pull_tiny_vision(
    server: Any,
    directory: Path,
    model: str,
    write_checkpoint: Any,
    vocab_size: int,
    image_tokens: dict[str, int],
    template: str,
) -> dict[str, int]:
    """Write a tiny multimodal checkpoint (`write_checkpoint(directory)`) with the word
    tokenizer, pull it into the running daemon as `model`, and return its vocabulary."""
    from tests.conftest import run_llmd

    write_checkpoint(directory)
    words = write_word_tokenizer(directory, vocab_size, image_tokens, template)
    pulled = run_llmd(server.env, "pull", str(directory), "--name", model, timeout=300)
    assert pulled.returncode == 0, pulled.stderr
    return words


def anthropic_image(name: str) -> dict:
    """The fixture image `name` as an Anthropic base64 image block."""
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": png_b64(name)},
    }


def anthropic_two_image_content(cases: list[str]) -> list[dict]:
    """The fixtures' prompt as Anthropic content blocks, images in their order."""
    return [
        {"type": "text", "text": "w5 w17 w33"},
        anthropic_image(cases[0]),
        {"type": "text", "text": "w40 w41"},
        anthropic_image(cases[1]),
        {"type": "text", "text": "w9 w60 w61"},
    ]


def assert_anthropic_answers_greedy(
    base_url: str, model: str, ref: Any, vocab: dict[str, int], prompt_tokens: int
) -> None:
    """Anthropic's base64 image blocks in the fixture's order make the same prompt, and greedy
    decoding gives the reference's first two tokens (`next_token`, then the argmax of
    `next_logits`)."""
    import anthropic

    token = {i: t for t, i in vocab.items()}
    claude = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0)
    out = claude.messages.create(
        model=model,
        max_tokens=2,
        extra_body={"temperature": 0},
        messages=[
            {
                "role": "user",
                "content": anthropic_two_image_content(json.loads(ref["cases"].tobytes())),
            }
        ],  # type: ignore[typeddict-item]
    )
    assert out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0) == prompt_tokens
    first, second = int(ref["next_token"][0]), int(np.argmax(ref["next_logits"]))
    assert out.content[0].text.split() == [token[first], token[second]]  # type: ignore[union-attr]


def assert_ollama_images_seen(
    base_url: str, model: str, cases: list[str], prompt_tokens: int
) -> None:
    """Ollama's `images` (base64) on /api/chat and /api/generate, placed before the message's
    text as Ollama does: both prompts come to `prompt_tokens` (bos, each image's layout, the
    three words)."""
    import ollama

    olla = ollama.Client(host=base_url)
    pngs = [png_b64(cases[0]), png_b64(cases[1])]
    chat = olla.chat(
        model=model,
        messages=[{"role": "user", "content": "w5 w17 w33", "images": pngs}],
        options={"num_predict": 1, "temperature": 0},
    )
    assert chat.prompt_eval_count == prompt_tokens
    gen = olla.generate(model=model, prompt="w5 w17 w33", images=pngs, options={"num_predict": 1})
    assert gen.prompt_eval_count == prompt_tokens
