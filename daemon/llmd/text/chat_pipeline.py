"""The one generation pipeline every protocol translates into (OpenAI Chat Completions and
Completions, Anthropic Messages, OpenAI Responses, Ollama's API).

Decision: the internal request is the validated OpenAI Chat Completions request
(`ChatCompletionRequest`: it already names every feature llmd implements: sampling, tools,
structured output, sessions, keep-alive), and the internal events are OpenAI's chat `delta`
objects per choice (`content`, `reasoning_content`, `tool_calls` fragments with stable ids)
plus one end event per choice with the engine's counts. A protocol module holds only its
schemas and the mapping to and from these; validation, templating, tool and reasoning
parsing, stop handling, cancellation and sessions live here and below, once.

Life of a run: `start_chat` (or `start_text` for a raw prompt) checks and renders everything
that can fail with a 400 before anything runs; `accepted()` waits until the worker has the
request (a 429 or 503 arrives here, before any byte of a stream); then either `events()`
(streaming) or `result()` (whole). Closing the run (or the `events()` iterator) cancels its
requests in the worker. With `n > 1`, the other choices start from choice 0's prefill (the
engine copies its KV and last logits), so the prompt is prefilled once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from llmd.errors import ApiError, bad_request, server_error
from llmd.runtime import protocol as p
from llmd.runtime.sessions import SESSION_ID, Session, SessionTable
from llmd.runtime.speculative import usage_extension
from llmd.runtime.supervisor import ModelSupervisor
from llmd.runtime.worker_client import ACCEPTED, Accepted
from llmd.text.chat_output import ChatOutputPlan, ChatStream
from llmd.text.chat_template import fold_inner_system_messages, render_chat
from llmd.text.generation import (
    ContextOverflow,
    Delta,
    Finished,
    Started,
    generate_text,
    require_generation,
    token_budget,
)
from llmd.text.image_inputs import expand_prompt, image_inputs
from llmd.text.images import VISION_FEATURE, ChatImage, ImagePolicy, load_images
from llmd.text.openai_schemas import ChatCompletionRequest, SamplingFields, image_refs
from llmd.text.reasoning import (
    ReasoningSupport,
    prompt_closes_reasoning,
    prompt_opens_reasoning,
    reasoning_support,
    thinking_switch,
)
from llmd.text.structured import response_format_grammar
from llmd.text.text_model import TextModel
from llmd.text.tools import (
    ToolPlan,
    ToolSpecError,
    fallback_messages,
    function_specs,
    grammar_error,
    lazy_tool_call_grammar,
    marker_token_ids,
    plan_tools,
    resolve_tool_choice,
    template_messages,
    tool_call_grammar,
)

Piece = tuple[int, Started | Delta | Finished]
# make(index, prefill_of): choice `index`'s generation, starting from request `prefill_of`'s
# prefill when that is not empty.
MakeChoice = Callable[[int, str], AsyncIterator[Accepted | Started | Delta | Finished]]


# ---------------------------------------------------------------------- events


@dataclass
class ChoiceStarted:
    """Choice `index` was admitted: `cached_tokens` of its `prompt_tokens` are reused from
    the prefix cache. Only from `ChatRun.events(started=True)`."""

    index: int
    prompt_tokens: int
    cached_tokens: int


@dataclass
class ChoiceDelta:
    """Part of choice `index`'s answer: one OpenAI chat `delta` (exactly one of `content`,
    `reasoning_content` or a one-entry `tool_calls` list), and the OpenAI `logprobs` object of
    the tokens behind it when the request asked for them."""

    index: int
    delta: dict[str, Any]
    logprobs: dict[str, Any] | None = None


@dataclass
class ChoiceEnd:
    """Choice `index` is complete: its finish reason (`stop`, `length`, `tool_calls`) and the
    engine's counts."""

    index: int
    finish_reason: str
    finished: Finished


ChatEvent = ChoiceStarted | ChoiceDelta | ChoiceEnd


@dataclass
class ChatChoice:
    """One whole answer: an OpenAI assistant message (`content`, `reasoning_content`,
    `tool_calls` with `function.arguments` as a JSON string), its finish reason and logprobs."""

    message: dict[str, Any]
    finish_reason: str
    logprobs: dict[str, Any] | None = None


@dataclass
class ChatResult:
    choices: list[ChatChoice]
    usage: dict[str, Any]


def usage_of(finished: list[Finished]) -> dict[str, Any]:
    """OpenAI's usage object; the prompt counts once however many choices shared it (as
    OpenAI bills it)."""
    first = finished[0]
    completion = sum(f.completion_tokens for f in finished)
    usage: dict[str, Any] = {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens},
    }
    drafts = [f.speculative for f in finished if f.speculative is not None]
    if drafts:  # llmd extension: what speculative decoding drafted and kept, all choices
        usage["speculative"] = usage_extension(sum(d for d, _ in drafts), sum(a for _, a in drafts))
    return usage


# ---------------------------------------------------------------------- choices


def sampling_params(req: SamplingFields, index: int, top_logprobs: int) -> p.SamplingParams:
    """Choice `index` of a seeded request uses seed + index: choices differ, runs repeat."""
    seed = None if req.seed is None else (req.seed + index) % 2**64
    return p.SamplingParams(
        temperature=req.temperature,
        top_k=req.top_k,
        top_p=req.top_p,
        min_p=req.min_p,
        seed=seed,
        frequency_penalty=req.frequency_penalty,
        presence_penalty=req.presence_penalty,
        repetition_penalty=1.0 if req.repeat_last_n == 0 else req.repetition_penalty,
        repetition_window=max(0, req.repeat_last_n),
        logit_bias=req.logit_bias_ids(),
        top_logprobs=top_logprobs,
    )


def check_logit_bias(req: SamplingFields, model: ModelSupervisor) -> None:
    assert model.worker is not None and model.worker.ready is not None
    vocab = model.worker.ready.model.vocab_size
    for token in req.logit_bias_ids():
        if token >= vocab:
            raise bad_request(
                f"logit_bias names token {token}, outside this model's vocabulary of {vocab}",
                param="logit_bias",
            )


_END = object()


async def run_choices(
    make: MakeChoice, n: int, *, started: bool = False
) -> AsyncIterator[Accepted | Piece]:
    """ACCEPTED once choice 0's request is in the worker, then (index, piece) of every
    choice as they come (Started pieces only with `started`). Raises the first choice error.
    Closing it cancels every choice.

    Choices 1..n-1 are submitted once choice 0 is accepted, naming it in `prefill_of`: the
    engine starts them from choice 0's prefilled KV and last logits, so the prompt is
    prefilled once (engine stat `forked_sequences`)."""
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    tasks: list[asyncio.Task[None]] = []

    async def pump(index: int, prefill_of: str) -> None:
        pieces = None
        try:
            pieces = make(index, prefill_of)
            async for piece in pieces:
                queue.put_nowait((index, piece))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            queue.put_nowait((index, exc))
        finally:
            if pieces is not None:
                await pieces.aclose()  # type: ignore[attr-defined]
            queue.put_nowait((index, _END))

    tasks.append(asyncio.create_task(pump(0, "")))
    ended = 0
    try:
        while ended < len(tasks):
            index, piece = await queue.get()
            if piece is _END:
                ended += 1
                continue
            if isinstance(piece, Exception):
                raise piece
            if isinstance(piece, Accepted):
                if index == 0:
                    tasks.extend(
                        asyncio.create_task(pump(i, piece.request_id)) for i in range(1, n)
                    )
                    yield ACCEPTED
                continue
            if isinstance(piece, Started) and not started:
                continue
            yield index, piece
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


SESSION_HEADER = "X-Llmd-Session-Id"


@dataclass(frozen=True)
class RequestContext:
    """What a generation needs from the HTTP request and the daemon around it, so the pipeline
    never reads HTTP itself (``api/http_common.pipeline_context`` builds one per request):
    llmd's session header, the daemon's session table, `--default-max-tokens` and what images
    may do (`--allow-remote-images`)."""

    sessions: SessionTable
    session_header: str | None = None
    default_max_tokens: int | None = None
    images: ImagePolicy = field(default_factory=ImagePolicy)


def request_session_id(ctx: RequestContext, req: SamplingFields) -> str:
    """The request's named session: `session_id` in the body or llmd's own header (other
    tools' `X-Session-Id` headers are theirs: see sessions.py)."""
    sid = req.session_id or ctx.session_header or ""
    if sid and not SESSION_ID.match(sid):
        raise bad_request(
            f"{SESSION_HEADER} must be 1-128 letters, digits or ._:@-", param="session_id"
        )
    return sid


def choice_maker(
    ctx: RequestContext,
    req: SamplingFields,
    model: ModelSupervisor,
    prompt: list[int],
    max_tokens: int,
    top_logprobs: int,
    grammar: str | None = None,
    show_tokens: frozenset[int] = frozenset(),
    images: list[p.ImageInput] | None = None,
) -> MakeChoice:
    """Choice i's generation; choice 0 runs in the request's named session, whose KV then
    stays pinned in the worker. `grammar`: a forced tool call's (else the response_format's,
    if any). The session is opened when choice 0 starts, so nothing can fail between opening
    and the generation that closes it."""
    grammar = grammar or response_format_grammar(req.response_format)
    sid = request_session_id(ctx, req)
    table = ctx.sessions

    def make(index: int, prefill_of: str) -> AsyncIterator[Accepted | Started | Delta | Finished]:
        session = None
        if index == 0 and sid:
            session = table.begin(sid, req.model, model, req.session_ttl)
        pieces = generate_text(
            model,
            prompt,
            max_tokens=max_tokens,
            sampling=sampling_params(req, index, top_logprobs),
            stops=req.stop_list(),
            session=session.id if session else "",
            grammar=grammar,
            show_tokens=show_tokens,
            prefill_of=prefill_of,
            speculative=req.speculative,
            images=images,
        )
        return pieces if session is None else _in_session(pieces, table, session)

    return make


async def _in_session(
    pieces: AsyncIterator[Accepted | Started | Delta | Finished],
    table: SessionTable,
    session: Session,
) -> AsyncIterator[Accepted | Started | Delta | Finished]:
    try:
        async for piece in pieces:
            yield piece
    finally:
        await pieces.aclose()  # type: ignore[attr-defined]
        await table.end(session)


async def wait_accepted(pieces: AsyncIterator[Accepted | Piece]) -> None:
    """Consumes run_choices' first item, ACCEPTED: errors before it are plain HTTP errors."""
    if not isinstance(await anext(pieces), Accepted):
        raise RuntimeError("generation did not start with ACCEPTED")


@dataclass
class Collected:
    """One choice, gathered for a non-streaming answer."""

    text: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[p.TokenLogprob] = field(default_factory=list)
    finished: Finished | None = None


async def collect(pieces: AsyncIterator[Accepted | Piece], n: int) -> list[Collected]:
    out = [Collected() for _ in range(n)]
    try:
        async for item in pieces:
            if isinstance(item, Accepted):
                continue
            index, piece = item
            if isinstance(piece, Finished):
                out[index].finished = piece
            elif isinstance(piece, Delta):
                out[index].text.append(piece.text)
                out[index].tokens += piece.tokens
                out[index].logprobs += piece.logprobs
    finally:
        await pieces.aclose()  # type: ignore[attr-defined]  # client gone: cancel in worker
    return out


# ---------------------------------------------------------------------- the chat prompt


@lru_cache(maxsize=32)
def _template_plans(template: str) -> tuple[ToolPlan, ReasoningSupport]:
    """How a template's model speaks tools and whether it thinks: read once per template."""
    return plan_tools(template, None), reasoning_support(template, None)


def _render(
    template: str, messages: list[dict[str, Any]], bos: str, eos: str, extra: dict[str, Any]
) -> str:
    """The chat template's prompt; a template that refuses system messages past the first
    turn (which agents send) gets them folded into user turns instead of a 400."""
    try:
        return render_chat(template, messages, bos_token=bos, eos_token=eos, **extra)
    except ApiError:
        folded = fold_inner_system_messages(messages)
        if folded is None:
            raise
        return render_chat(template, folded, bos_token=bos, eos_token=eos, **extra)


def refuse_unfittable(text: TextModel, prompt: str, context_length: int, param: str) -> None:
    """ContextOverflow, before tokenizing, for a prompt too long to fit whatever it holds."""
    if (fewest := text.fewest_tokens(prompt)) >= context_length:
        raise ContextOverflow(fewest, context_length, param, at_least=True)


@dataclass
class ChatPrompt:
    ids: list[int]
    output: ChatOutputPlan
    grammar: str | None
    show_tokens: frozenset[int]
    # The conversation's images in prompt order, decoded (images.py), for the model's vision
    # encoder; the template placed one image marker per image in `ids`.
    images: list[ChatImage] = field(default_factory=list)


def model_sees_images(model: ModelSupervisor) -> bool:
    ready = model.worker.ready if model.worker is not None else None
    return ready is not None and VISION_FEATURE in ready.features


async def request_images(
    ctx: RequestContext, req: ChatCompletionRequest, model: ModelSupervisor
) -> list[ChatImage]:
    """The request's images, decoded; a 400 naming the part for a bad one, and a 400 saying
    the model cannot see for any image sent to a text-only model (never dropped)."""
    return await load_images(
        image_refs(req.messages), ctx.images, model_sees_images(model), req.model
    )


def chat_prompt(
    req: ChatCompletionRequest, model: ModelSupervisor, images: list[ChatImage] | None = None
) -> ChatPrompt:
    """Render the conversation (with tools, natively or through llmd's fallback prompt),
    and decide how the answer is parsed and what, if anything, constrains it. `images`: the
    request's decoded images (request_images), which travel with the prompt."""
    if images is None and image_refs(req.messages):
        raise RuntimeError("a conversation with images needs them decoded (request_images)")
    text = model.text
    template = text.chat_template
    assert template is not None
    plan, thinking = _template_plans(template)
    messages = [m.for_template() for m in req.messages]
    try:
        specs = function_specs(req.tools)
        choice = resolve_tool_choice(req.tool_choice, specs)
    except ToolSpecError as exc:
        raise bad_request(str(exc), param=exc.param) from exc
    offer_tools = bool(specs) and choice.mode != "none"
    has_tool_turns = any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    extra: dict[str, Any] = {}
    if (offer_tools or has_tool_turns) and plan.template_renders_tools:
        messages = template_messages(messages)
        if offer_tools:
            extra["tools"] = req.tools
    elif offer_tools or has_tool_turns:
        messages = fallback_messages(
            messages, req.tools if offer_tools else None, plan.family, tool_role=plan.tool_role
        )
    extra.update(thinking_switch(req.reasoning_effort, thinking, strict=not req.reasoning_is_hint))
    rendered = _render(template, messages, text.bos_token, text.eos_token, extra)
    if images:
        if text.image_config is None:  # the worker sees, but the daemon cannot lay images out
            raise server_error(
                f"model '{req.model}' has a vision tower but no image settings llmd can read",
                code="model_cannot_see",
            )
        try:
            rendered = expand_prompt(rendered, images, text.image_config)
        except ValueError as exc:  # an image the processor refuses (Qwen's aspect ratio > 200)
            raise bad_request(str(exc), param="messages") from exc
    refuse_unfittable(text, rendered, model.context_length, "messages")
    ids = text.encode_rendered_chat(rendered)
    markers = thinking.markers
    starts_in = thinking.is_reasoning_model and prompt_opens_reasoning(rendered, markers.open)
    # Thinking switched off in the prompt (an empty block closed there): no block will come.
    thinks = thinking.is_reasoning_model and not prompt_closes_reasoning(rendered, markers.close)
    parallel = req.parallel_tool_calls is not False
    grammar = None
    free_format = req.response_format is None or req.response_format.type == "text"
    if offer_tools and choice.forces_call and not free_format:
        raise bad_request(
            "a forced tool call and response_format cannot both constrain the answer",
            param="tool_choice",
        )
    if offer_tools and free_format:
        special = marker_token_ids(
            plan.parser, text.tokenizer.token_to_id, text.special_ids, markers.tokens
        )
        markup: dict[str, Any] = {
            "special_tokens": special,
            "reasoning": ("open" if starts_in else "optional") if thinks else None,
            "reasoning_markers": (markers.open, markers.close),
        }
        if choice.forces_call:
            grammar = tool_call_grammar(specs, choice, plan.parser, parallel, **markup)
            if grammar is not None and (error := grammar_error(grammar)):
                raise bad_request(f"the tools cannot be enforced: {error}", param="tools")
        else:  # auto: once the model opens a call, the rest of it is held to the schema
            grammar = lazy_tool_call_grammar(specs, plan.parser, parallel, **markup)
            if grammar_error(grammar):  # a schema llguidance refuses: calls checked, not held
                grammar = None
    shown = (plan.parser.visible_tokens if offer_tools else ()) + (markers.tokens if thinks else ())
    show: set[int] = set()
    for marker in shown:  # control tokens that are markup the splitter or parser reads
        token = text.tokenizer.token_to_id(marker)
        if token is not None:
            show.add(token)
    names = tuple(s.name for s in specs) if choice.function is None else (choice.function,)
    output = ChatOutputPlan(
        split_reasoning=thinking.is_reasoning_model,
        starts_in_reasoning=starts_in,
        keep_inline=req.reasoning_format == "none",
        tools=plan.parser if offer_tools else None,
        function_names=names,
        parallel=parallel,
        reasoning_markers=markers,
        schemas={s.name: s.parameters for s in specs},
        stream_arguments=grammar is not None,
    )
    return ChatPrompt(ids, output, grammar, frozenset(show), list(images or []))


# ---------------------------------------------------------------------- runs


class ChatRun:
    """A started generation of `n` choices, read either as events or as a whole result."""

    def __init__(
        self,
        pieces: AsyncIterator[Accepted | Piece],
        output: ChatOutputPlan,
        n: int,
        prompt_tokens: int,
        chat_logprobs: Callable[[list[int], list[p.TokenLogprob]], dict[str, Any] | None],
    ) -> None:
        self._pieces = pieces
        self.output = output
        self.n = n
        self.prompt_tokens = prompt_tokens
        self._logprobs = chat_logprobs
        self._accepted = False

    async def accepted(self) -> None:
        """Returns once the worker has the request; raises ApiError (429 queue full, 503 no
        worker, ...) before that. Call it before a stream's first byte."""
        if self._accepted:
            return
        await wait_accepted(self._pieces)
        self._accepted = True

    async def events(self, *, started: bool = False) -> AsyncIterator[ChatEvent]:
        """Every choice's deltas and its end, in the order they are produced; with `started`,
        each choice's ChoiceStarted first (its prefix-cache split, once admitted). Raises
        ApiError for a failure mid-generation. Closing it cancels the run."""
        await self.accepted()
        streams: list[ChatStream] = [self.output.stream() for _ in range(self.n)]
        try:
            async for item in self._pieces:
                assert not isinstance(item, Accepted)
                index, piece = item
                if isinstance(piece, Started):
                    if started:
                        yield ChoiceStarted(index, piece.prompt_tokens, piece.cached_tokens)
                    continue
                if isinstance(piece, Finished):
                    deltas, reason = streams[index].finish(piece.finish_reason)
                    for delta in deltas:
                        yield ChoiceDelta(index, delta)
                    yield ChoiceEnd(index, reason, piece)
                    continue
                deltas = streams[index].feed(piece.text)
                lp = self._logprobs(piece.tokens, piece.logprobs)
                if lp is not None and not deltas:
                    deltas = [{"content": ""}]
                for i, delta in enumerate(deltas):
                    yield ChoiceDelta(index, delta, lp if i == 0 else None)
        finally:
            await self.aclose()

    async def result(self) -> ChatResult:
        """The whole answer of every choice, parsed (reasoning, tool calls) and with usage."""
        collected = await collect(self._pieces, self.n)
        choices = []
        for c in collected:
            message, reason = self.output.whole(
                "".join(c.text), c.finished.finish_reason if c.finished else "stop"
            )
            choices.append(ChatChoice(message, reason, self._logprobs(c.tokens, c.logprobs)))
        finished = [c.finished for c in collected if c.finished is not None]
        return ChatResult(choices, usage_of(finished))

    async def aclose(self) -> None:
        await self._pieces.aclose()  # type: ignore[attr-defined]


def _logprobs_formatter(
    model: ModelSupervisor, top_logprobs: int
) -> Callable[[list[int], list[p.TokenLogprob]], dict[str, Any] | None]:
    texts = model.text.token_texts

    def chat_logprobs(tokens: list[int], lps: list[p.TokenLogprob]) -> dict[str, Any] | None:
        if top_logprobs < 0:
            return None
        return {
            "content": [texts.chat_entry(t, lp) for t, lp in zip(tokens, lps, strict=True)],
            "refusal": None,
        }

    return chat_logprobs


async def start_chat(
    ctx: RequestContext,
    req: ChatCompletionRequest,
    model: ModelSupervisor,
    grammar: str | None = None,
) -> ChatRun:
    """Check, render and start a chat request (400s are raised here, before anything runs).
    `ctx` supplies the session header, the session table and the default limit. `grammar`: one the
    caller's protocol enforces on the whole answer instead of any tool-call grammar (the
    Responses API's forced custom tool: the answer is that tool's raw input)."""
    require_generation(model)
    if not model.text.chat_template:
        raise bad_request(
            f"model '{req.model}' has no chat template; use /v1/completions", param="model"
        )
    check_logit_bias(req, model)
    images = await request_images(ctx, req, model)
    # Off the event loop: a long prompt must not stall other clients' streams.
    chat = await asyncio.to_thread(chat_prompt, req, model, images)
    inputs = None
    if chat.images and model.text.image_config is not None:
        inputs = await asyncio.to_thread(image_inputs, chat.images, model.text.image_config)
    requested = req.token_limit() or ctx.default_max_tokens
    max_tokens = token_budget(
        len(chat.ids), requested, model.context_length, prompt_param="messages"
    )
    top_logprobs = req.engine_logprobs()
    make = choice_maker(
        ctx,
        req,
        model,
        chat.ids,
        max_tokens,
        top_logprobs,
        grammar or chat.grammar,
        chat.show_tokens,
        images=inputs,
    )
    pieces = run_choices(make, req.n, started=True)
    return ChatRun(
        pieces, chat.output, req.n, len(chat.ids), _logprobs_formatter(model, top_logprobs)
    )


async def encode_prompt(
    req: SamplingFields,
    model: ModelSupervisor,
    prompt_text: str | list[int],
    prompt_param: str = "prompt",
) -> tuple[list[int], int]:
    """A raw prompt's token ids (text encoded off the event loop; ids checked against the
    vocabulary and used as given) and its max_tokens, after the checks that answer 400 (empty
    prompt, unknown token ids, logit_bias, context window)."""
    if isinstance(prompt_text, list):
        prompt = prompt_text
        vocab = model.text.tokenizer.get_vocab_size(with_added_tokens=True)
        if (bad := next((t for t in prompt if not 0 <= t < vocab), None)) is not None:
            raise bad_request(
                f"the prompt holds token id {bad}, outside this model's vocabulary of {vocab}",
                param=prompt_param,
            )
    else:
        refuse_unfittable(model.text, prompt_text, model.context_length, prompt_param)
        prompt = await asyncio.to_thread(model.text.encode, prompt_text)
    if not prompt:
        raise bad_request("the prompt is empty", param=prompt_param)
    check_logit_bias(req, model)
    max_tokens = token_budget(
        len(prompt), req.max_tokens, model.context_length, prompt_param=prompt_param
    )
    return prompt, max_tokens


async def start_text(
    ctx: RequestContext,
    req: SamplingFields,
    model: ModelSupervisor,
    prompt_text: str,
    *,
    prompt_param: str = "prompt",
    output: ChatOutputPlan | None = None,
) -> ChatRun:
    """A raw prompt (no chat template) continued as plain text: its events carry `content`
    deltas only. For protocols with a raw mode (Ollama's `/api/generate` with `raw`)."""
    prompt, max_tokens = await encode_prompt(req, model, prompt_text, prompt_param)
    make = choice_maker(ctx, req, model, prompt, max_tokens, -1)
    return ChatRun(
        run_choices(make, req.n, started=True),
        output or ChatOutputPlan(),
        req.n,
        len(prompt),
        _logprobs_formatter(model, -1),
    )
