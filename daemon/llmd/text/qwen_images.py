"""Qwen3.5's image preprocessing and prompt layout, with numpy and Pillow (no transformers).

What Qwen3.5's vision encoder reads, as transformers' `Qwen2VLImageProcessorPil` (the
image processor `Qwen3VLProcessor` uses for qwen3_5 and qwen3_5_moe) makes it; checked against
it in tests/unit/test_qwen_images.py on fixtures recorded by
tests/fixtures/record_qwen3_5_vision.py:

- "Smart resize": each side rounded to a multiple of patch_size * merge_size (32 in the
  released checkpoints), then scaled down or up, keeping the aspect ratio, until the area lies
  within [size.shortest_edge, size.longest_edge] pixels; resized with Pillow's bicubic filter
  on the 8-bit pixels, rescaled by 1/255 and normalized with the processor's mean and std.
- Patches: the image cut into patch_size squares, listed in 2x2 merge-block order (block row,
  block column, row in block, column in block: the 4 patches that merge into one token are
  consecutive), each flattened channel-major over temporal_patch_size frames: a still image
  is its own frame repeated (the encoder's Conv3d has a temporal patch of 2).
- The grid (t, h, w) = (1, height / patch, width / patch); the image is
  h * w / merge^2 tokens: in the prompt, the chat template writes
  `<|vision_start|><|image_pad|><|vision_end|>` per image and the processor repeats
  `<|image_pad|>` once per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"


@dataclass(frozen=True)
class QwenImageConfig:
    """The processor settings that change what the encoder sees (defaults: the released
    Qwen3.5 checkpoints' `preprocessor_config.json`)."""

    min_pixels: int = 65536
    max_pixels: int = 16777216
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    resample: int = 3  # PIL's BICUBIC, the processor's default

    @classmethod
    def from_hf(cls, preprocessor: dict[str, Any]) -> QwenImageConfig:
        """From a checkpoint's `preprocessor_config.json`; `min_pixels` / `max_pixels` (older
        configs) stand for size.shortest_edge / size.longest_edge; absent keys keep the
        defaults."""
        size = preprocessor.get("size") or {}
        fields: dict[str, Any] = {
            "min_pixels": size.get("shortest_edge", preprocessor.get("min_pixels")),
            "max_pixels": size.get("longest_edge", preprocessor.get("max_pixels")),
            "patch_size": preprocessor.get("patch_size"),
            "temporal_patch_size": preprocessor.get("temporal_patch_size"),
            "merge_size": preprocessor.get("merge_size"),
            "rescale_factor": preprocessor.get("rescale_factor"),
            "resample": preprocessor.get("resample"),
        }
        for key in ("image_mean", "image_std"):
            value = preprocessor.get(key)
            if value is not None:
                fields[key] = tuple(float(v) for v in value)
        return cls(**{k: v for k, v in fields.items() if v is not None})

    @classmethod
    def from_mmproj(cls, meta: dict[str, Any]) -> QwenImageConfig:
        """From llama.cpp's mmproj GGUF metadata (`clip.vision.*`, converter's
        `qwen3vl_merger`): patch and merge sizes, mean and std. An mmproj keeps no pixel
        limits; llama.cpp's clip.cpp bounds Qwen-VL images to 8..4096 merged tokens
        (`image_min_pixels` / `image_max_pixels` when the file names them), and so does llmd
        for such a file, so an image gives the tokens it gives under llama-server. ValueError
        for an mmproj of another projector."""
        projector = meta.get("clip.projector_type")
        if projector != "qwen3vl_merger":
            raise ValueError(f"the mmproj's projector is {projector!r}, not Qwen3.5's")
        patch = int(meta["clip.vision.patch_size"])
        merge = int(meta.get("clip.vision.spatial_merge_size", 2))
        token_pixels = (patch * merge) ** 2
        fields: dict[str, Any] = {
            "patch_size": patch,
            "merge_size": merge,
            "min_pixels": int(meta.get("clip.vision.image_min_pixels", 8 * token_pixels)),
            "max_pixels": int(meta.get("clip.vision.image_max_pixels", 4096 * token_pixels)),
        }
        for key in ("image_mean", "image_std"):
            value = meta.get(f"clip.vision.{key}")
            if value is not None:
                fields[key] = tuple(float(v) for v in value)
        return cls(**fields)

    @property
    def patch_values(self) -> int:
        """Values per flattened patch: 3 channels x frames x patch x patch."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size


def smart_resize(height: int, width: int, cfg: QwenImageConfig) -> tuple[int, int]:
    """The (height, width) an image of (height, width) is resized to (transformers'
    `smart_resize`); ValueError for an aspect ratio above 200, as transformers refuses it."""
    factor = cfg.patch_size * cfg.merge_size
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"an image's aspect ratio must be below 200, not {max(height, width) / min(height, width):.0f}"
        )
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > cfg.max_pixels:
        beta = math.sqrt((height * width) / cfg.max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < cfg.min_pixels:
        beta = math.sqrt(cfg.min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def preprocess(image: Any, cfg: QwenImageConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """An RGB PIL image -> (float32 patches [h * w, patch_values], grid (1, h, w))."""
    height, width = smart_resize(image.height, image.width, cfg)
    resized = image.resize((width, height), resample=cfg.resample)
    pixels = np.asarray(resized, dtype=np.uint8).astype(np.float64) * cfg.rescale_factor
    pixels = pixels.astype(np.float32)
    mean = np.asarray(cfg.image_mean, dtype=np.float32)
    std = np.asarray(cfg.image_std, dtype=np.float32)
    chw = ((pixels - mean) / std).transpose(2, 0, 1).astype(np.float32)
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = height // p, width // p
    x = chw.reshape(3, gh // m, m, p, gw // m, m, p)
    x = x.transpose(1, 4, 2, 5, 0, 3, 6)  # block row, block col, row, col, channel, y, x
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], t, p, p))
    return np.ascontiguousarray(x.reshape(gh * gw, cfg.patch_values)), (1, gh, gw)


def token_count(grid: tuple[int, int, int], cfg: QwenImageConfig) -> int:
    """Image tokens (rows in the prompt) of an image with patch grid `grid`."""
    t, h, w = grid
    return t * h * w // (cfg.merge_size * cfg.merge_size)


def expand_image_markers(rendered: str, tokens: list[int]) -> str:
    """The rendered chat prompt with each image's single `<|image_pad|>` (the template writes
    one between `<|vision_start|>` and `<|vision_end|>`) repeated once per image token;
    `tokens[i]`: image i's token count. ValueError when the markers and images differ."""
    marker = VISION_START + IMAGE_PAD + VISION_END
    pieces = rendered.split(marker)
    if len(pieces) - 1 != len(tokens):
        raise ValueError(f"the prompt has {len(pieces) - 1} image markers for {len(tokens)} images")
    out = [pieces[0]]
    for n, piece in zip(tokens, pieces[1:], strict=True):
        out += [VISION_START + IMAGE_PAD * n + VISION_END, piece]
    return "".join(out)
