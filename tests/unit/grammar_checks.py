"""What a tool-call grammar lets the model write, checked with llguidance on the test model's
tokenizer (shared by the tool-call grammar tests of every family)."""

from __future__ import annotations

from typing import Any


def accepts(ll_tokenizer: Any, grammar: str, text: str, *, prefix: list[int] | None = None) -> bool:
    """Whether the grammar lets the model write exactly `text` (after the token ids `prefix`)
    and then end its turn."""
    from llguidance import LLMatcher

    matcher = LLMatcher(ll_tokenizer, LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ids = (prefix or []) + ll_tokenizer.tokenize_str(text)
    return (
        matcher.consume_tokens(ids)
        and matcher.is_accepting()
        and matcher.consume_token(ll_tokenizer.eos_token)
    )


def accepts_a_prefix(ll_tokenizer: Any, grammar: str, text: str) -> bool:
    """Whether `text` is a possible start of what the grammar lets the model write."""
    from llguidance import LLMatcher

    matcher = LLMatcher(ll_tokenizer, LLMatcher.grammar_from_lark(grammar), log_level=0)
    ids = ll_tokenizer.tokenize_str(text)
    return matcher.validate_tokens(ids) == len(ids)


def matcher(ll_tokenizer: Any, grammar: str) -> Any:
    """A fresh llguidance matcher for `grammar` (asserted to compile)."""
    from llguidance import LLMatcher

    m = LLMatcher(ll_tokenizer, LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def accepts_ids(ll_tokenizer: Any, grammar: str, ids: list[int]) -> bool:
    """Whether the grammar lets the model write exactly the tokens `ids`, then end its turn."""
    m = matcher(ll_tokenizer, grammar)
    return m.consume_tokens(ids) and m.is_accepting() and m.consume_token(ll_tokenizer.eos_token)
