"""Grammar-constrained decoding in the worker: llguidance matchers behind the engine's
TokenConstraint interface (allowed_tokens / accept, called from the engine thread).

Why llguidance: it computes a token mask for JSON schemas, Lark grammars and regexes in tens
of microseconds per step without torch (xgrammar needs torch, transformers and triton here),
and it handles tokenizer subtleties (byte-level BPE, tokens spanning grammar boundaries).
The worker builds the llguidance tokenizer from the model's own tokenizer (the same GGUF
fields the daemon reads), once, on the first constrained request (~1 s).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("llmd.worker.grammar")


class GrammarConstraint:
    """One request's matcher. The engine calls allowed_tokens() before sampling and
    accept(token) after; None from allowed_tokens ends the request (grammar complete)."""

    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    def allowed_tokens(self) -> bytes | None:
        m = self._matcher
        if m.is_stopped() or m.is_error():
            if m.is_error():
                log.warning("grammar matcher error: %s", m.get_error())
            return None
        return m.compute_bitmask()

    def accept(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            log.warning("grammar rejected sampled token %d: %s", token, self._matcher.get_error())


class GrammarFactory:
    """Builds constraints for one model (thread-safe: the reader thread calls it)."""

    def __init__(self, model_path: str, vocab_size: int) -> None:
        self._model_path = model_path
        self._vocab_size = vocab_size
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def _llg_tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                from pathlib import Path

                import llguidance

                from llmd.text.text_model import load_text_model

                text = load_text_model(Path(self._model_path))
                self._tokenizer = llguidance.LLTokenizer(
                    text.tokenizer.to_str(),
                    n_vocab=self._vocab_size,
                    eos_token=list(text.stop_token_ids),
                )
            return self._tokenizer

    def constraint(self, grammar: str) -> GrammarConstraint:
        """ValueError when the grammar does not compile."""
        import llguidance

        matcher = llguidance.LLMatcher(self._llg_tokenizer(), grammar)
        if matcher.is_error():
            raise ValueError(f"the grammar is invalid: {matcher.get_error()}")
        return GrammarConstraint(matcher)
