"""The daemon's default limits and the parser for sizes given on its command line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Requests that may wait per model beyond its running sequences before new ones get HTTP 429.
DEFAULT_QUEUE_LIMIT = 64
DEFAULT_MAX_LOADED = 3  # models loaded at once, as Ollama on a CPU box
# KV cache element types (--kv-type, per model with `llmd set`): float16, or GGML's q8_0 /
# q4_0 blocks (~1.9x / ~3.6x the tokens of f16 in the same budget).
KV_TYPES = ("f16", "q8_0", "q4_0")
DEFAULT_KV_TYPE = "f16"

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


# The disk tier of the KV cache (--kv-disk): by default at most 20 GiB and at most a tenth of
# the space free where it lives when the daemon starts, so it never fills a small disk.
KV_DISK_DEFAULT_MAX = 20 << 30


def default_kv_disk(where: Path) -> int:
    """--kv-disk auto: min(20 GiB, a tenth of the free space of the filesystem of `where`)."""
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return 0
    return min(KV_DISK_DEFAULT_MAX, free // 10)


KV_BUDGET_MIN = 256 << 20
KV_BUDGET_MAX = 16 << 30


def available_host_memory() -> int:
    """Memory the OS could give a new process now (Linux MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    # macOS and others: half the physical memory as a stand-in for what is free.
    return total_host_memory() // 2


def total_host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def kv_budget_share(free: int) -> int:
    """The automatic KV budget: a quarter of `free`, clamped to [256 MiB, 16 GiB]."""
    return max(KV_BUDGET_MIN, min(KV_BUDGET_MAX, free // 4))


def process_rss(pid: int | str = "self") -> int | None:
    """Resident memory of a process: Linux /proc, else (macOS, which has no /proc) `ps`; None
    where neither can tell."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return None
    except OSError:
        pass
    if sys.platform != "darwin":
        return None
    target = str(os.getpid() if pid == "self" else pid)
    try:
        out = subprocess.run(
            ["ps", "-o", "rss=", "-p", target], capture_output=True, text=True, timeout=2
        )
        return int(out.stdout.strip()) * 1024 if out.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
