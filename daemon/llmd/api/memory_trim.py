"""Giving the memory of big request bodies back to the system once they are answered.

Why: a multi-megabyte body is held several times over while it is decoded, validated and
rendered (bytes, JSON objects, pydantic models, the prompt string); Python frees it all when
the request ends, but glibc keeps the freed pages in its heap arenas, so the daemon's RSS stays
at its high-water mark (measured: 112 MiB before, ~190 MiB after a few 8 MB prompts, 0.6-1.7
GiB after a fuzz run). `malloc_trim(0)` returns free arena pages to the kernel; it costs a few
milliseconds, so it runs in a thread and only after a body this large.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Awaitable, Callable

from aiohttp import web

TRIM_AFTER_BODY = 1 << 20


def _load_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim this way
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_malloc_trim = _load_trim()


def _trim_now() -> None:
    assert _malloc_trim is not None
    _malloc_trim(0)


@web.middleware
async def trim_after_big_bodies(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    finally:
        if (request.content_length or 0) > TRIM_AFTER_BODY and _malloc_trim is not None:
            # After the handler: the body and everything built from it are garbage by now.
            asyncio.get_running_loop().run_in_executor(None, _trim_now)
