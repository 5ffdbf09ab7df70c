"""Seeded fuzzing of every generation protocol over the FAKE worker (issue 30): valid bodies
of chat, completions, responses, messages and Ollama's chat/generate, mutated with the
classes of hostile input that once reached a 500 (deep nesting, lone surrogates, huge
integers, wrong types, long or odd model names, nulls, unknown keys, broken framing). Every
answer must come within a timeout, with a status below 500 and, for a 4xx, the protocol's
error shape; the daemon must serve a normal request of each protocol afterwards."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random
from pathlib import Path
from typing import Any

from tests.unit.fake_api import MODEL, api
from tests.unit.test_hostile_input import assert_error_shape

SEED = int(os.environ.get("LLMD_FUZZ_SEED", "30"))
CASES = 600
TIMEOUT = 15.0

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Say hi."}]},
]
VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 4,
        "temperature": 0.5,
        "stop": ["\n\n"],
        "response_format": {"type": "text"},
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get",
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                },
            }
        ],
    },
    "/v1/completions": {"model": MODEL, "prompt": "Once upon", "max_tokens": 4, "seed": 1},
    "/v1/responses": {
        "model": MODEL,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "instructions": "Be brief.",
        "max_output_tokens": 4,
    },
    "/v1/messages": {
        "model": MODEL,
        "max_tokens": 4,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    },
    "/api/chat": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "options": {"temperature": 0.2, "num_ctx": 512},
        "keep_alive": "5m",
    },
    "/api/generate": {
        "model": MODEL,
        "prompt": "hi",
        "system": "Be brief.",
        "stream": False,
        "keep_alive": 60,
    },
}


def locations(value: Any) -> list[tuple[Any, ...]]:
    """Every path (keys and indexes) inside `value`, the root included; walked without
    recursion and not below 12 levels (a deep mutation is not mutated further inside)."""
    out: list[tuple[Any, ...]] = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, here = stack.pop()
        out.append(here)
        if len(here) >= 12:
            continue
        if isinstance(item, dict):
            stack.extend((v, (*here, k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, (*here, i)) for i, v in enumerate(item))
    return sorted(out, key=repr)  # a stable order for the seeded choices


def get_at(value: Any, where: tuple[Any, ...]) -> Any:
    for step in where:
        value = value[step]
    return value


def set_at(body: dict[str, Any], where: tuple[Any, ...], new: Any) -> dict[str, Any]:
    if not where:
        return new  # type: ignore[no-any-return]
    get_at(body, where[:-1])[where[-1]] = new
    return body


def deep(rng: random.Random) -> Any:
    depth = rng.choice([70, 129, 300, 999, 1500, 5000])
    inner: Any = rng.choice([1, "x", None, {}])
    for _ in range(depth):
        inner = [inner] if rng.random() < 0.5 else {"a": inner}
    return inner


def huge_int(rng: random.Random) -> int:
    return rng.choice([2**31, 2**63, -(2**63) - 1, 2**64, 10**100, -(10**300), 10**4000])


def wrong_type(rng: random.Random) -> Any:
    return rng.choice([None, True, False, 0, -1, 1.5, float("1e308"), "", "x", [], {}, [None]])


def odd_name(rng: random.Random) -> str:
    return rng.choice(
        [
            "a" * rng.choice([129, 256, 300, 5000, 70_000]),
            "../../etc/passwd",
            "/dev/zero",
            "x\x00y",
            "hf.co/" + "o" * 300 + "/r",
            "a:b:c:" * 50,
            "\ud800",
            " ",
            "💥" * 100,
        ]
    )


def mutate(body: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["deep", "surrogate", "int", "type", "name", "null", "drop", "extra"])
    where = rng.choice(locations(body))
    if kind == "deep":
        return set_at(body, where, deep(rng)) if where else {**body, "messages": deep(rng)}
    if kind == "surrogate":
        strings = [w for w in locations(body) if isinstance(get_at(body, w), str)]
        if not strings:
            return body
        w = rng.choice(strings)
        text = get_at(body, w)
        cut = rng.randrange(len(text) + 1)
        return set_at(
            body, w, text[:cut] + rng.choice(["\ud800", "\udfff", "\udc00x"]) + text[cut:]
        )
    if kind == "int":
        return set_at(body, where, huge_int(rng)) if where else body
    if kind == "type":
        return set_at(body, where, wrong_type(rng))
    if kind == "name":
        return {**body, "model": odd_name(rng)}
    if kind == "null":
        return set_at(body, where, None) if where else body
    if kind == "drop":
        if where and isinstance(get_at(body, where[:-1]), dict):
            del get_at(body, where[:-1])[where[-1]]
        return body
    body[rng.choice(["zzz", "keep_alive", "session_id", "stream", "format"])] = wrong_type(rng)
    return body


def encode(body: Any) -> bytes:
    try:
        return json.dumps(body).encode()
    except (ValueError, RecursionError):  # an int past Python's str limit, too deep to dump
        return b'{"model": "' + b"1" * 5000 + b'", "n": ' + b"9" * 5000 + b"}"


async def read_all(resp: Any) -> bytes:
    return await asyncio.wait_for(resp.read(), timeout=TIMEOUT)


async def test_mutated_requests_never_reach_a_500_or_a_hang(llmd_home: Path) -> None:
    rng = random.Random(SEED)
    seen: dict[int, int] = {}
    async with api(llmd_home, max_body=4 << 20) as client:
        for case in range(CASES):
            path = rng.choice(list(VALID))
            body: Any = copy.deepcopy(VALID[path])
            for _ in range(rng.choice([1, 1, 2, 3])):
                body = mutate(body, rng)
                if not isinstance(body, dict):
                    break
            data = encode(body)
            headers = {"Content-Type": "application/json"}
            framing = rng.random()
            if framing < 0.04:
                headers["Content-Encoding"] = "gzip"
            elif framing < 0.08:
                data = data[: rng.randrange(len(data))]  # truncated JSON
            resp = await asyncio.wait_for(
                client.post(path, data=data, headers=headers), timeout=TIMEOUT
            )
            raw = await read_all(resp)
            seen[resp.status] = seen.get(resp.status, 0) + 1
            context = (case, path, resp.status, data[:300], raw[:300])
            assert resp.status < 500, context
            if resp.status >= 400:
                assert resp.content_type == "application/json", context
                assert_error_shape(path, json.loads(raw), resp.status)
        # The daemon still serves every protocol normally.
        for path, valid in VALID.items():
            resp = await asyncio.wait_for(client.post(path, json=valid), timeout=TIMEOUT)
            assert resp.status == 200, (path, await resp.text())
    assert seen.get(400, 0) > CASES // 4, seen  # the mutations do reach validation
    assert seen.get(200, 0) > 0, seen  # and some harmless ones are still served
