"""Qwen3.5 / Qwen3-Coder tool calls (``<function=...>`` XML inside ``<tool_call>``): chosen from
the template, parsed the same whole or streamed at any split, values typed by the tool's
schema, forced by a grammar in the same syntax, and earlier calls rendered back through the
model's own template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmd.text.chat_output import ChatOutputPlan
from llmd.text.chat_template import render_chat
from llmd.text.reasoning import THINK
from llmd.text.tools import (
    ContentDelta,
    ToolCallArguments,
    ToolCallStart,
    ToolParserFactory,
    function_specs,
    grammar_error,
    plan_tools,
    template_messages,
    tool_call_grammar,
)
from llmd.text.tools.qwen_xml import parameter_value

from .grammar_checks import accepts as _accepts
from .grammar_checks import accepts_a_prefix as _accepts_a_prefix

# A minimal Qwen3.5-style template (written for these tests): tools as JSON in the system
# turn, assistant calls in the XML form, values rendered as Qwen3.5's template renders them
# (objects and lists as JSON, everything else with `string`), a `<think>` opened for the answer.
QWEN35_STYLE_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\nTo call a function reply with:\\n<tool_call>\\n<function=name>\\n"
    "<parameter=key>\\nvalue\\n</parameter>\\n</function>\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- set call = tool_call.function %}"
    "{%- if not loop.first or message.content %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n<function=' + call.name + '>\\n' }}"
    "{%- for name, value in call.arguments | items %}"
    "{{- '<parameter=' + name + '>\\n' }}"
    "{%- if value is mapping or (value is sequence and value is not string) %}"
    "{{- value | tojson }}{%- else %}{{- value | string }}{%- endif %}"
    "{{- '\\n</parameter>\\n' }}"
    "{%- endfor %}"
    "{{- '</function>\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response>"
    "<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)

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
                    "hours": {"type": "array", "items": {"type": "integer"}},
                    "options": {"type": "object"},
                },
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "description": "The current time"}},
]
NAMES = ["get_weather", "now"]
SCHEMAS = {s.name: s.parameters for s in function_specs(TOOLS)}
XML = ToolParserFactory("qwen_xml")


def _assistant_text(calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
    """What the model writes for `calls`: the template's own rendering of them as history."""
    message = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for i, (name, args) in enumerate(calls)
        ],
    }
    rendered = render_chat(
        QWEN35_STYLE_TEMPLATE,
        template_messages([message]),
        bos_token="",
        eos_token="",
        add_generation_prompt=False,
    )
    prefix, suffix = "<|im_start|>assistant\n", "<|im_end|>\n"
    assert rendered.startswith(prefix) and rendered.endswith(suffix)
    return rendered[len(prefix) : -len(suffix)]


WEATHER_ARGS = {
    "city": "New York",
    "days": 3,
    "metric": True,
    "hours": [9, 12],
    "options": {"wind": True, "units": "metric"},
}


def _streamed(text: str, pieces: list[str]) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    parser = XML(NAMES, schemas=SCHEMAS)
    events = [e for piece in pieces for e in parser.feed(piece)] + parser.flush()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    args: dict[int, str] = {}
    for e in events:
        if isinstance(e, ToolCallArguments):
            args[e.index] = args.get(e.index, "") + e.fragment
    return content, [(s.name, json.loads(args[s.index])) for s in starts]


def test_a_qwen35_template_selects_the_xml_parser_and_renders_tools_itself() -> None:
    plan = plan_tools(QWEN35_STYLE_TEMPLATE, "qwen3_5_moe")
    assert (plan.family, plan.template_renders_tools) == ("qwen_xml", True)
    assert plan.parser.visible_tokens == ("<tool_call>", "</tool_call>")
    # A plain Hermes template (JSON inside <tool_call>) keeps the Hermes parser.
    hermes = "{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>"
    assert plan_tools(hermes, "qwen3").family == "hermes"


def test_a_rendered_call_parses_back_with_values_typed_by_the_schema() -> None:
    text = _assistant_text([("get_weather", WEATHER_ARGS)], "Let me look that up.")
    assert "<parameter=city>\nNew York\n</parameter>" in text
    assert "<parameter=metric>\nTrue\n</parameter>" in text  # Python's spelling, as Qwen3.5's
    content, calls = XML.parse(text, NAMES, schemas=SCHEMAS)
    assert content == "Let me look that up."
    assert [(c.name, c.arguments_dict()) for c in calls] == [("get_weather", WEATHER_ARGS)]


def test_streamed_at_every_split_equals_the_whole_parse() -> None:
    text = _assistant_text(
        [("get_weather", {"city": "Oslo", "days": 2}), ("now", {})], "Checking both."
    )
    whole = ("Checking both.", [("get_weather", {"city": "Oslo", "days": 2}), ("now", {})])
    assert _streamed(text, [text]) == whole
    for i in range(len(text) + 1):
        assert _streamed(text, [text[:i], text[i:]]) == whole, i
    assert _streamed(text, list(text)) == whole


def test_several_calls_and_text_before_them() -> None:
    calls = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"}), ("now", {})]
    text = "I'll check three things.\n\n" + _assistant_text(calls)
    content, parsed = XML.parse(text, NAMES, schemas=SCHEMAS)
    assert content == "I'll check three things."
    assert [(c.name, c.arguments_dict()) for c in parsed] == calls
    assert len({c.id for c in parsed}) == 3
    # parallel_tool_calls false: the first call only.
    _, first = XML.parse(text, NAMES, parallel=False, schemas=SCHEMAS)
    assert [c.arguments_dict() for c in first] == [{"city": "Paris"}]


def test_a_string_parameter_keeps_its_text_exactly() -> None:
    code = "def f(x):\n    return x * 2\n"
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n"
        + code
        + "\n</parameter>\n</function>\n</tool_call>"
    )
    _, calls = XML.parse(text, NAMES, schemas=SCHEMAS)
    assert calls[0].arguments_dict() == {"city": code}  # inner newlines and indentation kept


@pytest.mark.parametrize(
    ("raw", "schema", "value"),
    [
        ("\n42\n", {"type": "string"}, "42"),  # a string stays text, even when it looks numeric
        ("\n42\n", {"type": "integer"}, 42),
        ("\n2.5\n", {"type": "number"}, 2.5),
        ("\nfalse\n", {"type": "boolean"}, False),
        ("\nTrue\n", {"type": "boolean"}, True),
        ('\n{"a": [1, 2]}\n', {"type": "object"}, {"a": [1, 2]}),
        ("\n[1, 2]\n", {"type": "array"}, [1, 2]),
        ("\nnull\n", {"type": ["integer", "null"]}, None),
        ("\nthree\n", {"type": "integer"}, "three"),  # does not parse: the raw string
        ("\n{not json\n", {"type": "object"}, "{not json"),
        ("\n7\n", {"anyOf": [{"type": "string"}, {"type": "integer"}]}, 7),
        ("\nseven\n", {"anyOf": [{"type": "string"}, {"type": "integer"}]}, "seven"),
        ("\n12\n", None, "12"),  # a parameter the schema does not declare: a string
        ("\n\n", {"type": "string"}, ""),
    ],
)
def test_values_are_typed_by_the_schema(raw: str, schema: Any, value: Any) -> None:
    assert parameter_value(raw, schema) == value


def test_unknown_functions_and_malformed_blocks_are_text() -> None:
    unknown = "<tool_call>\n<function=launch>\n</function>\n</tool_call>"
    assert XML.parse(unknown, NAMES, schemas=SCHEMAS) == (unknown, [])
    stray = "<tool_call>\n<function=now>\nsome words\n</function>\n</tool_call>"
    assert XML.parse(stray, NAMES, schemas=SCHEMAS) == (stray, [])
    json_body = '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    assert XML.parse(json_body, NAMES, schemas=SCHEMAS)[1] == []
    # Without tools markup the answer is untouched.
    assert XML.parse("Use <function=x> syntax.", NAMES) == ("Use <function=x> syntax.", [])


def test_a_call_cut_off_before_its_closing_tags_still_counts() -> None:
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nLima\n</parameter>\n"
    _, calls = XML.parse(text, NAMES, schemas=SCHEMAS)
    assert [c.arguments_dict() for c in calls] == [{"city": "Lima"}]
    cut = "<tool_call>\n<function=get_weather>\n<parameter=ci"
    assert XML.parse(cut, NAMES, schemas=SCHEMAS) == (cut, [])


def test_history_calls_render_through_the_template_as_xml() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    # OpenAI clients send arguments as a JSON string; the template iterates
                    # them as a mapping.
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "days": 2}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    rendered = render_chat(
        QWEN35_STYLE_TEMPLATE,
        template_messages(messages),
        bos_token="",
        eos_token="",
        tools=TOOLS,
    )
    assert (
        "<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>\n"
    ) in rendered
    assert rendered.endswith("<|im_start|>assistant\n<think>\n")


def test_the_answer_of_a_thinking_qwen35_model_splits_into_reasoning_and_calls() -> None:
    answer = "The user wants weather.\n</think>\n\n" + _assistant_text(
        [("get_weather", {"city": "Oslo", "days": 2})]
    )
    plan = ChatOutputPlan(
        split_reasoning=True,
        starts_in_reasoning=True,
        tools=XML,
        function_names=tuple(NAMES),
        reasoning_markers=THINK,
        schemas=SCHEMAS,
    )
    message, finish = plan.whole(answer, "stop")
    assert message["reasoning_content"] == "The user wants weather."
    assert message["content"] is None and finish == "tool_calls"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Oslo",
        "days": 2,
    }
    stream = plan.stream()
    deltas = [d for ch in answer for d in stream.feed(ch)] + stream.finish("stop")[0]
    args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d)
    assert json.loads(args) == {"city": "Oslo", "days": 2}


# -- forced calls ---------------------------------------------------------------------------


def _call(name: str, params: str = "") -> str:
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _param(name: str, value: str) -> str:
    return f"<parameter={name}>\n{value}\n</parameter>\n"


def test_required_forces_a_call_in_the_xml_syntax(ll_tokenizer: Any) -> None:
    grammar = tool_call_grammar(TOOLS, "required", "qwen_xml", parallel=False)
    assert grammar is not None and grammar_error(grammar, ll_tokenizer) is None
    # What the template renders is what the grammar allows, and it parses back.
    rendered = _assistant_text([("get_weather", {"city": "New York", "days": 3})])
    assert _accepts(ll_tokenizer, grammar, rendered)
    assert _accepts(ll_tokenizer, grammar, _call("now"))
    multiline = _call("get_weather", _param("city", "Paris\nTexas"))
    assert _accepts(ll_tokenizer, grammar, multiline)
    assert XML.parse(multiline, NAMES, schemas=SCHEMAS)[1][0].arguments_dict() == {
        "city": "Paris\nTexas"
    }
    # What it rejects the model cannot write.
    assert not _accepts_a_prefix(ll_tokenizer, grammar, "Sure! " + _call("now"))
    assert not _accepts_a_prefix(ll_tokenizer, grammar, _call("get_wether"))
    assert not _accepts(ll_tokenizer, grammar, _call("get_weather"))  # city is required
    days9 = _call("get_weather", _param("city", "Oslo") + _param("days", "9"))
    assert not _accepts_a_prefix(ll_tokenizer, grammar, days9)  # the schema's maximum
    days_text = _call("get_weather", _param("city", "Oslo") + _param("days", "three"))
    assert not _accepts_a_prefix(ll_tokenizer, grammar, days_text)
    extra = _call("get_weather", _param("city", "Oslo") + _param("country", "NO"))
    assert not _accepts_a_prefix(ll_tokenizer, grammar, extra)  # not a declared parameter
    assert not _accepts(ll_tokenizer, grammar, "")
    assert not _accepts(ll_tokenizer, grammar, _call("now") + "\n" + _call("now"))


def test_parallel_and_named_choices(ll_tokenizer: Any) -> None:
    grammar = tool_call_grammar(TOOLS, "required", "qwen_xml", parallel=True)
    assert grammar is not None
    two = _call("get_weather", _param("city", "Oslo")) + "\n" + _call("now")
    assert _accepts(ll_tokenizer, grammar, two)
    assert [c.name for c in XML.parse(two, NAMES, schemas=SCHEMAS)[1]] == NAMES
    named = tool_call_grammar(
        TOOLS, {"type": "function", "function": {"name": "now"}}, "qwen_xml", parallel=True
    )
    assert named is not None
    assert _accepts(ll_tokenizer, named, _call("now"))
    assert not _accepts_a_prefix(ll_tokenizer, named, _call("get_weather"))


def test_a_forced_call_after_the_prompt_opened_think(ll_tokenizer: Any) -> None:
    grammar = tool_call_grammar(TOOLS, "required", "qwen_xml", reasoning="open")
    assert grammar is not None
    assert _accepts(ll_tokenizer, grammar, "Need the time.\n</think>\n\n" + _call("now"))
    assert not _accepts_a_prefix(ll_tokenizer, grammar, "Need it.</think>\n\nNo call.")


# -- the real templates, where llama.cpp's sources are on disk (not committed here) ---------

LLAMACPP_TEMPLATES = (
    Path(__file__).parents[2]
    / "bench/.llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates"
)


@pytest.mark.parametrize("name", ["Qwen3.5-4B.jinja", "Qwen3-Coder.jinja"])
def test_real_qwen_templates_round_trip_a_call(name: str) -> None:
    path = LLAMACPP_TEMPLATES / name
    if not path.exists():
        pytest.skip(f"{name} is not on disk")
    template = path.read_text(encoding="utf-8")
    assert plan_tools(template, None).family == "qwen_xml"
    args = {"city": "Paris", "days": 2, "metric": False, "hours": [9], "options": {"a": 1}}
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(args)},
                }
            ],
        },
    ]
    rendered = render_chat(
        template,
        template_messages(messages),
        bos_token="",
        eos_token="",
        add_generation_prompt=False,
        tools=TOOLS,
    )
    turn = rendered.rsplit("<|im_start|>assistant\n", 1)[1].split("<|im_end|>")[0]
    turn = turn.split("</think>")[-1]  # Qwen3.5 writes an empty think block in the last turn
    content, calls = XML.parse(turn, NAMES, schemas=SCHEMAS)
    assert content is None
    assert [(c.name, c.arguments_dict()) for c in calls] == [("get_weather", args)]
