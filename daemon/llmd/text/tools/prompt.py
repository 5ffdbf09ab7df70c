"""Tools in the prompt: for templates that render them, and for templates that do not.

A template that references ``tools`` (Qwen2.5/3, Llama 3.1+, Mistral) renders the tool list
and tool turns itself; it wants OpenAI messages with call arguments as objects
(:func:`template_messages`), as Hugging Face's ``apply_chat_template`` does.

Many templates ignore ``tools`` (SmolLM2's ChatML, Llama 3.0, Gemma 3). For those llmd writes
the tools into the system prompt and the tool turns into plain text
(:func:`fallback_messages`), in the Hermes convention Qwen2.5 uses (``<tools>`` JSON list,
``<tool_call>`` answers, ``<tool_response>`` results), or for Gemma in Google's documented
convention (```` ```tool_code ```` calls, ```` ```tool_output ```` results). Tool results
become ``tool`` turns of their own, as llama-server renders them, where the template writes
any role under its own name (SmolLM2's ChatML: ``<|im_start|>tool``; found by rendering a
probe, :func:`template_renders_tool_role`): wrapped in ``<tool_response>`` inside a user
turn, a small model copies the tag into its answer. Other templates get only system, user
and assistant turns with string content, so any template renders the conversation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jinja2 import TemplateError, meta

from llmd.errors import ApiError
from llmd.text.chat_template import (
    _compile,  # the daemon's own sandbox and Jinja extensions
    render_chat,
)
from llmd.text.tools.pycall import format_python_call

_HERMES_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
_GEMMA_INSTRUCTIONS = (
    "You have access to functions. If you decide to invoke any of the function(s), you MUST "
    "put it in the format of\n```tool_code\nfunction_name(parameter_name=value, ...)\n```\n"
    "Write one call per line, with keyword arguments whose values are JSON (strings in "
    "double quotes, true, false, null). You SHOULD NOT include any other text in the "
    "response if you call a function. The result of each call is given to you in a "
    "```tool_output``` block.\n\n{tools}"
)
_LLAMA3_INSTRUCTIONS = (
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\n"
    'Respond in the format {{"name": function name, "parameters": dictionary of argument '
    "name and its value}}. Do not use variables.\n\n{tools}"
)


def template_handles_tools(chat_template: str) -> bool:
    """Whether the Jinja template reads a ``tools`` variable (found in its syntax tree, so a
    comment or a string that says "tools" does not count). A template that does not parse
    handles nothing."""
    try:
        env = _compile(chat_template).environment
        return "tools" in meta.find_undeclared_variables(env.parse(chat_template))
    except TemplateError:
        return False


_PROBE_RESULT = "llmd-probe-result-7f3a"


def template_renders_tool_role(chat_template: str) -> bool:
    """Whether the template renders a ``tool`` turn as a turn of that role: a probe
    conversation (user, assistant, tool) renders, the result appears, and the role's name
    stands between the assistant's text and it (a header such as ``<|im_start|>tool``). A
    template that refuses the role, drops the turn or folds it into another role does not."""
    probe = [
        {"role": "user", "content": "llmd-probe-question"},
        {"role": "assistant", "content": "llmd-probe-answer"},
        {"role": "tool", "content": _PROBE_RESULT},
    ]
    try:
        rendered = render_chat(chat_template, probe, bos_token="", eos_token="")
    except (ApiError, TemplateError, TypeError, ValueError, KeyError, AttributeError):
        return False
    answer = rendered.find("llmd-probe-answer")
    result = rendered.find(_PROBE_RESULT)
    return 0 <= answer < result and "tool" in rendered[answer:result]


def tools_system_prompt(tools: Sequence[dict[str, Any]], family: str) -> str:
    """The system-prompt block that teaches a model without tool support in its template
    to call `tools` (OpenAI ``tools`` entries) in `family`'s markup: hermes (llmd's default,
    Qwen2.5's own wording), gemma, or llama3 (Llama 3.1's JSON-tools wording). Mistral models
    have templates that render tools; there is no text convention to fall back to."""
    if family == "hermes":
        listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        return _HERMES_INSTRUCTIONS.format(tools=listed)
    if family == "gemma":
        functions = [tool.get("function", tool) for tool in tools]
        return _GEMMA_INSTRUCTIONS.format(tools=json.dumps(functions, ensure_ascii=False, indent=2))
    if family == "llama3":
        listed = "\n\n".join(json.dumps(tool, ensure_ascii=False, indent=4) for tool in tools)
        return _LLAMA3_INSTRUCTIONS.format(tools=listed)
    raise ValueError(f"no fallback tools prompt for the {family} markup")


def _text(content: Any) -> str:
    """Message content as one string: text parts of a content list joined, null empty."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(
        part.get("text", "")
        for part in content
        if isinstance(part, dict) and part.get("type") == "text"
    )


def _call_parts(call: dict[str, Any]) -> tuple[str, Any, str]:
    """(name, arguments as an object when they decode to one, arguments JSON text)."""
    fn = call.get("function", call)
    name = fn.get("name", "")
    raw = fn.get("arguments", {})
    if isinstance(raw, str):
        try:
            decoded = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError):
            return name, raw, raw
        return name, decoded, json.dumps(decoded, ensure_ascii=False)
    return name, raw, json.dumps(raw, ensure_ascii=False)


def _calls_text(calls: Sequence[dict[str, Any]], family: str) -> str:
    if family == "gemma":
        lines = []
        for call in calls:
            name, args, text = _call_parts(call)
            lines.append(format_python_call(name, args) if isinstance(args, dict) else text)
        return "```tool_code\n" + "\n".join(lines) + "\n```"
    if family == "llama3":
        return "; ".join(
            f'{{"name": {json.dumps(name)}, "parameters": {text}}}'
            for name, _, text in map(_call_parts, calls)
        )
    return "\n".join(
        f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {text}}}\n</tool_call>'
        for name, _, text in map(_call_parts, calls)
    )


def _result_text(content: str, family: str) -> str:
    if family == "gemma":
        return f"```tool_output\n{content}\n```"
    if family == "llama3":
        return content
    return f"<tool_response>\n{content}\n</tool_response>"


def fallback_messages(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    family: str = "hermes",
    *,
    tool_role: bool = False,
) -> list[dict[str, Any]]:
    """The conversation for a template that knows no tools: the tools block appended to the
    system message (or a system message of its own first), assistant calls written as the
    model is asked to write them, and each ``tool`` result as a ``tool`` turn with its text
    as it is (`tool_role`: the template renders that role, see
    :func:`template_renders_tool_role`), else each run of results as one user turn (merged
    with an adjacent user turn, for templates that insist on alternating roles). With no
    `tools` (``tool_choice`` none), earlier tool turns are still written out."""
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "tool" and tool_role:
            turns.append({"role": "tool", "content": _text(message.get("content"))})
            continue
        if message.get("role") == "tool":
            result = _result_text(_text(message.get("content")), family)
            turns.append({"role": "user", "content": result, "_results": True})
            continue
        turn = {k: v for k, v in message.items() if k not in ("tool_calls", "tool_call_id")}
        turn["content"] = _text(message.get("content"))
        if message.get("role") == "assistant" and message.get("tool_calls"):
            calls = _calls_text(message["tool_calls"], family)
            turn["content"] = f"{turn['content'].strip()}\n{calls}".lstrip("\n")
        turns.append(turn)
    out: list[dict[str, Any]] = []
    for turn in turns:
        last = out[-1] if out else None
        if (
            last is not None
            and last["role"] == turn["role"] == "user"
            and (last.get("_results") or turn.get("_results"))
        ):
            both = last.get("_results") and turn.get("_results")
            last["content"] += ("\n" if both else "\n\n") + turn["content"]
            last["_results"] = True
        else:
            out.append(turn)
    for turn in out:
        turn.pop("_results", None)
    if tools:
        block = tools_system_prompt(tools, family)
        if out and out[0].get("role") == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation for a template that renders tools: as given, except that call
    arguments (a JSON string in the OpenAI API) become objects, which is what templates
    expect (they ``tojson`` them; a string would be encoded twice). Arguments that are not
    JSON stay a string."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                fn = dict(call.get("function", {}))
                _, args, _ = _call_parts(call)
                fn["arguments"] = args
                calls.append({**call, "function": fn})
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out
