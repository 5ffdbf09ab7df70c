"""Speculative decoding's cost model (native/core/draft_cost.h): before a step verifies drafts,
the engine weighs what their rows cost against the tokens they are expected to save. With a
fixed cost (the `draft_row_cost` engine option) the decisions are deterministic: where rows
are dear, a sequence whose drafts are rejected stops drafting while one whose drafts are kept
goes on, and greedy output stays token for token what plain decoding gives."""

from __future__ import annotations

import pytest

from .conftest import TEST_BACKEND, run_all
from .test_speculative import chat, copy_request


@pytest.fixture(scope="module")
def prompts(text_model) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    # A story the model makes up: prompt lookup finds short matches in its own words, and the
    # model mostly goes another way, so their drafts are rejected. Against it, a file the model
    # copies (test_speculative's copy_request): its drafts are kept. Both hold on every CPU path.
    story = chat(text_model, "Write a short story about a dragon who learns to bake bread.")
    return {"copy": copy_request(text_model), "story": story}


def _engine(model_path, row_cost: float):  # type: ignore[no-untyped-def]
    native = pytest.importorskip("llmd._engine")
    return native.Engine(
        str(model_path),
        context_length=4096,
        max_sequences=4,
        backend=TEST_BACKEND,
        draft_row_cost=row_cost,
    )


def _run(engine, prompts: dict[str, list[int]], max_draft: int) -> tuple[dict, int]:  # type: ignore[no-untyped-def]
    before = engine.stats()["draft_declined_tokens"]
    out = run_all(
        engine,
        {k: {"prompt": p, "max_tokens": 120, "max_draft": max_draft} for k, p in prompts.items()},
    )
    return out, engine.stats()["draft_declined_tokens"] - before


def test_dear_rows_stop_rejected_drafts_and_keep_accepted_ones(model_path, prompts) -> None:  # type: ignore[no-untyped-def]
    """Each extra row costs half a one-row step: a draft token pays only when it is kept more
    often than not. Against drafting priced as free (what the engine did before the cost model),
    the sequence whose drafts are rejected drafts a fraction as much, the one copying its file
    still drafts and keeps most of what it drafts, and every token is the same as without
    speculation, batched."""
    free, dear = _engine(model_path, 0.0), _engine(model_path, 0.5)
    try:
        plain, _ = _run(free, prompts, 0)
        as_before, declined_free = _run(free, prompts, 8)
        priced, declined = _run(dear, prompts, 8)
    finally:
        free.shutdown()
        dear.shutdown()
    for name in prompts:
        assert as_before[name]["tokens"] == plain[name]["tokens"], name
        assert priced[name]["tokens"] == plain[name]["tokens"], name
    assert declined_free == 0  # free rows: every draft on offer is verified
    assert declined > 0
    story, story_free = priced["story"]["done"], as_before["story"]["done"]
    assert story_free["drafted_tokens"] > 2 * story_free["accepted_tokens"], story_free
    assert story["drafted_tokens"] * 3 <= story_free["drafted_tokens"], (story, story_free)
    copied = priced["copy"]["done"]
    assert copied["accepted_tokens"] >= len(priced["copy"]["tokens"]) // 5, copied
    assert copied["accepted_tokens"] * 2 > copied["drafted_tokens"], copied


def test_rows_as_dear_as_a_step_verify_no_ngram_draft(model_path, prompts) -> None:  # type: ignore[no-untyped-def]
    """Where every row costs a whole one-row step (a fully compute-bound box), no draft can
    pay, and no step verifies an n-gram draft at all, not even the copy's first ones: a
    declined n-gram draft still shows its acceptance (its first token against the token the
    step took), so it needs no unconditional start. Every draft on offer is counted as
    declined, and output is unchanged."""
    engine = _engine(model_path, 1.0)
    try:
        plain, _ = _run(engine, prompts, 0)
        before = engine.stats()["speculative_steps"]
        spec, declined = _run(engine, prompts, 8)
        steps = engine.stats()["speculative_steps"] - before
    finally:
        engine.shutdown()
    for name in prompts:
        assert spec[name]["tokens"] == plain[name]["tokens"], name
        assert spec[name]["done"]["drafted_tokens"] == 0, spec[name]["done"]
    assert steps == 0
    assert declined > len(spec["copy"]["tokens"]), declined


def test_a_draft_model_is_verified_until_its_acceptance_is_known(model_path, prompts) -> None:  # type: ignore[no-untyped-def]
    """A draft model's declined draft shows nothing of how it would have fared, so at the same
    dear rows a sequence drafting with one (here the model itself) verifies its drafts until
    DraftAcceptance::kEvidence = 4 positions were seen: a few drafting steps, then none."""
    native = pytest.importorskip("llmd._engine")
    engine = native.Engine(
        str(model_path),
        draft_model_path=str(model_path),
        context_length=4096,
        max_sequences=4,
        backend=TEST_BACKEND,
        draft_row_cost=1.0,
    )
    try:
        plain = run_all(engine, {"p": {"prompt": prompts["copy"], "max_tokens": 60}})["p"]
        before = engine.stats()["speculative_steps"]
        spec = run_all(
            engine,
            {
                "s": {
                    "prompt": prompts["copy"],
                    "max_tokens": 60,
                    "max_draft": 8,
                    "draft_model": True,
                }
            },
        )["s"]
        steps = engine.stats()["speculative_steps"] - before
    finally:
        engine.shutdown()
    assert spec["tokens"] == plain["tokens"]
    assert 0 < steps <= 4, steps
    assert spec["done"]["accepted_tokens"] >= 4, spec["done"]


def test_drafting_is_measured_one_row_at_a_time_and_must_pay_by_a_margin() -> None:
    """With measured step times the cost model never guesses drafting free: with nothing
    measured at a step's rows it verifies no draft (the step measures plain decode); with
    nothing measured above them, only the single most promising draft token (one extra row
    measures what a row costs); then as many as pay for their measured rows, by at least 20%
    more expected tokens per second than plain decode (its estimates are noisy, and it acts on
    the high ones). What a badly drafting sequence pays for exploration is one row per
    re-measurement, not a whole draft."""
    native = pytest.importorskip("llmd._engine")
    plan = native.plan_drafts
    offers = [(8, 0.3, False), (8, 0.9, False), (8, 0.3, False), (8, 0.3, False)]
    assert plan([], 4, 4, offers) == [0, 0, 0, 0]
    assert plan([(4, 0.040)], 4, 4, offers) == [0, 1, 0, 0]
    # An extra row costs 5% of the step: the well-drafting sequence drafts, the others do not.
    cheap = plan([(4, 0.040), (5, 0.042)], 4, 4, offers)
    assert cheap[0] == cheap[2] == cheap[3] == 0 and cheap[1] >= 4, cheap
    # 15%: its drafts promise at most 11% more tokens per second than plain decode (three
    # tokens: (4 + 0.9 + 0.81 + 0.73) / 1.45 = 4.44 tokens per plain step's time): not enough.
    assert plan([(4, 0.040), (5, 0.046)], 4, 4, offers) == [0, 0, 0, 0]
    # Rows free (a bandwidth-bound step): every draft on offer is verified.
    assert plan([(4, 0.040), (5, 0.040)], 4, 4, offers) == [8, 8, 8, 8]
    # A sampled request (or a draft model still showing its acceptance) drafts whatever it costs.
    assert plan([], 4, 4, [(3, 0.1, True), (8, 0.9, False)]) == [3, 0]
