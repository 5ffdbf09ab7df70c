"""Qwen3.5's image preprocessing (text/qwen_images.py) against what transformers'
Qwen2VLImageProcessorPil made of the same images (tests/fixtures/record_qwen3_5_vision.py
recorded them, with the tiny encoder's settings and with the released checkpoints')."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llmd.text.qwen_images import (
    IMAGE_PAD,
    VISION_END,
    VISION_START,
    QwenImageConfig,
    expand_image_markers,
    preprocess,
    smart_resize,
    token_count,
)

from .image_recordings import ImageRecording

FIXTURE = Path(__file__).parents[1] / "fixtures" / "qwen3_5_vision_transformers.npz"
IMAGES = ImageRecording("gemma3_images_transformers.npz")  # the test images Gemma 3's tests use
REF = np.load(FIXTURE)
CASES: list[str] = json.loads(REF["preprocess_cases"].tobytes())
# tests/native/tiny_models.py's QWEN3_5_PREPROCESSOR, as its preprocessor_config.json.
TINY = {
    "size": {"shortest_edge": 256, "longest_edge": 1024},
    "patch_size": 4,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


@pytest.mark.parametrize("name", CASES)
def test_patches_match_transformers(name: str) -> None:
    cfg = QwenImageConfig.from_hf(TINY)
    patches, grid = preprocess(IMAGES.image(name), cfg)
    want = REF[f"{name}.pixel_values"]
    assert grid == tuple(REF[f"{name}.grid_thw"].tolist())
    assert patches.shape == want.shape == (grid[1] * grid[2], 96)
    # The same 8-bit pixels out of Pillow's resize, normalized alike and laid out in the same
    # merge-block order: only float32 rounding may differ.
    assert np.abs(patches - want).max() <= 1e-6


def test_released_settings_match_transformers() -> None:
    """A 640x480 screenshot with the released checkpoints' preprocessor: 40x30 patches of
    16 pixels (1536 values each: 3 channels, 2 frames), 300 image tokens."""
    cfg = QwenImageConfig()
    patches, grid = preprocess(IMAGES.image("released_square"), cfg)
    assert grid == tuple(REF["released_square.grid_thw"].tolist()) == (1, 30, 40)
    assert np.abs(patches[:64] - REF["released_square.pixel_rows"]).max() <= 1e-6
    assert token_count(grid, cfg) == 300


def test_smart_resize_bounds_the_area() -> None:
    cfg = QwenImageConfig.from_hf(TINY)
    assert smart_resize(200, 300, cfg) == (24, 32)  # scaled down to at most 1024 pixels
    assert smart_resize(5, 7, cfg) == (16, 24)  # scaled up to at least 256
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(1, 400, cfg)


def test_prompt_layout() -> None:
    rendered = f"<|im_start|>user\n{VISION_START}{IMAGE_PAD}{VISION_END}hi{VISION_START}{IMAGE_PAD}{VISION_END}"
    out = expand_image_markers(rendered, [3, 2])
    assert out.count(IMAGE_PAD) == 5
    assert f"{VISION_START}{IMAGE_PAD * 3}{VISION_END}hi{VISION_START}{IMAGE_PAD * 2}" in out
    with pytest.raises(ValueError, match="2 image markers for 1 images"):
        expand_image_markers(rendered, [3])


def test_mmproj_settings_bound_images_as_llama_cpp_does() -> None:
    """An mmproj keeps no pixel limits: llama.cpp's clip.cpp bounds Qwen-VL images to 8..4096
    merged tokens, and so does llmd for such a file (the released patch 16, merge 2: 8192 to
    4,194,304 pixels). A 7x5 image is upscaled to 24x32 pixels, 12 tokens, what llama-server laid out for it
    from the tiny mmproj (tests/native/tiny_qwen35_gguf.py's, patch 4), measured."""
    released = QwenImageConfig.from_mmproj(
        {
            "clip.projector_type": "qwen3vl_merger",
            "clip.vision.patch_size": 16,
            "clip.vision.spatial_merge_size": 2,
            "clip.vision.image_mean": [0.5, 0.5, 0.5],
            "clip.vision.image_std": [0.5, 0.5, 0.5],
        }
    )
    assert (released.min_pixels, released.max_pixels) == (8 * 32 * 32, 4096 * 32 * 32)
    tiny = QwenImageConfig.from_mmproj(
        {"clip.projector_type": "qwen3vl_merger", "clip.vision.patch_size": 4}
    )
    pixels = IMAGES.image("small_tiny_upscaled")
    assert pixels.size == (7, 5)
    _, (_, h, w) = preprocess(pixels, tiny)
    assert (h // 2, w // 2) == (3, 4)
    with pytest.raises(ValueError, match="not Qwen3.5's"):
        QwenImageConfig.from_mmproj({"clip.projector_type": "gemma3"})
