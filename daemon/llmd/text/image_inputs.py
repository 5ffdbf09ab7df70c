"""A chat request's decoded images as the worker's vision tower reads them.

Gemma 3: each image becomes its preprocessed views (gemma3_images.preprocess: the whole
image, then any pan-and-scan crops), each a protocol ImageInput of float32 pixels
(channels, height, width); the prompt holds one run of image placeholder tokens per view, in
the same order (expand_image_markers).

Qwen3.5: each image becomes one ImageInput of its flattened patches (qwen_images.preprocess),
shaped (grid height, grid width, values per patch): the patch rows in the processor's
merge-block order, the shape carrying the grid the tower and the M-RoPE positions need; the
prompt holds one run of `<|image_pad|>` per image, one per merged token.

Gemma 4: each image becomes one ImageInput of its patches (gemma4_images.preprocess), shaped
(grid height, grid width, values per patch): the patch rows row by row, (y, x, channel) within
each patch, the shape carrying the grid the tower's 2-D positions and pooling need; the
prompt's `<|image|>` (one per image) becomes `<|image>`, one `<|image|>` per soft token and
`<image|>`.

Pixels travel preprocessed so the worker runs exactly what transformers' processor would
feed the model, and the worker keys the prefix cache by their content.
"""

from __future__ import annotations

import base64

import numpy as np

from llmd.runtime import protocol as p
from llmd.text import gemma4_images, qwen_images
from llmd.text.gemma3_images import Gemma3ImageConfig, crop_count, expand_image_markers, preprocess
from llmd.text.gemma4_images import Gemma4ImageConfig
from llmd.text.images import ChatImage
from llmd.text.qwen_images import QwenImageConfig

ImageConfig = Gemma3ImageConfig | QwenImageConfig | Gemma4ImageConfig


def expand_prompt(rendered: str, images: list[ChatImage], cfg: ImageConfig) -> str:
    """The rendered chat prompt with each image's marker replaced by its full token layout."""
    if isinstance(cfg, QwenImageConfig):
        tokens = []
        for im in images:
            h, w = qwen_images.smart_resize(im.pixels.height, im.pixels.width, cfg)
            tokens.append(
                qwen_images.token_count((1, h // cfg.patch_size, w // cfg.patch_size), cfg)
            )
        return qwen_images.expand_image_markers(rendered, tokens)
    if isinstance(cfg, Gemma4ImageConfig):
        counts = [gemma4_images.soft_token_count(im.size, cfg) for im in images]
        return gemma4_images.expand_image_tokens(rendered, counts)
    return expand_image_markers(rendered, [crop_count(im.size, cfg) for im in images], cfg)


def _input(view: np.ndarray) -> p.ImageInput:
    data = np.ascontiguousarray(view, dtype="<f4").tobytes()
    return p.ImageInput(pixels=base64.b64encode(data).decode(), shape=list(view.shape))


def image_inputs(images: list[ChatImage], cfg: ImageConfig) -> list[p.ImageInput]:
    """Every view of every image, in prompt order, as the worker's Generate carries them."""
    out = []
    for image in images:
        if isinstance(cfg, QwenImageConfig):
            patches, (_, gh, gw) = qwen_images.preprocess(image.pixels, cfg)
            out.append(_input(patches.reshape(gh, gw, cfg.patch_values)))
        elif isinstance(cfg, Gemma4ImageConfig):
            g4 = gemma4_images.preprocess(image.pixels, cfg)
            out.append(_input(g4.patches.reshape(*g4.grid, g4.patches.shape[1])))
        else:
            out += [_input(view) for view in preprocess(image.pixels, cfg)]
    return out
