"""A remote model's answer as the chat pipeline's events, so every protocol serves remote
models through its own translation code.

The Anthropic, Responses and Ollama routes translate their request into the pipeline's
internal request (a validated `ChatCompletionRequest`) and read the answer back as a
`ChatRun`'s events (`ChoiceDelta`, `ChoiceEnd`) or whole result. For a remote model that run
is a `RemoteRun`: the internal request goes to the upstream's `/v1/chat/completions`, always
streamed (with `stream_options.include_usage`), and each upstream chunk becomes the same
events a local generation yields: one delta per piece of text, reasoning or tool-call
fragment, then one end per choice with the upstream's usage (`cached_tokens` included). The
protocols then lay them out as they do for local models, delta by delta; nothing is
translated twice.

Decision: the upstream is always asked to stream, even when the client wants a whole answer.
One reading path serves both, a stalled upstream is caught between chunks by the read timeout
instead of after minutes of silence, and the client's whole answer is assembled exactly as a
local one is.

A raw prompt (Ollama's `raw` or `suffix` on `/api/generate`) goes to the upstream's
`/v1/completions` the same way; its `text` pieces become content deltas.

`start_remote_chat` takes a slot of the remote (its bounded queue, 429 beyond), sends the
request and waits for the status line, so an upstream refusal (400, 429, 503, ...) is raised
before any byte of the client's stream, as a local 400 is. Closing the run closes the
upstream connection (the upstream stops generating) and frees the slot.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from llmd.errors import ApiError
from llmd.runtime.remote_upstream import (
    SSE,
    RemoteGate,
    Slots,
    read_lines,
    request_options,
    transport_error,
    upstream_body,
    upstream_error,
)
from llmd.store.remotes import RemoteRecord
from llmd.text.chat_output import ChatOutputPlan
from llmd.text.chat_pipeline import (
    ChatChoice,
    ChatEvent,
    ChatResult,
    ChatRun,
    ChoiceDelta,
    ChoiceEnd,
)
from llmd.text.generation import Finished
from llmd.text.openai_schemas import ChatCompletionRequest, SamplingFields


def chat_body(req: SamplingFields, remote: RemoteRecord) -> dict[str, Any]:
    """The internal request as the upstream gets it: streamed with usage. A reasoning switch
    that the client's protocol only hints at (Anthropic's `thinking`) stays home: an upstream
    would refuse it for a model without one, where a local model ignores the hint."""
    body = upstream_body(req, remote)
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if isinstance(req, ChatCompletionRequest) and req.reasoning_is_hint:
        body.pop("reasoning_effort", None)
    return body


async def start_remote_chat(
    gate: RemoteGate, remote: RemoteRecord, req: SamplingFields
) -> RemoteRun:
    """The run of `req` on `remote`, once the upstream accepted it (raises its refusal, a
    429 when the remote's queue is full, 502/504 when it cannot be reached). A chat request
    goes to the upstream's `/v1/chat/completions`; a raw prompt (a `CompletionRequest`:
    Ollama's `raw`, or `suffix` for fill-in-the-middle) to its `/v1/completions`, whose
    `text` pieces become content deltas."""
    path = "/v1/chat/completions" if isinstance(req, ChatCompletionRequest) else "/v1/completions"
    options = request_options(remote)
    body = chat_body(req, remote)
    started = time.perf_counter()
    try:
        slots = await gate.acquire(remote)
    except ApiError as err:  # 429: the remote's queue is full
        gate.failed(remote, err, time.perf_counter() - started)
        raise
    try:
        try:
            resp = await gate.post(remote, path, json=body, **options)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise transport_error(remote, exc) from exc
        if resp.status >= 400:
            try:
                text = await resp.text(errors="replace")
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                raise transport_error(remote, exc) from exc
            finally:
                resp.close()
            raise upstream_error(remote, resp.status, text, resp.headers)
    except ApiError as err:
        gate.failed(remote, err, time.perf_counter() - started)
        gate.release(slots)
        raise
    except BaseException:
        gate.release(slots)
        raise
    return RemoteRun(gate, remote, req, resp, slots, started)


class RemoteRun:
    """A ChatRun's interface (accepted, events, result, aclose) over an upstream's stream."""

    output = ChatOutputPlan()  # the upstream parsed reasoning and tool calls already

    def __init__(
        self,
        gate: RemoteGate,
        remote: RemoteRecord,
        req: SamplingFields,
        resp: aiohttp.ClientResponse,
        slots: Slots,
        started: float,
    ) -> None:
        self.gate = gate
        self.remote = remote
        self.n = req.n
        self.prompt_tokens = 0  # known at the end only (the upstream's usage)
        self.reasoning_tokens = 0  # the upstream's usage.completion_tokens_details, if any
        self._stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        self._resp = resp
        self._slots: Slots | None = slots
        self._started = started
        self._finished: list[Finished] = []
        self._usage: dict[str, Any] | None = None  # the upstream's, for the remote's metrics
        self._failed = False

    async def accepted(self) -> None:
        """The upstream accepted the request when the run was started."""

    async def events(self, *, started: bool = False) -> AsyncIterator[ChatEvent]:
        """The upstream's answer as pipeline events. No ChoiceStarted (the prompt's token
        counts only come with the upstream's usage, at the end). A stream that breaks off,
        stalls past the read timeout or reports an error raises ApiError (502/504, or the
        upstream's own error)."""
        ends: dict[int, str] = {}
        matched: dict[int, str | None] = {}
        usage: dict[str, Any] | None = None
        done = False
        try:
            async for data in self._data():
                if data == "[DONE]":
                    done = True
                    break
                chunk = self._parse(data)
                if isinstance(chunk.get("usage"), dict):
                    usage = self._usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    index = int(choice.get("index") or 0)
                    if isinstance(choice.get("text"), str):  # /v1/completions
                        choice = {"delta": {"content": choice["text"]}, **choice}
                        choice.pop("logprobs", None)  # its own shape; never asked for here
                    for delta in split_delta(choice.get("delta") or {}, choice.get("logprobs")):
                        yield ChoiceDelta(index, delta[0], delta[1])
                    if choice.get("finish_reason"):
                        ends[index] = str(choice["finish_reason"])
                        reason = choice.get("stop_reason")  # vLLM: the stop string matched
                        matched[index] = reason if reason in self._stops else None
            if not done:
                raise ApiError(
                    502,
                    f"remote '{self.remote.name}' ({self.remote.host}) ended the stream before "
                    "it was complete",
                    type="server_error",
                    code="upstream_unreachable",
                )
            for index in range(self.n):
                finished = self._finish(ends.get(index, "stop"), usage, matched.get(index))
                yield ChoiceEnd(index, finished.finish_reason, finished)
        except ApiError as err:
            self._failed = True
            self.gate.failed(self.remote, err, time.perf_counter() - self._started)
            raise
        finally:
            await self.aclose()

    async def result(self) -> ChatResult:
        """The whole answer, assembled from the events as a client assembles a stream."""
        texts: dict[int, dict[str, Any]] = {}
        logprobs: dict[int, list[dict[str, Any]]] = {}
        reasons: dict[int, str] = {}
        finished: list[Finished] = []
        async for event in self.events():
            if isinstance(event, ChoiceDelta):
                message = texts.setdefault(event.index, {"role": "assistant", "content": ""})
                _merge(message, event.delta)
                if event.logprobs:
                    logprobs.setdefault(event.index, []).extend(event.logprobs.get("content") or [])
            elif isinstance(event, ChoiceEnd):
                reasons[event.index] = event.finish_reason
                finished.append(event.finished)
        choices = []
        for index in range(self.n):
            message = texts.get(index, {"role": "assistant", "content": ""})
            lps = logprobs.get(index)
            choices.append(
                ChatChoice(
                    message,
                    reasons.get(index, "stop"),
                    {"content": lps, "refusal": None} if lps is not None else None,
                )
            )
        return ChatResult(choices, _usage(finished))

    async def aclose(self) -> None:
        """Close the upstream connection (pooled again when read to the end, else cut, which
        stops the generation there) and free the slot; counted once."""
        resp, self._resp = self._resp, None  # type: ignore[assignment]
        if resp is not None:
            if resp.content.is_eof():
                resp.release()
            else:
                resp.close()
        slots, self._slots = self._slots, None
        if slots is not None:
            self.gate.release(slots)
            if not self._failed:
                self.gate.finished(
                    self.remote,
                    time.perf_counter() - self._started,
                    self._usage,
                    complete=bool(self._finished),
                )

    # ------------------------------------------------------------------ reading

    async def _data(self) -> AsyncIterator[str]:
        """Each SSE event's `data` (lines joined), transport failures as 502/504. An upstream
        that answered whole despite `stream` (JSON) reads as one chunk holding all of it."""
        if self._resp.content_type != SSE:
            try:
                raw = await self._resp.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                raise transport_error(self.remote, exc) from exc
            yield json.dumps(as_chunk(self._parse(raw.decode("utf-8", errors="replace"))))
            yield "[DONE]"
            return
        lines: list[str] = []
        try:
            async for raw in read_lines(self._resp.content):
                line = raw.decode("utf-8", errors="replace")
                if line.startswith("data:"):
                    lines.append(line[5:].removeprefix(" "))
                elif not line and lines:
                    yield "\n".join(lines)
                    lines = []
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise transport_error(self.remote, exc) from exc
        if lines:
            yield "\n".join(lines)

    def _parse(self, data: str) -> dict[str, Any]:
        try:
            chunk = json.loads(data)
        except ValueError as exc:
            raise self._broken("an event that is not JSON") from exc
        if not isinstance(chunk, dict):
            raise self._broken("an event that is not a JSON object")
        if "error" in chunk:  # the upstream's own in-band error ends its stream
            raise upstream_error(self.remote, 500, json.dumps(chunk), {}, in_stream=True)
        return chunk

    def _broken(self, what: str) -> ApiError:
        return ApiError(
            502,
            f"remote '{self.remote.name}' ({self.remote.host}) sent {what}",
            type="server_error",
            code="upstream_error",
        )

    def _finish(self, reason: str, usage: dict[str, Any] | None, stop: str | None) -> Finished:
        usage = usage or {}
        prompt = _count(usage.get("prompt_tokens"))
        details = usage.get("prompt_tokens_details") or {}
        done = usage.get("completion_tokens_details") or {}
        self.prompt_tokens = prompt
        self.reasoning_tokens = _count(done.get("reasoning_tokens"))
        finished = Finished(
            finish_reason=reason if reason in ("stop", "length", "tool_calls") else "stop",
            prompt_tokens=prompt,
            completion_tokens=_count(usage.get("completion_tokens")),
            cached_tokens=_count(details.get("cached_tokens")),
            stop_sequence=stop,
        )
        self._finished.append(finished)
        return finished


def as_chunk(whole: dict[str, Any]) -> dict[str, Any]:
    """A whole chat completion as one stream chunk: each choice's message as its delta (tool
    calls numbered), its logprobs and finish reason, and the usage."""
    choices = []
    for i, choice in enumerate(whole.get("choices") or []):
        if not isinstance(choice, dict):
            continue
        message = dict(choice.get("message") or {})
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            message["tool_calls"] = [
                {**c, "index": n} for n, c in enumerate(calls) if isinstance(c, dict)
            ]
        entry = {**choice, "index": choice.get("index", i), "delta": message}
        entry.pop("message", None)
        choices.append(entry)
    return {"choices": choices, "usage": whole.get("usage")}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def split_delta(
    delta: dict[str, Any], logprobs: dict[str, Any] | None
) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """An upstream chunk's delta as the pipeline's deltas: exactly one of `reasoning_content`
    (vLLM's newer `reasoning` too), `content` or a one-entry `tool_calls` each; the chunk's
    logprobs ride on the first. A chunk with logprobs but no text keeps them on an empty
    content delta, as the local pipeline does."""
    out: list[dict[str, Any]] = []
    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        out.append({"reasoning_content": reasoning})
    content = delta.get("content")
    if isinstance(content, str) and content:
        out.append({"content": content})
    for call in delta.get("tool_calls") or []:
        if isinstance(call, dict):
            out.append({"tool_calls": [call]})
    lp = logprobs if isinstance(logprobs, dict) and logprobs.get("content") else None
    if lp is not None and not out:
        out.append({"content": ""})
    return [(d, lp if i == 0 else None) for i, d in enumerate(out)]


def _merge(message: dict[str, Any], delta: dict[str, Any]) -> None:
    """One pipeline delta into an OpenAI assistant message (tool calls by their index)."""
    if "content" in delta:
        message["content"] = (message["content"] or "") + (delta["content"] or "")
    elif "reasoning_content" in delta:
        message["reasoning_content"] = message.get("reasoning_content", "") + (
            delta["reasoning_content"] or ""
        )
    for fragment in delta.get("tool_calls") or []:
        calls = message.setdefault("tool_calls", [])
        index = fragment.get("index", len(calls))
        while len(calls) <= index:
            calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        call, fn = calls[index], fragment.get("function") or {}
        call["id"] = fragment.get("id") or call["id"]
        call["function"]["name"] += fn.get("name") or ""
        call["function"]["arguments"] += fn.get("arguments") or ""
    if message.get("tool_calls") and not message["content"]:
        message["content"] = None


def _usage(finished: list[Finished]) -> dict[str, Any]:
    if not finished:
        return {
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "total_tokens": 0,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
    first = finished[0]
    completion = first.completion_tokens  # the upstream's usage counts every choice already
    return {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens},
    }


# ---------------------------------------------------------------------- counting tokens


async def count_remote_tokens(
    gate: RemoteGate, remote: RemoteRecord, req: ChatCompletionRequest
) -> int:
    """The prompt's length in the upstream's own tokens (its template, its tokenizer): vLLM's
    and SGLang's `/tokenize` take the chat messages; llama-server renders them with
    `/apply-template`, then counts with `/tokenize`. An upstream with neither (another llmd,
    a hosted API) is a 400 saying so: llmd cannot count for a model it does not hold."""
    body = chat_body(req, remote)
    chat = {k: body[k] for k in ("messages", "tools") if k in body}
    answer = await _ask(gate, remote, "/tokenize", {"model": remote.upstream_model, **chat})
    if answer is not None and isinstance(answer.get("count"), int):
        return int(answer["count"])
    rendered = await _ask(gate, remote, "/apply-template", chat)
    if rendered is not None and isinstance(rendered.get("prompt"), str):
        tokens = await _ask(
            gate,
            remote,
            "/tokenize",
            {"content": rendered["prompt"], "add_special": True, "parse_special": True},
        )
        if tokens is not None and isinstance(tokens.get("tokens"), list):
            return len(tokens["tokens"])
    raise ApiError(
        400,
        f"'{remote.name}' is a remote model whose upstream ({remote.host}) has no /tokenize "
        "endpoint, so its tokens cannot be counted",
        param="model",
        code="remote_count_unsupported",
    )


async def _ask(
    gate: RemoteGate, remote: RemoteRecord, path: str, body: dict[str, Any]
) -> dict[str, Any] | None:
    """The upstream's JSON answer to a small request, None when it has no such endpoint or
    does not understand the body (any 4xx); 502/504 when it cannot be reached."""
    options = request_options(remote)
    slots = await gate.acquire(remote)
    try:
        async with await gate.post(remote, path, json=body, **options) as resp:
            text = await resp.text(errors="replace")
            if 400 <= resp.status < 500:
                return None
            if resp.status >= 500:
                raise upstream_error(remote, resp.status, text, resp.headers)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise transport_error(remote, exc) from exc
    finally:
        gate.release(slots)
    try:
        answer = json.loads(text)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


# A generation either protocol route reads: a local one or a remote model's.
AnyRun = ChatRun | RemoteRun
