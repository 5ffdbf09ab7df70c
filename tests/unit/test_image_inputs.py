"""What the daemon sends the worker for a request's images (llmd/text/image_inputs.py): one
ImageInput per view (the image, then its pan-and-scan crops), in the order of the image-token
runs the expanded prompt holds, so the worker pairs each run with its own view."""

from __future__ import annotations

import base64

import numpy as np
from PIL import Image

from llmd.text.gemma3_images import BOI_TOKEN, IMAGE_TOKEN, Gemma3ImageConfig, preprocess
from llmd.text.image_inputs import expand_prompt, image_inputs
from llmd.text.images import ChatImage


def _image(width: int, height: int, shade: int) -> ChatImage:
    pixels = Image.new("RGB", (width, height), (shade, 255 - shade, shade // 2))
    return ChatImage(where=f"image {shade}", pixels=pixels, sha256="")


def test_every_view_has_its_run_in_prompt_order() -> None:
    cfg = Gemma3ImageConfig(
        height=64,
        width=64,
        tokens_per_image=4,
        do_pan_and_scan=True,
        pan_and_scan_min_crop_size=32,
        pan_and_scan_max_num_crops=3,
        pan_and_scan_min_ratio_to_activate=1.2,
    )
    images = [_image(330, 100, 10), _image(80, 80, 200)]  # 3 crops, then none
    rendered = f"<bos>look {BOI_TOKEN} and {BOI_TOKEN} now"
    expanded = expand_prompt(rendered, images, cfg)
    inputs = image_inputs(images, cfg)
    assert expanded.count(IMAGE_TOKEN * 4) == len(inputs) == 4 + 1
    assert expanded.count(BOI_TOKEN) == 5
    views = [v for im in images for v in preprocess(im.pixels, cfg)]
    for sent, view in zip(inputs, views, strict=True):
        assert sent.shape == [3, 64, 64]
        pixels = np.frombuffer(base64.b64decode(sent.pixels), dtype="<f4").reshape(sent.shape)
        assert np.array_equal(pixels, view)


def test_gemma4_images_travel_as_patch_grids_with_their_soft_tokens() -> None:
    """Gemma 4: one ImageInput per image, its patches on their grid (rows, columns, values),
    and the prompt's `<|image|>` per image expanded to `<|image>`, one `<|image|>` per soft
    token (the grid pooled 3x3) and `<image|>`, each image its own count."""
    from llmd.text import gemma4_images as g4

    cfg = g4.Gemma4ImageConfig(patch_size=4, pooling_kernel_size=3, max_soft_tokens=70)
    images = [_image(300, 200, 10), _image(90, 200, 200)]
    expanded = expand_prompt(f"<bos>look {g4.IMAGE_TOKEN} and {g4.IMAGE_TOKEN} now", images, cfg)
    inputs = image_inputs(images, cfg)
    assert [sent.shape for sent in inputs] == [[18, 30, 48], [36, 15, 48]]
    runs = [run.count(g4.IMAGE_TOKEN) for run in expanded.split(g4.BOI_TOKEN)[1:]]
    assert runs == [60, 60]
    assert expanded.startswith(f"<bos>look {g4.BOI_TOKEN}") and expanded.endswith(
        f"{g4.EOI_TOKEN} now"
    )
    for sent, image in zip(inputs, images, strict=True):
        want = g4.preprocess(image.pixels, cfg).patches
        pixels = np.frombuffer(base64.b64decode(sent.pixels), dtype="<f4").reshape(sent.shape)
        assert np.array_equal(pixels.reshape(want.shape), want)


def test_gemma4_image_settings_come_from_the_checkpoint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A Gemma 4 checkpoint's processor settings: preprocessor_config.json, else
    processor_config.json's `image_processor` (as released repos ship them), else the
    processor's defaults; a checkpoint without a vision tower gets none (images refused)."""
    import json

    from llmd.text.gemma4_images import Gemma4ImageConfig
    from llmd.text.text_model import _image_config

    config = {"model_type": "gemma4", "vision_config": {"hidden_size": 8}}
    assert _image_config(tmp_path, config) == Gemma4ImageConfig()
    (tmp_path / "processor_config.json").write_text(
        json.dumps({"image_processor": {"max_soft_tokens": 560, "patch_size": 16}})
    )
    assert _image_config(tmp_path, config) == Gemma4ImageConfig(max_soft_tokens=560)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"max_soft_tokens": 70}))
    assert _image_config(tmp_path, config) == Gemma4ImageConfig(max_soft_tokens=70)
    assert _image_config(tmp_path, {"model_type": "gemma4"}) is None
