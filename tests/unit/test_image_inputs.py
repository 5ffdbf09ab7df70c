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
