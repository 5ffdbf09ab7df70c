"""A GGUF Qwen3.5-MoE sees through llama.cpp's mmproj, as a user reaches it (issue 26): a hub
repo (the local test hub) ships the tiny Qwen3.5-MoE as llama.cpp's converter writes it
(`qwen35moe`, tests/native/tiny_qwen35_gguf.py) and beside it its `qwen3vl_merger` mmproj (F16,
as repos publish it); `llmd pull hf.co/ORG/REPO:F32` fetches both, and the served model
answers image requests with the OpenAI and Ollama clients.

Reference: the same GGUF and mmproj run in this process (test_qwen3_5_mmproj.py holds those
to transformers), the image preprocessed with the settings the daemon reads from the mmproj
(llama.cpp's Qwen-VL pixel limits: the tiny 4x4-pixel patches merged 2x2 take an image at its
size, rounded to multiples of 8), laid out one `<|image_pad|>` row per merged token at M-RoPE
positions. The first token's log-probabilities agree within the served float16 KV's rounding,
which they would not if the daemon's preprocessing, the token count or the positions were
wrong.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from openai import OpenAI

from tests.conftest import run_llmd
from tests.fakes.fake_hub import FakeHub
from tests.native.tiny_models import QWEN3_5_MULTIMODAL
from tests.native.tiny_qwen35_gguf import write_qwen3_5_mmproj, write_qwen35moe_gguf

ollama = pytest.importorskip("ollama")
native = pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

FIXTURES = Path(__file__).parents[1] / "fixtures"
IMAGES = np.load(FIXTURES / "gemma3_images_transformers.npz")
CASES = ["pan_crops_too_small", "small_tiny_upscaled"]  # 24 and 12 image tokens: within the context
REPO = "test-org/tiny-qwen3.5-vision-GGUF"
MODEL = f"hf.co/{REPO}:F32"
F16_TOLERANCE = 2e-3  # the served worker keeps KV in float16
VOCAB = 128
START, END, PAD = (
    QWEN3_5_MULTIMODAL["vision_start_token_id"],
    QWEN3_5_MULTIMODAL["vision_end_token_id"],
    QWEN3_5_MULTIMODAL["image_token_id"],
)
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m.content is string %}{{ m.content }}"
    "{% else %}{% for c in m.content %}{% if c.type == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ c.text }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
)


def _png(name: str) -> bytes:
    return IMAGES[f"{name}.png"].tobytes()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The GGUF with a byte-level vocabulary ("ab" is token 5 by one merge) and a template
    without spaces, and the F16 mmproj."""
    d = tmp_path_factory.mktemp("qwen35-gguf-served")
    vocabulary = {3: ("a", 1), 4: ("b", 1), 5: ("ab", 1), 6: ("\u010a", 1)}
    model = write_qwen35moe_gguf(
        d / "tiny-qwen3.5-vision-F32.gguf",
        vocabulary=vocabulary,
        merges=["a b"],
        template=TEMPLATE,
    )
    return {"model": model, "mmproj": write_qwen3_5_mmproj(d / "mmproj-F16.gguf", "F16")}


@pytest.fixture(scope="module")
def hub(files: dict[str, Path]) -> Iterator[FakeHub]:
    fake = FakeHub()
    fake.add_repo(
        REPO,
        {
            "tiny-qwen3.5-vision-F32.gguf": files["model"],
            "mmproj-tiny-qwen3.5-vision-F16.gguf": files["mmproj"],
            "README.md": b"# tiny Qwen3.5-MoE GGUF\n",
        },
    )
    fake.start_in_thread()
    yield fake
    fake.stop_thread()


@pytest.fixture(scope="module")
def pulled(server, hub: FakeHub) -> str:  # type: ignore[no-untyped-def]
    out = run_llmd({**server.env, "HF_ENDPOINT": hub.endpoint}, "pull", MODEL, timeout=300)
    assert out.returncode == 0, out.stderr
    assert hub.requests("cdn", "mmproj-tiny-qwen3.5-vision-F16.gguf")
    return MODEL


def _reference(files: dict[str, Path], image: str) -> tuple[list[int], np.ndarray]:
    """The prompt "ab", image, "ab" as the daemon should lay it out, and its first-token
    log-probabilities from the GGUF and mmproj in this process (float32 KV)."""
    from llmd.store.gguf_metadata import read_gguf_metadata
    from llmd.text.images import decode_image
    from llmd.text.qwen_images import QwenImageConfig, preprocess
    from llmd.worker.vision import content_digest, surrogate_ids
    from tests.native.vision_scaffold import first_logprobs as _first_logprobs

    cfg = QwenImageConfig.from_mmproj(read_gguf_metadata(files["mmproj"]))
    patches, (_, h, w) = preprocess(decode_image(_png(image), "p").pixels, cfg)
    emb = native.VisionTower(str(files["mmproj"]), {}).encode_patches(patches, [(1, h, w)])[0]
    n = len(emb)
    prompt = [1, 5, START, *[PAD] * n, END, 5]
    ids = list(prompt)
    ids[3 : 3 + n] = surrogate_ids(content_digest(patches), n)
    engine = native.Engine(str(files["model"]), context_length=256, max_sequences=2, kv_type="f32")
    lp = _first_logprobs(engine, "ref", ids, [(3, emb, False, (h // 2, w // 2))])[0]
    return prompt, lp


def test_pull_fetches_the_mmproj_and_the_model_can_see(server, pulled: str, files) -> None:  # type: ignore[no-untyped-def]
    manifests = {
        json.loads(f.read_text())["name"]: json.loads(f.read_text())
        for f in Path(server.home).rglob("manifests/*.json")
    }
    assert Path(manifests[MODEL]["mmproj"]).read_bytes() == files["mmproj"].read_bytes()
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    listed = {m.id: m for m in client.models.list()}
    assert listed[MODEL].capabilities["vision"] is True  # type: ignore[attr-defined]


def test_openai_image_answers_as_the_engine_does(server, pulled: str, files) -> None:  # type: ignore[no-untyped-def]
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    ids = {f"w{i}": i for i in range(VOCAB)}
    ids.update({"a": 3, "b": 4, "ab": 5, "\n": 6, "<bos>": 1, "<eos>": 2})
    ids.update({"<|vision_start|>": START, "<|vision_end|>": END, "<|image_pad|>": PAD})
    ids.update({"<|video_pad|>": QWEN3_5_MULTIMODAL["video_token_id"]})
    for image in CASES:
        prompt, want = _reference(files, image)
        url = "data:image/png;base64," + base64.b64encode(_png(image)).decode()
        out = client.chat.completions.create(
            model=pulled,
            messages=[
                {
                    "role": "user",
                    "content": [  # type: ignore[list-item]
                        {"type": "text", "text": "ab"},
                        {"type": "image_url", "image_url": {"url": url}},
                        {"type": "text", "text": "ab"},
                    ],
                }
            ],
            max_tokens=1,
            temperature=0,
            logprobs=True,
            top_logprobs=20,
        )
        assert out.usage is not None and out.usage.prompt_tokens == len(prompt), image
        top = out.choices[0].logprobs.content[0].top_logprobs  # type: ignore[union-attr,index]
        assert len(top) == 20
        scale = float(np.abs(want[np.isfinite(want)]).max())
        for alt in top:
            assert abs(alt.logprob - want[ids[alt.token]]) / scale < F16_TOLERANCE, (image, alt)


def test_ollama_images_are_seen(server, pulled: str, files) -> None:  # type: ignore[no-untyped-def]
    """Ollama's base64 `images`, placed before the message's text: the prompt less its
    first "ab", the image's rows as many as its merged grid."""
    prompt, _ = _reference(files, CASES[0])
    chat = ollama.Client(host=server.base_url).chat(
        model=pulled,
        messages=[
            {
                "role": "user",
                "content": "ab",
                "images": [base64.b64encode(_png(CASES[0])).decode()],
            }
        ],
        options={"num_predict": 1, "temperature": 0},
    )
    assert chat.prompt_eval_count == len(prompt) - 1
