"""A chat answer's text -> OpenAI's message fields: reasoning (`<think>`, Gemma 4's thought
channel) split into `reasoning_content` (reasoning.py) and tool-call markup into
`tool_calls` (tools/), streamed as deltas or parsed whole. Order: stop strings (generation.py), then reasoning, then tools, so
markup inside the thinking is never taken for a call."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmd.text.reasoning import THINK, ReasoningMarkers, ReasoningSplitter, split_reasoning
from llmd.text.tools import ToolCallParser, ToolParserFactory, openai_delta, tool_finish_reason


@dataclass(frozen=True)
class ChatOutputPlan:
    """What one request's answers need: reasoning split (for reasoning models, unless the
    client keeps it inline) and a tool parser (when tools are offered). `reasoning_markers`:
    the model family's reasoning block; `schemas`: each function's parameters schema, for
    markups whose values carry no JSON types (Qwen3.5's XML calls); `stream_arguments`: a
    grammar constrains the calls (``auto``'s lazy grammar or a forced call), so their
    arguments stream as they are generated instead of at each call's end."""

    split_reasoning: bool = False
    starts_in_reasoning: bool = False
    keep_inline: bool = False
    tools: ToolParserFactory | None = None
    function_names: tuple[str, ...] = ()
    parallel: bool = True
    reasoning_markers: ReasoningMarkers = THINK
    schemas: Mapping[str, Any] | None = None
    stream_arguments: bool = False

    def stream(self) -> ChatStream:
        return ChatStream(self)

    def whole(self, text: str, engine_reason: str) -> tuple[dict[str, Any], str]:
        """The message fields and finish reason of a complete answer."""
        message: dict[str, Any] = {"role": "assistant"}
        content: str | None = text
        if self.split_reasoning and not self.keep_inline:
            reasoning, content = split_reasoning(
                text, starts_in_reasoning=self.starts_in_reasoning, markers=self.reasoning_markers
            )
            if reasoning is not None:
                message["reasoning_content"] = reasoning
        elif self.split_reasoning and self.starts_in_reasoning:
            content = self.reasoning_markers.open + "\n" + text
        calls = []
        incomplete = False
        if self.tools is not None:
            parser = self.parser()
            content, calls = parser.parse(content or "", cut=engine_reason == "length")
            incomplete = parser.incomplete
        message["content"] = content
        message["refusal"] = None
        if calls:
            message["tool_calls"] = [c.to_openai() for c in calls]
        return message, tool_finish_reason(engine_reason, len(calls), incomplete)

    def parser(self) -> ToolCallParser:
        """A fresh tool-call parser for one answer (`tools` must be set)."""
        assert self.tools is not None
        return self.tools(
            list(self.function_names),
            parallel=self.parallel,
            schemas=self.schemas,
            stream=self.stream_arguments,
        )


@dataclass
class ChatStream:
    """One streamed choice: text deltas in, OpenAI `delta` objects out."""

    plan: ChatOutputPlan
    _splitter: ReasoningSplitter | None = field(init=False, default=None)
    _parser: ToolCallParser | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.plan.split_reasoning:
            self._splitter = ReasoningSplitter(
                starts_in_reasoning=self.plan.starts_in_reasoning,
                keep_inline=self.plan.keep_inline,
                open_tag=self.plan.reasoning_markers.open,
                close_tag=self.plan.reasoning_markers.close,
            )
        if self.plan.tools is not None:
            self._parser = self.plan.parser()

    def feed(self, text: str) -> list[dict[str, Any]]:
        if self._splitter is None:
            return self._content(text)
        part = self._splitter.feed(text)
        out = [{"reasoning_content": part.reasoning}] if part.reasoning else []
        return out + self._content(part.content)

    def finish(self, engine_reason: str) -> tuple[list[dict[str, Any]], str]:
        """Held-back text, then the choice's finish reason."""
        out: list[dict[str, Any]] = []
        if self._splitter is not None:
            part = self._splitter.flush()
            if part.reasoning:
                out.append({"reasoning_content": part.reasoning})
            out += self._content(part.content)
        calls, incomplete = 0, False
        if self._parser is not None:
            out += [openai_delta(e) for e in self._parser.flush(cut=engine_reason == "length")]
            calls, incomplete = len(self._parser.calls), self._parser.incomplete
        return out, tool_finish_reason(engine_reason, calls, incomplete)

    def _content(self, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        if self._parser is None:
            return [{"content": text}]
        return [openai_delta(e) for e in self._parser.feed(text)]
