"""Speculative decoding's switches: the `speculative` request extension, the server default
(`llmd serve --speculative ngram`), and what a request reports (`usage.speculative`).

The engine drafts tokens by prompt lookup (n-gram: the sequence's own prompt and output) and
verifies every running sequence's drafts in its one batched forward; output is the same
with and without (greedy token for token, sampled in distribution), so speculation is a speed
setting. Draft models and MTP heads are not implemented yet: asking for one is a 400, never a
silent fallback."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmd.errors import bad_request

# Drafted tokens per sequence and step when a request or the server names no max_draft: the
# engine adapts below it per sequence to recent acceptance (bench/README.md, speculative).
DEFAULT_MAX_DRAFT = 8
MAX_DRAFT = 32  # the engine's limit
DRAFTERS = ("ngram",)
# Drafters llmd will have (issue 24) but not yet: named in the 400 so it says what is coming.
NOT_YET = {
    "draft_model": "a draft model",
    "draft": "a draft model",
    "mtp": "an MTP head",
    "eagle": "EAGLE",
    "eagle3": "EAGLE",
}
FEATURE = "speculative_ngram"  # in the worker's ready features where the engine can verify


class SpeculativeOptions(BaseModel):
    """llmd extension on chat/completions: `"speculative": {"type": "ngram", "max_draft": 8}`
    (or `false` to turn the server's default off for one request)."""

    model_config = ConfigDict(extra="forbid")

    type: str
    max_draft: int | None = Field(default=None, ge=1, le=MAX_DRAFT)

    @model_validator(mode="after")
    def _known(self) -> SpeculativeOptions:
        if self.type in NOT_YET:
            raise bad_request(
                f"speculative decoding with {NOT_YET[self.type]} ('{self.type}') is not "
                f"implemented yet; available: {', '.join(DRAFTERS)}",
                param="speculative",
                code="not_implemented",
            )
        if self.type not in DRAFTERS:
            raise bad_request(
                f"unknown speculative type '{self.type[:64]}'; available: {', '.join(DRAFTERS)}",
                param="speculative",
            )
        return self


# `true`: the n-gram drafter with the server's (or the default) max_draft.
SpeculativeField = SpeculativeOptions | bool | None


def server_default(mode: str, max_draft: int | None) -> int:
    """`llmd serve --speculative MODE [--speculative-max-draft N]` as the max_draft every
    request gets unless it says otherwise (0: off)."""
    if mode == "off":
        return 0
    if mode not in DRAFTERS:
        raise ValueError(f"--speculative must be off or one of {', '.join(DRAFTERS)}")
    return max_draft or DEFAULT_MAX_DRAFT


def max_draft_for(requested: SpeculativeField, server: int, features: list[str], model: str) -> int:
    """The max_draft a request runs with: its own choice, else the server's default where the
    model's engine can speculate. A request that asks for speculation on a model that cannot
    (recurrent layers) gets a 400; the server default there just does not apply."""
    supported = FEATURE in features
    if requested is False:
        return 0
    if requested is True or isinstance(requested, SpeculativeOptions):
        if not supported:
            raise bad_request(
                f"speculative decoding is not implemented yet for model '{model}' "
                "(its architecture keeps recurrent state)",
                param="speculative",
                code="not_implemented",
            )
        own = requested.max_draft if isinstance(requested, SpeculativeOptions) else None
        return own or server or DEFAULT_MAX_DRAFT
    return server if supported else 0


def speculative_status(server: int, features: list[str]) -> dict[str, Any]:
    """A loaded model's drafter in `GET /status`: what requests get by default, and whether
    its engine can speculate at all (requests may still turn it on or off)."""
    supported = FEATURE in features
    return {
        "drafter": "ngram" if server and supported else "off",
        "max_draft": server if supported else 0,
        "available": list(DRAFTERS) if supported else [],
    }


def usage_extension(drafted: int, accepted: int) -> dict[str, Any]:
    """`usage.speculative`: drafted tokens verified, and how many of them were accepted."""
    return {"drafted_tokens": drafted, "accepted_tokens": accepted}
