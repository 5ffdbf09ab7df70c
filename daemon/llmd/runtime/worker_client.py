"""The daemon's side of one worker process: spawn it, wait for ``ready``, multiplex requests
by id over its stdin/stdout, and turn its death into errors for whoever was waiting - the
daemon itself never dies with a worker."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from llmd.runtime import protocol as p

log = logging.getLogger("llmd.worker")

_ids = itertools.count(1)


class WorkerLauncher(Protocol):
    """Builds argv and env of a worker process; `llmd.runtime.worker_launch.worker_command` in
    production, a fake worker in the daemon's unit tests."""

    def __call__(
        self,
        model_path: str,
        *,
        context_length: int | None = None,
        threads: int | None = None,
        kv_budget_bytes: int | None = None,
        max_sequences: int | None = None,
        kv_type: str | None = None,
        kv_disk_bytes: int | None = None,
        kv_disk_dir: str | None = None,
        model_digest: str | None = None,
        draft_model: str | None = None,
        mmproj: str | None = None,
    ) -> tuple[list[str], dict[str, str]]: ...


def default_launcher() -> WorkerLauncher:
    # Imported lazily: worker_launch.py pulls in BLAS discovery.
    from llmd.runtime.worker_launch import worker_command

    return worker_command


class WorkerError(Exception):
    """A request (or the whole worker) failed; `code` is the protocol's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Accepted:
    """Yielded first by `WorkerClient.generate` once the worker has the request: what comes
    after is the model's output, so a server can still answer an HTTP status before it.
    `request_id`: the worker's id of the request (sibling choices name it in `prefill_of`)."""

    request_id: str = ""


ACCEPTED = Accepted()


def _failure(msg: object) -> WorkerError | None:
    """The error a request's queued message ends it with: the worker's death (queued as a
    WorkerError) or the worker's own `error` event; None for any other message."""
    if isinstance(msg, WorkerError):
        return msg
    if isinstance(msg, p.Error):
        return WorkerError(msg.code, msg.message)
    return None


class WorkerClient:
    """One worker process. Requests are multiplexed by id: each has its own event queue."""

    def __init__(
        self,
        model_path: str,
        *,
        context_length: int | None = None,
        threads: int | None = None,
        launcher: WorkerLauncher | None = None,
        name: str = "",
        queue_limit: int | None = None,
        kv_budget_bytes: int | None = None,
        max_sequences: int | None = None,
        kv_type: str | None = None,
        kv_disk_bytes: int | None = None,
        kv_disk_dir: str | None = None,
        model_digest: str | None = None,
        draft_model: str | None = None,
        mmproj: str | None = None,
    ) -> None:
        self.model_path = model_path
        self.context_length = context_length
        self.threads = threads
        # Requests that may wait beyond the engine's running sequences; None: no limit.
        self.queue_limit = queue_limit
        self.kv_budget_bytes = kv_budget_bytes
        self.max_sequences = max_sequences
        self.kv_type = kv_type  # None: the worker's default (f16)
        # The disk tier (native/core/kv_disk.h): its bound and directory, and the digest of
        # the model file that keys its blocks.
        self.kv_disk_bytes = kv_disk_bytes
        self.kv_disk_dir = kv_disk_dir
        self.model_digest = model_digest
        self.draft_model = draft_model  # file of a draft model loaded beside it, if any
        self.mmproj = mmproj  # a GGUF model's vision tower (llama.cpp's mmproj file), if any
        self.launcher = launcher or default_launcher()
        self.name = name or model_path
        self.ready: p.Ready | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._queues: dict[str, asyncio.Queue[p.WorkerMessage | WorkerError]] = {}
        self._stats_waiters: list[asyncio.Future[p.Stats]] = []
        self._reader: asyncio.Task[None] | None = None
        self._stderr: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self.dead: WorkerError | None = None
        self._stopping: WorkerError | None = None  # why the daemon is stopping it, if it is
        # The worker's last log lines: what `status` shows when it crashes or fails to load.
        self.stderr_tail: deque[str] = deque(maxlen=20)
        self.completed = 0  # requests that ended with `done`: proof the worker can serve
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def start(self, timeout: float = 300.0) -> p.Ready:
        given = {
            "kv_budget_bytes": self.kv_budget_bytes,
            "max_sequences": self.max_sequences,
            "kv_type": self.kv_type,
            "kv_disk_bytes": self.kv_disk_bytes,
            "kv_disk_dir": self.kv_disk_dir,
            "model_digest": self.model_digest,
            "draft_model": self.draft_model,
            "mmproj": self.mmproj,
        }
        options = {k: v for k, v in given.items() if v}
        argv, env = self.launcher(
            self.model_path, context_length=self.context_length, threads=self.threads, **options
        )
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            limit=1 << 24,
        )
        self._stderr = asyncio.create_task(self._pump_stderr())
        try:
            first = await asyncio.wait_for(self._first_message(), timeout)
        except asyncio.TimeoutError:
            await self.stop()
            raise WorkerError(
                "load_timeout", f"the worker did not become ready in {timeout:.0f}s"
            ) from None
        if first is None:
            code = await self._proc.wait()
            await self._stderr_drained()
            self._set_exited(code)
            raise WorkerError("worker_died", f"the worker {describe_exit(code)} while loading")
        if isinstance(first, p.Fatal):
            self._set_exited(await self._proc.wait())
            raise WorkerError(first.code, first.message)
        if not isinstance(first, p.Ready):
            await self.stop()
            raise WorkerError("protocol", f"the worker's first message was {first.type}, not ready")
        self.ready = first
        self._reader = asyncio.create_task(self._pump_stdout())
        return first

    async def _first_message(self) -> p.WorkerMessage | None:
        """The first protocol line; stray output (a library printing to stdout) is logged."""
        assert self._proc is not None and self._proc.stdout is not None
        while line := await self._proc.stdout.readline():
            try:
                return p.decode_worker_message(line)
            except ValueError:
                log.warning("[worker %s] non-protocol output: %r", self.name, line[:200])
        return None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _set_exited(self, code: int) -> None:
        if not self.exited.done():
            self.exited.set_result(code)

    async def _stderr_drained(self, timeout: float = 1.0) -> None:
        """Lets the last log lines of a dead worker arrive (they explain its death)."""
        if self._stderr is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._stderr), timeout)
            except asyncio.TimeoutError:
                pass

    async def _pump_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        async for raw in self._proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            self.stderr_tail.append(line)
            log.info("[worker %s %s] %s", self.name, self._proc.pid, line)

    async def _pump_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        try:
            async for raw in self._proc.stdout:
                try:
                    msg = p.decode_worker_message(raw)
                except ValueError:
                    log.warning("unparseable worker line: %r", raw[:200])
                    continue
                if isinstance(msg, p.Stats):
                    if self._stats_waiters:
                        waiter = self._stats_waiters.pop(0)
                        if not waiter.done():  # its asker may have timed out
                            waiter.set_result(msg)
                    continue
                if isinstance(msg, p.Done):
                    self.completed += 1
                rid = getattr(msg, "id", None)
                if rid is None:
                    log.warning("worker error without a request: %s", msg)
                    continue
                queue = self._queues.get(rid)
                if queue is not None:
                    queue.put_nowait(msg)
        finally:
            code = await self._proc.wait()
            if self._stopping is None:
                await self._stderr_drained()
                log.warning(
                    "worker for %s (pid %s) %s; %d request(s) in flight",
                    self.name,
                    self._proc.pid,
                    describe_exit(code),
                    len(self._queues),
                )
                self.dead = WorkerError(
                    "worker_died", f"the model worker {describe_exit(code)} unexpectedly"
                )
            else:
                self.dead = self._stopping
            self._set_exited(code)
            for queue in self._queues.values():
                queue.put_nowait(self.dead)
            for fut in self._stats_waiters:
                if not fut.done():
                    fut.set_exception(self.dead)

    async def _send(self, message: p.BaseModel) -> None:
        if self.dead or self._proc is None or self._proc.stdin is None:
            raise self.dead or WorkerError("worker_died", "the model worker is not running")
        async with self._write_lock:
            self._proc.stdin.write(p.encode(message))
            try:
                await self._proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise WorkerError("worker_died", "the model worker is not running") from exc

    async def generate(
        self,
        prompt: list[int],
        *,
        max_tokens: int,
        sampling: p.SamplingParams,
        stop_tokens: list[int],
        session: str = "",
        tag: str = "r",
        grammar: str | None = None,
        prefill_of: str = "",
        max_draft: int = 0,
        draft_model: bool = False,
        mtp: bool = False,
        images: list[p.ImageInput] | None = None,
    ) -> AsyncIterator[Accepted | p.Started | p.Tokens | p.Done]:
        """Yields ACCEPTED, Started once the engine admits it (the prefix-cache split), token
        events, then one Done; raises WorkerError on error (code
        ``queue_full`` before ACCEPTED when the worker has max_sequences running and
        queue_limit waiting). Closing the iterator early (client gone, stop string hit)
        cancels the request in the worker."""
        self._check_capacity()
        rid = f"{tag}{next(_ids)}-{os.getpid()}"  # tag: "warmup" for the supervisor's
        queue: asyncio.Queue[p.WorkerMessage | WorkerError] = asyncio.Queue()
        self._queues[rid] = queue
        finished = False
        try:
            await self._send(
                p.Generate(
                    id=rid,
                    prompt=prompt,
                    max_tokens=max_tokens,
                    sampling=sampling,
                    stop_tokens=stop_tokens,
                    session=session,
                    grammar=grammar,
                    prefill_of=prefill_of,
                    max_draft=max_draft,
                    draft_model=draft_model,
                    mtp=mtp,
                    images=images or [],
                )
            )
            yield Accepted(rid)
            while True:
                msg = await queue.get()
                if (failure := _failure(msg)) is not None:
                    finished = True
                    raise failure
                if isinstance(msg, p.Done):
                    finished = True
                    yield msg
                    return
                if isinstance(msg, p.Tokens | p.Started):
                    yield msg
        finally:
            self._queues.pop(rid, None)
            if not finished and not self.dead:
                try:
                    await self._send(p.Cancel(id=rid))
                except WorkerError:
                    pass

    async def embed(
        self,
        prompts: list[list[int]],
        *,
        output: str = "embedding",
        pooling: str = "last",
        normalize: bool = False,
        logit_tokens: list[int] | None = None,
    ) -> tuple[p.Done, list[list[float]]]:
        """One `embed` request (protocol.Embed): its Done and one row of values per prompt,
        in order. Raises WorkerError (``queue_full`` first when the worker is at capacity);
        cancelling the awaiting task (the client went away) cancels it in the worker."""
        self._check_capacity()
        rid = f"e{next(_ids)}-{os.getpid()}"
        queue: asyncio.Queue[p.WorkerMessage | WorkerError] = asyncio.Queue()
        self._queues[rid] = queue
        finished = False
        rows: dict[int, list[float]] = {}
        try:
            await self._send(
                p.Embed(
                    id=rid,
                    prompts=prompts,
                    output=output,  # type: ignore[arg-type]
                    pooling=pooling,  # type: ignore[arg-type]
                    normalize=normalize,
                    logit_tokens=logit_tokens or [],
                )
            )
            while True:
                msg = await queue.get()
                if (failure := _failure(msg)) is not None:
                    finished = True
                    raise failure
                if isinstance(msg, p.Pooled):
                    rows[msg.index] = msg.values
                if isinstance(msg, p.Done):
                    finished = True
                    return msg, [rows.get(i, []) for i in range(len(prompts))]
        finally:
            self._queues.pop(rid, None)
            if not finished and not self.dead:
                try:
                    await self._send(p.Cancel(id=rid))
                except WorkerError:
                    pass

    async def score(self, tokens: list[int], top_logprobs: int = 0) -> list[p.TokenLogprob]:
        """Logprobs of each of `tokens` after the first, given the ones before it."""
        rid = f"s{next(_ids)}-{os.getpid()}"
        queue: asyncio.Queue[p.WorkerMessage | WorkerError] = asyncio.Queue()
        self._queues[rid] = queue
        try:
            await self._send(p.Score(id=rid, tokens=tokens, top_logprobs=top_logprobs))
            msg = await queue.get()
        finally:
            self._queues.pop(rid, None)
        if (failure := _failure(msg)) is not None:
            raise failure
        assert isinstance(msg, p.Scored)
        return msg.logprobs

    async def unpin(self, session: str) -> None:
        """Lets the session's KV be evicted again (no-op if the worker is gone)."""
        if not self.dead:
            try:
                await self._send(p.Unpin(session=session))
            except WorkerError:
                pass

    @property
    def in_flight(self) -> int:
        """Requests this worker is running or queueing."""
        return len(self._queues)

    def _check_capacity(self) -> None:
        # Why a bound: the engine queues fairly (FIFO) but without limit; past it a client is
        # better served by a clear 429 it can retry than by a latency that grows without end.
        if self.queue_limit is None or self.ready is None:
            return
        capacity = self.ready.max_sequences + self.queue_limit
        if self.in_flight >= capacity:
            raise WorkerError(
                "queue_full",
                f"model '{self.name}' is at capacity: {self.ready.max_sequences} requests running "
                f"and {self.in_flight - self.ready.max_sequences} waiting (queue limit "
                f"{self.queue_limit}); retry later",
            )

    async def stats(self, timeout: float = 10.0) -> p.Stats:
        fut: asyncio.Future[p.Stats] = asyncio.get_running_loop().create_future()
        self._stats_waiters.append(fut)
        await self._send(p.StatsRequest())
        return await asyncio.wait_for(fut, timeout)

    def kill(self) -> None:
        """SIGKILL (a hung worker): its death is then handled like a crash."""
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()

    async def stop(self, timeout: float = 10.0, reason: WorkerError | None = None) -> None:
        """Asks the worker to exit (SIGKILL after `timeout`). Requests still in flight end
        with `reason` (default: the model was unloaded)."""
        if self._proc is None or self._proc.returncode is not None:
            return
        self._stopping = reason or WorkerError(
            "model_unloaded", f"model '{self.name}' was unloaded while this request ran"
        )
        try:
            await self._send(p.Shutdown())
            await asyncio.wait_for(self._proc.wait(), timeout)
        except (WorkerError, asyncio.TimeoutError):
            self._proc.kill()
            await self._proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        self._set_exited(self._proc.returncode or 0)


def describe_exit(code: int) -> str:
    """'exited with status 3' / 'was killed by SIGKILL' for a process's return code."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"
