"""Gemma 3's image preprocessing and prompt layout, with numpy and Pillow (no transformers).

What Gemma 3's SigLIP encoder reads, as transformers' `Gemma3ImageProcessor` (PIL backend)
and `Gemma3Processor` make it (checked against them: tests/unit/test_gemma3_images.py, from
fixtures recorded by tests/fixtures/record_gemma3_images.py):

- Each image is resized to the processor's `size` (896x896 in every released checkpoint)
  with Pillow's bilinear filter on its 8-bit pixels, rescaled by 1/255 and normalized with
  the processor's mean and std (0.5 each): values in [-1, 1], channels first.
- Pan-and-scan (`do_pan_and_scan`, off in the released configs; Ollama and llama.cpp leave it
  off too): an image whose aspect ratio reaches `pan_and_scan_min_ratio_to_activate` is also
  cut into 2..`pan_and_scan_max_num_crops` crops along its long side (each at least
  `pan_and_scan_min_crop_size` pixels), each crop preprocessed as an image of its own after
  the whole image.
- In the prompt, the chat template writes one `<start_of_image>` per image; each becomes
  `"\\n\\n<start_of_image>" + N x "<image_soft_token>" + "<end_of_image>\\n\\n"` with N the
  config's `mm_tokens_per_image` (256: the encoder's 64x64 patches average-pooled 4x4). With
  crops, the image is introduced as "Here is the original image ... and here are some crops
  to help you see better" followed by one such sequence per crop. The soft tokens are where
  the projected image embeddings replace the token embeddings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

BOI_TOKEN = "<start_of_image>"
EOI_TOKEN = "<end_of_image>"
IMAGE_TOKEN = "<image_soft_token>"


@dataclass(frozen=True)
class Gemma3ImageConfig:
    """The processor settings that change what the encoder sees (defaults: the released
    checkpoints' `preprocessor_config.json` and the processor's own defaults for its nulls)."""

    height: int = 896
    width: int = 896
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    resample: int = 2  # PIL's BILINEAR, the checkpoints' `resample`
    do_pan_and_scan: bool = False
    pan_and_scan_min_crop_size: int = 256
    pan_and_scan_max_num_crops: int = 4
    pan_and_scan_min_ratio_to_activate: float = 1.2
    tokens_per_image: int = 256

    @classmethod
    def from_hf(
        cls, preprocessor: dict[str, Any], config: dict[str, Any] | None = None
    ) -> Gemma3ImageConfig:
        """From a checkpoint's `preprocessor_config.json` (and `config.json` for
        `mm_tokens_per_image`); a null or absent value keeps the processor's default."""
        size = preprocessor.get("size") or {}
        fields: dict[str, Any] = {
            "height": size.get("height"),
            "width": size.get("width"),
            "rescale_factor": preprocessor.get("rescale_factor"),
            "resample": preprocessor.get("resample"),
            "do_pan_and_scan": preprocessor.get("do_pan_and_scan"),
            "pan_and_scan_min_crop_size": preprocessor.get("pan_and_scan_min_crop_size"),
            "pan_and_scan_max_num_crops": preprocessor.get("pan_and_scan_max_num_crops"),
            "pan_and_scan_min_ratio_to_activate": preprocessor.get(
                "pan_and_scan_min_ratio_to_activate"
            ),
            "tokens_per_image": (config or {}).get("mm_tokens_per_image")
            or preprocessor.get("image_seq_length"),
        }
        for key in ("image_mean", "image_std"):
            value = preprocessor.get(key)
            if value is not None:
                fields[key] = tuple(float(v) for v in value)
        return cls(**{k: v for k, v in fields.items() if v is not None})

    @classmethod
    def from_mmproj(cls, meta: dict[str, Any]) -> Gemma3ImageConfig:
        """From llama.cpp's mmproj GGUF metadata (`clip.vision.*`, as its converter writes
        it from the same checkpoint): the square image size, mean and std; the tokens per
        image are the patch grid pooled by `clip.vision.projector.scale_factor` (4 when
        absent, as llama.cpp reads it). An mmproj keeps no pan-and-scan settings and llama.cpp
        never pans and scans: off. ValueError for an mmproj of another projector."""
        projector = meta.get("clip.projector_type")
        if projector != "gemma3":
            raise ValueError(f"the mmproj's projector is {projector!r}, not Gemma 3's")
        size = int(meta["clip.vision.image_size"])
        patch = int(meta["clip.vision.patch_size"])
        side = size // patch // int(meta.get("clip.vision.projector.scale_factor", 4))
        fields: dict[str, Any] = {"height": size, "width": size, "tokens_per_image": side * side}
        for key in ("image_mean", "image_std"):
            value = meta.get(f"clip.vision.{key}")
            if value is not None:
                fields[key] = tuple(float(v) for v in value)
        return cls(**fields)


def pan_and_scan_boxes(
    width: int, height: int, cfg: Gemma3ImageConfig
) -> list[tuple[int, int, int, int]]:
    """The crops' (left, top, right, bottom) boxes, row by row; none when the image is not
    elongated enough or the crops would be too small (transformers' `pan_and_scan`)."""
    if width >= height:
        if width / height < cfg.pan_and_scan_min_ratio_to_activate:
            return []
        across = int(math.floor(width / height + 0.5))
        across = min(int(math.floor(width / cfg.pan_and_scan_min_crop_size)), across)
        across = min(cfg.pan_and_scan_max_num_crops, max(2, across))
        down = 1
    else:
        if height / width < cfg.pan_and_scan_min_ratio_to_activate:
            return []
        down = int(math.floor(height / width + 0.5))
        down = min(int(math.floor(height / cfg.pan_and_scan_min_crop_size)), down)
        down = min(cfg.pan_and_scan_max_num_crops, max(2, down))
        across = 1
    crop_w = int(math.ceil(width / across))
    crop_h = int(math.ceil(height / down))
    if min(crop_w, crop_h) < cfg.pan_and_scan_min_crop_size:
        return []
    # A slice past the edge stops at the edge (numpy's slicing, as transformers crops).
    return [
        (x, y, min(x + crop_w, width), min(y + crop_h, height))
        for y in range(0, crop_h * down, crop_h)
        for x in range(0, crop_w * across, crop_w)
    ]


def _normalized(image: Any, cfg: Gemma3ImageConfig) -> np.ndarray:
    """One RGB PIL image -> float32 (3, height, width) as the encoder reads it."""
    resized = image.resize((cfg.width, cfg.height), resample=cfg.resample)
    pixels = np.asarray(resized, dtype=np.uint8).astype(np.float64) * cfg.rescale_factor
    pixels = pixels.astype(np.float32)
    mean = np.asarray(cfg.image_mean, dtype=np.float32)
    std = np.asarray(cfg.image_std, dtype=np.float32)
    return ((pixels - mean) / std).transpose(2, 0, 1).astype(np.float32)


def preprocess(image: Any, cfg: Gemma3ImageConfig) -> np.ndarray:
    """An RGB PIL image -> float32 (1 + crops, 3, height, width): the whole image, then its
    pan-and-scan crops when the config asks for them."""
    views = [image]
    if cfg.do_pan_and_scan:
        views += [image.crop(box) for box in pan_and_scan_boxes(*image.size, cfg)]
    return np.stack([_normalized(view, cfg) for view in views])


def crop_count(image_size: tuple[int, int], cfg: Gemma3ImageConfig) -> int:
    """How many pan-and-scan crops an image of (width, height) gets (0: the image alone)."""
    return len(pan_and_scan_boxes(*image_size, cfg)) if cfg.do_pan_and_scan else 0


def image_sequence(cfg: Gemma3ImageConfig) -> str:
    """One image (or crop) in the prompt: its marker, soft tokens and end marker."""
    return f"\n\n{BOI_TOKEN}{IMAGE_TOKEN * cfg.tokens_per_image}{EOI_TOKEN}\n\n"


def image_prompt(crops: int, cfg: Gemma3ImageConfig) -> str:
    """What replaces one image's `<start_of_image>` in the rendered prompt."""
    one = image_sequence(cfg)
    if not crops:
        return one
    return (
        f"Here is the original image {one} and here are some crops to help you see better "
        + " ".join([one] * crops)
    )


def expand_image_markers(rendered: str, crops: list[int], cfg: Gemma3ImageConfig) -> str:
    """The rendered chat prompt with each image's `<start_of_image>` (as the template writes
    it, one per image in order) replaced by its full sequence; `crops[i]`: image i's crop
    count. A prompt whose markers do not match the images is a bug in the caller."""
    pieces = rendered.split(BOI_TOKEN)
    if len(pieces) - 1 != len(crops):
        raise ValueError(
            f"the prompt has {len(pieces) - 1} {BOI_TOKEN} markers for {len(crops)} images"
        )
    out = [pieces[0]]
    for n, piece in zip(crops, pieces[1:], strict=True):
        out += [image_prompt(n, cfg), piece]
    return "".join(out)
