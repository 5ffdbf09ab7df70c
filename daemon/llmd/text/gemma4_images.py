"""Gemma 4's image preprocessing and prompt layout, with numpy and Pillow (no transformers).

What Gemma 4's vision encoder reads, as transformers' `Gemma4ImageProcessorPil` and
`Gemma4Processor` make it (checked against them: tests/unit/test_gemma4_images.py, from
fixtures recorded by tests/fixtures/record_gemma4_images.py). Unlike Gemma 3 (every image
squashed to 896x896), Gemma 4 keeps the image's aspect ratio and spends a token budget:

- Each image is resized, keeping its aspect ratio, to the largest size whose sides are
  multiples of `pooling_kernel_size * patch_size` (3 x 16 = 48 pixels by default) and whose
  patches number at most `max_soft_tokens * pooling_kernel_size**2` (280 tokens: 2,520
  patches), with Pillow's bicubic filter on its 8-bit pixels (not at all when it already has
  that size); a sliver too thin for one such multiple gets one on that side and its aspect
  ratio (capped) on the other.
- Pixels are rescaled by 1/255 into [0, 1] and not normalized (the checkpoints' mean 0, std 1).
- The image is cut into `patch_size` squares, row by row, each flattened row-major with the
  channels innermost ((y, x, channel) order, what the patch embedder's linear map reads), and
  each patch keeps its (x, y) place in the grid for the encoder's 2-D positions. transformers
  pads the patches to the budget (positions -1); the padding is never attended to or pooled,
  so it is not made here.
- The encoder pools `pooling_kernel_size` x `pooling_kernel_size` patches into one soft token:
  an image of h x w patches takes h * w / k**2 tokens. In the prompt, the chat template's image
  token (one per image) becomes `<|image>` + that many image tokens + `<image|>`, the soft
  tokens being where the image's embeddings replace the token embeddings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

BOI_TOKEN = "<|image>"
EOI_TOKEN = "<image|>"
IMAGE_TOKEN = "<|image|>"
# The budgets the processor accepts (transformers' _SUPPORTED_SOFT_TOKENS).
SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)


@dataclass(frozen=True)
class Gemma4ImageConfig:
    """The processor settings that change what the encoder sees (defaults: the processor's)."""

    patch_size: int = 16
    max_soft_tokens: int = 280
    pooling_kernel_size: int = 3
    rescale_factor: float = 1 / 255
    resample: int = 3  # PIL's BICUBIC

    def __post_init__(self) -> None:
        if self.max_soft_tokens not in SOFT_TOKEN_BUDGETS:
            raise ValueError(
                f"max_soft_tokens must be one of {SOFT_TOKEN_BUDGETS}, not {self.max_soft_tokens}"
            )

    @property
    def max_patches(self) -> int:
        return self.max_soft_tokens * self.pooling_kernel_size**2

    @classmethod
    def from_hf(cls, preprocessor: dict[str, Any]) -> Gemma4ImageConfig:
        """From a checkpoint's `preprocessor_config.json` (or processor_config.json's
        `image_processor`); a null or absent value keeps the processor's default. The
        normalization a config could ask for is refused: the encoder was trained on [0, 1]."""
        if preprocessor.get("do_normalize") and (
            any(float(m) != 0.0 for m in preprocessor.get("image_mean") or [0.0])
            or any(float(s) != 1.0 for s in preprocessor.get("image_std") or [1.0])
        ):
            raise ValueError("a Gemma 4 image processor that normalizes is not supported")
        fields = {
            key: preprocessor.get(key)
            for key in (
                "patch_size",
                "max_soft_tokens",
                "pooling_kernel_size",
                "rescale_factor",
                "resample",
            )
        }
        return cls(**{k: v for k, v in fields.items() if v is not None})


def target_size(height: int, width: int, cfg: Gemma4ImageConfig) -> tuple[int, int]:
    """(height, width) an image of that size is resized to (transformers'
    `get_aspect_ratio_preserving_size`). ValueError for an image no multiple fits."""
    target_px = cfg.max_patches * cfg.patch_size**2
    factor = math.sqrt(target_px / (height * width))
    side = cfg.pooling_kernel_size * cfg.patch_size
    th = int(math.floor(factor * height / side)) * side
    tw = int(math.floor(factor * width / side)) * side
    if th == 0 and tw == 0:
        raise ValueError(f"a {width}x{height} image has no size of {side}-pixel multiples")
    longest = (cfg.max_patches // cfg.pooling_kernel_size**2) * side
    if th == 0:
        th, tw = side, min(int(math.floor(width / height)) * side, longest)
    elif tw == 0:
        th, tw = min(int(math.floor(height / width)) * side, longest), side
    if th * tw > target_px:
        raise ValueError(
            f"a {width}x{height} image resized to {tw}x{th} exceeds {cfg.max_patches} patches"
        )
    return th, tw


@dataclass(frozen=True)
class Gemma4Pixels:
    """One image as the encoder reads it."""

    patches: np.ndarray  # float32 [patches, patch_size * patch_size * 3], (y, x, channel) order
    positions: np.ndarray  # int32 [patches, 2]: each patch's (x, y) in the grid
    grid: tuple[int, int]  # (rows, columns) of patches
    soft_tokens: int  # rows the encoder gives back for it


def preprocess(image: Any, cfg: Gemma4ImageConfig) -> Gemma4Pixels:
    """An RGB PIL image -> its patches, their grid positions and its soft-token count."""
    height, width = target_size(image.height, image.width, cfg)
    if (height, width) != (image.height, image.width):
        image = image.resize((width, height), resample=cfg.resample)
    pixels = np.asarray(image, dtype=np.uint8).astype(np.float64) * cfg.rescale_factor
    p = cfg.patch_size
    rows, cols = height // p, width // p
    patches = pixels.astype(np.float32).reshape(rows, p, cols, p, 3).transpose(0, 2, 1, 3, 4)
    xs, ys = np.meshgrid(np.arange(cols), np.arange(rows), indexing="xy")
    return Gemma4Pixels(
        patches=np.ascontiguousarray(patches.reshape(rows * cols, p * p * 3)),
        positions=np.stack([xs, ys], axis=-1).reshape(rows * cols, 2).astype(np.int32),
        grid=(rows, cols),
        soft_tokens=rows * cols // cfg.pooling_kernel_size**2,
    )


def soft_token_count(image_size: tuple[int, int], cfg: Gemma4ImageConfig) -> int:
    """How many soft tokens an image of (width, height) takes, without resizing it."""
    height, width = target_size(image_size[1], image_size[0], cfg)
    return (height // cfg.patch_size) * (width // cfg.patch_size) // cfg.pooling_kernel_size**2


def image_sequence(soft_tokens: int) -> str:
    """One image in the prompt: its marker, soft tokens and end marker."""
    return f"{BOI_TOKEN}{IMAGE_TOKEN * soft_tokens}{EOI_TOKEN}"


def expand_image_tokens(rendered: str, soft_tokens: list[int]) -> str:
    """The rendered chat prompt with each image's `<|image|>` (as the template writes it, one
    per image in order) replaced by its full sequence; `soft_tokens[i]`: image i's count."""
    pieces = rendered.split(IMAGE_TOKEN)
    if len(pieces) - 1 != len(soft_tokens):
        raise ValueError(
            f"the prompt has {len(pieces) - 1} {IMAGE_TOKEN} tokens for {len(soft_tokens)} images"
        )
    out = [pieces[0]]
    for n, piece in zip(soft_tokens, pieces[1:], strict=True):
        out += [image_sequence(n), piece]
    return "".join(out)
