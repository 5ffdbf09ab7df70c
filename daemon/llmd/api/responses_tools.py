"""The Responses API's tools as the model sees them, and its calls as the client expects them.

Coding agents (OpenAI's Codex CLI) send more than flat function tools:

- `namespace` tools group functions (`{"type": "namespace", "name": "multi_agent_v1",
  "tools": [...]}`). The model sees each as a function named `<namespace>.<name>`; its calls
  come back as `function_call` items with the plain `name` and the `namespace`, as OpenAI
  returns them, and a `function_call` input item with a `namespace` maps back the same way.
- `custom` (freeform) tools take raw text, optionally held to a Lark or regex grammar
  (Codex's `apply_patch`). The model sees a function with one string argument, `input`, whose
  description carries the grammar; calls come back as `custom_tool_call` items whose `input`
  is that text. The grammar is enforced with llguidance: a forced custom call (`tool_choice`
  naming it) is generated under the grammar directly, and a call the model chose itself whose
  input does not match is generated again under the grammar (responses_api.py does both).
- Hosted tools that run on OpenAI's side (`web_search`, `file_search`, `code_interpreter`,
  `image_generation`, `mcp`, ...) cannot run here: they are dropped from what the model sees
  (the model simply never calls them), rather than failing the whole request. A `tool_choice`
  that forces one of them is still a 400, since no answer could honour it. Tool types llmd
  does not know at all remain a 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from llmd.errors import ApiError, bad_request

# Tools that run on the provider's side (or need a client protocol llmd does not speak):
# dropped from the prompt. The model cannot call what it does not see, so nothing misleads.
HOSTED_TOOL_TYPES = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer_use_preview",
        "computer",
        "mcp",
        "tool_search",
        "local_shell",
        "shell",
        "apply_patch",
    }
)
_FUNCTION_KEYS = {"type", "name", "description", "parameters", "strict"}
# Fields OpenAI added to function and custom tools that change nothing llmd does: deferred
# loading and callers are about OpenAI's tool search and programmatic calls.
_IGNORED_KEYS = {"defer_loading", "allowed_callers", "output_schema"}
_CUSTOM_KEYS = {"type", "name", "description", "format"}
CUSTOM_INPUT = "input"  # the one argument of a custom tool, as the model sees it


def _unsupported(message: str, param: str) -> ApiError:
    return bad_request(message, param=param, code="unsupported_parameter")


@dataclass(frozen=True)
class CustomFormat:
    """A custom tool's input format: free text (`syntax` None) or a Lark / regex grammar."""

    syntax: Literal["lark", "regex"] | None = None
    definition: str = ""

    def grammar(self) -> str | None:
        """The llguidance grammar the worker enforces (None: any text)."""
        if self.syntax is None:
            return None
        return _compiled(self.syntax, self.definition)


@lru_cache(maxsize=64)
def _compiled(syntax: str, definition: str) -> str:
    import llguidance

    if syntax == "regex":
        grammar = llguidance.LLMatcher.grammar_from_regex(definition)
    else:
        grammar = llguidance.LLMatcher.grammar_from_lark(definition)
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error and not error.startswith("WARNING"):
        raise ValueError(error)
    return grammar


@dataclass(frozen=True)
class ToolEntry:
    """One tool the model may call: what the client named it and how its calls look."""

    kind: Literal["function", "custom"]
    name: str
    namespace: str | None = None
    format: CustomFormat | None = None

    @property
    def model_name(self) -> str:
        return model_name(self.name, self.namespace)


def model_name(name: str, namespace: str | None) -> str:
    """The function name the model sees (and writes) for a tool of `namespace`."""
    return f"{namespace}.{name}" if namespace else name


@dataclass
class ToolSet:
    """The request's tools: the chat tools offered to the model, what each name maps back
    to, and the hosted tools that were dropped."""

    chat_tools: list[dict[str, Any]] = field(default_factory=list)
    entries: dict[str, ToolEntry] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)

    def entry(self, model_function: str) -> ToolEntry | None:
        return self.entries.get(model_function)

    def custom(self, model_function: str) -> ToolEntry | None:
        entry = self.entries.get(model_function)
        return entry if entry is not None and entry.kind == "custom" else None

    def _add(self, entry: ToolEntry, fn: dict[str, Any], where: str) -> None:
        if entry.model_name in self.entries:
            raise bad_request(f"{where}: tool '{entry.model_name}' is defined twice", where)
        self.entries[entry.model_name] = entry
        self.chat_tools.append({"type": "function", "function": {**fn, "name": entry.model_name}})


def _named(tool: dict[str, Any], where: str, known: set[str]) -> str:
    """The tool's name, after refusing fields llmd does not know for its type (400s)."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request(f"{where}.name is required", param=f"{where}.name")
    extra = sorted(set(tool) - known - _IGNORED_KEYS)
    if extra:
        raise _unsupported(
            f"{where}: field(s) not supported by llmd: {', '.join(extra)}", f"{where}.{extra[0]}"
        )
    return name


def _function(tool: dict[str, Any], where: str, namespace: str | None, tools: ToolSet) -> None:
    name = _named(tool, where, _FUNCTION_KEYS)
    fn: dict[str, Any] = {}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            fn[key] = tool[key]
    tools._add(ToolEntry("function", name, namespace), fn, where)


def custom_format(raw: Any, where: str) -> CustomFormat:
    """`format` of a custom tool: absent or `{type: text}` is free text; `{type: grammar,
    syntax: lark|regex, definition}` a grammar, compiled now so a bad one is a 400."""
    if raw is None:
        return CustomFormat()
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return CustomFormat()
    if kind != "grammar":
        raise bad_request(f"{where}.format.type must be 'text' or 'grammar'", f"{where}.format")
    syntax, definition = raw.get("syntax"), raw.get("definition")
    if syntax not in ("lark", "regex") or not isinstance(definition, str) or not definition:
        raise bad_request(
            f"{where}.format needs syntax 'lark' or 'regex' and a definition", f"{where}.format"
        )
    fmt = CustomFormat(syntax, definition)
    try:
        fmt.grammar()
    except ValueError as exc:
        raise bad_request(f"{where}.format: the grammar does not compile: {exc}", where) from exc
    return fmt


def _custom(tool: dict[str, Any], where: str, namespace: str | None, tools: ToolSet) -> None:
    name = _named(tool, where, _CUSTOM_KEYS)
    fmt = custom_format(tool.get("format"), where)
    description = tool.get("description") or ""
    if fmt.syntax is not None:
        note = f"The input must follow this {fmt.syntax} grammar:\n{fmt.definition}"
        description = f"{description}\n\n{note}" if description else note
    parameters = {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "description": "The raw input text."}},
        "required": [CUSTOM_INPUT],
    }
    fn = {"description": description, "parameters": parameters}
    tools._add(ToolEntry("custom", name, namespace, fmt), fn, where)


def read_tools(raw_tools: list[Any] | None) -> ToolSet:
    """The request's `tools`: function, custom and namespace tools offered to the model,
    hosted tools dropped, anything else a 400 naming it."""
    tools = ToolSet()
    unknown: list[str] = []
    for i, tool in enumerate(raw_tools or []):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad_request(f"{where} must be an object", param=where)
        kind = tool.get("type")
        if kind == "function":
            _function(tool, where, None, tools)
        elif kind == "custom":
            _custom(tool, where, None, tools)
        elif kind == "namespace":
            _namespace(tool, where, tools)
        elif kind in HOSTED_TOOL_TYPES:
            tools.dropped.append(str(kind))
        else:
            unknown.append(str(kind))
    if unknown:
        raise _unsupported(
            f"tools of type {', '.join(repr(u) for u in unknown)} are not supported by llmd "
            "(function, custom and namespace tools are; hosted tools are dropped)",
            "tools",
        )
    return tools


def _namespace(tool: dict[str, Any], where: str, tools: ToolSet) -> None:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request(f"{where}.name is required", param=f"{where}.name")
    members = tool.get("tools")
    if not isinstance(members, list) or not members:
        raise bad_request(f"{where}.tools must be a non-empty list", param=f"{where}.tools")
    for j, member in enumerate(members):
        inner = f"{where}.tools[{j}]"
        kind = member.get("type") if isinstance(member, dict) else None
        if kind == "function":
            _function(member, inner, name, tools)
        elif kind == "custom":
            _custom(member, inner, name, tools)
        else:
            raise _unsupported(
                f"{inner}: a namespace holds function and custom tools, not '{kind}'", inner
            )


@dataclass(frozen=True)
class Choice:
    """`tool_choice` for the chat pipeline, or the custom tool whose call is forced (then
    the answer is that tool's input, generated under its grammar)."""

    chat: Any = None
    forced_custom: ToolEntry | None = None


def read_tool_choice(choice: str | dict[str, Any] | None, tools: ToolSet) -> Choice:
    """Responses' `tool_choice` -> chat's. `auto`/`none` without tools mean nothing to
    choose (OpenAI reports `auto` by default), so they are dropped."""
    has_tools = bool(tools.chat_tools)
    if choice is None:
        return Choice()
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise bad_request(
                "tool_choice must be 'none', 'auto', 'required' or "
                '{"type": "function" | "custom", "name": ...}',
                param="tool_choice",
            )
        return Choice(choice if has_tools or choice == "required" else None)
    kind = choice.get("type")
    if kind in ("function", "custom"):
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request("tool_choice.name is required", param="tool_choice.name")
        namespace = choice.get("namespace")
        entry = tools.entry(model_name(name, namespace if isinstance(namespace, str) else None))
        if entry is None and namespace is None:  # a namespaced tool named plainly, if unique
            named = [e for e in tools.entries.values() if e.name == name]
            entry = named[0] if len(named) == 1 else None
        if entry is None or entry.kind != kind:
            raise bad_request(
                f"tool_choice names {kind} tool '{name}', which is not in tools",
                param="tool_choice",
            )
        if entry.kind == "custom":
            return Choice(None, entry)
        return Choice({"type": "function", "function": {"name": entry.model_name}})
    raise _unsupported(
        f"tool_choice of type '{kind}' is not supported by llmd (function and custom tools)",
        "tool_choice",
    )


# ---------------------------------------------------------------------- items


def call_item(
    tools: ToolSet, item_id: str, call_id: str, function: str, arguments: str, status: str
) -> dict[str, Any]:
    """A model's call -> its output item: `function_call` (with `namespace` when the tool
    had one) or `custom_tool_call` with the raw input."""
    entry = tools.entry(function)
    if entry is not None and entry.kind == "custom":
        return custom_call_item(item_id, call_id, entry, custom_input(arguments), status)
    item: dict[str, Any] = {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": entry.name if entry else function,
        "arguments": arguments,
        "status": status,
    }
    if entry is not None and entry.namespace:
        item["namespace"] = entry.namespace
    return item


def custom_call_item(
    item_id: str, call_id: str, entry: ToolEntry, text: str, status: str
) -> dict[str, Any]:
    item: dict[str, Any] = {
        "type": "custom_tool_call",
        "id": item_id,
        "call_id": call_id,
        "name": entry.name,
        "input": text,
        "status": status,
    }
    if entry.namespace:
        item["namespace"] = entry.namespace
    return item


def custom_input(arguments: str) -> str:
    """The raw input from the arguments the model wrote for a custom tool (`{"input": ...}`);
    arguments of any other shape are passed on as the text they are."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(CUSTOM_INPUT), str):
        return value[CUSTOM_INPUT]
    return arguments


def custom_arguments(text: str) -> str:
    """A custom tool's input as the function arguments the model would have written."""
    return json.dumps({CUSTOM_INPUT: text}, ensure_ascii=False)


# ---------------------------------------------------------------------- grammar checks


@lru_cache(maxsize=8)
def _llg_tokenizer(tokenizer_json: str, vocab: int, eos: tuple[int, ...]) -> Any:
    import llguidance

    return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=list(eos))


def input_matches(fmt: CustomFormat, text: str, model_text: Any) -> bool:
    """Whether `text` is a complete sentence of the tool's grammar (free text always is).
    `model_text`: the model's TextModel, whose tokenizer llguidance walks the text with."""
    grammar = fmt.grammar()
    if grammar is None:
        return True
    import llguidance

    tokenizer = model_text.tokenizer
    llg = _llg_tokenizer(
        tokenizer.to_str(),
        tokenizer.get_vocab_size(with_added_tokens=True),
        tuple(model_text.stop_token_ids),
    )
    matcher = llguidance.LLMatcher(llg, grammar, log_level=0)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return matcher.consume_tokens(ids) and not matcher.is_error() and matcher.is_accepting()
