"""Which models are loaded: name -> ModelSupervisor (supervisor.py keeps each one served).

Policy, as Ollama users expect it: a model loads on its first request (or at start with
`--preload`), stays loaded for its keep-alive after its last request (the daemon's default, or
the request's `keep_alive`; never while requests or pinned sessions use it), and at most
`max_loaded` models and `memory_budget` bytes (weights file + KV budget per model) are held at
once: a load that would exceed either unloads the least recently used idle models first. A
load that cannot fit because every other model is busy is refused with 503 rather than left
waiting without bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from llmd.errors import bad_request, model_not_found, server_error
from llmd.limits import (
    DEFAULT_MAX_LOADED,
    available_host_memory,
    kv_budget_share,
    total_host_memory,
)
from llmd.runtime.keep_alive import DEFAULT_KEEP_ALIVE
from llmd.runtime.speculative import DEFAULT_MAX_DRAFT
from llmd.runtime.supervisor import ModelState, ModelSupervisor, RestartPolicy, TextSide
from llmd.runtime.worker_client import WorkerClient, WorkerError, WorkerLauncher
from llmd.store.catalog import install_hint
from llmd.store.manifests import ModelRecord
from llmd.store.model_store import ModelStore
from llmd.store.vocabulary import vocabulary_mismatch

if TYPE_CHECKING:
    from llmd.runtime.counters import Metrics

log = logging.getLogger("llmd.models")


def default_memory_budget() -> int:
    """80% of physical memory: the rest is the OS's and the user's."""
    return total_host_memory() * 4 // 5


class ModelRegistry:
    """name -> ModelSupervisor. One load at a time per name; concurrent first requests share
    it."""

    def __init__(
        self,
        store: ModelStore,
        *,
        load_text: Callable[[ModelRecord], TextSide],
        context_length: int | None = None,
        threads: int | None = None,
        launcher: WorkerLauncher | None = None,
        queue_limit: int | None = None,
        kv_budget_bytes: int | None = None,
        max_sequences: int | None = None,
        policy: RestartPolicy | None = None,
        keep_alive: float = DEFAULT_KEEP_ALIVE,
        max_loaded: int = DEFAULT_MAX_LOADED,
        memory_budget: int | None = None,
        speculative_max_draft: int = 0,
        kv_type: str | None = None,
        kv_disk_bytes: int = 0,
        kv_disk_dir: str | None = None,
        speculative_drafter: str = "ngram",
        draft_model: str | None = None,
    ) -> None:
        self.store = store
        # The model's text side (tokenizer, template) is the text layer's business: it hands
        # its loader in, which reads the files (off the event loop) or raises an ApiError.
        self.load_text = load_text
        self.speculative_max_draft = speculative_max_draft
        # `llmd serve --speculative MODE --draft-model NAME`: the default drafter, and the
        # draft model every model loads beside it (a model's own setting wins: ModelRecord).
        self.speculative_drafter = speculative_drafter
        self.draft_model = draft_model or ""
        self.context_length = context_length
        self.threads = threads
        self.launcher = launcher
        self.queue_limit = queue_limit
        self.kv_budget_bytes = kv_budget_bytes
        self.max_sequences = max_sequences
        self.kv_type = kv_type  # --kv-type; a model's own setting (ModelRecord.kv_type) wins
        self.kv_disk_bytes = kv_disk_bytes  # --kv-disk (0: off), shared by every model
        self.kv_disk_dir = kv_disk_dir
        self.policy = policy or RestartPolicy()
        self.keep_alive = keep_alive
        self.max_loaded = max_loaded
        self.memory_budget = memory_budget or default_memory_budget()
        # When a model's named sessions end (sessions.py): it is not unloaded before.
        self.pinned_until: Callable[[str], float] = lambda name: 0.0
        self.metrics: Metrics | None = None  # the app's, handed to each model it loads
        self._models: dict[str, ModelSupervisor] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._load_lock = asyncio.Lock()  # room-making and spawning, one model at a time

    def loaded(self) -> list[ModelSupervisor]:
        return list(self._models.values())

    async def get(self, name: str, keep_alive: float | None = None) -> ModelSupervisor:
        """The served model `name`, loading it first if needed (404 if unknown, 503 if it
        cannot load). The store is consulted on every request, so `llmd rm` or a re-pull
        under the same name takes effect at once."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            record = self.store.resolve(name)
            current = self._models.get(name)
            if current is not None and (record is None or record.path != current.record.path):
                await self.unload(name, why="its files changed")
                current = None
            elif current is not None and record.kv_type != current.record.kv_type:
                await self.unload(name, why="its KV type setting changed")
                current = None
            elif current is not None and record.draft_model != current.record.draft_model:
                await self.unload(name, why="its draft model setting changed")
                current = None
            if record is None:
                raise model_not_found(name, install_hint(name))
            if current is None:
                text = await asyncio.to_thread(self.load_text, record)
                draft_path, draft_problem = await asyncio.to_thread(self._draft_for, record)
                async with self._load_lock:
                    await self._make_room(record)
                    current = ModelSupervisor(
                        record,
                        text,
                        lambda: self._make_worker(record, draft_path),
                        self.policy,
                        keep_alive=self.keep_alive,
                    )
                    current.metrics = self.metrics
                    current.speculative_max_draft = self.speculative_max_draft
                    current.speculative_drafter = self.speculative_drafter
                    current.draft_model = record.draft_model or self.draft_model
                    current.draft_problem = draft_problem
                    if record.draft_model and draft_path:
                        # A model's own draft model is what it drafts with by default.
                        current.speculative_drafter = "draft_model"
                        current.speculative_max_draft = (
                            self.speculative_max_draft or DEFAULT_MAX_DRAFT
                        )
                    self._models[name] = current
                    current.touch(keep_alive)
                    await current.ensure_ready()
            current.touch(keep_alive)
        await current.ensure_ready()
        return current

    def _draft_for(self, record: ModelRecord) -> tuple[str | None, str]:
        """The draft model file `record` loads beside it, and why none where one is asked
        for but cannot draft for it. A model's own setting (`llmd set NAME --draft-model`)
        that cannot is a 400 at load; the server's `--draft-model` then only does not apply
        to this model (its status says why: it may serve models of other vocabularies)."""
        own = record.draft_model
        name = own or self.draft_model
        if not name or record.kind != "generate":
            return None, ""
        draft = self.store.resolve(name)
        problem = ""
        if draft is None:
            problem = f"draft model '{name}' is not installed"
        else:
            try:
                mismatch = vocabulary_mismatch(record.path, draft.path)
            except (OSError, ValueError) as exc:
                mismatch = f"its vocabulary could not be read: {exc}"
            if mismatch:
                problem = f"'{name}' cannot draft for '{record.name}': {mismatch}"
        if problem and own:
            raise bad_request(problem, param="model", code="draft_model_mismatch")
        if problem:
            log.warning("%s: server draft model not loaded: %s", record.name, problem)
            return None, problem
        assert draft is not None
        return str(draft.path), ""

    def _make_worker(self, record: ModelRecord, draft_path: str | None = None) -> WorkerClient:
        return WorkerClient(
            record.path,
            context_length=self.context_length,
            threads=self.threads,
            launcher=self.launcher,
            name=record.name,
            queue_limit=self.queue_limit,
            kv_budget_bytes=self.kv_budget_bytes,
            max_sequences=self.max_sequences,
            kv_type=record.kv_type or self.kv_type,
            kv_disk_bytes=self.kv_disk_bytes or None,
            kv_disk_dir=self.kv_disk_dir,
            model_digest=record.digest or None,
            draft_model=draft_path,
            mmproj=record.mmproj or None,
        )

    def _estimate(self, record: ModelRecord) -> int:
        kv = self.kv_budget_bytes or kv_budget_share(available_host_memory())
        return record.size + kv

    async def _make_room(self, record: ModelRecord) -> None:
        """Unload least-recently-used idle models until `record` fits the model count and
        the memory budget; 503 when busy models leave no room."""
        need = self._estimate(record)
        while True:
            held = [m for m in self._models.values() if m.state is not ModelState.FAILED]
            used = sum(m.footprint_bytes() for m in held)
            too_many = len(held) >= self.max_loaded
            too_big = held and used + need > self.memory_budget
            if not too_many and not too_big:
                return
            idle = [m for m in held if m.active == 0 and not _busy(m)]
            if not idle:
                busy = ", ".join(m.name for m in held)
                if too_many:
                    why = f"{len(held)} models are loaded (--max-loaded {self.max_loaded})"
                else:
                    why = (
                        f"it needs about {need / 2**30:.1f} GiB and {used / 2**30:.1f} GiB of "
                        f"the {self.memory_budget / 2**30:.1f} GiB budget (--memory-budget) "
                        "are held"
                    )
                raise server_error(
                    f"cannot load '{record.name}' now: {why} by models serving requests "
                    f"({busy}); retry when they finish",
                    code="insufficient_capacity",
                    status=503,
                )
            victim = min(idle, key=lambda m: m.last_used)
            await self.unload(victim.name, why="too many models" if too_many else "memory budget")

    async def unload(self, name: str, *, why: str = "requested") -> bool:
        model = self._models.pop(name, None)
        if model is None:
            return False
        log.info("unloading %s (%s)", name, why)
        await model.stop()
        return True

    @asynccontextmanager
    async def use(
        self, name: str, keep_alive: float | None = None
    ) -> AsyncIterator[ModelSupervisor]:
        """The served model for the length of one request: never unloaded meanwhile; its
        keep-alive counts from the request's end (`keep_alive` 0 unloads it right then)."""
        model = await self.get(name, keep_alive)
        model.active += 1
        try:
            yield model
        finally:
            model.active -= 1
            model.touch(keep_alive)
            if model.keep_alive == 0 and model.active == 0:
                await self.unload_expired()

    async def unload_expired(self) -> list[str]:
        """Unloads idle models past their keep-alive (and failed ones past their retry
        delay, so `status` does not list them forever); returns their names."""
        now = time.time()
        gone = []
        for m in list(self._models.values()):
            if m.active > 0 or _busy(m) or m.starting:
                continue
            deadline = m.expires_at()
            if m.keep_alive > 0:  # keep_alive 0: unload now, sessions or not
                deadline = max(deadline, self.pinned_until(m.name))
            if m.state is ModelState.FAILED:
                deadline = max(deadline, m.failed_until)
            if now >= deadline and self._models.get(m.name) is m:
                await self.unload(m.name, why="keep-alive expired")
                gone.append(m.name)
        return gone

    async def run_keep_alive(self, interval: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.unload_expired()
            except Exception:  # noqa: BLE001 - the sweeper must outlive any one failure
                log.exception("keep-alive sweep failed")

    def in_flight(self) -> int:
        return sum(m.active for m in self._models.values())

    async def close(self, reason: WorkerError | None = None) -> None:
        """Stop every worker (daemon shutdown); requests still running end with `reason`."""
        models = list(self._models.values())
        self._models.clear()
        await asyncio.gather(*(m.stop(reason) for m in models), return_exceptions=True)


def _busy(model: ModelSupervisor) -> bool:
    return model.worker is not None and model.worker.dead is None and model.worker.in_flight > 0
