"""Tool calling for the OpenAI-compatible API: which markup a model speaks, prompts for
templates that know no tools, streaming parsers, and grammars that enforce a forced choice.

The server's path: :func:`plan_tools` once per model; per request :func:`function_specs` and
:func:`resolve_tool_choice`; the prompt from :func:`template_messages` (template renders
tools) or :func:`fallback_messages`; :func:`tool_call_grammar` when a call is forced, :func:`lazy_tool_call_grammar` when the
model may call (``auto``); a
parser from ``plan.parser(names, parallel=...)`` fed the content text; and
:func:`tool_finish_reason` at the end.
"""

from llmd.text.tools.calls import (
    ContentDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
    ToolEvent,
    new_call_id,
    openai_delta,
    tool_finish_reason,
)
from llmd.text.tools.grammar import (
    grammar_error,
    lazy_tool_call_grammar,
    marker_token_ids,
    tool_call_grammar,
)
from llmd.text.tools.parsers import (
    Gemma4Parser,
    GemmaParser,
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    ToolCallParser,
)
from llmd.text.tools.prompt import (
    fallback_messages,
    template_handles_tools,
    template_messages,
    template_renders_tool_role,
    tools_system_prompt,
)
from llmd.text.tools.select import ToolParserFactory, ToolPlan, parser_for, plan_tools
from llmd.text.tools.specs import (
    FunctionSpec,
    ToolChoice,
    ToolSpecError,
    function_specs,
    resolve_tool_choice,
)

__all__ = [
    "ContentDelta",
    "FunctionSpec",
    "Gemma4Parser",
    "GemmaParser",
    "HermesParser",
    "Llama3JsonParser",
    "MistralParser",
    "ToolCall",
    "ToolCallArguments",
    "ToolCallParser",
    "ToolCallStart",
    "ToolChoice",
    "ToolEvent",
    "ToolParserFactory",
    "ToolPlan",
    "ToolSpecError",
    "fallback_messages",
    "function_specs",
    "grammar_error",
    "lazy_tool_call_grammar",
    "marker_token_ids",
    "new_call_id",
    "openai_delta",
    "parser_for",
    "plan_tools",
    "resolve_tool_choice",
    "template_handles_tools",
    "template_messages",
    "template_renders_tool_role",
    "tool_call_grammar",
    "tool_finish_reason",
    "tools_system_prompt",
]
