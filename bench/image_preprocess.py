"""What an image costs the daemon before any model sees it (issue 26): Pillow's decoding
(text/images.py), Gemma 3's preprocessing to 896x896 (text/gemma3_images.py) and Qwen3.5's
(text/qwen_images.py: aspect kept, multiples of 32, patches flattened over 2 frames; released
settings), for a 1920x1080 screenshot-like PNG and an 896x896 JPEG. Medians of 15 runs; one
core's work.

  python -m bench.image_preprocess

(The vision encoder's time and TTFT against llama-server's mmproj are the issue's other
figures; they wait for the encoder.)
"""

from __future__ import annotations

import io
import statistics
import time

import numpy as np
from PIL import Image, ImageDraw

from llmd.text.gemma3_images import Gemma3ImageConfig, preprocess
from llmd.text.images import decode_image
from llmd.text.qwen_images import QwenImageConfig
from llmd.text.qwen_images import preprocess as qwen_preprocess


def screenshot(width: int, height: int, fmt: str) -> bytes:
    """Text lines on a light background under a dark title bar, as a screenshot looks."""
    img = Image.new("RGB", (width, height), (245, 245, 245))
    pen = ImageDraw.Draw(img)
    rng = np.random.default_rng(0)
    for _ in range(300):
        x, y = int(rng.integers(0, width - 200)), int(rng.integers(0, height - 20))
        pen.text((x, y), "def f(x): return x * 2  # screenshot text", fill=(20, 20, 20))
    pen.rectangle((0, 0, width, 40), fill=(40, 60, 120))
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def main() -> None:
    cfg = Gemma3ImageConfig()
    qwen = QwenImageConfig()
    cases = [
        ("1920x1080 PNG", screenshot(1920, 1080, "PNG")),
        ("896x896 JPEG", screenshot(896, 896, "JPEG")),
    ]
    for name, data in cases:
        decode_ms, prep_ms, qwen_ms = [], [], []
        for _ in range(15):
            t0 = time.perf_counter()
            image = decode_image(data, "bench")
            t1 = time.perf_counter()
            preprocess(image.pixels, cfg)
            t2 = time.perf_counter()
            patches, grid = qwen_preprocess(image.pixels, qwen)
            t3 = time.perf_counter()
            decode_ms.append((t1 - t0) * 1e3)
            prep_ms.append((t2 - t1) * 1e3)
            qwen_ms.append((t3 - t2) * 1e3)
        print(
            f"{name} ({len(data) // 1024} KiB): decode {statistics.median(decode_ms):.1f} ms, "
            f"gemma3 preprocess {statistics.median(prep_ms):.1f} ms, qwen3.5 preprocess "
            f"{statistics.median(qwen_ms):.1f} ms (grid {grid[1]}x{grid[2]}, {patches.shape})"
        )


if __name__ == "__main__":
    main()
