"""Qwen3.5's vision encoder (native/mlx/qwen_vision.cpp) and its image rows in the
Qwen3.5-MoE decoder with M-RoPE positions (native/mlx/qwen3_5_moe.cpp), against transformers.

A tiny random Qwen3_5MoeForConditionalGeneration (tiny_models.write_qwen3_5_moe_multimodal:
a 2-block encoder with 4x4 patches merged 2x2, learned positions on a 4x4 grid resampled to
each image's grid) encodes two images of different shapes (6x8 and 10x4 patches: 12 and 10
tokens); transformers' embeddings and logits are in tests/fixtures/qwen3_5_vision_transformers.npz
(recorded by tests/fixtures/record_qwen3_5_vision.py). The images are preprocessed by llmd's
own qwen_images.preprocess, so the whole path from PNG bytes to logits is compared.

Tolerance: 1e-4 of the largest value, as test_gemma3_vision.py: both sides compute in float32
from the same bf16-representable weights and differ only in summation order.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from . import vision_scaffold as vs
from .tiny_models import QWEN3_5_MULTIMODAL, QWEN3_5_PREPROCESSOR, write_qwen3_5_moe_multimodal

native = pytest.importorskip("llmd._engine")

FIXTURE = Path(__file__).parents[1] / "fixtures" / "qwen3_5_vision_transformers.npz"
IMAGES = Path(__file__).parents[1] / "fixtures" / "gemma3_images_transformers.npz"
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3_5_mm")
    write_qwen3_5_moe_multimodal(path)
    return path


def _images(names: list[str]) -> list[tuple[np.ndarray, tuple[int, int, int]]]:
    """The fixture's images through llmd's Qwen3.5 preprocessing (the tiny config)."""
    from llmd.text.images import decode_image
    from llmd.text.qwen_images import QwenImageConfig, preprocess

    images = np.load(IMAGES)
    cfg = QwenImageConfig.from_hf(QWEN3_5_PREPROCESSOR)
    return [preprocess(decode_image(images[f"{n}.png"].tobytes(), "p").pixels, cfg) for n in names]


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_image_embeddings_match_transformers(checkpoint: Path, backend: str) -> None:
    ref = np.load(FIXTURE)
    names = json.loads(ref["cases"].tobytes())
    images = _images(names)
    tower = vs.tower(checkpoint, backend)
    assert (tower.architecture, tower.image_size, tower.hidden_size) == ("qwen3_5_moe", 0, 64)
    assert (tower.patch_values, tower.merge_size) == (96, 2)
    # Both images, of different grids, in one pass.
    out = tower.encode_patches(np.concatenate([p for p, _ in images]), [g for _, g in images])
    assert [o.shape for o in out] == [(12, 64), (10, 64)]
    for emb, name in zip(out, names, strict=True):
        assert vs.rel(emb, ref[f"{name}.embeddings"]) < TOLERANCE, name
    # Alone, an image encodes the same: attention stays inside each image.
    alone = tower.encode_patches(images[1][0], [images[1][1]])[0]
    assert np.abs(alone - out[1]).max() <= 1e-5 * np.abs(out[1]).max()


def test_a_large_image_matches_transformers(checkpoint: Path) -> None:
    """2112 patches (a 48x44 grid): more than one attention chunk of the tower (2048 query
    rows at a time, so a released-size image's scores fit in memory)."""
    ref = np.load(FIXTURE)
    grid = tuple(ref["big.grid_thw"].tolist())
    patches = np.random.default_rng(5).normal(size=(grid[1] * grid[2], 96)).astype(np.float32)
    out = vs.tower(checkpoint, "mlx-cpu").encode_patches(patches, [grid])[0]
    assert out.shape == (528, 64)
    assert vs.rel(out, ref["big.embeddings"]) < TOLERANCE


def test_bad_patches_are_refused(checkpoint: Path) -> None:
    tower = vs.tower(checkpoint, "cpu")
    with pytest.raises(ValueError, match=r"patches must be \[48 \(the grids' patches\), 96\]"):
        tower.encode_patches(np.zeros((40, 96), dtype=np.float32), [(1, 6, 8)])
    with pytest.raises(ValueError, match="does not merge 2x2"):
        tower.encode_patches(np.zeros((15, 96), dtype=np.float32), [(1, 3, 5)])
    with pytest.raises(ValueError, match="only still images"):
        tower.encode_patches(np.zeros((96, 96), dtype=np.float32), [(2, 6, 8)])
    with pytest.raises(ValueError, match="any size as patches"):
        tower.encode(np.zeros((1, 3, 32, 32), dtype=np.float32))


def _image_prompt(
    checkpoint: Path, backend: str = "cpu", grids: bool = True
) -> tuple[list[int], list]:
    """The fixture's prompt with the image rows as the worker lays them out."""
    from llmd.worker.vision import content_digest, surrogate_ids

    ref = np.load(FIXTURE)
    names = json.loads(ref["cases"].tobytes())
    images = _images(names)
    out = vs.tower(checkpoint, backend).encode_patches(
        np.concatenate([p for p, _ in images]), [g for _, g in images]
    )
    prompt = ref["prompt_ids"].tolist()
    runs: list = []
    i = 0
    for (pixels, (_, h, w)), emb in zip(images, out, strict=True):
        i = prompt.index(QWEN3_5_MULTIMODAL["image_token_id"], i)
        prompt[i : i + len(emb)] = surrogate_ids(content_digest(pixels), len(emb))
        runs.append((i, emb, False, (h // 2, w // 2)) if grids else (i, emb, False))
        i += len(emb)
    return prompt, runs


@pytest.mark.parametrize("budget", [512, 7])
@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_image_prompt_logits_match_transformers(
    checkpoint: Path, backend: str, budget: int
) -> None:
    """The last prompt position's logits with both images' rows at their M-RoPE positions, on
    llmd's CPU backend and on the device graph (MLX's CPU device); budget 7 prefills in chunks
    that cut through the images."""
    ref = np.load(FIXTURE)
    prompt, embedded = _image_prompt(checkpoint, backend)
    engine = vs.engine(checkpoint, backend, step_token_budget=budget)
    lp, done = vs.first_logprobs(engine, "a", prompt, embedded)
    want = vs.log_softmax(ref["logits"][-1])
    scale = float(np.abs(ref["logits"][-1]).max())
    assert np.abs(lp - want).max() / scale < TOLERANCE
    assert done["prompt_tokens"] == len(prompt)
    # With plain 1-D positions the logits differ: the test tells M-RoPE from no M-RoPE.
    plain = vs.log_softmax(ref["text_position_logits"][-1])
    assert np.abs(lp - plain).max() / scale > 1e-2


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_decode_continues_at_the_shifted_position(checkpoint: Path, backend: str) -> None:
    """The second generated token's logits: the first one decoded at its index shifted as the
    text after the images (transformers' rope_deltas), matching transformers' logits for the
    prompt plus that token."""
    ref = np.load(FIXTURE)
    prompt, embedded = _image_prompt(checkpoint, backend)
    tokens, logprobs, _ = vs.generate(vs.engine(checkpoint, backend), "a", prompt, embedded, 2)
    assert tokens[0] == int(ref["next_token"][0])  # greedy, as the recording
    second = logprobs[1]
    scale = float(np.abs(ref["next_logits"]).max())
    assert np.abs(second - vs.log_softmax(ref["next_logits"])).max() / scale < TOLERANCE


def test_same_images_reuse_the_cache(checkpoint: Path) -> None:
    """A second turn with the same images past the first KV block (64 rows; the recurrent
    state is kept at block boundaries) reuses the block, images and shifted text positions
    included, and answers the same."""
    engine = vs.engine(checkpoint)
    prompt, embedded = _image_prompt(checkpoint)
    prompt += [int(t) for t in np.random.default_rng(3).integers(3, 120, 40)]
    first, done = vs.first_logprobs(engine, "a", prompt, embedded)
    assert done["cached_tokens"] == 0
    again, done = vs.first_logprobs(engine, "b", prompt, embedded)
    assert done["cached_tokens"] == 64
    assert np.abs(again - first).max() < 1e-5


def test_grids_are_refused_by_models_without_mrope(checkpoint: Path, tmp_path: Path) -> None:
    from .tiny_models import write_checkpoint

    prompt, embedded = _image_prompt(checkpoint)
    write_checkpoint(tmp_path, "gemma3_text")
    engine = vs.engine(tmp_path)
    engine.submit("a", prompt, 1, embedded=embedded)
    events = engine.poll(5000)
    assert [e["type"] for e in events] == ["error"]
    assert "no multimodal rotary positions" in events[0]["message"]
