"""Unit-test fixtures: llguidance's view of the test model's tokenizer, for grammar tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def ll_tokenizer(text_model: Any) -> Any:
    llguidance = pytest.importorskip("llguidance")
    tk = text_model.tokenizer
    return llguidance.LLTokenizer(
        tk.to_str(), n_vocab=tk.get_vocab_size(), eos_token=text_model.stop_token_ids[0]
    )
