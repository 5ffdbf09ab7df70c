"""The daemon's default limits and the parser for sizes given on its command line."""

from __future__ import annotations

import re

# Requests that may wait per model beyond its running sequences before new ones get HTTP 429.
DEFAULT_QUEUE_LIMIT = 64

_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


def parse_size(text: str) -> int:
    """'2GiB' -> 2147483648, '512MB' -> 512000000, '4096' -> 4096 (bytes)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"'{text}' is not a size (examples: 2GiB, 512MB, 1048576)")
    number, unit, binary = m.groups()
    scale = 1024 ** "kmgt".index(unit.lower()) * 1024 if binary and unit else _UNITS[unit.lower()]
    value = int(float(number) * scale)
    if value <= 0:
        raise ValueError(f"'{text}' must be more than 0 bytes")
    return value
