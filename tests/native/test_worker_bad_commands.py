"""The worker's command loop survives any command: a field at or past the limits of the
engine's types fails that request with an `error` naming it, and the same worker then serves
the next request (before, an int >= 2**31 in top_k killed the loop: the request hung, the
health ping replaced the worker, and three such requests put the model in `failed`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.native.conftest import read_event, send, worker_process

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

LIMITS = [
    ("top_k", 2**31),
    ("top_k", 2**63),
    ("repetition_window", 2**31),
    ("top_logprobs", 2**40),
    ("seed", 2**64),
]


def _generate(rid: str, **sampling: Any) -> dict[str, Any]:
    return {
        "type": "generate",
        "id": rid,
        "prompt": [1, 2, 3],
        "max_tokens": 2,
        "sampling": sampling,
    }


def test_limit_values_fail_their_request_and_the_worker_serves_on(model_path: Path) -> None:
    bad = [_generate(f"bad{i}", **{field: value}) for i, (field, value) in enumerate(LIMITS)]
    bad.append({**_generate("huge"), "max_tokens": 2**40})
    errors: dict[str, dict[str, Any]] = {}
    done = None
    with worker_process(model_path, "cpu") as (proc, _):
        send(proc, *bad, _generate("ok", temperature=0.0))
        while done is None:
            event = read_event(proc)
            if event["type"] == "error":
                errors[event["id"]] = event
            elif event["type"] == "done":
                done = event
    assert set(errors) == {m["id"] for m in bad}, errors
    assert done["id"] == "ok" and done["completion_tokens"] == 2
