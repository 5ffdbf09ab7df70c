"""Optimized BLAS for the worker on Linux.

The mlx-cpu wheel links the reference netlib BLAS, ~30x slower than OpenBLAS for the float
matmuls MLX still runs through BLAS (float-weight checkpoints, some attention shapes). The
worker is a child process, so the daemon can preload `cmeel-openblas` (standard ``cblas_*``
symbols) into it with ``LD_PRELOAD``. That library needs ``libgfortran.so.5``; where the system
lacks it, a private directory gets a ``libgfortran.so.5`` link to the copy the mlx-cpu (or
numpy) wheel already ships, and goes on ``LD_LIBRARY_PATH``. Nothing is installed system-wide.
The library is preloaded only where its build target runs on this CPU (openblas_runs_here).
"""

from __future__ import annotations

import ctypes.util
import functools
import glob
import os
import platform
import re
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path


def _site_packages() -> list[Path]:
    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    return [Path(p) for p in paths]


def find_openblas() -> Path | None:
    for sp in _site_packages():
        for candidate in (
            sp / "cmeel.prefix" / "lib" / "libopenblas.so.0",
            sp / "cmeel.prefix" / "lib" / "libopenblas.so",
        ):
            if candidate.exists():
                return candidate
    return None


# What each OpenBLAS build target executes beyond x86-64 baseline (its kernels are compiled
# for it; only a DYNAMIC_ARCH build picks kernels at run time). cmeel-openblas 0.3.31 ships a
# SKYLAKEX-only build whose sgemm kernels use AVX-512: preloaded on an AVX2-only CPU, the
# worker died of SIGILL in its first float matmul. pyproject pins 0.3.29 (a ZEN build: AVX2,
# which AVX-512 CPUs run too); this check keeps any other build from being preloaded where it
# cannot run.
_TARGET_FLAGS = {
    "SKYLAKEX": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"},
    "COOPERLAKE": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_bf16"},
    "SAPPHIRERAPIDS": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"},
    "HASWELL": {"avx2", "fma"},
    "ZEN": {"avx2", "fma"},
    "SANDYBRIDGE": {"avx"},
    "NEHALEM": {"sse4_2"},
    "PRESCOTT": set(),
}
_CONFIG = re.compile(rb"OpenBLAS \d+\.\d+\.\d+[ A-Za-z0-9_=.]*")


def _is_word_byte(byte: bytes) -> bool:
    return byte.isalnum() or byte == b"_"


def _names_as_words(data: bytes, names: Iterable[str]) -> frozenset[str]:
    """The names that occur in `data` as whole words (regex ``\\b`` semantics). A substring
    search per name, not one alternation regex: over a 17 MB library the regex took ~0.5 s of
    every daemon's first model load, `bytes.find` ~0.08 s."""
    found = set()
    for name in names:
        word = name.encode()
        at = data.find(word)
        while at != -1:
            before = data[at - 1 : at]  # b"" at the start: data[-1:0] is empty
            after = data[at + len(word) : at + len(word) + 1]
            if not _is_word_byte(before) and not _is_word_byte(after):
                found.add(name)
                break
            at = data.find(word, at + 1)
    return frozenset(found)


@functools.cache  # the daemon asks at every worker start; the file does not change
def openblas_build(library: Path) -> tuple[bool, frozenset[str]] | None:
    """Whether an OpenBLAS library is a DYNAMIC_ARCH build, and the x86 targets it names, read
    from the file (the start of the configuration string openblas_get_config() returns, and
    the core names it embeds) so the daemon never loads a library that may not run here."""
    try:
        data = library.read_bytes()
    except OSError:
        return None
    config = _CONFIG.search(data)
    if config is None:
        return None
    dynamic = b"DYNAMIC_ARCH" in config.group()
    return dynamic, _names_as_words(data, _TARGET_FLAGS)


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def openblas_runs_here(
    build: tuple[bool, frozenset[str]] | None, flags: set[str], machine: str
) -> bool:
    """Whether an OpenBLAS build can run on this CPU: a DYNAMIC_ARCH build anywhere; a fixed
    x86 build only where the CPU has every instruction set its targets need; arm64 builds on
    arm64. Unknown builds are not preloaded (a wrong guess kills every worker)."""
    if build is None:
        return False
    dynamic, targets = build
    if dynamic or machine in ("aarch64", "arm64"):
        return True
    if not targets:
        return False
    needed = set().union(*(_TARGET_FLAGS[t] for t in targets))
    return needed <= flags


def _bundled_gfortran() -> Path | None:
    for sp in _site_packages():
        for pattern in ("mlx_cpu.libs/libgfortran-*.so.5*", "numpy.libs/libgfortran-*.so.5*"):
            hits = sorted(glob.glob(str(sp / pattern)))
            if hits:
                return Path(hits[0])
    return None


def _system_has_gfortran() -> bool:
    return ctypes.util.find_library("gfortran") is not None


def _link(link: Path, target: Path) -> None:
    """Atomically point `link` at `target` (safe when several daemons race)."""
    if link.is_symlink() and link.resolve() == target.resolve():
        return
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


def blas_environment(shim_dir: Path) -> dict[str, str]:
    """Environment variables that make the worker use OpenBLAS; empty where not applicable."""
    if not sys.platform.startswith("linux"):
        return {}  # macOS: MLX uses Accelerate
    openblas = find_openblas()
    if openblas is None:
        return {}
    if not openblas_runs_here(openblas_build(openblas), cpu_flags(), platform.machine()):
        return {}  # MLX's own BLAS: slow for float matmuls, but it runs
    env: dict[str, str] = {"LD_PRELOAD": str(openblas)}
    if not _system_has_gfortran():
        bundled = _bundled_gfortran()
        if bundled is None:
            return {}
        shim_dir.mkdir(parents=True, exist_ok=True)
        _link(shim_dir / "libgfortran.so.5", bundled)
        # The bundled copy finds its renamed libquadmath through $ORIGIN, which the loader
        # takes from the link's directory: link its neighbours too.
        for neighbour in bundled.parent.glob("libquadmath-*"):
            _link(shim_dir / neighbour.name, neighbour)
        existing = os.environ.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = str(shim_dir) + (os.pathsep + existing if existing else "")
    return env


def loaded_blas() -> str:
    """Which BLAS this process actually mapped (read from /proc/self/maps)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "system"
    if "libopenblas" in maps:
        return "openblas"
    if "libblas" in maps:
        return "reference"
    return "accelerate" if sys.platform == "darwin" else "unknown"
