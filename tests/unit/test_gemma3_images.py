"""Gemma 3's image preprocessing and prompt layout (text/gemma3_images.py) against what
transformers' Gemma3ImageProcessor (PIL backend) and Gemma3Processor made of the same images
and configs (tests/fixtures/record_gemma3_images.py recorded them)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from llmd.text.gemma3_images import (
    BOI_TOKEN,
    Gemma3ImageConfig,
    crop_count,
    expand_image_markers,
    pan_and_scan_boxes,
    preprocess,
)

from .image_recordings import ImageRecording

RECORDING = ImageRecording("gemma3_images_transformers.npz")
REF = RECORDING.ref


def _case(name: str) -> tuple[Any, Gemma3ImageConfig]:
    image, case = RECORDING.case(name)
    return image, Gemma3ImageConfig.from_hf(case["config"])


@pytest.mark.parametrize("name", RECORDING.names)
def test_pixel_values_match_transformers(name: str) -> None:
    image, cfg = _case(name)
    ours = preprocess(image, cfg)
    want_u8 = REF[f"{name}.pixels_u8"]
    want = ((want_u8.astype(np.float64) / 255 - 0.5) / 0.5).astype(np.float32)
    assert ours.shape == want.shape and ours.dtype == np.float32
    # The same 8-bit pixels out of Pillow's resize, rescaled and normalized alike: the only
    # difference allowed is float32 rounding.
    assert np.abs(ours - want).max() <= 1e-6
    assert crop_count(image.size, cfg) == int(REF[f"{name}.num_crops"][0])


@pytest.mark.parametrize("name", RECORDING.names)
def test_prompt_layout_matches_the_processor(name: str) -> None:
    image, cfg = _case(name)
    expanded = expand_image_markers(RECORDING.prompt, [crop_count(image.size, cfg)], cfg)
    assert RECORDING.tokenizer.encode(expanded).ids == REF[f"{name}.input_ids"].tolist()


def test_released_config_gives_256_soft_tokens_between_the_markers() -> None:
    cfg = Gemma3ImageConfig.from_hf({"size": {"height": 896, "width": 896}}, {})
    text = expand_image_markers(f"look {BOI_TOKEN} here", [0], cfg)
    assert text.count("<image_soft_token>") == 256
    assert "\n\n<start_of_image><image_soft_token>" in text
    assert text.endswith("<end_of_image>\n\n here")
    with pytest.raises(ValueError, match="2 <start_of_image> markers for 1 images"):
        expand_image_markers(BOI_TOKEN * 2, [0], cfg)


def test_pan_and_scan_crops_tile_the_long_side() -> None:
    cfg = Gemma3ImageConfig(do_pan_and_scan=True)
    # 2:1 landscape of 1200 px: two 600 px crops side by side, covering the whole image.
    assert pan_and_scan_boxes(1200, 600, cfg) == [(0, 0, 600, 600), (600, 0, 1200, 600)]
    # a 5:1 strip: capped at 4 crops; the last one stops at the edge
    assert pan_and_scan_boxes(1001, 200, Gemma3ImageConfig(pan_and_scan_min_crop_size=100)) == [
        (0, 0, 251, 200),
        (251, 0, 502, 200),
        (502, 0, 753, 200),
        (753, 0, 1001, 200),
    ]
    assert pan_and_scan_boxes(896, 896, cfg) == []  # square: the image alone
    assert crop_count((1200, 600), Gemma3ImageConfig()) == 0  # off unless the config says


def test_settings_from_an_mmproj() -> None:
    """A GGUF Gemma 3's image settings come from llama.cpp's mmproj metadata: the released
    896 / 14 = 64-patch grid pooled 4x4 by default (256 tokens), or by the file's
    clip.vision.projector.scale_factor; another projector is refused."""
    from llmd.text.gemma3_images import Gemma3ImageConfig

    released = {
        "clip.projector_type": "gemma3",
        "clip.vision.image_size": 896,
        "clip.vision.patch_size": 14,
        "clip.vision.image_mean": [0.5, 0.5, 0.5],
        "clip.vision.image_std": [0.5, 0.5, 0.5],
    }
    cfg = Gemma3ImageConfig.from_mmproj(released)
    assert (cfg.height, cfg.width, cfg.tokens_per_image) == (896, 896, 256)
    assert cfg.image_mean == (0.5, 0.5, 0.5) and not cfg.do_pan_and_scan
    scaled = Gemma3ImageConfig.from_mmproj({**released, "clip.vision.projector.scale_factor": 2})
    assert scaled.tokens_per_image == 32 * 32
    with pytest.raises(ValueError, match="projector is 'qwen2vl_merger'"):
        Gemma3ImageConfig.from_mmproj({**released, "clip.projector_type": "qwen2vl_merger"})
