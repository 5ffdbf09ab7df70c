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

import base64
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
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
    image has (0: each image its own, its embeddings' count: Qwen3.5, Gemma 4), whether an
    image's rows attend to one another (Gemma 3, Gemma 4), and for towers of any image size the patches merged per
    token along a side (0: none), whose merged grid places the rows for M-RoPE (Qwen3.5)."""

    image_token: int
    rows: int
    bidirectional: bool
    merge: int = 0


def layout_images(
    prompt: list[int], embeddings: list[np.ndarray], pixels: list[np.ndarray], layout: ImageLayout
) -> tuple[list[int], list[tuple[int, np.ndarray, bool]]]:
    """The prompt with each run of `layout.rows` image tokens (one per image, in order)
    replaced by that image's surrogate ids, and the engine's embedded runs (with the merged
    grid for M-RoPE where the layout has one). Raises ValueError
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
        k = len(runs)
        if k >= len(embeddings):
            raise ValueError(f"the prompt has more image runs than the {len(embeddings)} images")
        rows = layout.rows or len(embeddings[k])
        if j - i != rows:
            raise ValueError(f"an image takes {rows} image tokens; the prompt has a run of {j - i}")
        ids[i:j] = surrogate_ids(content_digest(pixels[k]), rows)
        if layout.merge:  # pixels[k]: (grid h, grid w, patch values)
            grid = (pixels[k].shape[0] // layout.merge, pixels[k].shape[1] // layout.merge)
            runs.append((i, embeddings[k], layout.bidirectional, grid))
        else:
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


def qwen_layout(config: dict[str, Any], merge: int) -> ImageLayout:
    """Qwen3.5's: `image_token_id` (`<|image_pad|>`) once per merged token, a count per
    image, causal like text (transformers' Qwen3.5 masks image tokens as text), the rows on
    the image's merged grid for M-RoPE."""
    token = config.get("image_token_id")
    if token is None:
        raise ValueError("the Qwen3.5 config names no image_token_id")
    return ImageLayout(int(token), 0, False, merge)


def gemma4_layout(config: dict[str, Any]) -> ImageLayout:
    """Gemma 4's: `image_token_id` (`<|image|>`) once per soft token, a count per image (its
    pooled grid), the rows seeing their whole image where the text config says so
    (use_bidirectional_attention "vision": transformers' mm_token_type_ids mask; the decoder
    applies it on its sliding layers only), else causal like text (the small released models)."""
    token = config.get("image_token_id")
    if token is None:
        raise ValueError("the Gemma 4 config names no image_token_id")
    bidirectional = config.get("text_config.use_bidirectional_attention") == "vision"
    return ImageLayout(int(token), 0, bidirectional)


def gemma3_gguf_layout(tokens: list[str], rows: int) -> ImageLayout:
    """A GGUF Gemma 3's, its vision tower from an mmproj: the vocabulary's
    `<image_soft_token>` once per row (llama.cpp's GGUFs keep Gemma 3's whole vocabulary, image
    tokens included), `rows` from the mmproj's pooled grid."""
    try:
        token = tokens.index("<image_soft_token>")
    except ValueError:
        raise ValueError("the model's vocabulary has no <image_soft_token>") from None
    return ImageLayout(token, rows, True)


def qwen_gguf_layout(tokens: list[str], merge: int) -> ImageLayout:
    """A GGUF Qwen3.5-MoE's, its vision tower from an mmproj: as qwen_layout, the image token
    found in the vocabulary (`<|image_pad|>`, which llama.cpp's GGUFs keep)."""
    try:
        token = tokens.index("<|image_pad|>")
    except ValueError:
        raise ValueError("the model's vocabulary has no <|image_pad|>") from None
    return ImageLayout(token, 0, False, merge)


def decode_pixels(data: str, shape: list[int]) -> np.ndarray:
    """An ImageInput's base64 float32 pixels as a (channels, height, width) array; ValueError
    when the bytes do not fill the shape or hold a non-finite value."""
    raw = base64.b64decode(data, validate=True)
    count = shape[0] * shape[1] * shape[2]
    if len(raw) != 4 * count:
        raise ValueError(
            f"an image of shape {shape} needs {4 * count} bytes of pixels, not {len(raw)}"
        )
    pixels = np.frombuffer(raw, dtype="<f4").reshape(shape)
    if not np.isfinite(pixels).all():
        raise ValueError("an image's pixels hold a non-finite value")
    return pixels


# Images per vision-tower pass: the SigLIP encoder's attention scores are [heads, patches,
# patches] per image (16 x 4096 x 4096 float32, 1 GiB, for the released Gemma 3 on MLX's CPU
# path), so a pass holds that many of them at once.
MAX_IMAGES_PER_PASS = 2


# Embeddings of recent images kept in the worker (a released Gemma 3 4B image: 256 x 2560
# float32, 2.5 MiB): what lets a conversation's later turns skip the tower for an image they
# send again, as the prefix cache lets them skip its prefill.
EMBEDDING_CACHE_BYTES = 128 << 20


class EmbeddingCache:
    """Image embeddings by content digest, least recently used dropped past `budget` bytes."""

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._bytes = 0
        self._items: OrderedDict[bytes, np.ndarray] = OrderedDict()

    def get(self, digest: bytes) -> np.ndarray | None:
        emb = self._items.get(digest)
        if emb is not None:
            self._items.move_to_end(digest)
        return emb

    def put(self, digest: bytes, emb: np.ndarray) -> None:
        if digest in self._items or emb.nbytes > self._budget:
            return
        self._items[digest] = emb
        self._bytes += emb.nbytes
        while self._bytes > self._budget:
            _, old = self._items.popitem(last=False)
            self._bytes -= old.nbytes


class ImageEncoder:
    """The model's vision tower beside its engine: images encoded (between the engine's
    forward passes) and laid into their request's prompt."""

    def __init__(self, tower: Any, layout: ImageLayout, engine: Any) -> None:
        self._tower = tower
        self._layout = layout
        self._engine = engine
        self._cache = EmbeddingCache(EMBEDDING_CACHE_BYTES)
        self.encoded = 0  # images run through the tower
        self.cache_hits = 0  # images whose embeddings came from the cache
        self.encode_seconds = 0.0  # wall time in the tower (pixels in, rows out)
        self.load_ms = 0.0  # what loading the tower took (set by load)

    def facts(self) -> dict[str, Any]:
        """What the worker's `ready` says of the tower."""
        return {
            "architecture": self._tower.architecture,
            "tokens_per_image": self._tower.tokens_per_image,
            "load_ms": round(self.load_ms, 1),
        }

    @classmethod
    def load(
        cls,
        model_path: str,
        engine: Any,
        config: dict[str, Any] | None,
        mmproj: str | None = None,
    ) -> ImageEncoder | None:
        """The encoder of a multimodal checkpoint, or of a GGUF model with llama.cpp's
        `mmproj` file beside it, whose images the engine can take, else None (a GGUF file
        without an mmproj, a text-only checkpoint, or an architecture or backend without image
        support: the daemon then refuses images for this model). Raises ValueError naming
        what does not fit (an mmproj for another architecture or another hidden size)."""
        if not engine.accepts_embeddings:
            return None
        from llmd import _engine

        started = time.perf_counter()

        backend = engine.info()["backend"]
        if mmproj:
            from llmd.store.gguf_metadata import read_gguf_metadata

            arch = engine.info()["architecture"]
            if arch not in ("gemma3", "qwen3_5_moe"):
                raise ValueError(
                    f"llmd runs mmproj vision towers for gemma3 and qwen35moe only, not {arch}"
                )
            tower = _engine.VisionTower(mmproj, {}, backend=backend)
            if tower.architecture != arch:
                raise ValueError(f"the mmproj is a {tower.architecture} tower, the model {arch}")
            tokens = read_gguf_metadata(model_path).get("tokenizer.ggml.tokens", [])
            if arch == "gemma3":
                layout = gemma3_gguf_layout(tokens, tower.tokens_per_image)
            else:
                layout = qwen_gguf_layout(tokens, tower.merge_size)
        elif config is not None and config.get("model_type") == "gemma3":
            tower = _engine.VisionTower(model_path, config, backend=backend)
            layout = gemma3_layout(config)
        elif config is not None and config.get("model_type") == "gemma4":
            tower = _engine.VisionTower(model_path, config, backend=backend)
            layout = gemma4_layout(config)
        elif config is not None and config.get("model_type") in ("qwen3_5", "qwen3_5_moe"):
            tower = _engine.VisionTower(model_path, config, backend=backend)
            layout = qwen_layout(config, tower.merge_size)
        else:
            return None
        if tower.hidden_size != engine.info()["hidden_size"]:
            raise ValueError(
                f"the vision projector gives {tower.hidden_size} values per row, "
                f"the text model takes {engine.info()['hidden_size']}"
            )
        encoder = cls(tower, layout, engine)
        encoder.load_ms = (time.perf_counter() - started) * 1000
        return encoder

    def pixels(self, images: list[Any]) -> list[np.ndarray]:
        """A request's ImageInputs decoded; ValueError naming one the tower cannot read."""
        size = self._tower.image_size
        out = []
        for i, image in enumerate(images):
            if not size:  # a tower of any image size: (grid h, grid w, patch values)
                gh, gw, values = image.shape
                m = self._tower.merge_size
                if values != self._tower.patch_values or gh % m or gw % m:
                    raise ValueError(
                        f"image {i} is {image.shape}; this model reads patches "
                        f"[grid h, grid w, {self._tower.patch_values}], the grid in multiples of {m}"
                    )
                out.append(decode_pixels(image.pixels, list(image.shape)))
                continue
            if list(image.shape) != [3, size, size]:
                raise ValueError(
                    f"image {i} is {image.shape}; this model reads [3, {size}, {size}]"
                )
            out.append(decode_pixels(image.pixels, list(image.shape)))
        return out

    def encode(self, pixels: list[np.ndarray]) -> list[np.ndarray]:
        """Each image's [rows, hidden] embeddings: from the cache of recent images (the next
        turn of a conversation sends its screenshot again), the others through the tower,
        MAX_IMAGES_PER_PASS images per pass."""
        digests = [content_digest(px) for px in pixels]
        out: list[np.ndarray | None] = [self._cache.get(d) for d in digests]
        missing = [i for i, e in enumerate(out) if e is None]
        for k in range(0, len(missing), MAX_IMAGES_PER_PASS):
            part = missing[k : k + MAX_IMAGES_PER_PASS]
            started = time.perf_counter()
            rows = self._run_tower([pixels[i] for i in part])
            self.encode_seconds += time.perf_counter() - started
            for i, emb in zip(part, rows, strict=True):
                out[i] = emb
                self._cache.put(digests[i], emb)
        self.encoded += len(missing)
        self.cache_hits += len(pixels) - len(missing)
        return [e for e in out if e is not None]

    def _run_tower(self, pixels: list[np.ndarray]) -> list[np.ndarray]:
        """One pass of the tower over `pixels`: whole images of one size, or (a tower of any
        size) each image's patches with its grid."""
        if self._tower.image_size:
            return list(self._tower.encode(np.stack(pixels), engine=self._engine))
        patches = np.concatenate([px.reshape(-1, px.shape[2]) for px in pixels])
        grids = [(1, px.shape[0], px.shape[1]) for px in pixels]
        return self._tower.encode_patches(patches, grids, engine=self._engine)

    def layout(
        self, prompt: list[int], embeddings: list[np.ndarray], pixels: list[np.ndarray]
    ) -> tuple[list[int], list]:
        return layout_images(prompt, embeddings, pixels, self._layout)

    def prepare(self, prompt: list[int], images: list[Any]) -> tuple[list[int], list]:
        """(prompt with surrogate ids, embedded runs) for the engine; ValueError naming what
        does not fit (an image of the wrong size, placeholder runs that do not match)."""
        pixels = self.pixels(images)
        return self.layout(prompt, self.encode(pixels), pixels)


Submit = Callable[[list[int], list], None]
Fail = Callable[[str, str, str], None]  # (request id, code, message)


class ImageRequests:
    """Requests with images wait here for a thread of their own, which encodes the images of
    every request waiting when it wakes in the same passes (batched across requests) and then
    submits each request. The reader thread never blocks on an encode, so cancels, stats and
    text-only requests go on meanwhile.

    A cancel for a request still waiting is remembered: the request is submitted and
    cancelled at once, so it ends with the engine's `done` (cancelled) like any other."""

    def __init__(self, encoder: ImageEncoder, engine: Any, fail: Fail) -> None:
        self._encoder = encoder
        self._engine = engine
        self._fail = fail
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._waiting: list[tuple[str, list[int], list[Any], Submit]] = []
        self._pending: set[str] = set()  # waiting or being encoded
        self._cancelled: set[str] = set()
        self._passes = 0
        self._largest_batch = 0
        threading.Thread(target=self._run, name="llmd-images", daemon=True).start()

    def put(self, rid: str, prompt: list[int], images: list[Any], submit: Submit) -> None:
        with self._lock:
            self._waiting.append((rid, prompt, images, submit))
            self._pending.add(rid)
            self._wake.notify()

    def cancel(self, rid: str) -> bool:
        """True when the request is still here (it will end cancelled)."""
        with self._lock:
            if rid not in self._pending:
                return False
            self._cancelled.add(rid)
            return True

    def stats(self) -> dict[str, int | float]:
        with self._lock:
            return {
                "images_encoded": self._encoder.encoded,
                "image_encode_seconds": self._encoder.encode_seconds,
                "image_cache_hits": self._encoder.cache_hits,
                "image_batches": self._passes,
                "image_requests_largest_batch": self._largest_batch,
            }

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._waiting:
                    self._wake.wait()
                batch, self._waiting = self._waiting, []
            ready = []
            for rid, prompt, images, submit in batch:
                try:
                    ready.append((rid, prompt, self._encoder.pixels(images), submit))
                except ValueError as exc:
                    self._done(rid)
                    self._fail(rid, "invalid_request", str(exc))
            try:
                embeddings = self._encoder.encode([px for r in ready for px in r[2]])
            except Exception as exc:  # noqa: BLE001 - the batch's requests fail, the worker goes on
                for rid, *_ in ready:
                    self._done(rid)
                    self._fail(rid, "internal", f"encoding the images failed: {exc}")
                continue
            with self._lock:
                self._passes += 1
                self._largest_batch = max(self._largest_batch, len(ready))
            first = 0
            for rid, prompt, pixels, submit in ready:
                mine = embeddings[first : first + len(pixels)]
                first += len(pixels)
                try:
                    ids, runs = self._encoder.layout(prompt, mine, pixels)
                    with self._lock:  # a cancel now either finds it pending or reaches the engine
                        submit(ids, runs)
                        if rid in self._cancelled:
                            self._engine.cancel(rid)
                        self._pending.discard(rid)
                        self._cancelled.discard(rid)
                except (TypeError, ValueError, OverflowError) as exc:
                    self._done(rid)
                    self._fail(rid, "invalid_request", str(exc))

    def _done(self, rid: str) -> None:
        with self._lock:
            self._pending.discard(rid)
            self._cancelled.discard(rid)
