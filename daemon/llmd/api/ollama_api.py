"""Ollama's generation API: ``POST /api/chat`` and ``POST /api/generate``, translated into the
one chat pipeline (chat_pipeline.py) and back into Ollama's NDJSON / JSON shapes.

Request mapping (decisions, also in README):

- ``options``: ``num_predict`` -> max_tokens (``-1``/``-2``/``0``: until the model stops or
  the context is full; a prompt plus ``num_predict`` beyond the context is a 400, as on /v1), ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``seed`` (``-1``:
  random, as Ollama), ``stop``, ``repeat_penalty`` -> repetition_penalty over the latest
  ``repeat_last_n`` tokens (Ollama's default 64; ``-1`` the whole context, ``0`` off),
  ``presence_penalty``, ``frequency_penalty`` (OpenAI's: over the generated tokens). ``num_ctx`` is a load-time setting in Ollama;
  llmd serves each model with one context (``--context-length``), so any ``num_ctx`` is
  accepted and the served context is used: a prompt that does not fit is a 400 (Ollama would
  truncate it) and an answer that fills the context ends with ``done_reason: "length"``.
  Load and performance options (``num_thread``, ``num_gpu``, ``use_mmap``, ``num_batch``,
  ...) are accepted and ignored. Options that would change the answer and are not
  implemented (``mirostat``, ``typical_p`` != 1, ``tfs_z`` != 1) and unknown ones are a 400
  naming them. Defaults are llmd's (the same answer whatever API asks), not Ollama's
  Modelfile defaults.
- ``format``: ``"json"`` -> any JSON object, a JSON schema -> that schema, strictly
  (grammar-enforced).
- ``think``: on a reasoning model the thinking comes back in ``thinking`` (default on, as
  Ollama); ``false`` leaves it out of the answer (llmd cannot stop the model from thinking:
  the tokens are still generated and counted). On other models ``true`` or a level is a 400
  ``"model" does not support thinking``, exactly as Ollama answers. Levels (``"low"`` ...)
  are a 400 on reasoning models too: llmd cannot set a thinking effort.
- Tool calls: the history's ``arguments`` objects become OpenAI's JSON strings; calls get
  ids (``tool_call_id`` or ``tool_name`` match a tool message to its call). Answers carry
  each call whole, in a line of its own as soon as it is complete.
- ``suffix``: fill-in-the-middle from the model's own FIM tokens (fim.py; Ollama fills its
  template's ``.Suffix``), raw or not; the answer is the middle. A model without FIM tokens,
  ``system`` or ``logprobs`` with it are a 400.
- ``images`` (base64, on a message or on ``/api/generate``) become image parts before the
  message's text, as Ollama places them; the pipeline decodes them (images.py) and a bad one
  is a 400 naming ``messages[i].images[k]`` (or ``images[k]``). With ``raw`` or ``suffix``
  they are a 400: only the chat template places images.
- ``template`` or ``context`` are a 400: llmd serves models with their own chat template, and
  the deprecated token ``context`` is not kept (use ``/api/chat`` with ``messages``; answers
  never carry a ``context``).
- Empty ``messages`` / ``prompt``: the model is loaded (``done_reason: "load"``), or with
  ``keep_alive: 0`` unloaded (``"unload"``), as Ollama does.

Durations are measured by the daemon, in nanoseconds: ``load_duration`` (until the model
served the request), ``prompt_eval_duration`` (until the first answer text),
``eval_duration`` (the rest), ``total_duration`` (the whole request).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmd.api.http_common import REGISTRY, STORE, ndjson, parsed_body, pipeline_context, relay
from llmd.api.remote_routes import remote_for, start_remote
from llmd.errors import ApiError, bad_request
from llmd.runtime.keep_alive import KeepAlive, parse_keep_alive
from llmd.runtime.supervisor import ModelSupervisor
from llmd.store.catalog import install_hint
from llmd.store.model_store import ModelStore
from llmd.store.remotes import RemoteRecord
from llmd.text.chat_pipeline import ChatRun, ChoiceDelta, ChoiceEnd, start_chat, start_text
from llmd.text.fim import start_fim_text
from llmd.text.generation import Finished
from llmd.text.openai_schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    name_image_parts,
    parse_request,
)
from llmd.text.reasoning import reasoning_support
from llmd.text.remote_chat import AnyRun

NDJSON = "application/x-ndjson"
# How a request's run starts, on its local model or its remote.
Start = Callable[[Any], Awaitable[Any]]

# ---------------------------------------------------------------------- shared helpers


def rfc3339(ts: float | None = None) -> str:
    """Ollama's timestamps: RFC 3339 in UTC with a Z."""
    moment = datetime.fromtimestamp(time.time() if ts is None else ts, timezone.utc)  # noqa: UP017 - datetime.UTC needs Python 3.11
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def resolve_model_name(store: ModelStore, name: str) -> str:
    """The installed name a request means: Ollama clients add the default tag ``:latest``
    to untagged names, which llmd's names do not carry."""
    if store.resolve(name) is None and name.endswith(":latest"):
        bare = name.removesuffix(":latest")
        if store.resolve(bare) is not None:
            return bare
    return name


def require_model(store: ModelStore, name: str) -> str:
    """The resolved name; 404 in Ollama's words when nothing by that name is installed."""
    resolved = resolve_model_name(store, name)
    if store.resolve(resolved) is None:  # Ollama's words first: clients match "not found"
        raise ApiError(
            404,
            f"model '{name}' not found. {install_hint(name)}",
            param="model",
            code="model_not_found",
        )
    return resolved


# Internal (OpenAI) parameter names -> what an Ollama client sent.
_RENAMED = {
    "max_completion_tokens": "options.num_predict",
    "max_tokens": "options.num_predict",
    "response_format.json_schema.schema": "format",
    "response_format": "format",
    "repetition_penalty": "options.repeat_penalty",
}
_OPTION_PARAMS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
)
_RENAME_RE = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, _RENAMED)) + r")(?![\w])")
_OPTION_RE = re.compile(r"(?<![\w.])(" + "|".join(_OPTION_PARAMS) + r")(?=:)")


def ollama_message(message: str) -> str:
    """An error message with the pipeline's parameter names spelled as Ollama's."""
    message = _RENAME_RE.sub(lambda m: _RENAMED[m.group(1)], message)
    return _OPTION_RE.sub(lambda m: f"options.{m.group(1)}", message)


def error_body(err: ApiError) -> dict[str, Any]:
    """Ollama's error shape: ``{"error": "message"}`` (the HTTP status says the rest)."""
    return {"error": ollama_message(err.message)}


def error_line(err: ApiError) -> bytes:
    """A started stream's error: one NDJSON line, then the stream ends."""
    return ndjson(error_body(err))


def parse_body(body: Any, schema: type[BaseModel], prefix: str = "") -> Any:
    """Validate an Ollama request body (or its `prefix` part); problems are one 400 naming
    each field."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = prefix + ".".join(str(p) for p in err["loc"] if not _is_tag(p))
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown field '{loc}' (not supported by llmd)")
            else:
                problems.append(f"{loc}: {err['msg']}" if loc else err["msg"])
        raise bad_request("invalid request: " + "; ".join(dict.fromkeys(problems))) from exc


def _is_tag(part: Any) -> bool:
    """pydantic's union member names in error locations are not fields."""
    return isinstance(part, str) and (
        part in ("str", "int", "float", "bool", "none")
        or "[" in part
        or part.startswith("function-")
    )


# ---------------------------------------------------------------------- schemas


class OllamaSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolCallFunction(OllamaSchema):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    index: int | None = None  # Ollama numbers the calls of one answer


class ToolCall(OllamaSchema):
    id: str | None = None
    type: Literal["function"] | None = None
    function: ToolCallFunction


class Message(OllamaSchema):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    thinking: str | None = None  # earlier thinking: templates drop it, so llmd does too
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class _Request(OllamaSchema):
    model: str = Field(min_length=1)
    format: str | dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    stream: bool | None = None  # absent or null: stream (Ollama's default)
    keep_alive: KeepAlive = None
    think: bool | str | None = None
    # Ollama truncates an over-long prompt (truncate) and shifts the context when the answer
    # fills it (shift); llmd does neither: a prompt that does not fit is a 400, and a full
    # context ends the answer with done_reason "length". Either value is accepted.
    truncate: bool | None = None
    shift: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


class ChatRequest(_Request):
    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None


class GenerateRequest(_Request):
    prompt: str | None = ""
    suffix: str | None = ""
    system: str | None = ""
    template: str | None = ""
    context: list[int] | None = None
    raw: bool | None = False
    images: list[str] | None = None


class Options(OllamaSchema):
    """Ollama's ``options`` (api/types.go Options + Runner), typed so that a wrong type is a
    400 naming ``options.X``."""

    num_predict: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repeat_last_n: int | None = None
    num_ctx: int | None = Field(default=None, ge=1)
    # Change the answer, not implemented: refused unless neutral (see map_options).
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    typical_p: float | None = None
    tfs_z: float | None = None
    # Load, memory and speed settings, or no-ops: they cannot change the answer.
    num_keep: int | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    num_thread: int | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    numa: bool | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    vocab_only: bool | None = None
    logits_all: bool | None = None
    embedding_only: bool | None = None
    draft_num_predict: int | None = None
    penalize_newline: bool | None = None  # ignored by Ollama itself nowadays


# ---------------------------------------------------------------------- request mapping


def map_options(raw: dict[str, Any] | None) -> dict[str, Any]:
    """Ollama options -> the internal request's sampling fields."""
    if not raw:
        return {}
    unknown = [k for k in raw if k not in Options.model_fields]
    if unknown:
        raise bad_request(f"unknown option(s): {', '.join(unknown)}", param=f"options.{unknown[0]}")
    opts = parse_body(raw, Options, "options.")
    assert isinstance(opts, Options)
    refused = []
    if opts.mirostat not in (None, 0):
        refused.append("mirostat")
    if opts.typical_p not in (None, 1.0):
        refused.append("typical_p")
    if opts.tfs_z not in (None, 1.0):
        refused.append("tfs_z")
    if refused:
        raise bad_request(
            f"option(s) not supported by llmd: {', '.join(refused)}",
            param=f"options.{refused[0].split()[0]}",
        )
    out: dict[str, Any] = {}
    if opts.num_predict is not None:
        if opts.num_predict < -2:
            raise bad_request(
                "options.num_predict must be a positive number of tokens, or -1 (until the "
                "model stops) or -2 (until the context is full)",
                param="options.num_predict",
            )
        if opts.num_predict > 0:
            out["max_tokens"] = opts.num_predict
    for name in ("temperature", "top_k", "top_p", "min_p", "presence_penalty"):
        value = getattr(opts, name)
        if value is not None:
            out[name] = value
    if opts.frequency_penalty is not None:
        out["frequency_penalty"] = opts.frequency_penalty
    if opts.repeat_penalty is not None:
        out["repetition_penalty"] = opts.repeat_penalty
        # Ollama's default window is the latest 64 tokens (-1: the whole context, 0: off).
        out["repeat_last_n"] = 64 if opts.repeat_last_n is None else opts.repeat_last_n
    if opts.seed is not None and opts.seed != -1:  # -1: a random seed, as Ollama
        out["seed"] = opts.seed
    if opts.stop:
        out["stop"] = [opts.stop] if isinstance(opts.stop, str) else list(opts.stop)
    return out


def map_format(fmt: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """``format`` -> the internal response_format: ``"json"`` any object, a schema strictly."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"schema": fmt, "strict": True}}
    raise bad_request(f'format must be "json" or a JSON schema object, not {fmt!r}', param="format")


def _arguments_json(arguments: dict[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def image_content(images: list[str], text: str) -> list[dict[str, Any]]:
    """Ollama's base64 images, then the text, as chat content parts (a data URL passes as
    it is)."""
    parts: list[dict[str, Any]] = [
        {
            "type": "image_url",
            "image_url": {"url": b64 if b64.startswith("data:") else f"data:image/*;base64,{b64}"},
        }
        for b64 in images
    ]
    if text:
        parts.append({"type": "text", "text": text})
    return parts


def map_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Ollama messages -> OpenAI chat messages. Calls without an id get one; a tool message
    is matched to its call by ``tool_call_id``, else by ``tool_name`` (the earliest
    unanswered call of that name), else the earliest unanswered call."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (id, name) of unanswered calls, oldest first
    for i, m in enumerate(messages):
        msg: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if m.images:
            if m.role not in ("user", "tool"):
                raise bad_request("images belong in user messages", param=f"messages[{i}].images")
            msg["content"] = image_content(m.images, m.content or "")
        if m.tool_calls:
            if m.role != "assistant":
                raise bad_request(
                    "only assistant messages carry tool_calls", param=f"messages[{i}].tool_calls"
                )
            calls = []
            for j, call in enumerate(m.tool_calls):
                cid = call.id or f"call_{i}_{j}"
                calls.append(
                    {
                        "id": cid,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": _arguments_json(call.function.arguments),
                        },
                    }
                )
                pending.append((cid, call.function.name))
            msg["tool_calls"] = calls
        if m.role == "tool":
            msg["tool_call_id"] = _answered_call(m, pending, i)
            if m.tool_name:
                msg["name"] = m.tool_name
        out.append(msg)
    return out


def _answered_call(m: Message, pending: list[tuple[str, str]], i: int) -> str:
    if m.tool_call_id:
        for entry in pending:
            if entry[0] == m.tool_call_id:
                pending.remove(entry)
        return m.tool_call_id
    match = next((e for e in pending if e[1] == m.tool_name), None) if m.tool_name else None
    match = match or (pending[0] if pending else None)
    if match is None:  # a result with no call before it: still a tool turn for the template
        return f"call_{i}_result"
    pending.remove(match)
    return match[0]


def _common_fields(req: _Request, name: str) -> dict[str, Any]:
    fields: dict[str, Any] = {"model": name, **map_options(req.options)}
    response_format = map_format(req.format)
    if response_format is not None:
        fields["response_format"] = response_format
    if req.keep_alive is not None:
        fields["keep_alive"] = req.keep_alive
    if req.logprobs:
        fields["logprobs"] = True
        if req.top_logprobs:
            fields["top_logprobs"] = req.top_logprobs
    return fields


def image_places(req: ChatRequest | GenerateRequest) -> list[str]:
    """Where each image of the request is, in the order map_messages puts them."""
    if isinstance(req, GenerateRequest):
        return [f"images[{k}]" for k in range(len(req.images or []))]
    return [
        f"messages[{i}].images[{k}]"
        for i, m in enumerate(req.messages)
        for k in range(len(m.images or []))
    ]


def chat_fields(req: ChatRequest, name: str) -> dict[str, Any]:
    """The internal (OpenAI chat) request body for an Ollama chat request."""
    fields = _common_fields(req, name)
    fields["messages"] = map_messages(req.messages)
    if req.tools:
        fields["tools"] = req.tools
    return fields


def check_generate(req: GenerateRequest) -> None:
    """What /api/generate refuses, in Ollama's order and words where Ollama has them."""
    if req.images and (req.raw or req.suffix):
        raise bad_request(
            "images cannot be used with raw or suffix: only the chat template places images",
            param="images",
        )
    if req.suffix and req.system:
        raise bad_request(
            "system cannot be used with suffix: fill-in-the-middle has no system prompt",
            param="system",
        )
    if req.suffix and req.logprobs:
        raise bad_request("logprobs are not supported with suffix", param="logprobs")
    if req.raw and (req.template or req.system or req.context):
        raise bad_request("raw mode does not support template, system, or context")
    if req.template:
        raise bad_request(
            "template is not supported: llmd renders the model's own chat template; use "
            "raw: true to send a prompt you formatted yourself",
            param="template",
        )
    if req.context:
        raise bad_request(
            "context (deprecated) is not supported by llmd: send the conversation to "
            "/api/chat as messages",
            param="context",
        )


def generate_fields(req: GenerateRequest, name: str) -> dict[str, Any]:
    """The internal request body for a templated (not raw) /api/generate: the prompt is a
    user message, after the system message when one is given."""
    fields = _common_fields(req, name)
    messages = []
    if req.system:
        messages.append({"role": "system", "content": req.system})
    prompt = req.prompt or ""
    content = image_content(req.images, prompt) if req.images else prompt
    messages.append({"role": "user", "content": content})
    fields["messages"] = messages
    return fields


def raw_fields(req: GenerateRequest, name: str) -> dict[str, Any]:
    """The internal request body for raw /api/generate: the prompt as the model reads it."""
    if req.logprobs:
        raise bad_request("logprobs are not supported with raw: true", param="logprobs")
    fields = _common_fields(req, name)
    fields["prompt"] = req.prompt or ""
    return fields


def to_internal(
    fields: dict[str, Any],
    schema: type[Any] = ChatCompletionRequest,
    images: list[str] | None = None,
) -> Any:
    """Validate the mapped body with the pipeline's own schema (its 400s renamed); `images`
    names the image parts as the client sent them (image_places)."""
    try:
        internal = parse_request(fields, schema)
    except ApiError as err:
        raise ApiError(err.status, ollama_message(err.message), param=err.param) from err
    if images:
        name_image_parts(internal.messages, images)
    return internal


@lru_cache(maxsize=32)
def template_thinks(template: str) -> bool:
    return reasoning_support(template, None).is_reasoning_model


def thinking_mode(think: bool | str | None, model: ModelSupervisor, shown: str) -> bool:
    """Whether to return the model's thinking; 400 for what llmd cannot do."""
    template = model.text.chat_template
    thinks = bool(template) and template_thinks(template)  # type: ignore[arg-type]
    if not thinks:
        if think is True or isinstance(think, str):
            raise bad_request(f'"{shown}" does not support thinking', param="think")
        return False
    if isinstance(think, str):
        raise bad_request(
            f"think: {think!r}: llmd cannot set a thinking level; use true or false",
            param="think",
        )
    return think is not False


def done_reason(finish_reason: str) -> str:
    """A tool call ends Ollama's turn with "stop"; running out of tokens is "length"."""
    return "stop" if finish_reason == "tool_calls" else finish_reason


# ---------------------------------------------------------------------- answer mapping


def ollama_tool_call(index: int, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One whole call as Ollama sends it: arguments as an object."""
    try:
        parsed: Any = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        parsed = {"arguments": arguments}  # a call cut by max_tokens: kept, not lost
    if not isinstance(parsed, dict):
        parsed = {"value": parsed}
    return {"id": call_id, "function": {"index": index, "name": name, "arguments": parsed}}


@dataclass
class ToolCallBuffer:
    """The pipeline streams a call as a start and argument fragments; Ollama sends each
    call whole. A call is complete when the next one starts or the answer ends."""

    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [id, name, args]
    emitted: int = 0

    def feed(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        done = []
        for entry in entries:
            index = entry["index"]
            if index not in self.calls:
                done += self._complete(upto=index)
                fn = entry.get("function", {})
                self.calls[index] = [entry.get("id", ""), fn.get("name", ""), ""]
            self.calls[index][2] += entry.get("function", {}).get("arguments") or ""
        return done

    def flush(self) -> list[dict[str, Any]]:
        return self._complete(upto=max(self.calls, default=-1) + 1)

    def _complete(self, upto: int) -> list[dict[str, Any]]:
        out = []
        while self.emitted < upto:
            if self.emitted in self.calls:
                cid, name, args = self.calls[self.emitted]
                out.append(ollama_tool_call(self.emitted, cid, name, args))
            self.emitted += 1
        return out


def logprob_entries(logprobs: dict[str, Any] | None) -> list[dict[str, Any]]:
    """OpenAI's chat logprobs entries are Ollama's Logprob shape already (token, logprob,
    bytes, top_logprobs)."""
    return list((logprobs or {}).get("content") or [])


@dataclass
class Clock:
    """Ollama's durations, in nanoseconds, measured around one request."""

    start: int = field(default_factory=time.perf_counter_ns)
    loaded: int = 0
    started: int = 0
    first: int = 0

    def mark_loaded(self) -> None:
        self.loaded = time.perf_counter_ns()

    def mark_started(self) -> None:
        self.started = time.perf_counter_ns()

    def mark_first(self) -> None:
        if not self.first:
            self.first = time.perf_counter_ns()

    def stats(self, finished: Finished) -> dict[str, Any]:
        end = time.perf_counter_ns()
        first = self.first or end
        return {
            "total_duration": end - self.start,
            "load_duration": self.loaded - self.start,
            "prompt_eval_count": finished.prompt_tokens,
            "prompt_eval_duration": first - self.started,
            "eval_count": finished.completion_tokens,
            "eval_duration": end - first,
        }


@dataclass
class Piece:
    """One line's worth of answer: text, thinking, completed calls, logprobs."""

    content: str = ""
    thinking: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.thinking or self.tool_calls or self.logprobs)

    def add(self, other: Piece) -> None:
        self.content += other.content
        self.thinking += other.thinking
        self.tool_calls += other.tool_calls
        self.logprobs += other.logprobs


@dataclass
class End:
    reason: str
    stats: dict[str, Any]


async def pieces(run: AnyRun, clock: Clock, *, keep_thinking: bool) -> AsyncIterator[Piece | End]:
    """The run's events as Ollama answer pieces, then its end with the measured stats."""
    calls = ToolCallBuffer()
    clock.mark_started()
    async for event in run.events():
        if isinstance(event, ChoiceDelta):
            clock.mark_first()
            delta = event.delta
            piece = Piece(
                content=delta.get("content") or "",
                thinking=(delta.get("reasoning_content") or "") if keep_thinking else "",
                tool_calls=calls.feed(delta.get("tool_calls") or []),
                logprobs=logprob_entries(event.logprobs),
            )
            if piece:
                yield piece
        elif isinstance(event, ChoiceEnd):
            final = calls.flush()
            if final:
                yield Piece(tool_calls=final)
            yield End(done_reason(event.finish_reason), clock.stats(event.finished))


# ---------------------------------------------------------------------- handlers


@dataclass
class Shape:
    """How chat and generate lay a piece out: a chat `message` or generate's `response`."""

    chat: bool

    def body(self, shown: str, piece: Piece, done: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"model": shown, "created_at": rfc3339()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": piece.content}
            if piece.thinking:
                message["thinking"] = piece.thinking
            if piece.tool_calls:
                message["tool_calls"] = piece.tool_calls
            out["message"] = message
        else:
            out["response"] = piece.content
            if piece.thinking:
                out["thinking"] = piece.thinking
        out["done"] = done
        if piece.logprobs:
            out["logprobs"] = piece.logprobs
        return out


async def _answer(
    request: web.Request,
    run: AnyRun,
    clock: Clock,
    shape: Shape,
    shown: str,
    *,
    stream: bool,
    keep_thinking: bool,
) -> web.StreamResponse:
    items = pieces(run, clock, keep_thinking=keep_thinking)
    if not stream:
        whole = Piece()
        end: End | None = None
        try:
            async for item in items:
                if isinstance(item, End):
                    end = item
                else:
                    whole.add(item)
        finally:
            await items.aclose()
        assert end is not None
        body = shape.body(shown, whole, True)
        body.update(done_reason=end.reason, **end.stats)
        return web.json_response(body)

    async def frames() -> AsyncIterator[bytes]:
        try:
            async for item in items:
                if isinstance(item, End):
                    body = shape.body(shown, Piece(), True)
                    body.update(done_reason=item.reason, **item.stats)
                    yield ndjson(body)
                else:
                    yield ndjson(shape.body(shown, item, False))
        finally:
            await items.aclose()

    return await relay(
        request, run.accepted(), frames(), content_type=NDJSON, error_frame=error_line
    )


def keep_alive_seconds(value: str | float | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_keep_alive(value)
    except ValueError as exc:
        raise bad_request(f"keep_alive: {exc}", param="keep_alive") from exc


async def _load_or_unload(
    request: web.Request,
    name: str,
    shown: str,
    keep: float | None,
    shape: Shape,
    remote: RemoteRecord | None = None,
) -> web.Response:
    """Ollama's empty request: load the model (keep it for `keep`), or unload it (keep 0).
    A model busy with requests unloads as soon as they end. A remote model is always ready
    (its upstream holds it): "load" or "unload" is answered without a request."""
    registry = request.app[REGISTRY]
    if remote is not None:
        reason = "unload" if keep == 0 else "load"
    elif keep == 0:
        for model in registry.loaded():
            if model.name == name:
                model.touch(0)
        await registry.unload_expired()
        reason = "unload"
    else:
        async with registry.use(name, keep):
            pass
        reason = "load"
    body = shape.body(shown, Piece(), True)
    body["done_reason"] = reason
    return web.json_response(body)


async def _remote(request: web.Request, name: str) -> RemoteRecord | None:
    """The remote an Ollama model name (`:latest` understood) is served by, if any."""
    for candidate in dict.fromkeys((name, name.removesuffix(":latest"))):
        remote = await remote_for(request, candidate)
        if remote is not None:
            return remote
    return None


def _start_chat(request: web.Request, internal: ChatCompletionRequest) -> Start:
    def start(model: ModelSupervisor | RemoteRecord) -> Awaitable[AnyRun]:
        if isinstance(model, RemoteRecord):
            return start_remote(request, model, internal)
        return start_chat(pipeline_context(request), internal, model)

    return start


async def chat(request: web.Request) -> web.StreamResponse:
    clock = Clock()
    req = await parsed_body(request, parse_body, ChatRequest)
    shape = Shape(chat=True)
    remote = await _remote(request, req.model)
    name = remote.name if remote else require_model(request.app[STORE], req.model)
    keep = keep_alive_seconds(req.keep_alive)
    if not req.messages:
        return await _load_or_unload(request, name, req.model, keep, shape, remote)
    internal = to_internal(chat_fields(req, name), images=image_places(req))
    return await _run(
        request, req, name, keep, _start_chat(request, internal), clock, shape, remote
    )


async def generate(request: web.Request) -> web.StreamResponse:
    clock = Clock()
    req = await parsed_body(request, parse_body, GenerateRequest)
    shape = Shape(chat=False)
    remote = await _remote(request, req.model)
    name = remote.name if remote else require_model(request.app[STORE], req.model)
    keep = keep_alive_seconds(req.keep_alive)
    if not req.prompt and not req.images:
        return await _load_or_unload(request, name, req.model, keep, shape, remote)
    check_generate(req)
    if remote is not None and (req.suffix or req.raw):
        # The prompt as given (and the suffix) to the upstream's /v1/completions: it renders
        # fill-in-the-middle with its own model's tokens, as llmd does for local models.
        fields = raw_fields(req, name)
        if req.suffix:
            fields["suffix"] = req.suffix
        raw_req = to_internal(fields, CompletionRequest)

        def start(model: ModelSupervisor | RemoteRecord) -> Awaitable[AnyRun]:
            assert isinstance(model, RemoteRecord)
            return start_remote(request, model, raw_req)

    elif req.suffix:  # fill-in-the-middle from the model's FIM tokens (raw or not)
        fim_req = to_internal(raw_fields(req, name), CompletionRequest)

        def start(model: ModelSupervisor) -> Awaitable[ChatRun]:
            prefix, suffix = req.prompt or "", req.suffix or ""
            return start_fim_text(
                pipeline_context(request), fim_req, model, prefix, suffix, model_name=req.model
            )

    elif req.raw:
        text_req = to_internal(raw_fields(req, name), CompletionRequest)

        def start(model: ModelSupervisor) -> Awaitable[ChatRun]:
            return start_text(pipeline_context(request), text_req, model, req.prompt or "")

    else:
        internal = to_internal(generate_fields(req, name), images=image_places(req))
        start = _start_chat(request, internal)

    return await _run(request, req, name, keep, start, clock, shape, remote)


async def _run(
    request: web.Request,
    req: ChatRequest | GenerateRequest,
    name: str,
    keep: float | None,
    start: Start,
    clock: Clock,
    shape: Shape,
    remote: RemoteRecord | None = None,
) -> web.StreamResponse:
    """Load the model (or pick its remote), start the run and answer in Ollama's shape."""
    if remote is not None:
        clock.mark_loaded()
        if isinstance(req.think, str):  # as for local models: no effort can be set
            raise bad_request(
                f"think: {req.think!r}: llmd cannot set a thinking level; use true or false",
                param="think",
            )
        return await _respond(request, req, await _start(start(remote)), clock, shape, True)
    async with request.app[REGISTRY].use(name, keep) as model:
        clock.mark_loaded()
        keep_thinking = thinking_mode(req.think, model, req.model)
        run = await _start(start(model))
        return await _respond(request, req, run, clock, shape, keep_thinking)


async def _respond(
    request: web.Request,
    req: ChatRequest | GenerateRequest,
    run: AnyRun,
    clock: Clock,
    shape: Shape,
    keep_thinking: bool,
) -> web.StreamResponse:
    """The run's answer in Ollama's shape (whole or NDJSON); closes the run."""
    try:
        return await _answer(
            request,
            run,
            clock,
            shape,
            req.model,
            stream=req.stream is not False,
            keep_thinking=keep_thinking and req.think is not False,
        )
    finally:
        await run.aclose()


async def _start(starting: Any) -> AnyRun:
    """The pipeline's 400s (context overflow, bad schema) in Ollama's parameter names."""
    try:
        return await starting  # type: ignore[no-any-return]
    except ApiError as err:
        out = ApiError(
            err.status, ollama_message(err.message), type=err.type, param=err.param, code=err.code
        )
        out.retry_after = err.retry_after  # a busy remote's 429 says when to retry
        raise out from err
