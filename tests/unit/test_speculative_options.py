"""The speculative-decoding switches without a worker: how a request's `speculative` field and
`llmd serve --speculative` combine into the max_draft the worker gets, and what is refused."""

from __future__ import annotations

import pytest

from llmd.errors import ApiError
from llmd.runtime.speculative import (
    DEFAULT_MAX_DRAFT,
    FEATURE,
    SpeculativeOptions,
    max_draft_for,
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


@pytest.mark.parametrize("kind", ["draft_model", "mtp", "eagle3"])
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
