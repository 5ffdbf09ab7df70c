"""Loaded models: name -> (text side, worker). A model's worker is spawned on its first
request; a dead worker is replaced on the next one. (Keep-alive, unloading and restart with
backoff arrive with the lifecycle issue.)"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from .catalog import install_hint
from .errors import ApiError, model_not_found, server_error
from .store import ModelRecord, ModelStore
from .text_model import TextModel, load_text_model
from .tokenizer import UnsupportedTokenizer
from .worker_client import WorkerClient, WorkerError, WorkerLauncher

log = logging.getLogger("llmd.models")


@dataclass
class LoadedModel:
    """A model ready to serve: its text side (daemon) and its worker (tokens)."""

    record: ModelRecord
    text: TextModel
    worker: WorkerClient
    loaded_at: float = field(default_factory=time.time)

    @property
    def context_length(self) -> int:
        assert self.worker.ready is not None
        return self.worker.ready.context_length


class ModelRegistry:
    """name -> LoadedModel. One load at a time per name; concurrent first requests share it."""

    def __init__(
        self,
        store: ModelStore,
        *,
        context_length: int | None = None,
        threads: int | None = None,
        launcher: WorkerLauncher | None = None,
        queue_limit: int | None = None,
        kv_budget_bytes: int | None = None,
        max_sequences: int | None = None,
    ) -> None:
        self.store = store
        self.context_length = context_length
        self.threads = threads
        self.launcher = launcher
        self.queue_limit = queue_limit
        self.kv_budget_bytes = kv_budget_bytes
        self.max_sequences = max_sequences
        self._loaded: dict[str, LoadedModel] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def loaded(self) -> list[LoadedModel]:
        return list(self._loaded.values())

    async def get(self, name: str) -> LoadedModel:
        """The loaded model `name`, spawning its worker first if needed (404 if unknown).

        The store is consulted on every request, so `llmd rm` or a re-pull under the same name
        takes effect at once: the old worker is stopped and, for a re-pull, a new one started.
        """
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            record = self.store.resolve(name)
            current = self._loaded.get(name)
            if current is not None and (record is None or record.path != current.record.path):
                del self._loaded[name]
                await current.worker.stop()
                current = None
            if record is None:
                raise model_not_found(name, install_hint(name))
            if current is not None and current.worker.dead is None:
                return current
            # A dead worker is replaced; its text side is still good.
            loaded = await self._load(record, current.text if current is not None else None)
            self._loaded[name] = loaded
            return loaded

    async def _load(self, record: ModelRecord, text: TextModel | None) -> LoadedModel:
        if text is None:
            text = await self._load_text(record)
        if not text.chat_template:
            log.warning("model %s has no chat template; chat requests will be refused", record.name)
        worker = WorkerClient(
            record.path,
            context_length=self.context_length,
            threads=self.threads,
            launcher=self.launcher,
            name=record.name,
            queue_limit=self.queue_limit,
            kv_budget_bytes=self.kv_budget_bytes,
            max_sequences=self.max_sequences,
        )
        started = time.perf_counter()
        try:
            ready = await worker.start()
        except WorkerError as exc:
            log.warning("model %s failed to load: %s (%s)", record.name, exc.message, exc.code)
            raise server_error(
                f"model '{record.name}' failed to load: {exc.message}", code=exc.code, status=503
            ) from exc
        log.info(
            "loaded %s in %.0f ms: backend=%s kernels=%s blas=%s threads=%d",
            record.name,
            (time.perf_counter() - started) * 1000,
            ready.backend,
            ready.kernels.get("isa"),
            ready.blas,
            ready.threads,
        )
        return LoadedModel(record=record, text=text, worker=worker)

    async def _load_text(self, record: ModelRecord) -> TextModel:
        try:
            return await asyncio.to_thread(load_text_model, Path(record.path))
        except UnsupportedTokenizer as exc:
            raise ApiError(
                400, f"model '{record.name}' cannot be served: {exc}", param="model"
            ) from exc
        except (OSError, ValueError, KeyError) as exc:
            raise server_error(
                f"model '{record.name}' could not be read from {record.path}: {exc}",
                code="model_load_failed",
            ) from exc

    async def close(self) -> None:
        """Stop every worker (daemon shutdown)."""
        await asyncio.gather(
            *(m.worker.stop() for m in self._loaded.values()), return_exceptions=True
        )
        self._loaded.clear()
