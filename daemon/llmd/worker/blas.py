"""Optimized BLAS for the worker on Linux.

The mlx-cpu wheel links the reference netlib BLAS, ~30x slower than OpenBLAS for the float
matmuls MLX still runs through BLAS (float-weight checkpoints, some attention shapes). The
worker is a child process, so the daemon can preload `cmeel-openblas` (standard ``cblas_*``
symbols) into it with ``LD_PRELOAD``. That library needs ``libgfortran.so.5``; where the system
lacks it, a private directory gets a ``libgfortran.so.5`` link to the copy the mlx-cpu (or
numpy) wheel already ships, and goes on ``LD_LIBRARY_PATH``. Nothing is installed system-wide.
"""

from __future__ import annotations

import ctypes.util
import glob
import os
import sys
import sysconfig
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
