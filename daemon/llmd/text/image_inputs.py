"""A chat request's decoded images as the worker's vision tower reads them.

Each image becomes its preprocessed views (gemma3_images.preprocess: the whole image, then
any pan-and-scan crops), each a protocol ImageInput of float32 pixels; the prompt holds one
run of image placeholder tokens per view, in the same order (expand_image_markers). Pixels
travel preprocessed so the worker runs exactly what transformers' processor would feed the
model, and the worker keys the prefix cache by their content.
"""

from __future__ import annotations

import base64

import numpy as np

from llmd.runtime import protocol as p
from llmd.text.gemma3_images import Gemma3ImageConfig, crop_count, expand_image_markers, preprocess
from llmd.text.images import ChatImage


def expand_prompt(rendered: str, images: list[ChatImage], cfg: Gemma3ImageConfig) -> str:
    """The rendered chat prompt with each image's marker replaced by its full token layout."""
    return expand_image_markers(rendered, [crop_count(im.size, cfg) for im in images], cfg)


def image_inputs(images: list[ChatImage], cfg: Gemma3ImageConfig) -> list[p.ImageInput]:
    """Every view of every image, in prompt order, as the worker's Generate carries them."""
    out = []
    for image in images:
        for view in preprocess(image.pixels, cfg):
            data = np.ascontiguousarray(view, dtype="<f4").tobytes()
            out.append(p.ImageInput(pixels=base64.b64encode(data).decode(), shape=list(view.shape)))
    return out
