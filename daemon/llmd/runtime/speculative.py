"""Speculative decoding's switches: the `speculative` request extension, the server default
(`llmd serve --speculative ngram|draft_model|mtp`, `--draft-model NAME`), and what a request
reports (`usage.speculative`).

The engine drafts tokens by prompt lookup (n-gram: the sequence's own prompt and output), with
a draft model loaded beside the model in its worker (a small model with the same vocabulary),
or with the model's own MTP head (Qwen3.5's `mtp.*` layers), and verifies every running
sequence's drafts in its one batched forward; output is the same with and without (greedy
token for token, sampled in distribution), so speculation is a speed setting. EAGLE is not
implemented yet: asking for it is a 400, never a silent fallback."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmd.errors import bad_request

# Drafted tokens per sequence and step when a request or the server names no max_draft: the
# engine adapts below it per sequence to recent acceptance (bench/README.md, speculative).
DEFAULT_MAX_DRAFT = 8
MAX_DRAFT = 32  # the engine's limit
DRAFTERS = ("ngram", "draft_model", "mtp")
ALIASES = {"draft": "draft_model"}
# Drafters llmd will have (issue 24) but not yet: named in the 400 so it says what is coming.
NOT_YET = {
    "eagle": "EAGLE",
    "eagle3": "EAGLE",
}
FEATURE = "speculative_ngram"  # in the worker's ready features where the engine can verify
DRAFT_FEATURE = "speculative_draft_model"  # ... and where a draft model is loaded beside it
MTP_FEATURE = "speculative_mtp"  # ... and where the model ships an MTP head


class SpeculativeOptions(BaseModel):
    """llmd extension on chat/completions: `"speculative": {"type": "ngram", "max_draft": 8}`,
    `{"type": "draft_model"}` or `{"type": "mtp"}` (or `false` to turn the server's default
    off for one request)."""

    model_config = ConfigDict(extra="forbid")

    type: str
    max_draft: int | None = Field(default=None, ge=1, le=MAX_DRAFT)

    @model_validator(mode="after")
    def _known(self) -> SpeculativeOptions:
        self.type = ALIASES.get(self.type, self.type)
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


# `true`: the server's drafter (n-gram when the server has none) with its max_draft.
SpeculativeField = SpeculativeOptions | bool | None


@dataclass(frozen=True)
class Speculation:
    """What one request runs with: at most max_draft drafted tokens per step (0: off), from
    the worker's draft model, the model's MTP head, or by prompt lookup."""

    max_draft: int = 0
    draft_model: bool = False
    mtp: bool = False


OFF = Speculation()


def server_default(mode: str, max_draft: int | None) -> int:
    """`llmd serve --speculative MODE [--speculative-max-draft N]` as the max_draft every
    request gets unless it says otherwise (0: off)."""
    if mode == "off":
        return 0
    if mode not in DRAFTERS:
        raise ValueError(f"--speculative must be off or one of {', '.join(DRAFTERS)}")
    return max_draft or DEFAULT_MAX_DRAFT


def _no_draft_model(model: str, problem: str) -> Exception:
    why = f" ({problem})" if problem else ""
    return bad_request(
        f"model '{model}' has no draft model loaded{why}; load one with "
        f"`llmd serve --draft-model NAME` or `llmd set {model} --draft-model NAME`",
        param="speculative",
        code="not_implemented",
    )


def _no_mtp_head(model: str) -> Exception:
    return bad_request(
        f"model '{model}' has no MTP head (multi-token-prediction layers ship with Qwen3.5 "
        "checkpoints); use `ngram` or `draft_model`",
        param="speculative",
        code="not_implemented",
    )


def _has(kind: str, features: list[str]) -> bool:
    """Whether the worker can draft with `kind` beyond prompt lookup."""
    if kind == "draft_model":
        return DRAFT_FEATURE in features
    if kind == "mtp":
        return MTP_FEATURE in features
    return True


def plan_for(
    requested: SpeculativeField,
    server: int,
    features: list[str],
    model: str,
    *,
    drafter: str = "ngram",
    draft_problem: str = "",
) -> Speculation:
    """How a request speculates: its own choice, else the server's default (`server`
    max_draft with `drafter`) where the model's engine can. A request that asks for what the
    model cannot do (an encoder; a draft model where none is loaded; an MTP head the model
    lacks) gets a 400; the server default there just does not apply (`/status` says so)."""
    supported = FEATURE in features
    if requested is False:
        return OFF
    if requested is True or isinstance(requested, SpeculativeOptions):
        if not supported:
            raise bad_request(
                f"speculative decoding is not implemented for model '{model}' (an encoder)",
                param="speculative",
                code="not_implemented",
            )
        own = requested.max_draft if isinstance(requested, SpeculativeOptions) else None
        kind = requested.type if isinstance(requested, SpeculativeOptions) else None
        if kind is None:
            kind = drafter if server and _has(drafter, features) else "ngram"
        if kind == "draft_model" and not _has(kind, features):
            raise _no_draft_model(model, draft_problem)
        if kind == "mtp" and not _has(kind, features):
            raise _no_mtp_head(model)
        return Speculation(own or server or DEFAULT_MAX_DRAFT, kind == "draft_model", kind == "mtp")
    if not supported or not server or not _has(drafter, features):
        return OFF
    return Speculation(server, drafter == "draft_model", drafter == "mtp")


def max_draft_for(requested: SpeculativeField, server: int, features: list[str], model: str) -> int:
    """plan_for's max_draft with the n-gram server default."""
    return plan_for(requested, server, features, model).max_draft


def speculative_status(
    server: int,
    features: list[str],
    *,
    drafter: str = "ngram",
    draft_model: str = "",
    draft_problem: str = "",
) -> dict[str, Any]:
    """A loaded model's drafter in `GET /status`: what requests get by default, whether its
    engine can speculate at all (requests may still turn it on or off), and its draft model
    (or why the one asked for is not loaded)."""
    supported = FEATURE in features
    has_draft = supported and DRAFT_FEATURE in features
    active = server and supported and _has(drafter, features)
    available = ["ngram"] + (["draft_model"] if has_draft else [])
    out: dict[str, Any] = {
        "drafter": drafter if active else "off",
        "max_draft": server if active else 0,
        "available": (available + (["mtp"] if MTP_FEATURE in features else []))
        if supported
        else [],
    }
    if draft_model or draft_problem:
        out["draft_model"] = draft_model if has_draft else None
    if draft_problem:
        out["draft_model_problem"] = draft_problem
    return out


def usage_extension(drafted: int, accepted: int) -> dict[str, Any]:
    """`usage.speculative`: drafted tokens verified, and how many of them were accepted."""
    return {"drafted_tokens": drafted, "accepted_tokens": accepted}
