"""A logging reverse proxy for the agent CLI tests: every request (method, path, headers, JSON
body) and the upstream's answer (status, headers, and the body of an error or the usage a
stream reported) is written to DIR/NNN.json as soon as the exchange ends.

    python -m tests.agents.capture_proxy --upstream http://127.0.0.1:7477 --port 7478 --out DIR

The bodies stream through unchanged (SSE included); the proxy only keeps a copy.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import time
from pathlib import Path

from aiohttp import ClientSession, ClientTimeout, web

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "content-encoding",
}
KEEP_ANSWER_BYTES = 64 * 1024


def _json_or_text(raw: bytes):
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return raw.decode("utf-8", "replace")


def _usage_from_sse(text: str) -> list:
    """The usage objects a stream carried (OpenAI chat, Anthropic, Responses shapes)."""
    found = []
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        try:
            ev = json.loads(line[5:].strip())
        except ValueError:
            continue
        if not isinstance(ev, dict):
            continue
        for holder in (ev, ev.get("message") or {}, ev.get("response") or {}):
            if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
                found.append(holder["usage"])
        if isinstance(ev.get("error"), dict) or ev.get("type") == "error":
            found.append({"stream_error": ev})
    return found


def make_app(upstream: str, out: Path) -> web.Application:
    out.mkdir(parents=True, exist_ok=True)
    counter = itertools.count(len(list(out.glob("*.json"))) + 1)

    async def on_startup(app: web.Application) -> None:
        app["client"] = ClientSession(timeout=ClientTimeout(total=None, sock_read=None))

    async def on_cleanup(app: web.Application) -> None:
        await app["client"].close()

    async def handle(request: web.Request) -> web.StreamResponse:
        n = next(counter)
        started = time.time()
        body = await request.read()
        record = {
            "n": n,
            "time": started,
            "method": request.method,
            "path": request.path_qs,
            "headers": dict(request.headers),
            "body": _json_or_text(body) if body else None,
        }
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        kept = bytearray()
        response: web.StreamResponse | None = None
        try:
            async with app["client"].request(
                request.method, upstream + request.path_qs, headers=headers, data=body
            ) as up:
                response = web.StreamResponse(status=up.status, reason=up.reason)
                for k, v in up.headers.items():
                    if k.lower() not in HOP_BY_HOP:
                        response.headers[k] = v
                await response.prepare(request)
                # Known from here on, even if the client hangs up before the stream ends.
                record["status"] = up.status
                record["response_headers"] = dict(up.headers)
                async for chunk in up.content.iter_any():
                    if len(kept) < KEEP_ANSWER_BYTES:
                        kept.extend(chunk)
                    elif b"usage" in chunk or b"error" in chunk:
                        kept.extend(chunk)  # a stream's last events carry the usage
                    await response.write(chunk)
                await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError) as exc:
            record["client_gone"] = repr(exc)
            raise
        except Exception as exc:  # noqa: BLE001 - recorded, then a 502 to the client
            record["proxy_error"] = repr(exc)
            if response is None:
                response = web.json_response({"error": {"message": repr(exc)}}, status=502)
            record.setdefault("status", 502)
        finally:
            record["elapsed_s"] = round(time.time() - started, 3)
            text = kept.decode("utf-8", "replace")
            ctype = record.get("response_headers", {}).get("Content-Type", "")
            if "event-stream" in ctype or "ndjson" in ctype:
                record["stream_usage"] = _usage_from_sse(text)
                record["response_head"] = text[:4000]
                record["response_tail"] = text[-4000:]
            else:
                record["response"] = _json_or_text(bytes(kept))
            path = out / f"{n:03d}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record, indent=1, ensure_ascii=False))
            os.replace(tmp, path)
        return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    web.run_app(
        make_app(args.upstream.rstrip("/"), Path(args.out)),
        host="127.0.0.1",
        port=args.port,
        print=lambda *_: print(f"proxy on {args.port} -> {args.upstream}", flush=True),
    )


if __name__ == "__main__":
    main()
