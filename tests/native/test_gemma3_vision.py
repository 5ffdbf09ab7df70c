"""Gemma 3's vision tower and projector (native/mlx/siglip.cpp) against transformers.

A tiny random Gemma3ForConditionalGeneration (tiny_models.write_gemma3_multimodal: a 2-layer
SigLIP encoder on 64x64 images, 16 tokens per image) encodes two fixed images; transformers'
embeddings of the same images are in tests/fixtures/gemma3_vision_transformers.npz (recorded
by tests/fixtures/record_gemma3_vision.py). The images are preprocessed by llmd's own
gemma3_images.preprocess, as the daemon will, so the whole path from PNG bytes to embeddings
is compared.

Tolerance: 1e-4 of the largest embedding value. Both sides compute in float32 from the same
bf16-representable weights; what differs is summation order (BLAS vs llmd's GEMM, MLX's
attention): ~1e-6 relative per op here, far below any real mistake (a wrong pooling order,
a missing bias or norm moves values by 10% or more).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from . import vision_scaffold as vs
from .tiny_models import GEMMA3_VISION, write_gemma3_multimodal

native = pytest.importorskip("llmd._engine")

FIXTURE = Path(__file__).parents[1] / "fixtures" / "gemma3_vision_transformers.npz"
IMAGES = Path(__file__).parents[1] / "fixtures" / "gemma3_images_transformers.npz"
TOLERANCE = 1e-4
F16_TOLERANCE = 2e-3


def _pixels(names: list[str]) -> np.ndarray:
    """The fixture's images through llmd's Gemma 3 preprocessing (64x64 config)."""
    from PIL import Image

    from llmd.text.gemma3_images import Gemma3ImageConfig, preprocess

    images = np.load(IMAGES)
    configs = {c["name"]: c["config"] for c in json.loads(images["cases"].tobytes())}
    out = []
    for name in names:
        cfg = Gemma3ImageConfig.from_hf(configs[name])
        image = Image.open(io.BytesIO(images[f"{name}.png"].tobytes())).convert("RGB")
        views = preprocess(image, cfg)
        assert views.shape == (1, 3, 64, 64)
        out.append(views[0])
    return np.stack(out)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gemma3_mm")
    write_gemma3_multimodal(path)
    return path


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_image_embeddings_match_transformers(checkpoint: Path, backend: str) -> None:
    ref = np.load(FIXTURE)
    names = json.loads(ref["cases"].tobytes())
    pixels = _pixels(names)
    # Same pixels as transformers' processor saw, so a mismatch below is the tower's.
    for i, name in enumerate(names):
        assert np.abs(pixels[i] - ref[f"{name}.pixels"]).max() < 1e-6
    tower = vs.tower(checkpoint, backend)
    assert (tower.architecture, tower.image_size) == ("gemma3", GEMMA3_VISION["image_size"])
    assert (tower.tokens_per_image, tower.hidden_size) == (16, 64)
    out = tower.encode(pixels)  # both images in one batched pass
    assert out.shape == (2, 16, 64)
    for i, name in enumerate(names):
        assert vs.rel(out[i], ref[f"{name}.embeddings"]) < TOLERANCE, name
    # The two images differ, and so do their embeddings (nothing collapsed to a constant).
    assert vs.rel(out[0], out[1]) > 0.1


def test_an_image_encodes_the_same_alone_or_batched(checkpoint: Path) -> None:
    """Batching images of several requests must not change any one of them: attention stays
    inside each image."""
    ref = np.load(FIXTURE)
    names = json.loads(ref["cases"].tobytes())
    pixels = _pixels(names)
    tower = vs.tower(checkpoint, "cpu")
    both = tower.encode(pixels)
    for i in range(2):
        alone = tower.encode(pixels[i : i + 1])[0]
        assert np.abs(alone - both[i]).max() <= 1e-5 * np.abs(both[i]).max()


def test_wrong_pixel_shape_is_refused(checkpoint: Path) -> None:
    tower = vs.tower(checkpoint, "cpu")
    with pytest.raises(ValueError, match=r"pixels must be \[n, 3, 64, 64\]"):
        tower.encode(np.zeros((1, 3, 32, 32), dtype=np.float32))


def test_checkpoint_without_a_vision_tower_is_refused(tmp_path: Path) -> None:
    config = write_gemma3_multimodal(tmp_path)
    from .tiny_models import multimodal_text_weights, write_multimodal_checkpoint

    write_multimodal_checkpoint(
        tmp_path,
        "gemma3_text",
        multimodal_text_weights("gemma3_text", "language_model.model."),
        model_type="gemma3",
        architecture="Gemma3ForConditionalGeneration",
        vision_type="siglip_vision_model",
        vision_config=config["vision_config"],
    )
    with pytest.raises(RuntimeError, match="no vision tower"):
        vs.tower(tmp_path, "cpu")


# The engine: image rows spliced into a prompt (worker/vision.py lays them out), against
# transformers' logits for the fixture's two-image prompt (image tokens attending to their
# whole image, as transformers' generate does with the processor's token_type_ids).


def _image_prompt(checkpoint: Path, order: tuple[int, int] = (0, 1)) -> tuple[list[int], list]:
    from llmd.worker.host import multimodal_config
    from llmd.worker.vision import gemma3_layout, layout_images

    ref = np.load(FIXTURE)
    pixels = _pixels(json.loads(ref["cases"].tobytes()))[list(order)]
    embeddings = vs.tower(checkpoint, "cpu").encode(pixels)
    layout = gemma3_layout(multimodal_config(str(checkpoint)) or {})
    return layout_images(ref["prompt_ids"].tolist(), list(embeddings), list(pixels), layout)


@pytest.mark.parametrize("budget", [512, 8])
@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_image_prompt_logits_match_transformers(
    checkpoint: Path, backend: str, budget: int
) -> None:
    """On llmd's CPU kernels and on the device backend's graph (run on MLX's CPU device).
    Budget 8: the prefill runs in chunks, each image's 16 rows kept in one of them."""
    ref = np.load(FIXTURE)
    prompt, embedded = _image_prompt(checkpoint)
    assert [first for first, _, _ in embedded] == [5, 25]
    assert all(t < 0 for t in prompt[5:21]) and prompt[4] == 125 and prompt[21] == 126
    engine = vs.engine(checkpoint, backend, step_token_budget=budget)
    lp, done = vs.first_logprobs(engine, "a", prompt, embedded)
    want = vs.log_softmax(ref["logits"][-1])
    scale = float(np.abs(ref["logits"][-1]).max())
    assert np.abs(lp - want).max() / scale < TOLERANCE
    assert done["prompt_tokens"] == len(prompt)
    # Plain causal attention over the image rows gives other logits: the test can tell.
    assert np.abs(lp - vs.log_softmax(ref["causal_logits"][-1])).max() / scale > 1e-2


def test_same_image_reuses_the_cache_and_another_does_not(checkpoint: Path) -> None:
    engine = vs.engine(checkpoint)
    prompt, embedded = _image_prompt(checkpoint)
    first, _ = vs.first_logprobs(engine, "a", prompt, embedded)
    again, done = vs.first_logprobs(engine, "b", prompt, embedded)
    # The second turn with the same images prefills nothing but its last row.
    assert done["cached_tokens"] == len(prompt) - 1
    assert np.abs(again - first).max() < 1e-5
    # The second image swapped for the first: the same placeholder tokens, but its rows come
    # from another image, so the cache stops where that image starts.
    other, other_runs = _image_prompt(checkpoint, order=(0, 0))
    assert other[:25] == prompt[:25] and other[25:41] != prompt[25:41]
    _, done = vs.first_logprobs(engine, "c", other, other_runs)
    assert done["cached_tokens"] == 25


def test_image_rows_are_refused_where_the_model_cannot_take_them(
    checkpoint: Path, tmp_path: Path
) -> None:
    """Architectures whose forward does not read image rows yet: an error, never an image
    silently read as something else."""
    from .tiny_models import write_checkpoint

    prompt, embedded = _image_prompt(checkpoint)
    write_checkpoint(tmp_path, "qwen3")
    engine = vs.engine(tmp_path)
    engine.submit("a", prompt, 1, embedded=embedded)  # qwen3's hidden size is 64 too
    events = engine.poll(5000)
    assert [e["type"] for e in events] == ["error"]
    assert "cannot take image" in events[0]["message"]


def test_worker_takes_images_with_the_request(checkpoint: Path) -> None:
    """The worker process as the daemon starts it: it reports the `vision` feature, encodes
    the images sent with a generate request, and answers with transformers' logits; the same
    images again come from the prefix cache; images of the wrong size are that request's
    error, and the worker goes on."""
    from .conftest import worker_process

    ref = np.load(FIXTURE)
    names = json.loads(ref["cases"].tobytes())
    pixels = _pixels(names)
    prompt = ref["prompt_ids"].tolist()  # the placeholders as the daemon's tokenizer writes them
    images = [vs.image_input(p) for p in pixels]
    with worker_process(checkpoint, "cpu") as (proc, ready):
        assert "vision" in ready["features"]
        tokens, done = vs.worker_turn(proc, "a", prompt, images)
        assert done["type"] == "done", done
        top = dict(tokens[0]["logprobs"][0]["top"])
        want = vs.log_softmax(ref["logits"][-1])
        scale = float(np.abs(ref["logits"][-1]).max())
        # The worker keeps KV in float16 (2^-11 relative rounding per key and value).
        assert max(abs(v - want[t]) for t, v in top.items()) / scale < F16_TOLERANCE
        _, again = vs.worker_turn(proc, "b", prompt, images)
        assert again["cached_tokens"] == len(prompt) - 1
        bad = [vs.image_input(np.zeros((3, 32, 32), dtype=np.float32))] * 2
        _, err = vs.worker_turn(proc, "c", prompt, bad)
        assert err["type"] == "error" and "this model reads [3, 64, 64]" in err["message"]
        _, err = vs.worker_turn(proc, "d", prompt, images[:1])
        assert err["type"] == "error" and "more image runs than the 1 images" in err["message"]
        # Two requests at once (encoded on the image thread, together when both wait), and a
        # cancel of a third that has images: each ends as it would alone.
        from .conftest import read_event, send

        turn = {"type": "generate", "prompt": prompt, "sampling": {"top_logprobs": 127}}
        send(
            proc,
            {**turn, "id": "e", "max_tokens": 1, "images": images},
            {**turn, "id": "f", "max_tokens": 1, "images": images[::-1]},
            {**turn, "id": "g", "max_tokens": 200, "images": images},
            {"type": "cancel", "id": "g"},
        )
        first: dict[str, dict] = {}
        done: dict[str, dict] = {}
        while len(done) < 3:
            event = read_event(proc)
            assert event["type"] != "error", event
            if event["type"] == "tokens":
                first.setdefault(event["id"], event)
            elif event["type"] == "done":
                done[event["id"]] = event
        # Equal to the request served alone up to float rounding: batched with "f", or taking
        # its prefix from the cache, the products run over other row counts (seen ~2e-6 apart).
        top_e = dict(first["e"]["logprobs"][0]["top"])
        assert top_e.keys() == top.keys()
        assert max(abs(top_e[t] - top[t]) for t in top) < 1e-4
        top_f = dict(first["f"]["logprobs"][0]["top"])
        assert max(abs(top_f.get(t, -1e9) - top[t]) for t in top) > 1e-2  # the images swapped
        assert done["g"]["finish_reason"] == "cancelled"
        send(proc, {"type": "stats"})
        stats = read_event(proc)
        assert stats["type"] == "stats"
        # Only a's two images ran through the tower: every later request sent them again.
        assert stats["extra"]["images_encoded"] == 2
        assert stats["extra"]["image_cache_hits"] == 2 + 1 + 3 * 2  # b, d and e, f, g


def test_text_only_worker_refuses_images(tmp_path: Path) -> None:
    from .conftest import worker_process
    from .tiny_models import write_checkpoint

    write_checkpoint(tmp_path, "gemma3_text")
    pixels = np.zeros((3, 64, 64), dtype=np.float32)
    with worker_process(tmp_path, "cpu") as (proc, ready):
        assert "vision" not in ready["features"]
        _, err = vs.worker_turn(proc, "a", [1, 5, 127, 9], [vs.image_input(pixels)])
        assert err["type"] == "error" and err["code"] == "model_cannot_see"


def test_device_backend_worker_sees(checkpoint: Path) -> None:
    """The device backend's worker (MLX's graph, here on MLX's CPU device): the tower runs on
    the image thread with a stream of its own, the engine reads the rows with its own
    attention, and the answer is transformers'."""
    from .conftest import worker_process

    ref = np.load(FIXTURE)
    pixels = _pixels(json.loads(ref["cases"].tobytes()))
    with worker_process(checkpoint, "mlx-cpu") as (proc, ready):
        assert "vision" in ready["features"]
        tokens, done = vs.worker_turn(
            proc, "a", ref["prompt_ids"].tolist(), [vs.image_input(p) for p in pixels]
        )
        assert done["type"] == "done", done
    top = dict(tokens[0]["logprobs"][0]["top"])
    want = vs.log_softmax(ref["logits"][-1])
    scale = float(np.abs(ref["logits"][-1]).max())
    assert max(abs(v - want[t]) for t, v in top.items()) / scale < F16_TOLERANCE
