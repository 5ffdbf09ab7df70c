"""Images in a chat request: where each one comes from, its bytes, and its pixels.

Every protocol translates its image parts into the internal request's OpenAI `image_url`
parts (a `data:` URL, or an `http(s)` URL when the daemon allows remote images); this module
turns those into decoded images once, in the pipeline, so every protocol refuses a bad image
with the same 400 naming the part in the client's own words (`where`).

Decisions:
- Formats are the four every anchor takes: PNG, JPEG, WebP and GIF (its first frame, as
  Ollama and llama-server read it). Pillow decodes them; any other format, or bytes Pillow
  cannot read, is a 400 naming the part.
- Limits: at most `MAX_IMAGE_BYTES` encoded and `MAX_IMAGE_PIXELS` decoded (checked from the
  header, before the pixels are decoded, so a decompression bomb costs nothing).
- Remote URLs are fetched only with `llmd serve --allow-remote-images`: a daemon on a
  developer's machine must not fetch arbitrary URLs for whoever can reach its port unless
  asked to. A fetch has a time limit and stops reading past the size limit.
- A model sees images when its worker says so (the ready handshake's `vision` feature); an
  image for any other model is a 400 saying the model cannot see, never dropped.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import re
from dataclasses import dataclass
from typing import Any

from llmd.errors import bad_request

MAX_IMAGE_BYTES = 20 << 20
MAX_IMAGE_PIXELS = 40_000_000  # 8K UHD (7680x4320 = 33 Mpx) fits; a bomb does not
FETCH_TIMEOUT_S = 15.0
FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif")
VISION_FEATURE = "vision"  # in the worker's ready features where the model has a vision tower

_DATA_URL = re.compile(r"data:([^;,]*)((?:;[^;,]*)*),(.*)", re.DOTALL)


@dataclass(frozen=True)
class ImagePolicy:
    """What the daemon lets a request's images do (from `llmd serve`'s switches)."""

    allow_remote: bool = False
    max_bytes: int = MAX_IMAGE_BYTES
    fetch_timeout: float = FETCH_TIMEOUT_S


@dataclass(frozen=True)
class ChatImage:
    """One decoded image of a request, in prompt order: RGB pixels, the part it came from
    (for errors) and the sha256 of its encoded bytes (what the prefix cache will key the
    image's tokens by, so a conversation's screenshot is encoded once)."""

    where: str
    pixels: Any  # PIL.Image.Image, RGB
    sha256: str

    @property
    def size(self) -> tuple[int, int]:
        return self.pixels.size  # type: ignore[no-any-return]


def image_error(where: str, what: str) -> Exception:
    return bad_request(f"{where}: {what}", param=where)


def is_remote(url: str) -> bool:
    return url[:8].lower().startswith(("http://", "https://"))


def check_source(url: str, where: str, policy: ImagePolicy) -> None:
    """A 400 for a URL llmd will not read: not `data:` nor `http(s)`, or remote when remote
    images are off."""
    if url[:5].lower() == "data:":
        return
    if is_remote(url):
        if not policy.allow_remote:
            raise image_error(
                where,
                "image URLs are not fetched unless the daemon runs with "
                "`llmd serve --allow-remote-images`; send the image inline as a base64 data URL",
            )
        return
    raise image_error(where, "an image URL must be a data: URL (base64) or an http(s) URL")


def base64_bytes(text: str, where: str, max_bytes: int = MAX_IMAGE_BYTES) -> bytes:
    """Base64 text (whitespace allowed, as clients wrap it) -> bytes, within the size limit."""
    compact = "".join(text.split())
    if len(compact) * 3 // 4 > max_bytes + 3:
        raise image_error(where, f"the image is larger than {max_bytes >> 20} MiB")
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise image_error(where, "the image data is not valid base64") from None
    if not data:
        raise image_error(where, "the image data is empty")
    if len(data) > max_bytes:
        raise image_error(where, f"the image is larger than {max_bytes >> 20} MiB")
    return data


def data_url_bytes(url: str, where: str, max_bytes: int = MAX_IMAGE_BYTES) -> bytes:
    """A `data:image/...;base64,...` URL's bytes. The media type is not trusted: Pillow reads
    the format from the bytes themselves."""
    m = _DATA_URL.fullmatch(url)
    if m is None:
        raise image_error(where, "malformed data URL (expected data:image/png;base64,...)")
    media, params, payload = m.groups()
    if media and not media.lower().startswith("image/"):
        raise image_error(where, f"the data URL holds '{media}', not an image")
    if "base64" not in params.lower().split(";"):
        raise image_error(where, "an image data URL must be base64 (data:image/png;base64,...)")
    return base64_bytes(payload, where, max_bytes)


def decode_image(data: bytes, where: str) -> ChatImage:
    """Encoded bytes -> RGB pixels (a GIF's first frame; transparency over white, as a
    screenshot's viewer shows it). CPU work: call it off the event loop."""
    from PIL import Image, UnidentifiedImageError  # deferred: only image requests pay for it

    try:
        img = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:
        raise image_error(
            where, "not an image llmd can read (PNG, JPEG, WebP or GIF expected)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - Pillow raises many kinds for broken headers
        raise image_error(where, f"the image cannot be read ({exc})") from None
    width, height = img.size
    if width * height > MAX_IMAGE_PIXELS:
        raise image_error(
            where,
            f"the image is {width}x{height} pixels; at most {MAX_IMAGE_PIXELS // 1_000_000} "
            "million pixels are accepted",
        )
    if width < 1 or height < 1:
        raise image_error(where, "the image has no pixels")
    try:
        img.seek(0)  # a GIF's (or animated WebP's) first frame
        img.load()
        rgb = _to_rgb(img)
    except Exception as exc:  # noqa: BLE001 - truncated or corrupt pixel data
        raise image_error(where, f"the image data is corrupt ({exc})") from None
    return ChatImage(where, rgb, hashlib.sha256(data).hexdigest())


def _to_rgb(img: Any) -> Any:
    from PIL import Image

    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


async def fetch_image_bytes(url: str, where: str, policy: ImagePolicy) -> bytes:
    """GET a remote image within the policy's time and size limits (400 naming the part on
    any failure: the client sent the URL)."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=policy.fetch_timeout)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.get(url, headers={"Accept": ", ".join(MEDIA_TYPES)}) as resp,
        ):
            if resp.status != 200:
                raise image_error(where, f"fetching the image failed: HTTP {resp.status}")
            if (resp.content_length or 0) > policy.max_bytes:
                raise image_error(where, f"the image is larger than {policy.max_bytes >> 20} MiB")
            chunks: list[bytes] = []
            total = 0
            async for chunk in resp.content.iter_chunked(1 << 16):
                total += len(chunk)
                if total > policy.max_bytes:
                    raise image_error(
                        where, f"the image is larger than {policy.max_bytes >> 20} MiB"
                    )
                chunks.append(chunk)
            return b"".join(chunks)
    except TimeoutError:
        raise image_error(
            where, f"fetching the image took longer than {policy.fetch_timeout:g} s"
        ) from None
    except aiohttp.ClientError as exc:
        raise image_error(where, f"fetching the image failed ({exc})") from None


async def load_images(
    refs: list[tuple[str, str]],
    policy: ImagePolicy,
    can_see: bool,
    model_name: str,
) -> list[ChatImage]:
    """A request's image parts, `(url, where)` in prompt order, -> decoded images.

    Order of the checks: every part's URL and inline bytes first (a malformed request is a
    400 whatever model it names), then whether the model can see (no remote fetch for a
    model that cannot use the image), then the remote fetches."""
    if not refs:
        return []
    for url, where in refs:
        check_source(url, where, policy)

    def inline() -> dict[int, ChatImage]:
        return {
            i: decode_image(data_url_bytes(url, where, policy.max_bytes), where)
            for i, (url, where) in enumerate(refs)
            if not is_remote(url)
        }

    decoded = await asyncio.to_thread(inline)
    if not can_see:
        raise bad_request(
            f"model '{model_name}' cannot see images: it is a text-only model (no vision "
            "encoder that llmd runs); send text only",
            param=refs[0][1],
            code="model_cannot_see",
        )
    for i, (url, where) in enumerate(refs):
        if i not in decoded:
            data = await fetch_image_bytes(url, where, policy)
            decoded[i] = await asyncio.to_thread(decode_image, data, where)
    return [decoded[i] for i in range(len(refs))]
