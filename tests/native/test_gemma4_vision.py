"""Gemma 4's vision encoder (native/mlx/gemma4_vision.cpp) and its image rows in the Gemma 4
decoder (native/mlx/gemma4.cpp), against transformers.

A tiny random Gemma4ForConditionalGeneration (tiny_models.write_gemma4_multimodal: a 2-layer
encoder with 4x4 patches pooled 3x3, a 2-D position table and 2-D rotary, grouped heads,
clipped linears, standardized soft tokens) encodes two images of different shapes (18x30 and
36x15 patches: 60 tokens each); transformers' embeddings and logits are in
tests/fixtures/gemma4_vision_transformers.npz (recorded by
tests/fixtures/record_gemma4_vision.py). The images are preprocessed by llmd's own
gemma4_images.preprocess, so the whole path from PNG bytes to logits is compared.

The decoder is the gemma4_text test model (sliding window 5, per-layer inputs, KV sharing):
with use_bidirectional_attention "vision" an image's rows see the whole image on the sliding
layers and stay causal on the full ones; with None (the small released models) they are
causal everywhere, and the prefill may cut through an image.

Tolerance: 1e-4 of the largest value, as test_gemma3_vision.py: both sides compute in float32
from the same bf16-representable weights and differ only in summation order.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from . import vision_scaffold as vs
from .tiny_models import GEMMA4_PREPROCESSOR, write_gemma4_multimodal

native = pytest.importorskip("llmd._engine")

FIXTURE = Path(__file__).parents[1] / "fixtures" / "gemma4_vision_transformers.npz"
IMAGES = Path(__file__).parents[1] / "fixtures" / "gemma3_images_transformers.npz"
TOLERANCE = 1e-4
F16_TOLERANCE = 4e-3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gemma4_mm")
    write_gemma4_multimodal(path)
    return path


@pytest.fixture(scope="module")
def causal_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gemma4_mm_causal")
    write_gemma4_multimodal(path, bidirectional=None)
    return path


def _images() -> list[np.ndarray]:
    """The fixture's images through llmd's Gemma 4 preprocessing (the tiny config), as the
    worker receives them: (grid rows, grid columns, values per patch)."""
    from llmd.text.gemma4_images import Gemma4ImageConfig, preprocess
    from llmd.text.images import decode_image

    images = np.load(IMAGES)
    ref = np.load(FIXTURE)
    cfg = Gemma4ImageConfig.from_hf(GEMMA4_PREPROCESSOR)
    out = []
    for name in json.loads(ref["cases"].tobytes()):
        px = preprocess(decode_image(images[f"{name}.png"].tobytes(), "p").pixels, cfg)
        # Same patches and positions as transformers' processor made, so a mismatch below is
        # the model's.
        assert np.abs(px.patches - ref[f"{name}.patches"]).max() < 1e-6
        assert (px.positions == ref[f"{name}.positions"]).all()
        out.append(px.patches.reshape(*px.grid, px.patches.shape[1]))
    return out


def _encode(tower, images: list[np.ndarray]) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    patches = np.concatenate([im.reshape(-1, im.shape[2]) for im in images])
    return tower.encode_patches(patches, [(1, im.shape[0], im.shape[1]) for im in images])


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_image_embeddings_match_transformers(checkpoint: Path, backend: str) -> None:
    ref = np.load(FIXTURE)
    names = json.loads(ref["cases"].tobytes())
    images = _images()
    assert [im.shape for im in images] == [(18, 30, 48), (36, 15, 48)]
    tower = vs.tower(checkpoint, backend)
    assert (tower.architecture, tower.image_size, tower.hidden_size) == ("gemma4", 0, 64)
    assert (tower.patch_values, tower.merge_size) == (48, 3)
    out = _encode(tower, images)  # both images, of different grids, in one pass
    assert [o.shape for o in out] == [(60, 64), (60, 64)]
    for emb, name in zip(out, names, strict=True):
        assert vs.rel(emb, ref[f"{name}.embeddings"]) < TOLERANCE, name
    assert vs.rel(out[0], out[1]) > 0.1
    # Alone, an image encodes the same: attention and pooling stay inside each image.
    alone = _encode(tower, images[1:])[0]
    assert np.abs(alone - out[1]).max() <= 1e-5 * np.abs(out[1]).max()


def test_bad_patches_are_refused(checkpoint: Path) -> None:
    tower = vs.tower(checkpoint, "cpu")
    with pytest.raises(ValueError, match="does not pool 3x3"):
        tower.encode_patches(np.zeros((40, 48), dtype=np.float32), [(1, 4, 10)])
    with pytest.raises(ValueError, match="only still images"):
        tower.encode_patches(np.zeros((18, 48), dtype=np.float32), [(2, 3, 3)])
    with pytest.raises(ValueError, match="exceeds the position table's 64 a side"):
        tower.encode_patches(np.zeros((198, 48), dtype=np.float32), [(1, 66, 3)])
    with pytest.raises(ValueError, match="any size as patches"):
        tower.encode(np.zeros((1, 3, 12, 12), dtype=np.float32))


def _image_prompt(checkpoint: Path, backend: str = "cpu") -> tuple[list[int], list]:
    """The fixture's prompt with the image rows as the worker lays them out."""
    from llmd.worker.host import multimodal_config
    from llmd.worker.vision import gemma4_layout, layout_images

    ref = np.load(FIXTURE)
    images = _images()
    embeddings = _encode(vs.tower(checkpoint, backend), images)
    layout = gemma4_layout(multimodal_config(str(checkpoint)) or {})
    return layout_images(ref["prompt_ids"].tolist(), embeddings, images, layout)


@pytest.mark.parametrize("budget", [512, 16])
@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_image_prompt_logits_match_transformers(
    checkpoint: Path, backend: str, budget: int
) -> None:
    """use_bidirectional_attention "vision": the last prompt position's logits on llmd's CPU
    backend and on the device graph (MLX's CPU device). Budget 16: the prefill runs in chunks,
    each image's 60 rows kept in one of them (they see one another)."""
    ref = np.load(FIXTURE)
    prompt, embedded = _image_prompt(checkpoint, backend)
    assert [(first, bidir) for first, _, bidir in embedded] == [(5, True), (69, True)]
    lp, done = vs.first_logprobs(
        vs.engine(checkpoint, backend, step_token_budget=budget), "a", prompt, embedded
    )
    want = vs.log_softmax(ref["logits"][-1])
    scale = float(np.abs(ref["logits"][-1]).max())
    assert np.abs(lp - want).max() / scale < TOLERANCE
    assert done["prompt_tokens"] == len(prompt)
    # Causal image rows give other logits: the test tells the two masks apart.
    assert np.abs(lp - vs.log_softmax(ref["causal_logits"][-1])).max() / scale > 1e-2


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_decode_after_the_images_matches_transformers(checkpoint: Path, backend: str) -> None:
    """The second generated token's logits: the first token decoded after the image rows."""
    ref = np.load(FIXTURE)
    prompt, embedded = _image_prompt(checkpoint, backend)
    tokens, logprobs, _ = vs.generate(vs.engine(checkpoint, backend), "a", prompt, embedded, 2)
    assert tokens[0] == int(ref["next_token"][0])  # greedy, as the recording
    scale = float(np.abs(ref["next_logits"]).max())
    assert np.abs(logprobs[1] - vs.log_softmax(ref["next_logits"])).max() / scale < TOLERANCE


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_causal_images_prefill_in_chunks_through_an_image(
    causal_checkpoint: Path, backend: str
) -> None:
    """use_bidirectional_attention None: image rows causal like text, so a budget of 7 rows
    cuts through both images; transformers' logits (without mm_token_type_ids) for the last
    prompt position and after the first generated token."""
    ref = np.load(FIXTURE)
    prompt, embedded = _image_prompt(causal_checkpoint, backend)
    assert [bidir for _, _, bidir in embedded] == [False, False]
    engine = vs.engine(causal_checkpoint, backend, step_token_budget=7)
    tokens, logprobs, done = vs.generate(engine, "a", prompt, embedded, 2)
    assert done["prompt_tokens"] == len(prompt)
    scale = float(np.abs(ref["causal_logits"][-1]).max())
    assert np.abs(logprobs[0] - vs.log_softmax(ref["causal_logits"][-1])).max() / scale < TOLERANCE
    assert tokens[0] == int(ref["causal_next_token"][0])
    scale = float(np.abs(ref["causal_next_logits"]).max())
    assert np.abs(logprobs[1] - vs.log_softmax(ref["causal_next_logits"])).max() / scale < TOLERANCE


def test_same_images_reuse_the_cache_and_other_images_do_not(checkpoint: Path) -> None:
    """The same images again: their rows come from the prefix cache (Gemma 4 reuses whole
    64-row KV blocks, here two: the first image and all but the last row of the second, as a
    text prompt of the same length reuses) and the answer is the same. The images swapped:
    other surrogate ids from the first image on, so nothing past the text before it."""
    engine = vs.engine(checkpoint)
    prompt, embedded = _image_prompt(checkpoint)
    first, done = vs.first_logprobs(engine, "a", prompt, embedded)
    assert done["cached_tokens"] == 0
    again, done = vs.first_logprobs(engine, "b", prompt, embedded)
    assert done["cached_tokens"] == 128
    assert np.abs(again - first).max() < 1e-5
    swapped = [
        (first_row, emb, bidir)
        for (first_row, _, bidir), (_, emb, _) in zip(embedded, embedded[::-1], strict=True)
    ]
    other = list(prompt)
    other[5:65], other[69:129] = prompt[69:129], prompt[5:65]
    _, done = vs.first_logprobs(engine, "c", other, swapped)
    assert done["cached_tokens"] < 5


def test_worker_takes_gemma4_images(checkpoint: Path) -> None:
    """The worker process as the daemon starts it: it reports the `vision` feature, encodes
    the patches sent with a generate request and answers with transformers' logits; a grid
    the tower cannot pool is that request's error, and the worker goes on."""
    from .conftest import worker_process

    ref = np.load(FIXTURE)
    prompt = ref["prompt_ids"].tolist()
    images = [vs.image_input(im) for im in _images()]
    with worker_process(checkpoint, "cpu") as (proc, ready):
        assert "vision" in ready["features"]
        tokens, done = vs.worker_turn(proc, "a", prompt, images)
        assert done["type"] == "done", done
        top = dict(tokens[0]["logprobs"][0]["top"])
        want = vs.log_softmax(ref["logits"][-1])
        scale = float(np.abs(ref["logits"][-1]).max())
        # The worker keeps KV in float16 (2^-11 relative rounding per key and value): 2.7e-3
        # here, the same as the engine with float16 KV in process (Gemma 3's model: < 2e-3).
        assert max(abs(v - want[t]) for t, v in top.items()) / scale < F16_TOLERANCE
        bad = [vs.image_input(np.zeros((4, 9, 48), dtype=np.float32))] * 2
        _, err = vs.worker_turn(proc, "b", prompt, bad)
        assert err["type"] == "error" and "the grid in multiples of 3" in err["message"]
        _, again = vs.worker_turn(proc, "c", prompt, images)
        assert again["type"] == "done" and again["cached_tokens"] == 128
