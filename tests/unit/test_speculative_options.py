"""The speculative-decoding switches without a worker: how a request's `speculative` field and
`llmd serve --speculative` / `--draft-model` combine into what the worker gets (max_draft, and
whether the draft model drafts), and what is refused."""

from __future__ import annotations

import pytest

from llmd.errors import ApiError
from llmd.runtime.speculative import (
    DEFAULT_MAX_DRAFT,
    DRAFT_FEATURE,
    FEATURE,
    MTP_FEATURE,
    Speculation,
    SpeculativeOptions,
    max_draft_for,
    plan_for,
    server_default,
    speculative_status,
)

CAN = [FEATURE]


def test_request_choice_wins_over_the_server_default() -> None:
    assert max_draft_for(None, 6, CAN, "m") == 6
    assert max_draft_for(False, 6, CAN, "m") == 0
    assert max_draft_for(True, 0, CAN, "m") == DEFAULT_MAX_DRAFT
    assert max_draft_for(SpeculativeOptions(type="ngram", max_draft=3), 6, CAN, "m") == 3
    assert max_draft_for(SpeculativeOptions(type="ngram"), 6, CAN, "m") == 6


def test_a_model_that_cannot_speculate_refuses_a_request_but_not_the_default() -> None:
    assert max_draft_for(None, 8, [], "qwen35") == 0
    with pytest.raises(ApiError) as err:
        max_draft_for(True, 8, [], "qwen35")
    assert err.value.status == 400 and err.value.code == "not_implemented"


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_drafters_not_built_yet_are_named_in_a_400(kind: str) -> None:
    with pytest.raises(ApiError) as err:
        SpeculativeOptions(type=kind)
    assert "not implemented yet" in err.value.message and err.value.param == "speculative"


def test_server_switch_and_status() -> None:
    assert server_default("off", 4) == 0
    assert server_default("ngram", None) == DEFAULT_MAX_DRAFT
    assert server_default("ngram", 12) == 12
    with pytest.raises(ValueError):
        server_default("medusa", None)
    assert speculative_status(8, CAN) == {
        "drafter": "ngram",
        "max_draft": 8,
        "available": ["ngram"],
    }
    assert speculative_status(8, [])["drafter"] == "off"


DRAFTS = [FEATURE, DRAFT_FEATURE]


def test_a_draft_model_request_drafts_with_it_where_one_is_loaded() -> None:
    ask = SpeculativeOptions(type="draft_model", max_draft=5)
    assert plan_for(ask, 0, DRAFTS, "m") == Speculation(5, True)
    assert plan_for(SpeculativeOptions(type="draft"), 0, DRAFTS, "m") == Speculation(
        DEFAULT_MAX_DRAFT, True
    )
    # `true` takes the server's drafter; an n-gram request stays n-gram beside a draft model.
    assert plan_for(True, 6, DRAFTS, "m", drafter="draft_model") == Speculation(6, True)
    assert plan_for(SpeculativeOptions(type="ngram"), 6, DRAFTS, "m", drafter="draft_model") == (
        Speculation(6, False)
    )
    assert plan_for(None, 6, DRAFTS, "m", drafter="draft_model") == Speculation(6, True)


def test_a_draft_model_request_without_one_is_a_400_naming_why() -> None:
    with pytest.raises(ApiError) as err:
        plan_for(
            SpeculativeOptions(type="draft_model"),
            0,
            CAN,
            "m",
            draft_problem="the vocabularies differ: 32000 tokens in the draft, 49152 in the model",
        )
    assert err.value.status == 400 and err.value.param == "speculative"
    assert "no draft model" in err.value.message and "vocabularies differ" in err.value.message
    # The server's draft-model default where this model has none: plain decode, not n-gram.
    assert plan_for(None, 8, CAN, "m", drafter="draft_model") == Speculation(0, False)


def test_status_names_the_draft_model_or_why_it_is_not_loaded() -> None:
    assert speculative_status(8, DRAFTS, drafter="draft_model", draft_model="small") == {
        "drafter": "draft_model",
        "max_draft": 8,
        "available": ["ngram", "draft_model"],
        "draft_model": "small",
    }
    off = speculative_status(8, CAN, drafter="draft_model", draft_model="small", draft_problem="x")
    assert off["drafter"] == "off" and off["draft_model"] is None
    assert off["draft_model_problem"] == "x"


MTP = [FEATURE, MTP_FEATURE]


def test_an_mtp_request_drafts_with_the_models_head() -> None:
    assert plan_for(SpeculativeOptions(type="mtp", max_draft=3), 0, MTP, "q") == Speculation(
        3, False, True
    )
    # The server's mtp default, and `true` under it; an n-gram request stays n-gram.
    assert plan_for(None, 6, MTP, "q", drafter="mtp") == Speculation(6, False, True)
    assert plan_for(True, 6, MTP, "q", drafter="mtp") == Speculation(6, False, True)
    assert plan_for(SpeculativeOptions(type="ngram"), 6, MTP, "q", drafter="mtp") == Speculation(6)
    assert speculative_status(6, MTP, drafter="mtp") == {
        "drafter": "mtp",
        "max_draft": 6,
        "available": ["ngram", "mtp"],
    }


def test_an_mtp_request_on_a_model_without_a_head_is_a_400() -> None:
    with pytest.raises(ApiError) as err:
        plan_for(SpeculativeOptions(type="mtp"), 0, CAN, "smol")
    assert err.value.status == 400 and err.value.code == "not_implemented"
    assert "has no MTP head" in err.value.message and err.value.param == "speculative"
    # The server's mtp default on a model without one: plain decode, and /status says off.
    assert plan_for(None, 8, CAN, "smol", drafter="mtp") == Speculation(0)
    assert plan_for(True, 8, CAN, "smol", drafter="mtp") == Speculation(8)
    assert speculative_status(8, CAN, drafter="mtp")["drafter"] == "off"
