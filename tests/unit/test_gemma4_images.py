"""Gemma 4's image preprocessing and prompt layout (text/gemma4_images.py) against what
transformers' Gemma4ImageProcessorPil and Gemma4Processor made of the same images and settings
(tests/fixtures/record_gemma4_images.py recorded them)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np
import pytest

from llmd.text.gemma4_images import (
    IMAGE_TOKEN,
    Gemma4ImageConfig,
    expand_image_tokens,
    preprocess,
    soft_token_count,
    target_size,
)

from .image_recordings import ImageRecording

RECORDING = ImageRecording("gemma4_images_transformers.npz")
REF = RECORDING.ref


def _case(name: str) -> tuple[Any, Gemma4ImageConfig]:
    image, case = RECORDING.case(name)
    return image, Gemma4ImageConfig.from_hf(case["settings"])


@pytest.mark.parametrize("name", RECORDING.names)
def test_patches_and_positions_match_transformers(name: str) -> None:
    image, cfg = _case(name)
    ours = preprocess(image, cfg)
    assert ours.patches.dtype == np.float32
    # The same 8-bit pixels out of Pillow's bicubic resize, in the same patch order: rescaled
    # back they are transformers' bytes exactly (its padding rows, never read, left out).
    u8 = np.rint(ours.patches.astype(np.float64) * 255).astype(np.uint8)
    assert np.abs(ours.patches.astype(np.float64) * 255 - u8).max() < 1e-3
    if f"{name}.patches_u8" in REF:
        assert np.array_equal(u8, REF[f"{name}.patches_u8"])
    assert hashlib.sha256(u8.tobytes()).digest() == REF[f"{name}.patches_sha256"].tobytes()
    assert np.array_equal(ours.positions, REF[f"{name}.positions"])
    assert ours.soft_tokens == int(REF[f"{name}.soft_tokens"])
    assert soft_token_count(image.size, cfg) == ours.soft_tokens
    assert ours.grid[0] * ours.grid[1] == len(ours.patches) <= int(REF[f"{name}.padded_to"])


@pytest.mark.parametrize("name", RECORDING.names)
def test_prompt_layout_matches_the_processor(name: str) -> None:
    image, cfg = _case(name)
    expanded = expand_image_tokens(RECORDING.prompt, [soft_token_count(image.size, cfg)])
    assert RECORDING.tokenizer.encode(expanded).ids == REF[f"{name}.input_ids"].tolist()


def test_default_budget_keeps_the_aspect_ratio() -> None:
    cfg = Gemma4ImageConfig()
    # A 16:9 screenshot: 1056 x 576 pixels (22 x 12 multiples of 48), 66 x 36 patches,
    # pooled 3x3 into 264 tokens, within the 280-token budget.
    assert target_size(1080, 1920, cfg) == (576, 1056)
    assert soft_token_count((1920, 1080), cfg) == 264
    assert target_size(720, 864, cfg) == (720, 864)  # already a fit: kept as is
    text = expand_image_tokens(f"look {IMAGE_TOKEN} here", [4])
    assert text == "look <|image><|image|><|image|><|image|><|image|><image|> here"
    with pytest.raises(ValueError, match=re.escape("2 <|image|> tokens for 1 images")):
        expand_image_tokens(IMAGE_TOKEN * 2, [4])


def test_settings_the_encoder_was_not_trained_on_are_refused() -> None:
    with pytest.raises(ValueError, match="max_soft_tokens must be one of"):
        Gemma4ImageConfig.from_hf({"max_soft_tokens": 300})
    with pytest.raises(ValueError, match="normalizes"):
        Gemma4ImageConfig.from_hf({"do_normalize": True, "image_mean": [0.5] * 3})
    # The released configs' identity normalization is accepted.
    cfg = Gemma4ImageConfig.from_hf({"do_normalize": False, "image_mean": [0.0] * 3})
    assert cfg.max_soft_tokens == 280 and cfg.patch_size == 16
