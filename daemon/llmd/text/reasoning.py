"""Reasoning ("thinking") split from the answer: ``<think>...</think>`` -> ``reasoning_content``.

The markers come from the model family (:func:`reasoning_markers`, read from the template):
``<think>``/``</think>`` for Qwen, QwQ and DeepSeek; ``<|channel>thought`` ... ``<channel|>``
for Gemma 4, whose template has a thinking switch (``enable_thinking``) and otherwise closes
an empty thought channel in the prompt. The rules below are the same for both.

Reasoning models (Qwen3, QwQ, DeepSeek-R1 and its distills) write their chain of thought
between ``<think>`` and ``</think>`` before the answer. Two prompt styles exist:

- the model itself writes ``<think>`` first (Qwen3): the output starts with the opening tag;
- the template ends the prompt with ``<think>\\n`` (DeepSeek-R1 since 2025-01, QwQ,
  Qwen3-Thinking-2507): the output starts *inside* the reasoning and only ``</think>`` shows.
  :func:`prompt_opens_reasoning` tells from the rendered prompt; pass the answer to
  :class:`ReasoningSplitter` as ``starts_in_reasoning``.

Rules, the same streamed or not (:func:`split_reasoning` is the splitter run over one string):

- ``<think>`` counts only at the very start of the output (after whitespace): a model that
  mentions the tag later in its answer is quoting it, not thinking.
- Without any tag the whole output is content, untouched.
- Whitespace around the reasoning and right after ``</think>`` is markup, not text: it is
  stripped (templates write ``<think>\\n`` and ``</think>\\n\\n``).
- An unterminated ``<think>`` (the token budget ran out while thinking) leaves everything as
  reasoning and the content empty: the model never started its answer, and showing half a
  chain of thought as the answer would be wrong. The finish reason (``length``) says why.

Qwen's tags are ordinary (non-control) tokens, so the detokenizer shows them; Gemma 4's
``<|channel>`` and ``<channel|>`` are control tokens, which the daemon hides unless told:
:attr:`ReasoningMarkers.tokens` lists what must stay visible for the splitter to see them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from jinja2 import TemplateError, meta

from llmd.errors import bad_request
from llmd.text.chat_template import _compile, render_chat
from llmd.text.markers import split_held

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
REASONING_MARKERS = (THINK_OPEN, THINK_CLOSE)
GEMMA4_CHANNEL_OPEN, GEMMA4_CHANNEL_CLOSE = "<|channel>", "<channel|>"


@dataclass(frozen=True)
class ReasoningMarkers:
    """One family's reasoning block: `open` and `close` as text, and `tokens`, the pieces of
    them that may be single (control) tokens in the vocabulary, to keep visible and to force
    as tokens in a grammar."""

    open: str
    close: str
    tokens: tuple[str, ...]


THINK = ReasoningMarkers(THINK_OPEN, THINK_CLOSE, REASONING_MARKERS)
GEMMA4_THOUGHT = ReasoningMarkers(
    GEMMA4_CHANNEL_OPEN + "thought",
    GEMMA4_CHANNEL_CLOSE,
    (GEMMA4_CHANNEL_OPEN, GEMMA4_CHANNEL_CLOSE),
)


def reasoning_markers(chat_template: str | None) -> ReasoningMarkers:
    """The reasoning markers a template's model writes: Gemma 4's thought channel when the
    template speaks of ``<|channel>``, ``<think>`` tags otherwise."""
    if chat_template and GEMMA4_CHANNEL_OPEN in chat_template:
        return GEMMA4_THOUGHT
    return THINK


# Catalog families whose models think by default; a fallback when no template is at hand.
_REASONING_FAMILIES = ("qwen3", "qwq", "deepseek-r1", "deepseek_r1", "r1-distill")


@dataclass(frozen=True)
class ReasoningDelta:
    """What one piece of output added to each channel (either may be empty)."""

    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


_State = Literal["start", "reasoning", "content"]


class ReasoningSplitter:
    """Streaming splitter: :meth:`feed` text deltas split anywhere (even inside a tag), get
    :class:`ReasoningDelta` pieces; call :meth:`flush` once at the end for held-back text.

    Text is held back only while it could still be part of a tag (or is whitespace that the
    rules strip), so reasoning and content stream as soon as they are known.

    `keep_inline`: the client asked for the reasoning to stay in the content (no split); the
    output passes through unchanged, with ``<think>\\n`` put back in front when the prompt
    opened it, so the client still sees a balanced block.
    """

    def __init__(
        self,
        *,
        starts_in_reasoning: bool = False,
        keep_inline: bool = False,
        open_tag: str = THINK_OPEN,
        close_tag: str = THINK_CLOSE,
    ) -> None:
        self._starts_in = starts_in_reasoning
        self._inline = keep_inline
        self._open = open_tag
        self._close = close_tag
        self._state: _State = "start"
        self._buf = ""
        self._reasoning_begun = False  # leading whitespace of the reasoning is dropped
        self._reasoning_ws = ""  # trailing whitespace, held: it may precede </think>
        self._strip_content = False  # right after </think>
        self._saw_reasoning = False

    @property
    def saw_reasoning(self) -> bool:
        """Whether the output had a reasoning section (even an empty one)."""
        return self._saw_reasoning

    def feed(self, delta: str) -> ReasoningDelta:
        if self._inline:
            if self._state == "start":
                self._state = "content"
                if self._starts_in:
                    return ReasoningDelta(content=f"{self._open}\n{delta}")
            return ReasoningDelta(content=delta)
        self._buf += delta
        reasoning: list[str] = []
        content: list[str] = []
        while self._buf:
            if self._state == "start":
                if not self._leave_start():
                    break
            elif self._state == "reasoning":
                end = self._buf.find(self._close)
                if end < 0:
                    ready, self._buf = split_held(self._buf, self._close)
                    reasoning.append(self._reasoning_text(ready, final=False))
                    break
                reasoning.append(self._reasoning_text(self._buf[:end], final=True))
                self._buf = self._buf[end + len(self._close) :]
                self._state = "content"
                self._strip_content = True
            else:
                text, self._buf = self._buf, ""
                if self._strip_content:
                    text = text.lstrip()
                    self._strip_content = not text
                content.append(text)
        return ReasoningDelta("".join(reasoning), "".join(content))

    def flush(self) -> ReasoningDelta:
        """The end of the output: what was held back, and an unterminated reasoning block
        closed (it stays reasoning; see the module docstring)."""
        if self._inline:
            if self._state == "start" and self._starts_in:
                self._state = "content"
                return ReasoningDelta(content=f"{self._open}\n")
            return ReasoningDelta()
        held, self._buf = self._buf, ""
        if self._state == "start" and not self._starts_in:
            self._state = "content"
            return ReasoningDelta(content=held)  # whitespace, or a cut-off "<thi"
        if self._state in ("start", "reasoning"):
            self._saw_reasoning = True
            self._state = "content"
            return ReasoningDelta(reasoning=self._reasoning_text(held, final=True))
        return ReasoningDelta()

    def _leave_start(self) -> bool:
        """Decide whether the output opens with a reasoning block; False: need more text."""
        head = self._buf.lstrip()
        if head.startswith(self._open):
            self._buf = head[len(self._open) :]  # a repeated <think> after the prompt's own
        elif not head or self._open.startswith(head):
            return False
        if self._starts_in or head.startswith(self._open):
            self._state = "reasoning"
            self._saw_reasoning = True
        else:
            self._state = "content"  # leading whitespace of a plain answer is kept
        return True

    def _reasoning_text(self, text: str, *, final: bool) -> str:
        text = self._reasoning_ws + text
        if not self._reasoning_begun:
            text = text.lstrip()
            self._reasoning_begun = bool(text)
        body = text.rstrip()
        self._reasoning_ws = "" if final else text[len(body) :]
        return body


def split_reasoning(
    text: str, *, starts_in_reasoning: bool = False, markers: ReasoningMarkers = THINK
) -> tuple[str | None, str]:
    """A whole output as (reasoning or None when there was none or it was empty, content)."""
    splitter = ReasoningSplitter(
        starts_in_reasoning=starts_in_reasoning, open_tag=markers.open, close_tag=markers.close
    )
    first, last = splitter.feed(text), splitter.flush()
    reasoning = first.reasoning + last.reasoning
    return (reasoning or None), first.content + last.content


def prompt_opens_reasoning(prompt: str, open_tag: str = THINK_OPEN) -> bool:
    """Whether the rendered prompt leaves the model inside an open reasoning block (it ends
    with ``<think>`` and optional whitespace). Decided per request from the prompt actually
    sent, so template switches such as Qwen3's ``enable_thinking=False`` (which writes an
    empty ``<think>\\n\\n</think>`` instead) are honoured."""
    return prompt.rstrip().endswith(open_tag)


def prompt_closes_reasoning(prompt: str, close_tag: str = THINK_CLOSE) -> bool:
    """Whether the rendered prompt already closed the reasoning block (thinking switched off:
    Qwen3's ``<think>\\n\\n</think>``, Gemma 4's empty ``<|channel>thought\\n<channel|>``):
    the model answers directly, so its reasoning markers need not be shown."""
    return prompt.rstrip().endswith(close_tag)


@dataclass(frozen=True)
class ReasoningSupport:
    """What a model's template says about thinking.

    `is_reasoning_model`: the template handles reasoning blocks (or the family is known to
    think); split its output. `template_opens_think`: its generation prompt ends inside
    the block for a plain conversation (the per-request answer is
    :func:`prompt_opens_reasoning` on the real prompt). `markers`: the family's block.
    `thinking_switch`: the template reads ``enable_thinking`` (Qwen3, Gemma 4), so a
    request can turn thinking on or off."""

    is_reasoning_model: bool
    template_opens_think: bool
    markers: ReasoningMarkers = THINK
    thinking_switch: bool = False


def reasoning_support(chat_template: str | None, family: str | None = None) -> ReasoningSupport:
    """Inspect a chat template (with the catalog family as a fallback) for reasoning support.

    Reasoning templates mention the tags: they strip ``</think>`` blocks from earlier
    assistant turns, and some open ``<think>`` in the generation prompt. Whether the prompt
    opens it is found by rendering a one-message conversation with the template itself,
    which no regex over Jinja source can match."""
    fam = (family or "").lower()
    by_family = any(name in fam for name in _REASONING_FAMILIES)
    if not chat_template:
        return ReasoningSupport(by_family, False)
    markers = reasoning_markers(chat_template)
    mentions = markers.close in chat_template or markers.open in chat_template
    opens = mentions and _renders_open_think(chat_template, markers)
    switch = _reads_variable(chat_template, "enable_thinking")
    return ReasoningSupport(mentions or by_family, opens, markers, switch)


def thinking_switch(
    effort: str | None, support: ReasoningSupport, *, strict: bool = True
) -> dict[str, bool]:
    """The template variables for OpenAI's ``reasoning_effort``: ``enable_thinking`` for a
    template with that switch (Qwen3, Gemma 4, whose default is off), ``"none"`` meaning off
    and any level on (llmd cannot set how much a model thinks, only whether). Without a
    switch, a request only gets what the model does anyway; asking otherwise is a 400, unless
    the protocol sends it as a hint (`strict` False: Anthropic clients ask on every request)."""
    if effort is None:
        return {}
    on = effort != "none"
    if support.thinking_switch:
        return {"enable_thinking": on}
    if not strict:
        return {}
    if on and not support.is_reasoning_model:
        raise bad_request(
            f"reasoning_effort {effort!r}: this model does not reason", param="reasoning_effort"
        )
    if not on and support.is_reasoning_model:
        raise bad_request(
            "reasoning_effort 'none': this model's chat template has no switch to turn "
            "thinking off",
            param="reasoning_effort",
        )
    return {}


def _reads_variable(chat_template: str, name: str) -> bool:
    """Whether the template's syntax tree reads `name` (a comment mentioning it does not)."""
    try:
        env = _compile(chat_template).environment
        return name in meta.find_undeclared_variables(env.parse(chat_template))
    except TemplateError:
        return False


def _renders_open_think(chat_template: str, markers: ReasoningMarkers = THINK) -> bool:
    try:
        prompt = render_chat(
            chat_template,
            [{"role": "user", "content": "Hi"}],
            bos_token="",
            eos_token="",
            add_generation_prompt=True,
        )
    except Exception:  # a template that cannot render this probe says nothing either way
        return False
    return prompt_opens_reasoning(prompt, markers.open)
