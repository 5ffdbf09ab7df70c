"""Speculative decoding through the API with the real worker: `llmd serve --speculative ngram`
turns it on for every request, `"speculative"` in a request turns it off or tunes it, drafters
that do not exist yet are a 400, and what it drafted and kept shows in `usage`, `/metrics` and
`/status`. Output (text, stop strings, logprobs, n > 1) is the same with or without."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from ..conftest import LiveServer, serving
from .test_metrics import scrape, value

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

MODEL = "smollm2-135m"
FILE = """import json


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save(path, data):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)


def update(path, key, value):
    data = load(path)
    data[key] = value
    save(path, data)
    return data
"""
EDIT = [
    {
        "role": "user",
        "content": f"Here is a file:\n```python\n{FILE}```\nRewrite the whole file with indent=4 "
        "instead of indent=2. Output only the code.",
    }
]


@pytest.fixture(scope="module")
def spec_server(model_path) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    """Drafting priced free (LLMD_DRAFT_ROW_COST=0): these tests count the drafts verified and
    check output with drafts in play, which measured step times on a loaded box would make
    depend on the load (the cost model may decline every n-gram draft there)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LLMD_DRAFT_ROW_COST", "0")
        with serving("--speculative", "ngram", "--speculative-max-draft", "8") as live:
            yield live


def post(server: LiveServer, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        server.base_url + "/v1/chat/completions",
        data=json.dumps({"model": MODEL, **body}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_server_default_speculates_and_output_is_unchanged(spec_server: LiveServer) -> None:
    before = scrape(spec_server.base_url)
    body = {"messages": EDIT, "temperature": 0, "max_tokens": 150}
    status, spec = post(spec_server, body)
    assert status == 200, spec
    status, plain = post(spec_server, {**body, "speculative": False})
    assert status == 200, plain
    assert spec["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    assert "speculative" not in plain["usage"]
    drafted = spec["usage"]["speculative"]
    assert (
        drafted["accepted_tokens"] > 0 and drafted["drafted_tokens"] >= drafted["accepted_tokens"]
    )
    after = scrape(spec_server.base_url)
    for name, key in (
        ("llmd_speculative_draft_tokens_total", "drafted_tokens"),
        ("llmd_speculative_accepted_tokens_total", "accepted_tokens"),
    ):
        moved = value(after, name, model=MODEL) - value(before, name, model=MODEL)
        assert moved == drafted[key], name
    with urllib.request.urlopen(spec_server.base_url + "/status", timeout=30) as r:
        model = next(m for m in json.loads(r.read())["models"] if m["name"] == MODEL)
    assert model["speculative"] == {"drafter": "ngram", "max_draft": 8, "available": ["ngram"]}


def test_where_drafts_cannot_pay_none_are_verified_and_metrics_say_so(
    model_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """A worker whose every extra row costs a whole step (LLMD_DRAFT_ROW_COST=1, the cost
    model's test hook: a fully compute-bound box) verifies no n-gram draft at all (a declined
    one still shows its acceptance, so none is verified to find it out), so speculation cannot
    slow it down; the drafts it declined show in /metrics, and the answer is unchanged."""
    monkeypatch.setenv("LLMD_DRAFT_ROW_COST", "1")
    with serving("--speculative", "ngram", "--speculative-max-draft", "8") as live:
        before = scrape(live.base_url)
        body = {"messages": EDIT, "temperature": 0, "max_tokens": 60}
        status, spec = post(live, body)
        assert status == 200, spec
        status, plain = post(live, {**body, "speculative": False})
        assert status == 200, plain
        after = scrape(live.base_url)
    assert spec["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    drafted = spec["usage"]["speculative"]["drafted_tokens"]
    name = "llmd_speculative_declined_tokens_total"
    declined = value(after, name, model=MODEL) - value(before, name, model=MODEL)
    assert drafted == 0
    assert declined > 0


def test_stop_strings_logprobs_and_n_are_the_same(spec_server: LiveServer) -> None:
    base = {
        "messages": EDIT,
        "temperature": 0,
        "max_tokens": 80,
        "logprobs": True,
        "top_logprobs": 2,
    }
    _, plain = post(spec_server, {**base, "speculative": False})
    _, spec = post(spec_server, {**base, "speculative": {"type": "ngram", "max_draft": 4}})
    a, b = plain["choices"][0], spec["choices"][0]
    assert b["message"]["content"] == a["message"]["content"]
    assert [t["token"] for t in b["logprobs"]["content"]] == [
        t["token"] for t in a["logprobs"]["content"]
    ]
    for x, y in zip(a["logprobs"]["content"], b["logprobs"]["content"], strict=True):
        assert y["logprob"] == pytest.approx(x["logprob"], abs=1e-4)
    # A stop string inside the copied text: both stop there, with the same usage.
    stop = a["message"]["content"][40:52]
    _, plain = post(spec_server, {**base, "stop": [stop], "speculative": False})
    _, spec = post(spec_server, {**base, "stop": [stop]})
    assert spec["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    assert spec["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"] == "stop"
    assert "speculative" in spec["usage"]
    # n > 1 greedy: every choice is the single answer.
    _, many = post(spec_server, {**base, "n": 3, "max_tokens": 40})
    _, one = post(spec_server, {**base, "max_tokens": 40, "speculative": False})
    contents = {c["message"]["content"] for c in many["choices"]}
    assert contents == {one["choices"][0]["message"]["content"]}


@pytest.mark.parametrize(
    ("speculative", "code", "words"),
    [
        ({"type": "draft_model"}, "not_implemented", "no draft model"),
        ({"type": "mtp"}, "not_implemented", "has no MTP head"),
        ({"type": "eagle3"}, "not_implemented", "not implemented yet"),
        ({"type": "lookahead"}, None, "unknown speculative type"),
        ({"type": "ngram", "max_draft": 0}, None, "max_draft"),
        ("ngram", None, "speculative"),
    ],
)
def test_unknown_or_unimplemented_drafters_are_a_400(
    spec_server: LiveServer, speculative: Any, code: str | None, words: str
) -> None:
    status, body = post(
        spec_server,
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2,
            "speculative": speculative,
        },
    )
    assert status == 400, body
    assert words in body["error"]["message"]
    if code:
        assert body["error"]["code"] == code
        assert body["error"]["param"] == "speculative"
