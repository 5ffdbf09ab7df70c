"""A GGUF Gemma 3 sees through llama.cpp's mmproj, as a user reaches it (issue 26): a hub repo
(the local test hub) ships a tiny Gemma 3 GGUF and, beside it, the mmproj that llama.cpp's
own converter wrote for the same checkpoint (tests/fixtures/gemma3_mmproj_llamacpp_f16.gguf);
`llmd pull hf.co/ORG/REPO:F32` fetches both, and the served model answers image requests
with the OpenAI and Ollama clients. A repo without an mmproj gives a GGUF that refuses images
with the 400 it always did.

Reference: the same GGUF run by the engine in this process, its image rows transformers'
recorded embeddings of the same images (tests/fixtures/gemma3_vision_transformers.npz), at
the prompt ids the tiny vocabulary gives: the first token's log-probabilities agree within
the served float16 KV's rounding, which they would not if the mmproj tower, the preprocessing
read from its metadata or the image token's place were wrong.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from openai import OpenAI

from tests.conftest import run_llmd
from tests.fakes.fake_hub import FakeHub
from tests.native.tiny_models import CONFIGS, GEMMA3_MULTIMODAL, write_gguf

ollama = pytest.importorskip("ollama")
native = pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

FIXTURES = Path(__file__).parents[1] / "fixtures"
MMPROJ = FIXTURES / "gemma3_mmproj_llamacpp_f16.gguf"
REF = np.load(FIXTURES / "gemma3_vision_transformers.npz")
IMAGES = np.load(FIXTURES / "gemma3_images_transformers.npz")
CASES = json.loads(REF["cases"].tobytes())
REPO, BLIND_REPO = "test-org/tiny-gemma3-vision-GGUF", "test-org/tiny-gemma3-GGUF"
MODEL, BLIND = f"hf.co/{REPO}:F32", f"hf.co/{BLIND_REPO}:F32"
F16_TOLERANCE = 2e-3  # the served worker keeps KV in float16
CONTROL = 3  # llama.cpp's token type for special tokens
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m.content is string %}{{ m.content }}"
    "{% else %}{% for c in m.content %}{% if c.type == 'image' %}<start_of_image>"
    "{% else %}{{ c.text }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
)
# The tiny byte-level vocabulary: "ab" is token 5 (one merge), "\n" token 6; Gemma 3's image
# markers at the multimodal config's ids. "ab", an image, "ab" renders as "<bos>ab\n\n
# <start_of_image>16 x <image_soft_token><end_of_image>\n\nab".
BOI, EOI, SOFT = (
    GEMMA3_MULTIMODAL["boi_token_index"],
    GEMMA3_MULTIMODAL["eoi_token_index"],
    GEMMA3_MULTIMODAL["image_token_id"],
)
PROMPT = [1, 5, 6, 6, BOI, *[SOFT] * 16, EOI, 6, 6, 5]


def _png(name: str) -> str:
    return base64.b64encode(IMAGES[f"{name}.png"].tobytes()).decode()


def _gguf(path: Path) -> Path:
    """The multimodal checkpoint's decoder as a GGUF with a vocabulary and template that
    know Gemma 3's image markers."""
    vocabulary = {
        1: ("<bos>", CONTROL),
        2: ("<eos>", CONTROL),
        BOI: ("<start_of_image>", CONTROL),
        EOI: ("<end_of_image>", CONTROL),
        SOFT: ("<image_soft_token>", CONTROL),
    }
    config = {**CONFIGS["gemma3_text"], "final_logit_softcapping": None}
    write_gguf(
        path,
        "gemma3_text",
        config=config,
        vocabulary=vocabulary,
        extra_strings={"tokenizer.chat_template": TEMPLATE},
    )
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _gguf(tmp_path_factory.mktemp("gemma3-gguf") / "tiny-gemma3-vision-F32.gguf")


@pytest.fixture(scope="module")
def hub(model: Path) -> Iterator[FakeHub]:
    fake = FakeHub()
    fake.add_repo(
        REPO,
        {
            "tiny-gemma3-vision-F32.gguf": model,
            "mmproj-tiny-gemma3-vision-F16.gguf": MMPROJ,
            "README.md": b"# tiny Gemma 3 GGUF\n",
        },
    )
    fake.add_repo(BLIND_REPO, {"tiny-gemma3-F32.gguf": model})
    fake.start_in_thread()
    yield fake
    fake.stop_thread()


@pytest.fixture(scope="module")
def pulled(server, hub: FakeHub) -> str:  # type: ignore[no-untyped-def]
    env = {**server.env, "HF_ENDPOINT": hub.endpoint}
    for name in (MODEL, BLIND):
        out = run_llmd(env, "pull", name, timeout=300)
        assert out.returncode == 0, out.stderr
    return MODEL


def _reference(model: Path, image: str) -> np.ndarray:
    """First-token log-probabilities of PROMPT with transformers' embeddings of `image`."""
    from llmd.worker.vision import gemma3_layout, layout_images
    from tests.native.test_gemma3_vision import _pixels
    from tests.native.vision_scaffold import first_logprobs

    pixels = _pixels([image])
    ids, embedded = layout_images(
        PROMPT, [REF[f"{image}.embeddings"]], list(pixels), gemma3_layout(GEMMA3_MULTIMODAL)
    )
    engine = native.Engine(str(model), context_length=256, max_sequences=2, kv_type="f32")
    return first_logprobs(engine, "ref", ids, embedded)[0]


def test_pull_fetches_the_mmproj_into_the_manifest(server, hub: FakeHub, pulled: str) -> None:  # type: ignore[no-untyped-def]
    assert hub.requests("cdn", "mmproj-tiny-gemma3-vision-F16.gguf")
    manifests = {
        json.loads(f.read_text())["name"]: json.loads(f.read_text())
        for f in Path(server.home).rglob("manifests/*.json")
    }
    mmproj = Path(manifests[MODEL]["mmproj"])
    assert mmproj.read_bytes() == MMPROJ.read_bytes()
    assert manifests[BLIND]["mmproj"] == ""
    shown = run_llmd(server.env, "show", MODEL)
    assert "mmproj (vision tower)" in shown.stdout, shown.stdout
    # What clients read before offering image input.
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    listed = {m.id: m for m in client.models.list()}
    assert listed[MODEL].capabilities["vision"] is True  # type: ignore[attr-defined]
    assert listed[BLIND].capabilities["vision"] is False  # type: ignore[attr-defined]
    olla = ollama.Client(host=server.base_url)
    assert "vision" in (olla.show(MODEL).capabilities or [])
    assert "vision" not in (olla.show(BLIND).capabilities or [])


def test_openai_image_answers_like_transformers_embeddings(
    server,  # type: ignore[no-untyped-def]
    pulled: str,
    model: Path,
) -> None:
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    ids = {f"<t{i}>": i for i in range(CONFIGS["gemma3_text"]["vocab_size"])}
    ids.update({"a": 3, "b": 4, "ab": 5, "\n": 6, "<bos>": 1, "<eos>": 2})
    ids.update({"<start_of_image>": BOI, "<end_of_image>": EOI, "<image_soft_token>": SOFT})

    def ask(image: str):  # type: ignore[no-untyped-def]
        url = "data:image/png;base64," + _png(image)
        content = [
            {"type": "text", "text": "ab"},
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "ab"},
        ]
        return client.chat.completions.create(
            model=pulled,
            messages=[{"role": "user", "content": content}],  # type: ignore[misc,list-item]
            max_tokens=1,
            temperature=0,
            logprobs=True,
            top_logprobs=20,
        )

    for image in CASES:
        want = _reference(model, image)
        out = ask(image)
        assert out.usage is not None and out.usage.prompt_tokens == len(PROMPT)
        top = out.choices[0].logprobs.content[0].top_logprobs  # type: ignore[union-attr,index]
        assert len(top) == 20
        scale = float(np.abs(want[np.isfinite(want)]).max())
        for alt in top:
            assert abs(alt.logprob - want[ids[alt.token]]) / scale < F16_TOLERANCE, (image, alt)
    # The same image again: all but the last prompt token from the prefix cache.
    again = ask(CASES[-1])
    details = again.usage.prompt_tokens_details  # type: ignore[union-attr]
    assert details is not None and details.cached_tokens == len(PROMPT) - 1
    # What an operator reads on /metrics: each image through the tower once (time counted),
    # the repeat's rows from the worker's cache of recent images.
    metrics = _model_metrics(server.base_url, pulled)
    assert metrics["llmd_images_encoded_total"] == len(CASES)
    assert metrics["llmd_image_cache_hits_total"] == 1
    assert 0 < metrics["llmd_image_encode_seconds_total"] < 60


def _model_metrics(base_url: str, model: str) -> dict[str, float]:
    """/metrics' samples labelled with `model` alone, by name."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels == {"model": model}
    }


def test_ollama_images_are_seen(server, pulled: str) -> None:  # type: ignore[no-untyped-def]
    """Ollama's base64 `images`: placed before the message's text, as Ollama does: PROMPT
    less its first "ab"."""
    chat = ollama.Client(host=server.base_url).chat(
        model=pulled,
        messages=[{"role": "user", "content": "ab", "images": [_png(CASES[0])]}],
        options={"num_predict": 1, "temperature": 0},
    )
    assert chat.prompt_eval_count == len(PROMPT) - 1


def test_gguf_without_an_mmproj_refuses_images(server, pulled: str) -> None:  # type: ignore[no-untyped-def]
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    url = "data:image/png;base64," + _png(CASES[0])
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=BLIND,
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}
            ],  # type: ignore[misc,list-item]
            max_tokens=1,
        )
    assert err.value.code == "model_cannot_see"


def test_the_vision_tower_loads_with_the_model(server, pulled: str) -> None:  # type: ignore[no-untyped-def]
    """The mmproj's tower is read and laid out for the kernels while the model loads, not by
    the first image request, and /status and `llmd status` say so with its share of the load: a
    text request is enough to have it loaded."""
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    client.chat.completions.create(
        model=pulled, messages=[{"role": "user", "content": "ab"}], max_tokens=1
    )
    with urllib.request.urlopen(server.base_url + "/status", timeout=30) as r:
        models = {m["name"]: m for m in json.loads(r.read())["models"]}
    vision = models[pulled]["vision"]
    assert vision["architecture"] == "gemma3"
    assert vision["tokens_per_image"] == 16  # the tiny tower's pooled grid: PROMPT's image rows
    assert 0 < vision["load_ms"] <= models[pulled]["load_ms"]
    shown = run_llmd(server.env, "status")
    assert "vision tower gemma3 loaded" in shown.stdout, shown.stdout
