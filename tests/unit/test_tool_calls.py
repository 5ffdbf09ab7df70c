"""Tool calls: every family's markup parsed the same streamed or not (split anywhere), a model's
mistakes returned as text, stable ids, model/markup selection, prompts for templates without
tool support, and grammars that make ``tool_choice`` required/named a guarantee."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from llmd.text.chat_template import render_chat
from llmd.text.reasoning import ReasoningSplitter
from llmd.text.tools import (
    ContentDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
    ToolParserFactory,
    ToolSpecError,
    fallback_messages,
    function_specs,
    grammar_error,
    marker_token_ids,
    openai_delta,
    parser_for,
    plan_tools,
    resolve_tool_choice,
    template_handles_tools,
    template_messages,
    template_renders_tool_role,
    tool_call_grammar,
    tool_finish_reason,
    tools_system_prompt,
)

from .grammar_checks import accepts as _accepts
from .grammar_checks import accepts_a_prefix as _accepts_a_prefix

NAMES = ["get_weather", "now"]
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
WEATHER_ARGS = '{"city": "Paris", "days": 2}'
ID_SHAPE = re.compile(r"call_[A-Za-z0-9]{24}")

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                    "metric": {"type": "boolean"},
                },
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "description": "The current time"}},
]


def _pieces_every_way(text: str) -> list[list[str]]:
    return [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]


def _collect(events: list[Any]) -> tuple[str | None, list[tuple[str, str, str]]]:
    """Rebuild what a client assembles from streamed deltas: content and (id, name, args)."""
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls: dict[int, tuple[str, str, str]] = {}
    for e in events:
        if isinstance(e, ToolCallStart):
            assert e.index == len(calls), "calls are numbered 0, 1, ... in order"
            calls[e.index] = (e.id, e.name, "")
        elif isinstance(e, ToolCallArguments):
            call_id, name, args = calls[e.index]
            calls[e.index] = (call_id, name, args + e.fragment)
    return (content or None), list(calls.values())


def _stream(
    family: str, pieces: list[str], parallel: bool = True
) -> tuple[str | None, list[tuple[str, str]]]:
    parser = ToolParserFactory(family)(NAMES, parallel=parallel)
    events: list[Any] = []
    for piece in pieces:
        events += parser.feed(piece)
    events += parser.flush()
    content, calls = _collect(events)
    assert [c[0] for c in calls] == [c.id for c in parser.calls], "streamed ids are the final ids"
    return content, [(name, args) for _, name, args in calls]


def _check(
    family: str,
    output: str,
    content: str | None,
    calls: list[tuple[str, str]],
    *,
    parallel: bool = True,
) -> None:
    """The non-streamed parse gives the expected result, and so does every streamed split."""
    got_content, got_calls = ToolParserFactory(family).parse(output, NAMES, parallel=parallel)
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls
    for call in got_calls:
        assert ID_SHAPE.fullmatch(call.id)
        json.loads(call.arguments)
    for pieces in _pieces_every_way(output):
        assert _stream(family, pieces, parallel=parallel) == (content, calls), pieces


# -- Hermes (<tool_call>) -------------------------------------------------------------------

HERMES_CASES = [
    pytest.param(
        f"<tool_call>\n{WEATHER}\n</tool_call>", None, [("get_weather", WEATHER_ARGS)], id="one"
    ),
    pytest.param(
        f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>\n",
        "Let me check.",
        [("get_weather", WEATHER_ARGS)],
        id="content-before",
    ),
    pytest.param(
        f'<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{{"name": "now", "arguments": {{}}}}\n</tool_call>',
        None,
        [("get_weather", WEATHER_ARGS), ("now", "{}")],
        id="parallel",
    ),
    pytest.param(
        '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>',
        [],
        id="unknown-function-is-text",
    ),
    pytest.param(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>',
        [],
        id="malformed-json-is-text",
    ),
    pytest.param(
        f'<tool_call>\n{{"name": "nope"}}\n</tool_call>\nThen: <tool_call>\n{WEATHER}\n</tool_call>',
        '<tool_call>\n{"name": "nope"}\n</tool_call>\nThen:',
        [("get_weather", WEATHER_ARGS)],
        id="bad-block-then-good-block",
    ),
    pytest.param(
        f"<tool_call>\n{WEATHER}", None, [("get_weather", WEATHER_ARGS)], id="unterminated-complete"
    ),
    pytest.param(
        '<tool_call>\n{"name": "get_weather", "argu',
        '<tool_call>\n{"name": "get_weather", "argu',
        [],
        id="unterminated-cut-off",
    ),
    pytest.param(
        '<tool_call>[{"name": "now", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]</tool_call>',
        None,
        [("now", "{}"), ("get_weather", '{"city": "Oslo"}')],
        id="smollm2-list",
    ),
    pytest.param(
        '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}\n</tool_call>',
        None,
        [("get_weather", '{"city": "Rome"}')],
        id="double-encoded-arguments",
    ),
    pytest.param(
        '<tool_call>\n{"name": "now"}\n</tool_call>', None, [("now", "{}")], id="no-arguments"
    ),
    pytest.param(
        '<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>',
        [],
        id="arguments-not-an-object",
    ),
    pytest.param(
        "a < b and <tool_c is not a tag\n\n",
        "a < b and <tool_c is not a tag\n\n",
        [],
        id="no-call-content-byte-for-byte",
    ),
    pytest.param(
        f"Sure!\n<tool_call>\n{WEATHER}\n</tool_call>\nAnything else?",
        "Sure!\n\nAnything else?",
        [("get_weather", WEATHER_ARGS)],
        id="text-around-a-call",
    ),
    pytest.param(
        '<tool_call>\n{"name": "get_weather", "arguments": {"note": "ünïcödé ✓"}}\n</tool_call>',
        None,
        [("get_weather", '{"note": "ünïcödé ✓"}')],
        id="unicode",
    ),
]


@pytest.mark.parametrize(("output", "content", "calls"), HERMES_CASES)
def test_hermes(output: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    _check("hermes", output, content, calls)


def test_hermes_not_parallel_keeps_the_first_call() -> None:
    two = f'<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{{"name": "now"}}\n</tool_call>'
    _check("hermes", two, None, [("get_weather", WEATHER_ARGS)], parallel=False)


def test_hermes_holds_back_only_a_possible_marker() -> None:
    parser = ToolParserFactory("hermes")(NAMES)
    assert parser.feed("The weather") == [ContentDelta("The weather")]
    assert parser.feed(" in a < b") == [ContentDelta(" in a < b")]
    # "<tool_c" could still become "<tool_call>": it waits; so does the space before it.
    assert parser.feed(" <tool_c") == []
    assert parser.feed("ar") == [ContentDelta(" <tool_car")]
    # Inside a call nothing is released until the block is complete and validated.
    assert parser.feed(f"\n<tool_call>\n{WEATHER[:30]}") == []
    events = parser.feed(WEATHER[30:] + "\n</tool_call>")
    assert [type(e) for e in events] == [ToolCallStart, ToolCallArguments]
    assert parser.flush() == []


@pytest.mark.parametrize("family", ["hermes", "llama3", "mistral", "gemma", "gemma4"])
def test_pathological_nesting_is_text_not_an_exception(family: str) -> None:
    deep = "[" * 100_000
    opener = {"hermes": "<tool_call>", "llama3": "", "mistral": "[TOOL_CALLS]", "gemma": ""}
    output = opener.get(family, "") + '{"name": "now", "arguments": ' + deep
    if family == "gemma":
        output = "```tool_code\nnow(a=" + deep + ")\n```"
    if family == "gemma4":
        output = "<|tool_call>call:now{a:" + deep + "}<tool_call|>"
    content, calls = ToolParserFactory(family).parse(output, NAMES)
    assert (content, calls) == (output, [])
    history = [
        {"role": "assistant", "tool_calls": [{"function": {"name": "now", "arguments": deep}}]}
    ]
    assert template_messages(history)[0]["tool_calls"][0]["function"]["arguments"] == deep


def test_ids_are_stable_unique_and_shaped_like_openai() -> None:
    output = f"<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{WEATHER}\n</tool_call>"
    parser = ToolParserFactory("hermes")(NAMES)
    events = [e for ch in output for e in parser.feed(ch)] + parser.flush()
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [s.id for s in starts] == [c.id for c in parser.calls]
    assert len({s.id for s in starts}) == 2
    assert all(ID_SHAPE.fullmatch(s.id) for s in starts)
    # Another response gets other ids.
    _, again = ToolParserFactory("hermes").parse(output, NAMES)
    assert not {c.id for c in again} & {s.id for s in starts}


def test_openai_deltas_and_message_entries() -> None:
    start = ToolCallStart(0, "call_" + "a" * 24, "get_weather")
    assert openai_delta(start) == {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_" + "a" * 24,
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ]
    }
    assert openai_delta(ToolCallArguments(0, WEATHER_ARGS)) == {
        "tool_calls": [{"index": 0, "function": {"arguments": WEATHER_ARGS}}]
    }
    assert openai_delta(ContentDelta("hi")) == {"content": "hi"}
    call = ToolCall("now", "{}", id="call_x")
    assert call.to_openai() == {
        "id": "call_x",
        "type": "function",
        "function": {"name": "now", "arguments": "{}"},
    }


def test_finish_reason_is_tool_calls_once_a_call_was_made() -> None:
    assert tool_finish_reason("stop", 1) == "tool_calls"
    assert tool_finish_reason("length", 2) == "tool_calls"
    assert tool_finish_reason("stop", 0) == "stop"
    assert tool_finish_reason("length", 0) == "length"
    assert tool_finish_reason("cancelled", 1) == "cancelled"


# -- Llama 3 JSON ---------------------------------------------------------------------------

LLAMA_WEATHER = '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}'

LLAMA_CASES = [
    pytest.param(LLAMA_WEATHER, None, [("get_weather", WEATHER_ARGS)], id="one"),
    pytest.param(
        "<|python_tag|>" + LLAMA_WEATHER, None, [("get_weather", WEATHER_ARGS)], id="python-tag"
    ),
    pytest.param(
        f' {LLAMA_WEATHER}; {{"name": "now", "parameters": {{}}}}',
        None,
        [("get_weather", WEATHER_ARGS), ("now", "{}")],
        id="several",
    ),
    pytest.param(
        "The weather in Paris is sunny {they say}.",
        "The weather in Paris is sunny {they say}.",
        [],
        id="plain-answer",
    ),
    pytest.param(
        '{"name": "launch_rockets", "parameters": {}}',
        '{"name": "launch_rockets", "parameters": {}}',
        [],
        id="unknown-function-is-text",
    ),
    pytest.param(
        '{"name": "get_weather", "parameters": {"city": }',
        '{"name": "get_weather", "parameters": {"city": }',
        [],
        id="malformed-json-is-text",
    ),
    pytest.param(
        f"{LLAMA_WEATHER} and then some prose",
        f"{LLAMA_WEATHER} and then some prose",
        [],
        id="all-or-nothing",
    ),
    pytest.param('{"answer": 42}', '{"answer": 42}', [], id="json-answer-not-a-call"),
]


@pytest.mark.parametrize(("output", "content", "calls"), LLAMA_CASES)
def test_llama3(output: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    _check("llama3", output, content, calls)


def test_llama3_releases_text_as_soon_as_it_cannot_be_a_call() -> None:
    parser = ToolParserFactory("llama3")(NAMES)
    assert parser.feed("Sunny") == [ContentDelta("Sunny")]
    parser = ToolParserFactory("llama3")(NAMES)
    assert parser.feed('{"answer": 4') == []  # could still be a call
    assert parser.feed("2}") == [ContentDelta('{"answer": 42}')]  # a complete non-call object


# -- Mistral --------------------------------------------------------------------------------

MISTRAL_CASES = [
    pytest.param(f"[TOOL_CALLS][{WEATHER}]", None, [("get_weather", WEATHER_ARGS)], id="list"),
    pytest.param(
        f'[TOOL_CALLS] [{WEATHER}, {{"name": "now", "arguments": {{}}, "id": "a1b2c3d4e"}}]',
        None,
        [("get_weather", WEATHER_ARGS), ("now", "{}")],
        id="list-of-two",
    ),
    pytest.param(
        f"Checking.[TOOL_CALLS]get_weather[ARGS]{WEATHER_ARGS}[TOOL_CALLS]now[ARGS]{{}}",
        "Checking.",
        [("get_weather", WEATHER_ARGS), ("now", "{}")],
        id="v11-named",
    ),
    pytest.param(
        f"[TOOL_CALLS]get_weather[CALL_ID]x7Yq2Lm9P[ARGS]{WEATHER_ARGS}",
        None,
        [("get_weather", WEATHER_ARGS)],
        id="v11-call-id",
    ),
    pytest.param(
        '[TOOL_CALLS][{"name": "launch_rockets", "arguments": {}}]',
        '[TOOL_CALLS][{"name": "launch_rockets", "arguments": {}}]',
        [],
        id="unknown-function-is-text",
    ),
    pytest.param(
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
        [],
        id="malformed-json-is-text",
    ),
    pytest.param(
        "[TOOL_CALL] is not [TOOL_CALLS", "[TOOL_CALL] is not [TOOL_CALLS", [], id="near-miss"
    ),
]


@pytest.mark.parametrize(("output", "content", "calls"), MISTRAL_CASES)
def test_mistral(output: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    _check("mistral", output, content, calls)
    _check("mistral_v11", output, content, calls)


# -- Gemma (```tool_code) -------------------------------------------------------------------

GEMMA_CASES = [
    pytest.param(
        '```tool_code\nget_weather(city="Paris", days=2)\n```',
        None,
        [("get_weather", WEATHER_ARGS)],
        id="one",
    ),
    pytest.param(
        "I'll look.\n```tool_code\nget_weather(city='Oslo', metric=True)\nnow()\n```",
        "I'll look.",
        [("get_weather", '{"city": "Oslo", "metric": true}'), ("now", "{}")],
        id="two-lines",
    ),
    pytest.param(
        '```tool_code\n[get_weather(city="Paris", days=2), now()]\n```',
        None,
        [("get_weather", WEATHER_ARGS), ("now", "{}")],
        id="list",
    ),
    pytest.param(
        '```tool_code\nprint(default_api.get_weather(city="Paris", days=2))\n```',
        None,
        [("get_weather", WEATHER_ARGS)],
        id="gemini-style",
    ),
    pytest.param(
        '```tool_code\nget_weather(city="Paris", opts={"a": [1, -2.5, null, false]})\n```',
        None,
        [("get_weather", '{"city": "Paris", "opts": {"a": [1, -2.5, null, false]}}')],
        id="json-values",
    ),
    pytest.param(
        '```tool_code\n{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}\n```',
        None,
        [("get_weather", WEATHER_ARGS)],
        id="json-form",
    ),
    pytest.param(
        "```tool_code\nget_weather(city=secret_var)\n```",
        "```tool_code\nget_weather(city=secret_var)\n```",
        [],
        id="non-literal-is-text",
    ),
    pytest.param(
        "```tool_code\nget_weather('Paris')\n```",
        "```tool_code\nget_weather('Paris')\n```",
        [],
        id="positional-is-text",
    ),
    pytest.param(
        "```tool_code\nimport os; os.system('rm -rf /')\n```",
        "```tool_code\nimport os; os.system('rm -rf /')\n```",
        [],
        id="code-is-text",
    ),
    pytest.param(
        "```tool_code\nlaunch_rockets()\n```",
        "```tool_code\nlaunch_rockets()\n```",
        [],
        id="unknown-function-is-text",
    ),
    pytest.param(
        "```python\nprint(get_weather(city='x'))\n```",
        "```python\nprint(get_weather(city='x'))\n```",
        [],
        id="other-code-block-is-text",
    ),
]


@pytest.mark.parametrize(("output", "content", "calls"), GEMMA_CASES)
def test_gemma(output: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    _check("gemma", output, content, calls)


# -- Gemma 4 (<|tool_call>call:name{...}<tool_call|>) ---------------------------------------

Q = '<|"|>'  # Gemma 4's string quote token
G4_WEATHER = f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:2}}<tool_call|>"

GEMMA4_CASES = [
    pytest.param(G4_WEATHER, None, [("get_weather", WEATHER_ARGS)], id="one"),
    pytest.param(
        f"Let me check.\n{G4_WEATHER}\n",
        "Let me check.",
        [("get_weather", WEATHER_ARGS)],
        id="content-before",
    ),
    pytest.param(
        f"{G4_WEATHER}<|tool_call>call:now{{}}<tool_call|>",
        None,
        [("get_weather", WEATHER_ARGS), ("now", "{}")],
        id="parallel",
    ),
    pytest.param(
        f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:2}}call:now{{}}<tool_call|>",
        None,
        [("get_weather", WEATHER_ARGS), ("now", "{}")],
        id="two-in-one-block",
    ),
    pytest.param(
        f'<|tool_call>call:get_weather{{city:{Q}Paris, {{"x"}}: [1]{Q},'
        f"opts:{{a:[1,-2.5e1,null,false,{Q}{Q}],{Q}b c{Q}:{{}}}}}}<tool_call|>",
        None,
        [
            (
                "get_weather",
                '{"city": "Paris, {\\"x\\"}: [1]", "opts": {"a": [1, -25.0, null, false, ""], '
                '"b c": {}}}',
            )
        ],
        id="nested-values-and-braces-in-strings",
    ),
    pytest.param("<|tool_call>call:now{}", None, [("now", "{}")], id="unterminated-but-complete"),
    pytest.param(
        "<|tool_call>call:launch_rockets{}<tool_call|>",
        "<|tool_call>call:launch_rockets{}<tool_call|>",
        [],
        id="unknown-function-is-text",
    ),
    pytest.param(
        "<|tool_call>call:get_weather{city:Paris}<tool_call|>",
        "<|tool_call>call:get_weather{city:Paris}<tool_call|>",
        [],
        id="bare-word-value-is-text",
    ),
    pytest.param(
        f"<|tool_call>get_weather{{city:{Q}Paris{Q}}}<tool_call|> ok",
        f"<|tool_call>get_weather{{city:{Q}Paris{Q}}}<tool_call|> ok",
        [],
        id="no-call-prefix-is-text",
    ),
]


@pytest.mark.parametrize(("output", "content", "calls"), GEMMA4_CASES)
def test_gemma4(output: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    _check("gemma4", output, content, calls)


def test_gemma4_calls_rendered_by_a_gemma4_style_template_parse_back() -> None:
    """A call as a Gemma 4-style template writes an assistant turn's tool_calls (string
    arguments between quote tokens, others bare) is parsed back to the same arguments."""
    template = (
        '{%- macro v(x) -%}{%- if x is string -%}<|"|>{{ x }}<|"|>'
        "{%- elif x is mapping -%}{{ '{' }}{%- for k, y in x | dictsort -%}{{ k }}:{{ v(y) }}"
        "{%- if not loop.last %},{% endif -%}{%- endfor -%}{{ '}' }}"
        "{%- elif x is sequence -%}[{%- for y in x -%}{{ v(y) }}{%- if not loop.last %},"
        "{% endif -%}{%- endfor -%}]"
        "{%- else -%}{{ x | tojson }}{%- endif -%}{%- endmacro -%}"
        "{%- for m in messages -%}{%- for c in m.tool_calls -%}"
        "<|tool_call>call:{{ c.function.name }}{{ v(c.function.arguments) }}<tool_call|>"
        "{%- endfor -%}{%- endfor -%}"
    )
    args = {"city": "Paris", "days": 2, "metric": True, "opts": {"at": [9, 17.5], "tz": None}}
    history = [
        {
            "role": "assistant",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": args}}],
        }
    ]
    rendered = render_chat(
        template, history, bos_token="<bos>", eos_token="<eos>", add_generation_prompt=False
    )
    assert rendered.startswith(f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:2,")
    content, calls = ToolParserFactory("gemma4").parse(rendered, NAMES)
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", args)]


# -- reasoning + tools, as the server chains them ------------------------------------------


def test_reasoning_then_tool_call_streamed_at_every_split() -> None:
    """The reasoning splitter runs first; markup inside the reasoning is never a call."""
    output = (
        '<think>\nMaybe <tool_call>\n{"name": "now"}\n</tool_call>? No, weather.\n</think>\n\n'
        f"<tool_call>\n{WEATHER}\n</tool_call>"
    )
    for pieces in _pieces_every_way(output):
        splitter = ReasoningSplitter()
        parser = ToolParserFactory("hermes")(NAMES)
        reasoning, events = "", []
        for piece in [*pieces, None]:
            out = splitter.feed(piece) if piece is not None else splitter.flush()
            reasoning += out.reasoning
            events += parser.feed(out.content)
        events += parser.flush()
        content, calls = _collect(events)
        assert reasoning == 'Maybe <tool_call>\n{"name": "now"}\n</tool_call>? No, weather.'
        assert content is None
        assert [(n, a) for _, n, a in calls] == [("get_weather", WEATHER_ARGS)]


# -- choosing the markup --------------------------------------------------------------------

QWEN25_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}"
    "{{- '\\n' + tool | tojson }}{%- endfor %}{{- '\\n</tools>\\n<tool_call>...</tool_call>' }}"
    "{%- endif %}{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
    "message.content + '<|im_end|>\\n' }}{%- endfor %}"
)
LLAMA31_TEMPLATE = (
    "{%- if custom_tools is defined %}{%- set tools = custom_tools %}{%- endif %}"
    "{%- for t in tools %}{{- t | tojson(indent=4) }}{%- endfor %}"
    "{%- for message in messages %}{%- if message.role == 'ipython' %}{{ message.content }}"
    "{%- elif 'tool_calls' in message %}{{- '<|python_tag|>' }}{%- endif %}{%- endfor %}"
)
MISTRAL_V11_TEMPLATE = (
    "{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif %}"
    "{%- for m in messages %}{%- if m.tool_calls %}{%- for c in m.tool_calls %}"
    "[TOOL_CALLS]{{ c.function.name }}[ARGS]{{ c.function.arguments | tojson }}"
    "{%- endfor %}{%- endif %}{%- endfor %}"
)
MISTRAL_V3_TEMPLATE = "{%- if tools %}[AVAILABLE_TOOLS]{%- endif %}[TOOL_CALLS] [TOOL_RESULTS]"
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages %}{{ '<start_of_turn>' + message.role + '\\n' + "
    "message.content + '<end_of_turn>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{%- endif %}"
)
# The tool parts of a Gemma 4-style template (abbreviated: declarations and calls).
GEMMA4_TEMPLATE = (
    "{%- if tools %}<|turn>system\n{%- for t in tools %}<|tool>declaration:"
    "{{ t.function.name }}<tool|>{%- endfor %}<turn|>\n{%- endif %}"
    "{%- for m in messages %}<|turn>{{ m.role }}\n{%- if m.tool_calls %}"
    "{%- for c in m.tool_calls %}<|tool_call>call:{{ c.function.name }}{}<tool_call|>"
    "{%- endfor %}{%- else %}{{ m.content }}{%- endif %}<turn|>\n{%- endfor %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.mark.parametrize(
    ("template", "family", "markup", "renders"),
    [
        (QWEN25_TEMPLATE, "qwen2", "hermes", True),
        (LLAMA31_TEMPLATE, "llama", "llama3", True),
        (MISTRAL_V11_TEMPLATE, "mistral", "mistral_v11", True),
        (MISTRAL_V3_TEMPLATE, "mistral", "mistral", True),
        (GEMMA3_TEMPLATE, "gemma3", "gemma", False),  # Gemma 3 has no tool template
        (GEMMA4_TEMPLATE, "gemma4", "gemma4", True),
        (None, "gemma4", "hermes", False),  # no template: llmd's fallback prompt
        (CHATML_TEMPLATE, "llama", "hermes", False),  # SmolLM2: llmd's fallback, not Llama 3
        ("{% for t in tools %}{{ t.name }}{% endfor %}", "qwen2", "hermes", True),
        ("{% for t in tools %}{{ t.name }}{% endfor %}", "llama", "llama3", True),
        ("{% for t in tools %}{{ t.name }}{% endfor %}", "exotic", "hermes", False),
        (None, "gemma", "gemma", False),
        (None, None, "hermes", False),
    ],
)
def test_markup_selection(
    template: str | None, family: str | None, markup: str, renders: bool
) -> None:
    plan = plan_tools(template, family)
    assert (plan.family, plan.template_renders_tools) == (markup, renders)
    assert parser_for(template, family) == plan.parser


def test_the_test_model_gets_the_hermes_fallback(text_model: Any) -> None:
    plan = plan_tools(text_model.chat_template, "llama")
    assert (plan.family, plan.template_renders_tools) == ("hermes", False)


def test_visible_tokens_name_the_markers_a_detokenizer_must_not_hide() -> None:
    assert ToolParserFactory("mistral").visible_tokens == ("[TOOL_CALLS]",)
    assert "<|python_tag|>" in ToolParserFactory("llama3").visible_tokens
    assert ToolParserFactory("gemma").visible_tokens == ()
    assert ToolParserFactory("gemma4").visible_tokens == ("<|tool_call>", "<tool_call|>", Q)


def test_template_handles_tools_reads_the_syntax_tree() -> None:
    assert template_handles_tools(QWEN25_TEMPLATE)
    assert template_handles_tools(LLAMA31_TEMPLATE)
    assert not template_handles_tools(CHATML_TEMPLATE)
    assert not template_handles_tools("{# tools go here one day #}{{ 'tools' }}")
    assert not template_handles_tools("{% if tools %}unclosed")
    assert template_handles_tools("{% generation %}{{ tools }}{% endgeneration %}")


# -- tools in the prompt --------------------------------------------------------------------


def test_hermes_tools_prompt_lists_every_tool_as_json() -> None:
    block = tools_system_prompt(TOOLS, "hermes")
    listed = block.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()
    assert [json.loads(line) for line in listed] == TOOLS
    assert "<tool_call>" in block and '"arguments": <args-json-object>' in block
    assert "```tool_code" in tools_system_prompt(TOOLS, "gemma")
    assert '"parameters": dictionary' in tools_system_prompt(TOOLS, "llama3")
    with pytest.raises(ValueError):
        tools_system_prompt(TOOLS, "mistral")


CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and the time?"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": WEATHER_ARGS},
            },
            {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
    {"role": "user", "content": "Thanks!"},
]


def test_fallback_conversation_renders_with_the_test_models_template(text_model: Any) -> None:
    messages = fallback_messages(CONVERSATION, TOOLS, "hermes")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert all(isinstance(m["content"], str) for m in messages)
    prompt = render_chat(
        text_model.chat_template,
        messages,
        bos_token=text_model.bos_token,
        eos_token=text_model.eos_token,
    )
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert (
        "<tool_response>\nsunny\n</tool_response>\n<tool_response>\n12:00\n</tool_response>"
        in prompt
    )
    assert "</tool_response>\n\nThanks!<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    # The model sees its earlier calls written exactly the way it is asked to write them.
    _, calls = ToolParserFactory("hermes").parse(messages[2]["content"], NAMES)
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", WEATHER_ARGS), ("now", "{}")]
    assert CONVERSATION[2]["content"] is None and "tool_calls" in CONVERSATION[2]  # untouched


def test_tool_results_are_tool_turns_where_the_template_renders_the_role(
    text_model: Any,
) -> None:
    """Issue 30: SmolLM2's template writes any role as `<|im_start|>{role}`, so results are
    `tool` turns of their own, as llama-server renders them; wrapped in `<tool_response>`
    inside a user turn the model copied the tag into its answer."""
    assert template_renders_tool_role(text_model.chat_template)
    assert plan_tools(text_model.chat_template, None).tool_role
    messages = fallback_messages(CONVERSATION, TOOLS, "hermes", tool_role=True)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "user"]
    prompt = render_chat(text_model.chat_template, messages, bos_token="", eos_token="")
    assert "<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>tool\n12:00<|im_end|>" in prompt
    assert "<tool_response>" not in prompt
    # A template that refuses the role, drops the turn, or writes it as a user turn: no.
    refuses = "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no') }}"
    refuses += "{% endif %}{{ m.content }}{% endfor %}"
    drops = "{% for m in messages %}{% if m.role != 'tool' %}{{ m.content }}{% endif %}{% endfor %}"
    as_user = (
        "{% for m in messages %}{% if m.role == 'assistant' %}<bot>{% else %}<user>{% endif %}"
        "{{ m.content }}{% endfor %}"
    )
    for template in (refuses, drops, as_user, "{{ messages[0].content }}"):
        assert not template_renders_tool_role(template)
        assert not plan_tools(template, None).tool_role


def test_gemma_fallback_keeps_roles_alternating() -> None:
    strict = (
        "{%- for m in messages %}{%- if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
        "{%- endif %}{{ '<start_of_turn>' + m.role + '\\n' + m.content + '<end_of_turn>\\n' }}"
        "{%- endfor %}"
    )
    messages = fallback_messages(CONVERSATION[1:], TOOLS, "gemma")
    messages = [m for m in messages if m["role"] != "system"]  # Gemma folds it into the user turn
    prompt = render_chat(strict, messages, bos_token="", eos_token="", add_generation_prompt=False)
    assert '```tool_code\nget_weather(city="Paris", days=2)\nnow()\n```' in prompt
    assert "```tool_output\nsunny\n```\n```tool_output\n12:00\n```\n\nThanks!" in prompt
    _, calls = ToolParserFactory("gemma").parse(messages[1]["content"], NAMES)
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", WEATHER_ARGS), ("now", "{}")]


def test_fallback_without_tools_still_writes_out_tool_turns() -> None:
    messages = fallback_messages(CONVERSATION[1:], None)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert "# Tools" not in json.dumps(messages)


def test_template_messages_give_templates_argument_objects() -> None:
    messages = template_messages(CONVERSATION)
    calls = messages[2]["tool_calls"]
    assert calls[0]["function"]["arguments"] == {"city": "Paris", "days": 2}
    assert calls[0]["id"] == "call_1"
    assert CONVERSATION[2]["tool_calls"][0]["function"]["arguments"] == WEATHER_ARGS
    prompt = render_chat(
        "{% for m in messages %}{% for c in m.tool_calls or [] %}"
        "{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}",
        messages,
        bos_token="",
        eos_token="",
    )
    assert prompt == WEATHER_ARGS + "{}"  # not a JSON string of JSON


# -- tools / tool_choice --------------------------------------------------------------------


def test_tool_choice_resolution() -> None:
    specs = function_specs(TOOLS)
    assert [s.name for s in specs] == NAMES
    assert specs[1].parameters == {"type": "object", "properties": {}}
    assert resolve_tool_choice(None, specs).mode == "auto"
    assert resolve_tool_choice(None, []).mode == "none"
    assert resolve_tool_choice("required", specs).forces_call
    named = resolve_tool_choice({"type": "function", "function": {"name": "now"}}, specs)
    assert (named.mode, named.function) == ("required", "now")
    with pytest.raises(ToolSpecError) as err:
        resolve_tool_choice({"type": "function", "function": {"name": "nope"}}, specs)
    assert err.value.param == "tool_choice"
    with pytest.raises(ToolSpecError):
        resolve_tool_choice("sometimes", specs)
    with pytest.raises(ToolSpecError):
        function_specs([{"type": "function", "function": {"description": "no name"}}])
    with pytest.raises(ToolSpecError):
        function_specs([TOOLS[0], TOOLS[0]])


# -- grammars -------------------------------------------------------------------------------


def _hermes(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def test_required_forces_a_valid_hermes_call(ll_tokenizer: Any) -> None:
    grammar = tool_call_grammar(TOOLS, "required", "hermes", parallel=False)
    assert grammar is not None and grammar_error(grammar, ll_tokenizer) is None
    assert _accepts(ll_tokenizer, grammar, _hermes("get_weather", WEATHER_ARGS))
    assert _accepts(ll_tokenizer, grammar, _hermes("now", "{}"))
    # What the grammar rejects is what the model cannot write.
    assert not _accepts_a_prefix(ll_tokenizer, grammar, "Sure! " + _hermes("now", "{}"))
    assert not _accepts_a_prefix(ll_tokenizer, grammar, _hermes("get_wether", WEATHER_ARGS))
    assert not _accepts_a_prefix(ll_tokenizer, grammar, _hermes("get_weather", '{"city": 3}'))
    assert not _accepts_a_prefix(ll_tokenizer, grammar, _hermes("get_weather", '{"days": 9}'))
    assert not _accepts(ll_tokenizer, grammar, _hermes("get_weather", '{"days": 2}'))  # city
    # Arguments the function does not declare cannot be invented (the real model tried).
    extra = '{"city": "Paris", "type": "string"}'
    assert not _accepts_a_prefix(ll_tokenizer, grammar, _hermes("get_weather", extra))
    assert not _accepts(ll_tokenizer, grammar, "")  # ending the turn without a call
    two = _hermes("now", "{}") + "\n" + _hermes("now", "{}")
    assert not _accepts(ll_tokenizer, grammar, two)  # parallel_tool_calls false: one call
    # JSON spaced the way templates render it: no room for whitespace loops.
    assert not _accepts_a_prefix(ll_tokenizer, grammar, '<tool_call>\n{"name":"now"')
    assert not _accepts_a_prefix(ll_tokenizer, grammar, '<tool_call>\n{"name": "now",  \n')


def test_required_parallel_allows_several_calls(ll_tokenizer: Any) -> None:
    grammar = tool_call_grammar(TOOLS, "required", "hermes", parallel=True)
    assert grammar is not None
    two = _hermes("get_weather", WEATHER_ARGS) + "\n" + _hermes("now", "{}")
    assert _accepts(ll_tokenizer, grammar, two)
    # And what it accepts, the parser turns into calls.
    _, calls = ToolParserFactory("hermes").parse(two, NAMES)
    assert [c.name for c in calls] == NAMES


def test_named_function_forces_exactly_that_function(ll_tokenizer: Any) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    grammar = tool_call_grammar(TOOLS, choice, "hermes", parallel=True)
    assert grammar is not None
    assert _accepts(ll_tokenizer, grammar, _hermes("get_weather", '{"city": "Oslo"}'))
    assert not _accepts_a_prefix(ll_tokenizer, grammar, _hermes("now", "{}"))
    two = (
        _hermes("get_weather", '{"city": "Oslo"}')
        + "\n"
        + _hermes("get_weather", '{"city": "Rome"}')
    )
    assert not _accepts(ll_tokenizer, grammar, two)


def test_auto_and_none_constrain_nothing() -> None:
    assert tool_call_grammar(TOOLS, "auto", "hermes") is None
    assert tool_call_grammar(TOOLS, "none", "hermes") is None
    assert tool_call_grammar(TOOLS, None, "hermes") is None
    with pytest.raises(ToolSpecError):
        tool_call_grammar(TOOLS, {"type": "function", "function": {"name": "nope"}}, "hermes")


FAMILY_TEXTS = {
    # family: (a valid call for get_weather, one with the wrong name, one violating the schema)
    "llama3": (
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
        '{"name": "weather", "parameters": {"city": "Paris"}}',
        '{"name": "get_weather", "parameters": {"city": ["Paris"]}}',
    ),
    "mistral": (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]',
        '[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Paris"}}]',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 0}}]',
    ),
    "mistral_v11": (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}',
        '[TOOL_CALLS]weather[ARGS]{"city": "Paris"}',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "metric": "yes"}',
    ),
    "gemma4": (
        G4_WEATHER,
        f"<|tool_call>call:weather{{city:{Q}Paris{Q}}}<tool_call|>",
        "<|tool_call>call:get_weather{days:2}<tool_call|>",  # city is required
    ),
    "gemma": (
        '```tool_code\nget_weather(city="Paris", days=2)\n```',
        '```tool_code\nweather(city="Paris")\n```',
        "```tool_code\nget_weather(days=2)\n```",
    ),
}


@pytest.mark.parametrize("family", sorted(FAMILY_TEXTS))
def test_every_family_grammar_agrees_with_its_parser(ll_tokenizer: Any, family: str) -> None:
    valid, wrong_name, bad_args = FAMILY_TEXTS[family]
    grammar = tool_call_grammar(TOOLS, "required", family, parallel=False)
    assert grammar is not None and grammar_error(grammar, ll_tokenizer) is None
    assert _accepts(ll_tokenizer, grammar, valid)
    assert not _accepts_a_prefix(ll_tokenizer, grammar, wrong_name)
    assert not _accepts(ll_tokenizer, grammar, bad_args)
    content, calls = ToolParserFactory(family).parse(valid, NAMES)
    assert content is None
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", WEATHER_ARGS)]


def test_gemma_grammar_orders_keyword_arguments(ll_tokenizer: Any) -> None:
    grammar = tool_call_grammar(TOOLS, "required", "gemma", parallel=True)
    assert grammar is not None
    for args in ['city="A"', 'city="A", metric=true', 'city="A", days=3, metric=false']:
        assert _accepts(ll_tokenizer, grammar, f"```tool_code\nget_weather({args})\n```"), args
    assert _accepts(ll_tokenizer, grammar, '```tool_code\nnow()\nget_weather(city="A")\n```')
    assert not _accepts(
        ll_tokenizer, grammar, '```tool_code\nget_weather(metric=true, city="A")\n```'
    )


def test_reasoning_models_may_think_before_a_forced_call(ll_tokenizer: Any) -> None:
    call = _hermes("now", "{}")
    optional = tool_call_grammar(TOOLS, "required", "hermes", reasoning="optional")
    assert optional is not None and grammar_error(optional, ll_tokenizer) is None
    assert _accepts(
        ll_tokenizer, optional, "<think>\nThe user wants the time.\n</think>\n\n" + call
    )
    assert _accepts(ll_tokenizer, optional, call)
    assert not _accepts(ll_tokenizer, optional, "<think>\nI'll just answer.\n</think>\n\nNoon.")
    opened = tool_call_grammar(TOOLS, "required", "hermes", reasoning="open")
    assert opened is not None
    assert _accepts(ll_tokenizer, opened, "Time, then.\n</think>\n\n" + call)
    assert not _accepts(ll_tokenizer, opened, call)  # the open block must be closed first


def test_markers_that_are_special_tokens_are_forced_as_tokens(
    ll_tokenizer: Any, text_model: Any
) -> None:
    # In SmolLM2's vocabulary "[TOOL_CALLS]" is plain text; pretend <|im_start|> were it.
    special = text_model.tokenizer.token_to_id("<|im_start|>")
    ids = marker_token_ids("mistral", lambda t: {"[TOOL_CALLS]": special}.get(t), {special})
    assert ids == {"[TOOL_CALLS]": special}
    grammar = tool_call_grammar(TOOLS, "required", "mistral", special_tokens=ids)
    assert grammar is not None and f"<[{special}]>" in grammar
    body = '[{"name": "now", "arguments": {}}]'
    assert _accepts(ll_tokenizer, grammar, body, prefix=[special])
    assert not _accepts_a_prefix(ll_tokenizer, grammar, "[TOOL_CALLS]" + body)
    assert (
        marker_token_ids("hermes", text_model.tokenizer.token_to_id, text_model.special_ids) == {}
    )


def test_schemas_with_local_refs_still_compile(ll_tokenizer: Any) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "book",
                "parameters": {
                    "type": "object",
                    "$defs": {"day": {"type": "string", "enum": ["mon", "tue"]}},
                    "properties": {"on": {"$ref": "#/$defs/day"}},
                    "required": ["on"],
                },
            },
        }
    ]
    for family in ("hermes", "mistral", "gemma"):
        grammar = tool_call_grammar(tools, "required", family)
        assert grammar is not None and grammar_error(grammar, ll_tokenizer) is None, family
    grammar = tool_call_grammar(tools, "required", "hermes")
    assert grammar is not None
    assert _accepts(ll_tokenizer, grammar, _hermes("book", '{"on": "tue"}'))
    assert not _accepts(ll_tokenizer, grammar, _hermes("book", '{"on": "sun"}'))


def test_a_schema_that_allows_more_properties_keeps_allowing_them(ll_tokenizer: Any) -> None:
    params = {
        "type": "object",
        "properties": {"q": {"type": "string"}, "opts": {"type": "object", "properties": {}}},
        "additionalProperties": True,
    }
    tools = [{"type": "function", "function": {"name": "search", "parameters": params}}]
    grammar = tool_call_grammar(tools, "required", "hermes")
    assert grammar is not None
    assert _accepts(ll_tokenizer, grammar, _hermes("search", '{"q": "x", "lang": "en"}'))
    # A nested object that declares properties is still closed.
    assert not _accepts(ll_tokenizer, grammar, _hermes("search", '{"opts": {"a": 1}}'))
    assert tools[0]["function"]["parameters"] == params  # the client's schema is not mutated


def test_an_unusable_schema_is_reported_not_crashed_on(ll_tokenizer: Any) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]
    grammar = tool_call_grammar(tools, "required", "hermes")
    assert grammar is not None
    assert grammar_error(grammar, ll_tokenizer)
