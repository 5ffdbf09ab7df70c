"""Images in requests (text/images.py): decoding the four formats, the limits, remote URLs
only when allowed (fetched within size and time limits), and the order of the checks."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from PIL import Image

from llmd.errors import ApiError
from llmd.text.images import (
    ImagePolicy,
    check_source,
    data_url_bytes,
    decode_image,
    fetch_image_bytes,
    load_images,
)


def encoded(fmt: str, size: tuple[int, int] = (8, 6), mode: str = "RGB", **save: object) -> bytes:
    colors = {"RGB": (10, 200, 30), "RGBA": (10, 200, 30, 0), "L": 120}
    img = Image.new(mode, size, colors[mode])
    buf = io.BytesIO()
    img.save(buf, format=fmt, **save)
    return buf.getvalue()


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def refused(fn, *args) -> ApiError:  # type: ignore[no-untyped-def]
    with pytest.raises(ApiError) as info:
        fn(*args)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_the_four_formats_decode_to_rgb(fmt: str) -> None:
    img = decode_image(encoded(fmt, (8, 6)), "p")
    assert img.size == (8, 6) and img.pixels.mode == "RGB"
    r, g, b = img.pixels.getpixel((3, 3))
    assert g > 150 and r < 60 and b < 80  # the green we drew, within lossy codecs' error


def test_a_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (4, 4), c) for c in ((255, 0, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    assert decode_image(buf.getvalue(), "p").pixels.getpixel((0, 0)) == (255, 0, 0)


def test_transparency_shows_over_white() -> None:
    img = decode_image(encoded("PNG", mode="RGBA"), "p")
    assert img.pixels.getpixel((0, 0)) == (255, 255, 255)


def test_same_bytes_same_hash_different_bytes_different_hash() -> None:
    a, b = encoded("PNG", (4, 4)), encoded("PNG", (5, 4))
    assert decode_image(a, "x").sha256 == decode_image(a, "y").sha256
    assert decode_image(a, "x").sha256 != decode_image(b, "x").sha256


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"not an image at all", "PNG, JPEG, WebP or GIF"),
        (encoded("BMP"), "PNG, JPEG, WebP or GIF"),  # a real image, not one of the four
        (encoded("PNG", (64, 64))[:60], "corrupt"),  # the header survives, the pixels do not
    ],
)
def test_bytes_that_are_no_image_name_the_part(data: bytes, words: str) -> None:
    err = refused(decode_image, data, "messages.[0].content.[1]")
    assert err.param == "messages.[0].content.[1]" and words in err.message


def test_a_decompression_bomb_is_refused_from_its_header() -> None:
    err = refused(decode_image, encoded("PNG", (8000, 6000), mode="L"), "images[0]")
    assert "8000x6000" in err.message and err.param == "images[0]"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("data:image/png;base64,###", "not valid base64"),
        ("data:image/png,rawbytes", "must be base64"),
        ("data:text/plain;base64,aGk=", "not an image"),
        ("data:image/png;base64,", "empty"),
        ("data-image", "malformed"),
    ],
)
def test_bad_data_urls_name_the_part(url: str, words: str) -> None:
    err = refused(data_url_bytes, url, "input[0].content[1]")
    assert err.param == "input[0].content[1]" and words in err.message


def test_an_image_over_the_size_limit_is_refused_before_decoding() -> None:
    err = refused(data_url_bytes, data_url(b"\0" * 2048), "p", 1024)
    assert "larger than" in err.message


def test_remote_urls_need_the_switch_and_other_schemes_never_pass() -> None:
    err = refused(check_source, "https://example.com/a.png", "p", ImagePolicy())
    assert "--allow-remote-images" in err.message
    check_source("https://example.com/a.png", "p", ImagePolicy(allow_remote=True))
    err = refused(check_source, "file:///etc/passwd", "p", ImagePolicy(allow_remote=True))
    assert "data: URL" in err.message


def test_a_model_that_cannot_see_is_a_400_after_the_images_are_checked() -> None:
    good = (data_url(encoded("PNG")), "messages.0.content.1")
    bad = ("data:image/png;base64,aGk=", "messages.2.content.0")
    policy = ImagePolicy()
    with pytest.raises(ApiError) as info:  # a bad image is named whatever the model
        asyncio.run(load_images([good, bad], policy, False, "m"))
    assert info.value.param == "messages.2.content.0"
    with pytest.raises(ApiError) as info:
        asyncio.run(load_images([good], policy, False, "smollm2"))
    assert info.value.code == "model_cannot_see" and "cannot see images" in info.value.message
    assert info.value.param == "messages.0.content.1"
    images = asyncio.run(load_images([good, good], policy, True, "m"))
    assert [i.where for i in images] == ["messages.0.content.1"] * 2


# ---------------------------------------------------------------------- remote fetches


@pytest.fixture
async def image_host(unused_tcp_port: int) -> AsyncIterator[str]:
    png = encoded("PNG", (5, 5))

    async def image(request: web.Request) -> web.StreamResponse:
        return web.Response(body=png, content_type="image/png")

    async def big(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()  # no Content-Length: the limit must hold while reading
        await resp.prepare(request)
        for _ in range(64):
            await resp.write(b"\0" * 1024)
        return resp

    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.Response(body=png)

    app = web.Application()
    app.router.add_get("/a.png", image)
    app.router.add_get("/big", big)
    app.router.add_get("/slow", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    yield f"http://127.0.0.1:{unused_tcp_port}"
    await runner.cleanup()


async def test_a_remote_image_is_fetched_and_decoded_when_allowed(image_host: str) -> None:
    policy = ImagePolicy(allow_remote=True)
    images = await load_images([(f"{image_host}/a.png", "p")], policy, True, "m")
    assert images[0].size == (5, 5)


@pytest.mark.parametrize(
    ("path", "policy", "words"),
    [
        ("/missing", ImagePolicy(allow_remote=True), "HTTP 404"),
        ("/big", ImagePolicy(allow_remote=True, max_bytes=16 * 1024), "larger than"),
        ("/slow", ImagePolicy(allow_remote=True, fetch_timeout=0.3), "longer than 0.3 s"),
    ],
)
async def test_remote_fetches_fail_as_a_400_naming_the_part(
    image_host: str, path: str, policy: ImagePolicy, words: str
) -> None:
    with pytest.raises(ApiError) as info:
        await fetch_image_bytes(f"{image_host}{path}", "messages.0.content.0", policy)
    assert info.value.status == 400 and words in info.value.message
    assert info.value.param == "messages.0.content.0"


async def test_a_remote_image_is_not_fetched_for_a_model_that_cannot_see(image_host: str) -> None:
    policy = ImagePolicy(allow_remote=True, fetch_timeout=0.3)
    with pytest.raises(ApiError) as info:  # /slow would time out if it were fetched
        await load_images([(f"{image_host}/slow", "p")], policy, False, "m")
    assert info.value.code == "model_cannot_see"
