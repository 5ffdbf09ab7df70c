"""Markers (``<think>``, ``<tool_call>``, ``[TOOL_CALLS]``...) in text that arrives in pieces.

A detokenizer splits text anywhere, so a marker can arrive in halves. Streaming parsers hold
back only the tail of their buffer that could still grow into a marker, and release it the
moment it cannot: text is never delayed longer than the markers require.
"""

from __future__ import annotations


def held_suffix_len(text: str, *markers: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`
    (the part that must wait for the next delta before anyone can tell what it is)."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if marker.startswith(text[len(text) - n :]):
                best = n
                break
    return best


def split_held(text: str, *markers: str) -> tuple[str, str]:
    """`text` as (safe to release now, held back because a marker may be starting)."""
    keep = held_suffix_len(text, *markers)
    return text[: len(text) - keep], text[len(text) - keep :]
