"""One generation, protocol-agnostic: prompt ids in, text deltas and a final result out.
Detokenization, stop strings and cancellation live here once for every API route."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from . import protocol as p
from .detokenizer import IncrementalDetokenizer
from .errors import ApiError, bad_request, server_error
from .metrics import observe_generation
from .stop_strings import StopMatcher
from .supervisor import ModelSupervisor
from .worker_client import Accepted, WorkerError


@dataclass
class Delta:
    """New answer text, and the tokens behind it with their logprobs when the request asked
    (tokens may be ahead of text that waits for the rest of a UTF-8 character)."""

    text: str
    tokens: list[int] = field(default_factory=list)
    logprobs: list[p.TokenLogprob] = field(default_factory=list)


@dataclass
class Finished:
    """How a generation ended; the counts are what `usage` reports."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    stop_sequence: str | None = None  # the request's stop string that ended it, if one did


def token_budget(
    prompt_len: int,
    requested: int | None,
    context_length: int,
    *,
    limit_param: str,
    prompt_param: str,
) -> int:
    """max_tokens after checking the context window (absent: what is left of it)."""
    if prompt_len >= context_length:
        raise ApiError(
            400,
            f"the prompt is {prompt_len} tokens, which does not fit this model's context of "
            f"{context_length} tokens (at least one token must be left to generate)",
            param=prompt_param,
            code="context_length_exceeded",
        )
    if requested is None:
        return context_length - prompt_len
    if prompt_len + requested > context_length:
        raise ApiError(
            400,
            f"this model's context is {context_length} tokens; the prompt is {prompt_len} tokens "
            f"and {limit_param} asks for {requested} more ({prompt_len + requested} in total). "
            f"Reduce the prompt or {limit_param}.",
            param=limit_param,
            code="context_length_exceeded",
        )
    return requested


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
) -> AsyncIterator[Accepted | Delta | Finished]:
    """Yields Accepted once the worker has the request (a 429 or other ApiError comes before
    it), then text deltas (never half a character, never a stop string or what follows it),
    then exactly one Finished. Raises ApiError. Closing it early cancels the worker request.

    A request whose worker dies before it produced a token (it was queued, or prefilling) is
    sent once more to the restarted worker: the client sees a delay, not an error. A second
    death is reported (the request itself may be what kills it)."""
    # Control tokens (end of turn, ...) are markup, not answer text (llama-server and vLLM
    # leave them out of the output by default too).
    # `show_tokens`: control tokens that are markup the API parses (tool-call markers).
    hidden = (model.text.special_ids | set(model.text.stop_token_ids)) - show_tokens
    detok = IncrementalDetokenizer(model.text.tokenizer, skip_ids=hidden)
    matcher = StopMatcher(stops)
    observed = observe_generation(model)  # tokens and latencies for GET /metrics
    produced = 0
    accepted = False
    retried = False
    while True:
        worker = await model.ensure_ready()
        events = worker.generate(
            prompt,
            max_tokens=max_tokens,
            sampling=sampling,
            stop_tokens=model.text.stop_token_ids,
            session=session,
            grammar=grammar,
            prefill_of=prefill_of,
        )
        try:
            async for event in events:
                if isinstance(event, Accepted):
                    if not accepted:
                        accepted = True
                        yield event
                elif isinstance(event, p.Tokens):
                    produced += len(event.tokens)
                    observed.tokens(len(event.tokens))
                    piece = matcher.feed(detok.add(event.tokens))
                    if piece or event.logprobs:
                        yield Delta(piece, event.tokens, event.logprobs or [])
                    if matcher.stopped:
                        yield observed.finished(
                            Finished("stop", len(prompt), produced, stop_sequence=matcher.matched)
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
