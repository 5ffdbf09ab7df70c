"""One daemon per llmd home: an exclusive lock on ``<runtime>/llmd.lock``, held for the
daemon's life, with its pid inside (for `llmd stop`).

Why a lock as well as the socket check: two `llmd start` racing would both find no live
socket; the kernel's lock decides, and it is released even when the daemon is SIGKILLed."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from llmd.paths import Paths, ensure_private_dir


class AlreadyRunning(RuntimeError):
    """Another llmd serves this home."""


class InstanceLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> InstanceLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = read_pid(self.path)
            raise AlreadyRunning(
                f"another llmd is already running for this home (pid {pid or '?'}; "
                f"lock {self.path})"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the lock
            self._fd = None


def lock_path(paths: Paths) -> Path:
    return ensure_private_dir(paths.runtime) / "llmd.lock"


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def running_pid(paths: Paths) -> int | None:
    """The pid of the daemon holding this home's lock, or None when none holds it."""
    path = paths.runtime / "llmd.lock"
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_pid(path)  # held: a daemon runs
    finally:
        os.close(fd)  # a lock we got is dropped with the fd
    return None
