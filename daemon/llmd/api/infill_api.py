"""llama-server's `POST /infill`: the fill-in-the-middle endpoint editor plugins (llama.vim,
llama.vscode and others) speak, on the one pipeline (chat_pipeline.choice_maker).

Request: `input_prefix`, `input_suffix` (both required), `input_extra` (other files,
``[{"filename", "text"}]``), `prompt` (text typed after the prefix, kept whole), llama-server's
sampling names (`n_predict`, `temperature`, `top_k`, `top_p`, `min_p`, `seed`, `stop`,
`repeat_penalty`, `repeat_last_n`, `presence_penalty`, `frequency_penalty`), `stream`, and
its editor controls: `n_indent` (a later line indented less ends the answer, cut before its
text) and `t_max_predict_ms` (past that time the answer ends at the next new line).
`response_fields` picks fields of the answer (``"timings/prompt_n"`` reaches into objects).
`model` is llmd's addition (llama-server serves one model): without it the most recently used
loaded model with FIM tokens answers. Accepted and ignored: `id_slot`, `cache_prompt` (the
prefix cache is always on), `t_max_prompt_ms`, `samplers` (llmd's samplers run in their
fixed order; llama.cpp's `infill` sampler is not implemented), `n_cmpl: 1`. Anything else is
a 400 naming it.

Prompt: fim.build_fim_prompt in its repo-level form. Where it does not fit the context (less
room for the answer: `n_predict`, or 256 tokens), the extra files' start is dropped first, then
the prefix's start and the suffix's end (3:1), as llama-server weighs them; `truncated: true`
then says so. `n_predict: 0` only prefills (plugins warm the cache that way): nothing is
returned.

Answer (llama-server's /completion shape, not OpenAI's): `content`, `stop`, `stop_type`
(`eos`, `word`, `limit`), `stopping_word`, `tokens_predicted`, `tokens_evaluated`,
`tokens_cached`, `truncated`, `has_new_line`, `prompt` (the prompt as text, FIM tokens
included), `model`, `generation_settings`, `timings` (measured by the daemon). Streams are SSE
``data: {...}`` events without ``[DONE]``: one per text piece with `stop: false`, then the
whole final object with empty `content`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmd.api.http_common import REGISTRY, parsed_body, pipeline_context, relay, sse
from llmd.errors import ApiError, bad_request
from llmd.runtime.keep_alive import KeepAlive, parse_keep_alive
from llmd.runtime.model_registry import ModelRegistry
from llmd.runtime.worker_client import Accepted
from llmd.text.chat_pipeline import choice_maker, encode_prompt, run_choices, wait_accepted
from llmd.text.fim import (
    ExtraFile,
    FimPrompt,
    build_fim_prompt,
    model_fim_tokens,
    no_fim_error,
    with_fim_stops,
)
from llmd.text.generation import Delta, Finished
from llmd.text.openai_schemas import CompletionRequest

# Room kept for the answer when `n_predict` does not say how much (-1: until the end).
DEFAULT_ANSWER_ROOM = 256
# Accepted and ignored (see the module docstring): llama-server scheduling and cache hints.
_IGNORED = ("id_slot", "cache_prompt", "t_max_prompt_ms", "samplers")


class ExtraChunk(BaseModel):
    """One `input_extra` entry; other keys (llama.vim's `time`) are ignored, as llama-server
    ignores them."""

    model_config = ConfigDict(extra="ignore")
    text: str
    filename: str = "tmp"


class InfillRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, min_length=1)
    input_prefix: str
    input_suffix: str
    input_extra: list[ExtraChunk] = Field(default_factory=list)
    prompt: str = ""
    n_predict: int = Field(default=-1, ge=-2)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_k: int = Field(default=0, ge=0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int = Field(default=-1, ge=-1, lt=2**64)
    stop: list[str] = Field(default_factory=list, max_length=16)
    repeat_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    repeat_last_n: int = Field(default=64, ge=-1)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stream: bool = False
    n_indent: int = Field(default=0, ge=0)
    t_max_predict_ms: int = Field(default=0, ge=0)
    response_fields: list[str] | None = None
    return_tokens: bool = False
    n_cmpl: int = Field(default=1, ge=1, le=1)
    keep_alive: KeepAlive = None  # llmd's (Ollama's) keep-alive

    def sampling(self, model: str, prompt: list[int]) -> CompletionRequest:
        """The pipeline's request for these sampling settings (already range-checked)."""
        fields: dict[str, Any] = {
            "model": model,
            "prompt": prompt,
            "max_tokens": self.max_tokens(),
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "seed": None if self.seed < 0 else self.seed,
            "stop": self.stop or None,
            "repetition_penalty": self.repeat_penalty,
            "repeat_last_n": self.repeat_last_n,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "stream": self.stream,
        }
        return CompletionRequest.model_validate(fields)

    def max_tokens(self) -> int | None:
        if self.n_predict < 0:
            return None  # until the model stops or the context is full
        return max(1, self.n_predict)  # 0: prefill only; the one token is not returned

    def answer_room(self) -> int:
        return self.n_predict if self.n_predict > 0 else DEFAULT_ANSWER_ROOM


def parse_infill(body: Any) -> InfillRequest:
    """Validate the body; every problem is a 400 naming the parameter."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    body = {k: v for k, v in body.items() if k not in _IGNORED}
    for key in ("input_prefix", "input_suffix"):
        if key not in body:
            raise bad_request(f'"{key}" is required', param=key)
    if isinstance(body.get("stop"), str):
        body["stop"] = [body["stop"]]
    try:
        req = InfillRequest.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            raise bad_request(f"unrecognized parameter: {param}", param=param) from exc
        raise bad_request(f"invalid request: {param}: {err['msg']}", param=param) from exc
    if req.keep_alive is not None:
        try:
            parse_keep_alive(req.keep_alive)
        except ValueError as exc:
            raise bad_request(f"keep_alive: {exc}", param="keep_alive") from exc
    return req


def pick_model(registry: ModelRegistry, named: str | None) -> str:
    """The named model, else the most recently used loaded one with FIM tokens."""
    if named:
        return named
    loaded = sorted(registry.loaded(), key=lambda m: m.last_used, reverse=True)
    for model in loaded:
        if model.worker is not None and model_fim_tokens(model) is not None:
            return model.name
    raise bad_request(
        "no loaded model can fill in the middle: name one with `model` (a code model with "
        "FIM tokens, such as Qwen2.5-Coder), or start the daemon with --preload NAME",
        param="model",
    )


# ---------------------------------------------------------------------- the answer


@dataclass
class EditorLimits:
    """llama-server's editor stops on the generated text: `n_indent` (a line after the first
    indented less than it ends the answer, cut where its text starts) and `t_max_predict_ms`
    (once that long has passed, a piece holding a new line is the last)."""

    n_indent: int = 0
    t_max_ms: int = 0
    text: str = ""
    _scan: int = 0  # where to look for the next new line whose indent is unchecked

    def feed(self, piece: str, elapsed_ms: float) -> tuple[str, bool]:
        """The part of `piece` to keep, and whether the answer ends here."""
        start = len(self.text)
        self.text += piece
        if self.n_indent > 0:
            while (nl := self.text.find("\n", self._scan)) >= 0:
                pos = nl + 1
                while pos < len(self.text) and self.text[pos] in " \t":
                    pos += 1
                if pos >= len(self.text):
                    break  # the line's indent is not known yet
                if pos - (nl + 1) < self.n_indent:
                    self.text = self.text[:pos]
                    return self.text[start:], True
                self._scan = nl + 1
        ended = self.t_max_ms > 0 and "\n" in piece and elapsed_ms > self.t_max_ms
        return piece, ended


@dataclass
class Outcome:
    """What the final object reports."""

    content: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    stop_type: str = "none"
    stopping_word: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int | None = None  # the engine's count (with an end token not shown)
    started: float = field(default_factory=time.perf_counter)
    first: float | None = None
    ended: float | None = None


def _predicted(out: Outcome, n_predict: int) -> int:
    if n_predict == 0:
        return 0
    return len(out.tokens) if out.completion_tokens is None else out.completion_tokens


def _stop_type(finished: Finished, fim: FimPrompt) -> tuple[str, str]:
    if finished.finish_reason == "length":
        return "limit", ""
    if finished.stop_sequence and finished.stop_sequence not in fim.stops:
        return "word", finished.stop_sequence
    return "eos", ""


async def _run(
    pieces: AsyncIterator[Accepted | tuple[int, Any]],
    req: InfillRequest,
    fim: FimPrompt,
    out: Outcome,
) -> AsyncIterator[str]:
    """The answer's text pieces as they are kept; fills `out`. Ending early (an editor
    limit) closes `pieces`, which cancels the generation in the worker."""
    limits = EditorLimits(req.n_indent, req.t_max_predict_ms)
    try:
        async for item in pieces:
            if isinstance(item, Accepted):
                continue
            _, piece = item
            if isinstance(piece, Finished):
                out.stop_type, out.stopping_word = _stop_type(piece, fim)
                out.prompt_tokens = piece.prompt_tokens
                out.cached_tokens = piece.cached_tokens
                out.completion_tokens = piece.completion_tokens
                break
            if not isinstance(piece, Delta):
                continue  # other pipeline events (admission) say nothing here
            now = time.perf_counter()
            if out.first is None:
                out.first = now
            out.tokens += piece.tokens
            if req.n_predict == 0:
                continue  # prefill only
            text, ended = limits.feed(piece.text, (now - out.first) * 1000)
            if text:
                out.content.append(text)
                yield text
            if ended:
                out.stop_type = "limit"
                break
    finally:
        out.ended = time.perf_counter()
        await pieces.aclose()  # type: ignore[attr-defined]


def _timings(out: Outcome, predicted: int) -> dict[str, Any]:
    first = out.first or out.ended or out.started
    prompt_ms = (first - out.started) * 1000
    predicted_ms = ((out.ended or first) - first) * 1000
    prompt_n = max(0, out.prompt_tokens - out.cached_tokens)
    return {
        "cache_n": out.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / prompt_ms * 1000 if prompt_ms > 0 else 0.0,
        "predicted_n": predicted,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted if predicted else 0.0,
        "predicted_per_second": predicted / predicted_ms * 1000 if predicted_ms > 0 else 0.0,
    }


def _final(
    req: InfillRequest, name: str, fim: FimPrompt, prompt_text: str, out: Outcome, stream: bool
) -> dict[str, Any]:
    content = "".join(out.content)
    predicted = _predicted(out, req.n_predict)
    return {
        "index": 0,
        "content": "" if stream else content,
        "tokens": out.tokens if req.return_tokens and not stream else [],
        "id_slot": 0,
        "stop": True,
        "model": name,
        "tokens_predicted": predicted,
        "tokens_evaluated": out.prompt_tokens,
        "generation_settings": {
            "n_predict": req.n_predict,
            "temperature": req.temperature,
            "top_k": req.top_k,
            "top_p": req.top_p,
            "min_p": req.min_p,
            "seed": req.seed,
            "stop": req.stop,
            "repeat_penalty": req.repeat_penalty,
            "repeat_last_n": req.repeat_last_n,
            "presence_penalty": req.presence_penalty,
            "frequency_penalty": req.frequency_penalty,
            "n_indent": req.n_indent,
            "t_max_predict_ms": req.t_max_predict_ms,
            "stream": stream,
        },
        "prompt": prompt_text,
        "has_new_line": "\n" in content,
        "truncated": fim.truncated,
        "stop_type": out.stop_type,
        "stopping_word": out.stopping_word,
        "tokens_cached": out.prompt_tokens + predicted,
        "timings": _timings(out, predicted),
    }


def pick_fields(body: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """llama-server's `response_fields`: each path (``a/b`` reaches into objects) that
    exists, under its path as the key."""
    picked: dict[str, Any] = {}
    for path in paths:
        value: Any = body
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            picked[path] = value
    return picked


# ---------------------------------------------------------------------- the route


async def infill(request: web.Request) -> web.StreamResponse:
    req = await parsed_body(request, parse_infill)
    registry = request.app[REGISTRY]
    name = pick_model(registry, req.model)
    keep = None if req.keep_alive is None else parse_keep_alive(req.keep_alive)
    async with registry.use(name, keep) as model:
        fim_tokens = await asyncio.to_thread(model_fim_tokens, model)
        if fim_tokens is None:
            raise no_fim_error(name, "model")
        extra = [ExtraFile(c.text, c.filename) for c in req.input_extra]
        fim = await asyncio.to_thread(
            build_fim_prompt,
            model.text,
            fim_tokens,
            req.input_prefix,
            req.input_suffix,
            cursor=req.prompt,
            extra=extra,
            repo_level=True,
            max_prompt_tokens=model.context_length
            - min(req.answer_room(), model.context_length // 2),
        )
        internal = req.sampling(name, fim.ids)
        prompt, max_tokens = await encode_prompt(internal, model, fim.ids, "input_prefix")
        prompt_text = model.text.tokenizer.decode(prompt, skip_special_tokens=False)
        make = choice_maker(
            pipeline_context(request),
            with_fim_stops(internal, fim),
            model,
            prompt,
            max_tokens,
            -1,
            None,
            fim.show_tokens,
        )
        pieces = run_choices(make, 1)
        out = Outcome(prompt_tokens=len(prompt))
        texts = _run(pieces, req, fim, out)
        try:
            if not req.stream:
                await wait_accepted(pieces)
                async for _ in texts:
                    pass
                body = _final(req, name, fim, prompt_text, out, stream=False)
                if req.response_fields:
                    body = pick_fields(body, req.response_fields)
                return web.json_response(body)

            async def frames() -> AsyncIterator[bytes]:
                async for text in texts:
                    yield sse(
                        {
                            "index": 0,
                            "content": text,
                            "tokens": [],
                            "stop": False,
                            "id_slot": 0,
                            "tokens_predicted": len(out.tokens),
                            "tokens_evaluated": len(prompt),
                        }
                    )
                yield sse(_final(req, name, fim, prompt_text, out, stream=True))

            return await relay(
                request,
                wait_accepted(pieces),
                frames(),
                content_type="text/event-stream",
                error_frame=_error_event,
            )
        finally:
            await texts.aclose()  # type: ignore[attr-defined]
            await pieces.aclose()  # type: ignore[attr-defined]  # if `texts` never started


def _error_event(err: ApiError) -> bytes:
    return sse(err.envelope())


def add_infill_routes(app: web.Application) -> None:
    app.router.add_post("/infill", infill)
