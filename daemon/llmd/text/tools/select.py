"""Which tool-call markup a model speaks, chosen from its chat template (catalog family as a
fallback), and whether its template renders tools itself or needs llmd's fallback prompt.

Templates name their markup: Qwen/Hermes templates write ``<tool_call>``, Llama 3.1+
templates the ``ipython`` role and ``<|python_tag|>``, Mistral templates ``[TOOL_CALLS]``,
Gemma 3 templates ``<start_of_turn>``, Gemma 4 templates ``<|tool_call>``; Qwen3.5 and
Qwen3-Coder templates write ``<tool_call>`` around ``<function=...>`` XML, not JSON. A template that ignores ``tools`` (SmolLM2's ChatML,
Llama 3.0) gets llmd's fallback: a Hermes-style system block and ``<tool_call>`` parsing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llmd.text.tools.calls import ToolCall
from llmd.text.tools.parsers import (
    Gemma4Parser,
    GemmaParser,
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    ToolCallParser,
)
from llmd.text.tools.prompt import template_handles_tools, template_renders_tool_role
from llmd.text.tools.qwen_xml import XML_FUNCTION, XML_PARAMETER, QwenXmlParser

# markup family -> its parser; and the markers that must stay visible in the detokenized text
_PARSERS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesParser,
    "llama3": Llama3JsonParser,
    "mistral": MistralParser,
    "mistral_v11": MistralParser,
    "gemma": GemmaParser,
    "gemma4": Gemma4Parser,
    "qwen_xml": QwenXmlParser,
}
# Families whose call text carries no JSON types: their parsers type values by the schemas.
_TYPED_BY_SCHEMA = frozenset({"qwen_xml"})
_VISIBLE: dict[str, tuple[str, ...]] = {
    "hermes": ("<tool_call>", "</tool_call>"),
    "llama3": ("<|python_tag|>",),
    "mistral": ("[TOOL_CALLS]",),
    "mistral_v11": ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
    "gemma": (),
    "gemma4": ("<|tool_call>", "<tool_call|>", '<|"|>'),
    "qwen_xml": ("<tool_call>", "</tool_call>"),
}
# Catalog families (lowercased, matched as prefixes) -> markup family.
_BY_CATALOG_FAMILY = (
    ("qwen", "hermes"),
    ("hermes", "hermes"),
    ("smollm", "hermes"),
    ("llama", "llama3"),
    ("mistral", "mistral"),
    ("mixtral", "mistral"),
    ("gemma4", "gemma4"),
    ("gemma", "gemma"),
)
FALLBACK_FAMILY = "hermes"


@dataclass(frozen=True)
class ToolParserFactory:
    """Makes a fresh parser per response for one markup family.

    `family`: hermes, llama3, mistral (JSON-list form), mistral_v11 (``name[ARGS]{...}``
    form), gemma, gemma4 or qwen_xml (``<function=...>`` XML in ``<tool_call>``); the
    grammar and prompt helpers take it too. `visible_tokens`: markers that are control
    tokens in some vocabularies (``[TOOL_CALLS]``, ``<|python_tag|>``); the detokenizer must
    not hide them while tools are on, or the parser never sees the call."""

    family: str

    @property
    def visible_tokens(self) -> tuple[str, ...]:
        return _VISIBLE[self.family]

    def __call__(
        self,
        function_names: Iterable[str] | None = None,
        *,
        parallel: bool = True,
        schemas: Mapping[str, Mapping[str, Any]] | None = None,
        stream: bool = False,
    ) -> ToolCallParser:
        """`schemas` (function name -> parameters schema) types the values of markups that
        write them as bare text (qwen_xml); JSON markups ignore it. `stream`: calls are
        grammar-constrained, so their arguments may stream as generated (see parsers.py)."""
        if self.family in _TYPED_BY_SCHEMA:
            return QwenXmlParser(function_names, parallel=parallel, stream=stream, schemas=schemas)
        return _PARSERS[self.family](function_names, parallel=parallel, stream=stream)

    def parse(
        self,
        text: str,
        function_names: Iterable[str] | None = None,
        *,
        parallel: bool = True,
        schemas: Mapping[str, Mapping[str, Any]] | None = None,
        stream: bool = False,
        cut: bool = False,
    ) -> tuple[str | None, list[ToolCall]]:
        """Non-streaming: a whole output as (content or None, calls)."""
        parser = self(function_names, parallel=parallel, schemas=schemas, stream=stream)
        return parser.parse(text, cut=cut)


def family_from_template(chat_template: str | None) -> str | None:
    """The markup a template's own text names, or None."""
    if not chat_template:
        return None
    if XML_FUNCTION in chat_template and XML_PARAMETER in chat_template:
        return "qwen_xml"  # checked first: these templates write <tool_call> too
    if "<tool_call>" in chat_template:
        return "hermes"
    if "[TOOL_CALLS]" in chat_template:
        return "mistral_v11" if "[ARGS]" in chat_template else "mistral"
    if "<|python_tag|>" in chat_template or "ipython" in chat_template:
        return "llama3"
    if "<|tool_call>" in chat_template:
        return "gemma4"
    if "<start_of_turn>" in chat_template:
        return "gemma"
    return None


def family_from_catalog(family: str | None) -> str | None:
    name = (family or "").lower()
    for prefix, markup in _BY_CATALOG_FAMILY:
        if name.startswith(prefix):
            return markup
    return None


def parser_for(chat_template: str | None, family: str | None) -> ToolParserFactory:
    """The parser for a model's tool calls: by the markers in its template, with the catalog
    family as a fallback when the template renders tools in a markup it does not name. A
    template that ignores ``tools`` (or no template) means llmd prompts the tools itself, in
    Hermes markup (Gemma: its own convention), so that is what gets parsed. Never None:
    every model can be served tools through the fallback. Same as ``plan_tools(...).parser``.
    """
    return plan_tools(chat_template, family).parser


@dataclass(frozen=True)
class ToolPlan:
    """How to serve tools for one model.

    `template_renders_tools`: pass ``tools=`` (and :func:`~.prompt.template_messages`) to the
    model's own template. Otherwise render :func:`~.prompt.fallback_messages` (the tools
    prompt and tool turns written out as text in `parser.family`'s convention). The parser
    always matches the markup the prompt asked for."""

    parser: ToolParserFactory
    template_renders_tools: bool
    tool_role: bool = False  # the fallback writes tool results as `tool` turns (prompt.py)

    @property
    def family(self) -> str:
        return self.parser.family


def plan_tools(chat_template: str | None, family: str | None) -> ToolPlan:
    """The template's own tool support when it has one in a known markup; llmd's fallback
    otherwise (no template, a template that ignores ``tools``, or one whose markup llmd
    cannot parse)."""
    named = family_from_template(chat_template)
    if chat_template and template_handles_tools(chat_template):
        markup = named or family_from_catalog(family)
        if markup is not None:
            return ToolPlan(ToolParserFactory(markup), True)
    if named is None and not chat_template:
        named = family_from_catalog(family)
    # Gemma 3's template ignores tools; it gets the Gemma prompt convention, not Hermes.
    fallback = "gemma" if named == "gemma" else FALLBACK_FAMILY
    tool_role = bool(chat_template) and template_renders_tool_role(chat_template)
    return ToolPlan(ToolParserFactory(fallback), False, tool_role)
