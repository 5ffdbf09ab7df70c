"""One generation, protocol-agnostic: prompt ids in, text deltas and a final result out.
Detokenization, stop strings and cancellation live here once for every API route."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from llmd.errors import ApiError, ContextOverflow, bad_request, server_error
from llmd.runtime import protocol as p
from llmd.runtime.counters import GenerationObserver
from llmd.runtime.speculative import SpeculativeField, plan_for
from llmd.runtime.supervisor import ModelSupervisor
from llmd.runtime.worker_client import Accepted, WorkerError
from llmd.store.model_kind import record_kind
from llmd.text.detokenizer import IncrementalDetokenizer
from llmd.text.stop_strings import StopMatcher


@dataclass
class Delta:
    """New answer text, and the tokens behind it with their logprobs when the request asked
    (tokens may be ahead of text that waits for the rest of a UTF-8 character)."""

    text: str
    tokens: list[int] = field(default_factory=list)
    logprobs: list[p.TokenLogprob] = field(default_factory=list)


@dataclass
class Started:
    """The engine admitted the request: `cached_tokens` of its `prompt_tokens` come from the
    prefix cache (the rest is being prefilled). Before any Delta."""

    prompt_tokens: int
    cached_tokens: int


@dataclass
class Finished:
    """How a generation ended; the counts are what `usage` reports."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    stop_sequence: str | None = None  # the request's stop string that ended it, if one did
    # Speculative decoding: None when the request did not speculate, else (drafted tokens
    # verified, of which accepted): `usage.speculative`.
    speculative: tuple[int, int] | None = None


def token_budget(
    prompt_len: int,
    requested: int | None,
    context_length: int,
    *,
    prompt_param: str,
) -> int:
    """max_tokens within the context window: absent, or more than what is left, it is what
    is left (the answer then ends with the protocol's length reason), as llama-server and
    Ollama do: agents ask for 32k tokens by default whatever the model. Only a prompt that
    leaves no room at all is refused."""
    if prompt_len >= context_length:
        raise ContextOverflow(prompt_len, context_length, prompt_param)
    room = context_length - prompt_len
    return room if requested is None else min(requested, room)


def _api_error(exc: WorkerError) -> ApiError:
    if exc.code == "context_length_exceeded":
        return ApiError(400, exc.message, code=exc.code)
    if exc.code == "invalid_request":
        return bad_request(exc.message)
    if exc.code == "queue_full":
        return ApiError(429, exc.message, type="rate_limit_error", code=exc.code)
    if exc.code in ("worker_died", "capacity", "model_unloaded", "shutting_down"):
        return server_error(exc.message, code=exc.code, status=503)
    return server_error(exc.message, code=exc.code)


def require_generation(model: ModelSupervisor) -> None:
    """A 400 naming the model's kind unless it generates text. generate_text asks it of every
    protocol; chat routes ask it first, so an embedding model without a chat template (every
    encoder) hears what it is rather than that it has no template."""
    kind = record_kind(model.record)
    if kind.kind != "generate":
        raise ApiError(
            400,
            f"model '{model.name}' is a{'n' if kind.kind == 'embed' else ''} {kind.kind} model: "
            "it does not generate text (use /v1/embeddings, /api/embed or /v1/rerank); its kind "
            "was decided when it was pulled (see `llmd show`)",
            param="model",
            code="wrong_model_kind",
        )


async def generate_text(
    model: ModelSupervisor,
    prompt: list[int],
    *,
    max_tokens: int,
    sampling: p.SamplingParams,
    stops: list[str],
    session: str = "",
    grammar: str | None = None,
    show_tokens: frozenset[int] = frozenset(),
    prefill_of: str = "",
    speculative: SpeculativeField = None,
    images: list[p.ImageInput] | None = None,
) -> AsyncIterator[Accepted | Started | Delta | Finished]:
    """Yields Accepted once the worker has the request (a 429 or other ApiError comes before
    it), Started when the engine admits it (its prefix-cache split), then text deltas (never half a character, never a stop string or what follows it),
    then exactly one Finished. Raises ApiError. Closing it early cancels the worker request.

    A request whose worker dies before it produced a token (it was queued, or prefilling) is
    sent once more to the restarted worker: the client sees a delay, not an error. A second
    death is reported (the request itself may be what kills it)."""
    # Control tokens (end of turn, ...) are markup, not answer text (llama-server and vLLM
    # leave them out of the output by default too).
    # `show_tokens`: control tokens that are markup the API parses (tool-call markers).
    # Every protocol's generation comes through here: one place refuses them all.
    require_generation(model)
    hidden = (model.text.special_ids | set(model.text.stop_token_ids)) - show_tokens
    detok = IncrementalDetokenizer(model.text.tokenizer, skip_ids=hidden)
    matcher = StopMatcher(stops)
    observed = GenerationObserver(
        model.metrics, model.name
    )  # tokens and latencies for GET /metrics
    produced = 0
    accepted = False
    started: Started | None = None  # the engine's admission: the prefix-cache split
    retried = False
    spec: tuple[int, int] | None = None  # (drafted, accepted) so far, when it speculates
    while True:
        worker = await model.ensure_ready()
        assert worker.ready is not None
        plan = plan_for(
            speculative,
            model.speculative_max_draft,
            worker.ready.features,
            model.name,
            drafter=model.speculative_drafter,
            draft_problem=model.draft_problem,
        )
        # Drafting is not implemented beside images (the engine refuses it); it is lossless, so
        # an image request runs without it and answers the same.
        max_draft = 0 if images else plan.max_draft
        if max_draft:
            spec = (0, 0)
        events = worker.generate(
            prompt,
            max_tokens=max_tokens,
            sampling=sampling,
            stop_tokens=model.text.stop_token_ids,
            session=session,
            grammar=grammar,
            prefill_of=prefill_of,
            max_draft=max_draft,
            draft_model=plan.draft_model,
            mtp=plan.mtp,
            images=images,
        )
        try:
            async for event in events:
                if isinstance(event, Accepted):
                    if not accepted:
                        accepted = True
                        yield event
                elif isinstance(event, p.Started):
                    if started is None:  # a request re-sent to a new worker is admitted twice
                        started = Started(event.prompt_tokens, event.cached_tokens)
                        yield started
                elif isinstance(event, p.Tokens):
                    produced += len(event.tokens)
                    if event.speculative is not None:
                        spec = event.speculative
                    observed.tokens(len(event.tokens))
                    piece = matcher.feed(detok.add(event.tokens))
                    if piece or event.logprobs:
                        yield Delta(piece, event.tokens, event.logprobs or [])
                    if matcher.stopped:
                        cached = started.cached_tokens if started else 0
                        yield observed.finished(
                            Finished(
                                "stop",
                                len(prompt),
                                produced,
                                cached,
                                stop_sequence=matcher.matched,
                                speculative=spec,
                            )
                        )
                        return  # closing `events` cancels the sequence in the worker
                else:
                    tail = matcher.feed(detok.flush())
                    tail += matcher.flush()
                    if tail:
                        yield Delta(tail)
                    reason = "stop" if matcher.stopped else event.finish_reason
                    # The worker's count includes an end-of-turn token it did not send as text.
                    yield observed.finished(
                        Finished(
                            reason,
                            event.prompt_tokens,
                            event.completion_tokens,
                            event.cached_tokens,
                            stop_sequence=matcher.matched,
                            speculative=(
                                None
                                if spec is None
                                else (event.drafted_tokens, event.accepted_tokens)
                            ),
                        )
                    )
                    return
        except WorkerError as exc:
            if exc.code == "worker_died" and produced == 0 and not retried:
                retried = True
                continue
            raise _api_error(exc) from exc
        finally:
            await events.aclose()
