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

from .tiny_models import GEMMA3_VISION, write_gemma3_multimodal

native = pytest.importorskip("llmd._engine")

FIXTURE = Path(__file__).parents[1] / "fixtures" / "gemma3_vision_transformers.npz"
IMAGES = Path(__file__).parents[1] / "fixtures" / "gemma3_images_transformers.npz"
TOLERANCE = 1e-4


def _tower(path: Path, backend: str):  # type: ignore[no-untyped-def]
    from llmd.worker.host import multimodal_config

    config = multimodal_config(str(path))
    assert config is not None
    return native.VisionTower(str(path), config, backend=backend)


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


def _rel(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


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
    tower = _tower(checkpoint, backend)
    assert (tower.architecture, tower.image_size) == ("gemma3", GEMMA3_VISION["image_size"])
    assert (tower.tokens_per_image, tower.hidden_size) == (16, 64)
    out = tower.encode(pixels)  # both images in one batched pass
    assert out.shape == (2, 16, 64)
    for i, name in enumerate(names):
        assert _rel(out[i], ref[f"{name}.embeddings"]) < TOLERANCE, name
    # The two images differ, and so do their embeddings (nothing collapsed to a constant).
    assert _rel(out[0], out[1]) > 0.1


def test_an_image_encodes_the_same_alone_or_batched(checkpoint: Path) -> None:
    """Batching images of several requests must not change any one of them: attention stays
    inside each image."""
    ref = np.load(FIXTURE)
    names = json.loads(ref["cases"].tobytes())
    pixels = _pixels(names)
    tower = _tower(checkpoint, "cpu")
    both = tower.encode(pixels)
    for i in range(2):
        alone = tower.encode(pixels[i : i + 1])[0]
        assert np.abs(alone - both[i]).max() <= 1e-5 * np.abs(both[i]).max()


def test_wrong_pixel_shape_is_refused(checkpoint: Path) -> None:
    tower = _tower(checkpoint, "cpu")
    with pytest.raises(ValueError, match=r"pixels must be \[n, 3, 64, 64\]"):
        tower.encode(np.zeros((1, 3, 32, 32), dtype=np.float32))


def test_checkpoint_without_a_vision_tower_is_refused(tmp_path: Path) -> None:
    config = write_gemma3_multimodal(tmp_path)
    from .tiny_models import weights, write_multimodal_checkpoint

    text_only = {
        ("language_model.model." + k.removeprefix("model.") if k.startswith("model.") else k): v
        for k, v in weights("gemma3_text").items()
    }
    write_multimodal_checkpoint(
        tmp_path,
        "gemma3_text",
        text_only,
        model_type="gemma3",
        architecture="Gemma3ForConditionalGeneration",
        vision_type="siglip_vision_model",
        vision_config=config["vision_config"],
    )
    with pytest.raises(RuntimeError, match="no vision tower"):
        _tower(tmp_path, "cpu")
