"""Where llmd keeps its state. Everything lives under platformdirs' per-user directories,
or under ``$LLMD_HOME`` when set (tests and relocations use it): ``$LLMD_HOME/data`` (models),
``cache``, ``logs`` and ``run`` (the Unix socket).

The API listens on 127.0.0.1:7477 by default: a port no well-known local server uses (Ollama
11434, LM Studio 1234, llama-server 8080, vLLM 8000, Jupyter 8888).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import platformdirs

DEFAULT_PORT = 7477  # collides with no well-known local server (Ollama 11434, LM Studio 1234, ...)
DEFAULT_HOST = "127.0.0.1"
_SOCKET_PATH_LIMIT = 107  # sun_path is 108 bytes including the NUL


@dataclass(frozen=True)
class Paths:
    """The directories of one llmd home."""

    data: Path  # models and manifests
    cache: Path
    logs: Path
    runtime: Path  # socket, pid files

    @property
    def models(self) -> Path:
        return self.data / "models"

    @property
    def manifests(self) -> Path:
        return self.models / "manifests"

    @property
    def blobs(self) -> Path:
        return self.models / "blobs"

    @property
    def kv_disk(self) -> Path:
        """The disk tier of the models' KV caches (blocks by model digest, KV type and prefix):
        a cache, safe to delete while no daemon runs."""
        return self.cache / "kv"

    @property
    def socket(self) -> Path:
        """``<runtime>/llmd.sock``; where that passes the 107-byte limit of a socket path, a
        short one in a private per-user temp dir, derived from the long one (so every llmd
        command of this home finds the same socket)."""
        preferred = self.runtime / "llmd.sock"
        if len(str(preferred).encode()) <= _SOCKET_PATH_LIMIT:
            return preferred
        digest = hashlib.sha256(str(preferred).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"llmd-{os.getuid()}" / f"{digest}.sock"


def get_paths() -> Paths:
    """The paths of this user's llmd, relocated wholesale by ``$LLMD_HOME``."""
    home = os.environ.get("LLMD_HOME")
    if home:
        root = Path(home).expanduser().resolve()
        return Paths(
            data=root / "data", cache=root / "cache", logs=root / "logs", runtime=root / "run"
        )
    with warnings.catch_warnings():
        # Without XDG_RUNTIME_DIR platformdirs falls back to a private /tmp dir: that is fine.
        warnings.simplefilter("ignore")
        runtime = platformdirs.user_runtime_dir("llmd", ensure_exists=False)
    return Paths(
        data=Path(platformdirs.user_data_dir("llmd")),
        cache=Path(platformdirs.user_cache_dir("llmd")),
        logs=Path(platformdirs.user_log_dir("llmd")),
        runtime=Path(runtime),
    )


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (mode 0700) if needed: the socket's directory must be ours alone. A dir
    someone else created (e.g. in a shared /tmp) is refused rather than trusted."""
    path.mkdir(parents=True, exist_ok=True)
    if path.stat().st_uid != os.getuid():
        raise PermissionError(
            f"{path} belongs to another user; refusing to put llmd's socket there"
        )
    os.chmod(path, 0o700)
    return path
