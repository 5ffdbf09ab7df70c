"""Text that agents put into their prompts for their own bookkeeping, which changes on every
request and means nothing to the model.

Why it matters: the prefix cache reuses KV only up to the first token that differs. Claude
Code's first system block is `x-anthropic-billing-header: cc_version=2.1.332.461;
cc_entrypoint=sdk-cli;` (its build hash part changes between runs and versions); kept in the
prompt, a second run over the same ~10k-token system prompt reused 27 tokens. Dropping such a
block is safe: Anthropic's own API strips it before the model sees it.

What else was looked for in the captured requests of Claude Code, Codex, opencode and
qwen-code (tests/fixtures/agents/): session ids travel in headers and `metadata`, not in the
prompt; dates in the system prompts ("Today's date: ...") change once a day, which the
cache can afford, and the model should see them. So the billing header is the one pattern.
"""

from __future__ import annotations

import re

# A whole text block that is only billing/attribution metadata.
_METADATA_BLOCK = re.compile(r"\A\s*x-anthropic-billing-header:[^\n]*\s*\Z")


def is_request_metadata(text: str) -> bool:
    """Whether a system text block is per-request metadata to leave out of the prompt."""
    return bool(_METADATA_BLOCK.match(text))
