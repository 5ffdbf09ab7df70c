"""Images in the worker: encoding them with the model's vision tower and laying their rows
into a request's prompt for the engine.

The engine takes an image as a run of prompt rows fed as embeddings (GenerateRequest's
`embedded` runs). Those rows carry surrogate ids below 0 instead of the placeholder token
(`<image_soft_token>`): ids derived from the image's content hash and the row's place in the
image. The prefix cache keys and checks blocks by the prompt's ids, so a second turn with the
same screenshot reuses its KV (same pixels, same ids), and a different image behind the same
placeholders never does (other ids).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np


def content_digest(pixels: np.ndarray) -> bytes:
    """sha256 of an image's preprocessed pixels (float32, C order) and their shape: what the
    model sees, so two files that decode to the same pixels share their cache."""
    data = np.ascontiguousarray(pixels, dtype=np.float32)
    h = hashlib.sha256(repr(data.shape).encode())
    h.update(data.tobytes())
    return h.digest()


def surrogate_ids(digest: bytes, rows: int) -> list[int]:
    """The ids of an image's `rows` prompt rows: below 0, a function of (digest, row). 31 bits
    per row from a keyed hash, so two images share a block's ids only if their sha256 do."""
    out = []
    for i in range(rows):
        word = hashlib.blake2b(i.to_bytes(4, "little"), key=digest[:32], digest_size=4).digest()
        out.append(-1 - (int.from_bytes(word, "little") & 0x7FFFFFFF))
    return out


@dataclass(frozen=True)
class ImageLayout:
    """Where each image's rows go: the token the template repeats per row, how many rows an
    image has, and whether an image's rows attend to one another (Gemma 3)."""

    image_token: int
    rows: int
    bidirectional: bool


def layout_images(
    prompt: list[int], embeddings: list[np.ndarray], pixels: list[np.ndarray], layout: ImageLayout
) -> tuple[list[int], list[tuple[int, np.ndarray, bool]]]:
    """The prompt with each run of `layout.rows` image tokens (one per image, in order)
    replaced by that image's surrogate ids, and the engine's embedded runs. Raises ValueError
    when the runs and the images do not match one to one."""
    ids = list(prompt)
    runs: list[tuple[int, np.ndarray, bool]] = []
    i = 0
    n = len(ids)
    while i < n:
        if ids[i] != layout.image_token:
            i += 1
            continue
        j = i
        while j < n and ids[j] == layout.image_token:
            j += 1
        if j - i != layout.rows:
            raise ValueError(
                f"an image takes {layout.rows} image tokens; the prompt has a run of {j - i}"
            )
        k = len(runs)
        if k >= len(embeddings):
            raise ValueError(f"the prompt has more image runs than the {len(embeddings)} images")
        ids[i:j] = surrogate_ids(content_digest(pixels[k]), layout.rows)
        runs.append((i, embeddings[k], layout.bidirectional))
        i = j
    if len(runs) != len(embeddings):
        raise ValueError(f"the prompt has {len(runs)} image runs for {len(embeddings)} images")
    return ids, runs


def gemma3_layout(config: dict[str, Any]) -> ImageLayout:
    """Gemma 3's: `image_token_id` (`image_token_index` in older configs) once per row,
    mm_tokens_per_image rows, bidirectional within each image (transformers' token_type_ids
    mask, llama.cpp's non-causal image batches)."""
    token = config.get("image_token_id", config.get("image_token_index"))
    if token is None:
        raise ValueError("the Gemma 3 config names no image_token_id")
    return ImageLayout(int(token), int(config.get("mm_tokens_per_image", 256)), True)
