"""``tool_choice: auto`` with a lazy grammar: free text until the family's call marker, then
only a valid call to an offered function (checked with llguidance on the test model's
tokenizer, token by token), and what that costs per decoding step."""

from __future__ import annotations

from typing import Any

import pytest

from llmd.text.tools import grammar_error, lazy_tool_call_grammar, marker_token_ids

from .grammar_checks import accepts, accepts_a_prefix, accepts_ids, matcher

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                },
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now"}},
]
Q = '<|"|>'
# family: (a valid call to get_weather, one to a function not offered, one breaking the schema)
CALLS = {
    "hermes": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>',
        '<tool_call>\n{"name": "get_wether"',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 9',
    ),
    "qwen_xml": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_wether>",
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</function>",
    ),
    "mistral": (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]',
        '[TOOL_CALLS][{"name": "get_wether"',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"town": ',
    ),
    "mistral_v11": (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}',
        "[TOOL_CALLS]get_wether",
        '[TOOL_CALLS]get_weather[ARGS]{"city": 3',
    ),
    "gemma4": (
        f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:2}}<tool_call|>",
        "<|tool_call>call:get_wether",
        "<|tool_call>call:get_weather{days:2}<tool_call|>",
    ),
    "gemma": (
        '```tool_code\nget_weather(city="Paris", days=2)\n```',
        "```tool_code\nget_wether(",
        "```tool_code\nget_weather(days=2)\n```",
    ),
}
TEXT = "Let me check that for you {with braces} and <tags>.\n"


@pytest.mark.parametrize("family", sorted(CALLS))
def test_free_text_until_the_marker_then_only_a_valid_call(ll_tokenizer: Any, family: str) -> None:
    valid, wrong_name, bad_args = CALLS[family]
    for parallel in (True, False):
        grammar = lazy_tool_call_grammar(TOOLS, family, parallel)
        assert grammar_error(grammar, ll_tokenizer) is None
        assert accepts(ll_tokenizer, grammar, TEXT)  # no call at all
        assert accepts(ll_tokenizer, grammar, "")
        assert accepts(ll_tokenizer, grammar, TEXT + valid)
        assert not accepts_a_prefix(ll_tokenizer, grammar, TEXT + wrong_name)
        assert not accepts(ll_tokenizer, grammar, TEXT + bad_args)
        two = TEXT + valid + "\n" + valid
        assert accepts(ll_tokenizer, grammar, two) is parallel  # one call: the turn ends there
    # parallel: text may follow a call, and more calls
    grammar = lazy_tool_call_grammar(TOOLS, family, True)
    assert accepts(ll_tokenizer, grammar, valid + "\nDone." + valid)


def test_llama3_calls_are_the_whole_answer_or_none_of_it(ll_tokenizer: Any) -> None:
    valid = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    for parallel in (True, False):
        grammar = lazy_tool_call_grammar(TOOLS, "llama3", parallel)
        assert grammar_error(grammar, ll_tokenizer) is None
        assert accepts(ll_tokenizer, grammar, TEXT)  # text not starting with "{"
        assert accepts(ll_tokenizer, grammar, "\n" + valid)
        assert accepts(ll_tokenizer, grammar, "<|python_tag|>" + valid)
        assert not accepts_a_prefix(ll_tokenizer, grammar, '{"name": "get_wether"')
        assert not accepts_a_prefix(ll_tokenizer, grammar, '{"x": 1} is JSON')
        assert not accepts(ll_tokenizer, grammar, valid + " and text")
        assert accepts(ll_tokenizer, grammar, valid + "; " + valid) is parallel


def test_the_marker_in_free_text_starts_a_call_even_mid_token(ll_tokenizer: Any) -> None:
    """Fed token by token: every token is allowed before the marker (but the grammar moves
    along), and right after it only the call's forced opening is."""
    grammar = lazy_tool_call_grammar(TOOLS, "hermes")
    m = matcher(ll_tokenizer, grammar)
    ids = ll_tokenizer.tokenize_str(TEXT)
    vocab = ll_tokenizer.vocab_size
    for token in ids:
        mask = m.compute_bitmask()
        allowed = sum(bin(b).count("1") for b in mask[: vocab // 8])
        assert allowed > vocab * 0.9  # free text: anything but (most) special tokens
        assert m.consume_token(token)
    assert m.consume_tokens(ll_tokenizer.tokenize_str("<tool_call>"))
    mask = m.compute_bitmask()
    allowed = [t for t in range(vocab) if mask[t // 8] >> (t % 8) & 1]
    assert allowed and all(ll_tokenizer.decode_str([t])[:1] in "\n" for t in allowed), [
        ll_tokenizer.decode_str([t]) for t in allowed[:5]
    ]


def test_special_token_markers_are_triggers_as_tokens(ll_tokenizer: Any, text_model: Any) -> None:
    # In SmolLM2's vocabulary "[TOOL_CALLS]" is plain text; pretend <|im_start|> were it.
    special = text_model.tokenizer.token_to_id("<|im_start|>")
    ids = marker_token_ids("mistral_v11", lambda t: {"[TOOL_CALLS]": special}.get(t), {special})
    grammar = lazy_tool_call_grammar(TOOLS, "mistral_v11", special_tokens=ids)
    assert f"<[{special}]>" in grammar and grammar_error(grammar, ll_tokenizer) is None
    text = ll_tokenizer.tokenize_str(TEXT)
    call = ll_tokenizer.tokenize_str('get_weather[ARGS]{"city": "Paris"}')
    assert accepts_ids(ll_tokenizer, grammar, text + [special] + call + text + [special] + call)
    assert accepts_ids(ll_tokenizer, grammar, [special] + call)
    wrong = ll_tokenizer.tokenize_str('get_wether[ARGS]{"city": "Paris"}')
    assert not accepts_ids(ll_tokenizer, grammar, text + [special] + wrong)
    # the marker as text is only text when the model's marker is a token
    assert accepts(ll_tokenizer, grammar, TEXT + "[TOOL_CALLS]get_wether")


def test_a_marker_inside_the_thinking_is_not_a_call(ll_tokenizer: Any) -> None:
    valid, wrong_name, _ = CALLS["hermes"]
    grammar = lazy_tool_call_grammar(TOOLS, "hermes", reasoning="optional")
    assert grammar_error(grammar, ll_tokenizer) is None
    thought = "<think>\nMaybe " + wrong_name + "? No.\n</think>\n\n"
    assert accepts(ll_tokenizer, grammar, thought + valid)
    assert accepts(ll_tokenizer, grammar, thought + "It is sunny.")
    assert not accepts_a_prefix(ll_tokenizer, grammar, thought + wrong_name)
    assert accepts(ll_tokenizer, grammar, valid)  # thinking is optional
    opened = lazy_tool_call_grammar(TOOLS, "hermes", reasoning="open")
    assert accepts(ll_tokenizer, opened, "Maybe " + wrong_name + "\n</think>\n" + valid)
    assert not accepts_a_prefix(ll_tokenizer, opened, "Hm.\n</think>\n" + wrong_name)
