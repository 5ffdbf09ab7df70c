"""The engine on the real model: batching is real, isolation holds, sampling is seeded, and the
quantized kernels (not MLX's quantized_matmul or fp32 copies) are on the hot path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import run_all


def native_threads() -> int:
    return pytest.importorskip("llmd._engine").thread_count()


def _prompt(reference: dict, name: str) -> list[int]:
    return next(c["prompt_ids"] for c in reference["cases"] if c["name"] == name)


def test_interleaved_sequences_match_their_solo_runs(engine, reference: dict) -> None:  # type: ignore[no-untyped-def]
    """Isolation: 8 sequences of different lengths (one spanning several prefill chunks)
    produce exactly their solo greedy tokens; the kernels are batch-invariant by design.
    Alone, the ~1000-token prompt's decode rows are 3 attention tiles (one per KV head), too few
    for the threads: each is split into one task per 512-position span and the spans folded
    (paged_attention.cpp); in the batch its 24 tiles run whole on a few threads. Same tokens."""
    names = [c["name"] for c in reference["cases"]][:8]
    if "long_1000" not in names:
        names[-1] = "long_1000"
    reqs = {
        n: {"prompt": _prompt(reference, n), "max_tokens": 24 + 3 * i} for i, n in enumerate(names)
    }
    solo = {}
    for n, r in reqs.items():
        paths_before = engine.stats()["attention_paths"]
        solo[n] = run_all(engine, {n: r})[n]["tokens"]
        paths = engine.stats()["attention_paths"]
        span_tasks = paths["cpu_span_tasks"] - paths_before["cpu_span_tasks"]
        if n == "long_1000":
            # Every decode step: 30 layers x 3 tiles x 2 spans.
            assert span_tasks >= 30 * 3 * 2 * (r["max_tokens"] - 1), span_tasks
        else:
            assert span_tasks == 0, n  # within one span: nothing to split
    before = engine.stats()
    together = run_all(engine, reqs)
    after = engine.stats()
    for n in names:
        assert together[n]["tokens"] == solo[n], n
    # The engine reports what it ran: some steps sampled many sequences at once.
    assert after["max_rows_sampled_in_a_step"] >= 7
    assert after["steps"] - before["steps"] < sum(r["max_tokens"] for r in reqs.values())
    if native_threads() <= 6:
        # The batch's 24 tiles are enough for these threads: only the steps where few of its
        # sequences were left split (the long prompt's, at the end).
        batch_spans = after["attention_paths"]["cpu_span_tasks"]
        batch_spans -= before["attention_paths"]["cpu_span_tasks"]
        assert batch_spans < 30 * 3 * 2 * (reqs["long_1000"]["max_tokens"] - 1)


def test_same_seed_same_tokens(engine, reference: dict) -> None:  # type: ignore[no-untyped-def]
    prompt = _prompt(reference, "system_prompt")
    sampled = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "min_p": 0.02}
    a = run_all(engine, {"a": {"prompt": prompt, "max_tokens": 24, "seed": 7, **sampled}})["a"][
        "tokens"
    ]
    b = run_all(engine, {"b": {"prompt": prompt, "max_tokens": 24, "seed": 7, **sampled}})["b"][
        "tokens"
    ]
    others = {
        tuple(
            run_all(engine, {f"s{s}": {"prompt": prompt, "max_tokens": 24, "seed": s, **sampled}})[
                f"s{s}"
            ]["tokens"]
        )
        for s in (1, 2, 3)
    }
    assert a == b
    assert len(others) > 1


def test_cancel_ends_a_running_sequence(engine, reference: dict) -> None:  # type: ignore[no-untyped-def]
    engine.submit("c", _prompt(reference, "python_code"), 2000)
    seen = 0
    while seen < 3:
        seen += sum(len(e.get("tokens", [])) for e in engine.poll(1000))
    engine.cancel("c")
    done = None
    while done is None:
        done = next((e for e in engine.poll(1000) if e["type"] == "done"), None)
    assert done["finish_reason"] == "cancelled" and done["completion_tokens"] < 2000
    import time

    deadline = time.monotonic() + 2  # the gauge is published at the engine's next loop turn
    while engine.stats()["active_sequences"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.stats()["active_sequences"] == 0


def test_bad_requests_get_error_events_and_the_engine_keeps_serving(
    engine, reference: dict
) -> None:  # type: ignore[no-untyped-def]
    engine.submit("empty", [], 5)
    engine.submit("huge", [1] * 10, 10_000)
    engine.submit("oov", [1, 10**6], 5)
    errors = {}
    while len(errors) < 3:
        for e in engine.poll(1000):
            errors[e["id"]] = e
    assert errors["empty"]["code"] == "invalid_request"
    assert errors["huge"]["code"] == "context_length_exceeded"
    assert errors["oov"]["code"] == "invalid_request"
    ok = run_all(engine, {"ok": {"prompt": _prompt(reference, "capital_france"), "max_tokens": 4}})
    assert ok["ok"]["done"]["finish_reason"] == "length"


def test_gguf_weights_run_llmd_kernels_on_every_layer(engine) -> None:  # type: ignore[no-untyped-def]
    paths = engine.matmul_paths()
    assert len(paths) == 30 * 4 + 1
    assert all(p.startswith("llmd:q") for p in paths.values()), paths
    assert paths["output"].startswith("llmd:q8_0:")


def test_x86_kernels_run_the_packed_layout_on_the_hot_path(engine) -> None:  # type: ignore[no-untyped-def]
    """Where the active path has kernels for the 8-row packed layout, every layer of the
    test model (Q4_1, Q8_0 tied head; all row counts multiples of 8) is packed at load and
    reports it, so the row-major kernels are not what decode runs."""
    _engine = pytest.importorskip("llmd._engine")
    packed_types = {t.lower() for t in _engine.packed_kernel_types("")}
    if not packed_types:
        pytest.skip(f"path {_engine.active_kernel_path()} has no packed kernels")
    paths = engine.matmul_paths()
    assert {"q4_1", "q8_0"} <= packed_types
    assert all(p.endswith(":x8") for p in paths.values()), paths


def test_worker_memory_stays_near_the_file_size(model_path: Path) -> None:
    """Resident memory added by loading stays within 1.2x the GGUF (weights stay quantized)."""
    proc = subprocess.run(
        [sys.executable, "-m", "llmd.worker", "--model", str(model_path)],
        input=b'{"type":"shutdown"}\n',
        capture_output=True,
        timeout=120,
    )
    ready = json.loads(proc.stdout.splitlines()[0])
    assert ready["type"] == "ready"
    grown = ready["memory"]["rss_after_load"] - ready["memory"]["rss_before_load"]
    assert grown <= 1.2 * model_path.stat().st_size, grown
    assert ready["kernels"]["isa"] in ready["kernels"]["blk.0.attn_qkv"]


def test_neighbours_of_a_cancelled_sequence_and_of_an_unpinned_session_keep_their_tokens(
    engine, reference: dict
) -> None:  # type: ignore[no-untyped-def]
    """Isolation under churn: while A and B decode, C is cancelled mid-way and session S's
    pinned KV is released mid-request; A, B and S still give exactly their solo tokens."""
    a = {"prompt": _prompt(reference, "capital_france"), "max_tokens": 40}
    b = {"prompt": _prompt(reference, "python_code"), "max_tokens": 40}
    s1 = run_all(
        engine, {"s1": {"prompt": _prompt(reference, "emoji"), "max_tokens": 8, "session": "iso"}}
    )
    s = {"prompt": _prompt(reference, "emoji") + s1["s1"]["tokens"] + [198], "max_tokens": 40}
    solo = {k: run_all(engine, {k: r})[k]["tokens"] for k, r in {"a": a, "b": b, "s": s}.items()}

    for rid, r in {"a": a, "b": b, "s": s}.items():
        engine.submit(rid, **r, session="iso" if rid == "s" else "")
    engine.submit("c", _prompt(reference, "cpp_question"), 500)
    tokens: dict[str, list[int]] = {k: [] for k in "absc"}
    done: dict[str, dict] = {}
    churned = False
    while len(done) < 4:
        for ev in engine.poll(1000):
            if ev["type"] == "tokens":
                tokens[ev["id"]] += ev["tokens"]
            else:
                done[ev["id"]] = ev
        if not churned and len(tokens["c"]) >= 3:
            assert not done and min(len(tokens[k]) for k in "abs") < 40  # all still running
            engine.cancel("c")
            engine.unpin("iso")
            churned = True
    assert churned and done["c"]["finish_reason"] == "cancelled"
    for k in "abs":
        assert tokens[k] == solo[k], k


def test_sibling_choices_start_from_one_prefill(engine, reference: dict) -> None:  # type: ignore[no-untyped-def]
    """`n > 1`: siblings naming the first choice in `prefill_of` copy its KV (shared full blocks
    plus a copy of the partial last one) and its last logits: the prompt is prefilled once, and
    greedy siblings produce exactly the solo run's tokens (the copied KV is the real one)."""
    prompt = _prompt(reference, "long_1000")
    assert len(prompt) % 64 != 0  # the last block is partial: it must be copied, not shared
    solo = run_all(engine, {"solo": {"prompt": prompt, "max_tokens": 16}})["solo"]["tokens"]
    before = engine.stats()
    together = run_all(
        engine,
        {
            "p": {"prompt": prompt, "max_tokens": 16},
            "u": {"prompt": [1, 2, 3], "max_tokens": 1},  # an unrelated request in between
            "c1": {"prompt": prompt, "max_tokens": 16, "prefill_of": "p"},
            "c2": {"prompt": prompt, "max_tokens": 16, "prefill_of": "p"},
        },
    )
    after = engine.stats()
    assert after["forked_sequences"] - before["forked_sequences"] == 2
    parent = together["p"]["done"]
    fresh = parent["prompt_tokens"] - parent["cached_tokens"]
    # Only the parent's uncached prompt tokens (and the tiny unrelated prompt) were prefilled.
    assert after["prompt_tokens_processed"] - before["prompt_tokens_processed"] <= fresh + 3
    for rid in ("p", "c1", "c2"):
        assert together[rid]["tokens"] == solo, rid
    assert together["c1"]["done"]["cached_tokens"] == len(prompt)


def test_sampled_siblings_differ_and_orphans_run_alone(engine, reference: dict) -> None:  # type: ignore[no-untyped-def]
    prompt = _prompt(reference, "system_prompt")
    sampled = {"temperature": 1.0, "max_tokens": 12}
    out = run_all(
        engine,
        {
            "sp": {"prompt": prompt, "seed": 1, **sampled},
            "sc1": {"prompt": prompt, "seed": 2, "prefill_of": "sp", **sampled},
            "sc2": {"prompt": prompt, "seed": 3, "prefill_of": "sp", **sampled},
        },
    )
    assert len({tuple(out[r]["tokens"]) for r in ("sp", "sc1", "sc2")}) == 3
    # Same seed as a sibling or alone: the same tokens (the fork is exact).
    alone = run_all(engine, {"a2": {"prompt": prompt, "seed": 2, **sampled}})["a2"]["tokens"]
    assert alone == out["sc1"]["tokens"]
    # A sibling whose parent is unknown (a restarted worker) runs as an ordinary request.
    orphan = run_all(engine, {"o": {"prompt": prompt, "seed": 2, "prefill_of": "gone", **sampled}})
    assert orphan["o"]["tokens"] == alone


def test_repetition_window_limits_what_the_penalty_sees(engine, reference: dict) -> None:  # type: ignore[no-untyped-def]
    """`repeat_last_n`: a window covering the whole sequence is the unwindowed penalty; a
    one-token window penalises only the previous token, which changes the greedy answer."""
    prompt = _prompt(reference, "python_code")
    n = 24

    def run(**sampling: float) -> list[int]:
        rid = f"w{len(sampling)}-{sampling.get('repetition_window', 'all')}"
        return run_all(engine, {rid: {"prompt": prompt, "max_tokens": n, **sampling}})[rid][
            "tokens"
        ]

    whole = run(repetition_penalty=3.0)
    assert run(repetition_penalty=3.0, repetition_window=len(prompt) + n) == whole
    assert run(repetition_penalty=3.0, repetition_window=1) != whole
