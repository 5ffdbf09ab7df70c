"""TEST DOUBLE: a fake model worker that speaks llmd's worker protocol (llmd/protocol.py).

It loads no model and runs no engine. It exists so the daemon's HTTP, streaming, stop-string,
cancellation, multiplexing and error paths can be tested fast and deterministically, apart
from model behaviour (which the integration tests check with the real worker).

Behaviour, per ``generate`` request:
- it "generates" the prompt's own tokens back, in order (an echo), one event per
  ``FAKE_WORKER_BATCH`` tokens, sleeping ``FAKE_WORKER_TOKEN_DELAY`` seconds between events;
  requests run concurrently, so events of different requests interleave;
- a token listed in ``stop_tokens`` ends the request with ``finish_reason="stop"``: it is not
  sent, but counted in ``completion_tokens`` (as the real engine does);
- reaching the end of the prompt also ends with ``stop`` (as if the model emitted its EOS,
  counted too); reaching ``max_tokens`` first ends with ``length``;
- ``cancel`` ends the request at its next step with ``finish_reason="cancelled"``;
- a prompt longer than the context gets ``error`` ``context_length_exceeded``;
- logprobs, when asked (``sampling.top_logprobs >= 0``): every token -0.25, alternatives
  token+k at -1-k; ``score`` answers -1.0 for every prompt token after the first;
- magic seeds: ``sampling.seed == 666`` makes the worker exit abruptly (status 17) after the
  first token event; ``667`` sends ``error`` (code ``internal``) after the first token event;
  ``665`` makes it exit (status 19) on receipt, before any token, the first time only (a
  marker file ``FAKE_WORKER_CRASH_MARKER`` remembers it across worker processes); ``668``
  makes it hang: it stops reading and answering (a stuck engine) until killed.

Environment: ``FAKE_WORKER_CONTEXT`` (context length, default 256), ``FAKE_WORKER_LOG``
(a file that receives every daemon message, one JSON line each, for assertions),
``FAKE_WORKER_FATAL`` (a message: send ``fatal`` instead of ``ready`` and exit 3),
``FAKE_WORKER_BATCH``, ``FAKE_WORKER_TOKEN_DELAY``.

Run as ``python fake_worker.py --model PATH [--context-length N] [--threads N] [--kv-budget B]
[--kv-type T]`` (the real worker's arguments; the KV budget and type are only reported back in
``ready``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from llmd.runtime import protocol as p

_out_lock = asyncio.Lock()


async def _send(message: p.BaseModel) -> None:
    async with _out_lock:
        sys.stdout.buffer.write(p.encode(message))
        sys.stdout.buffer.flush()


class FakeEngine:
    def __init__(self, context_length: int, batch: int, delay: float) -> None:
        self.context_length = context_length
        self.batch = max(1, batch)
        self.delay = delay
        self.cancelled: set[str] = set()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.generated = 0

    async def run(self, req: p.Generate) -> None:
        marker = os.environ.get("FAKE_WORKER_CRASH_MARKER", "")
        if req.sampling.seed == 665 and marker and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(19)
        if req.sampling.seed == 668:
            time.sleep(3600)  # blocks the event loop: no reads, no answers
        prompt = req.prompt
        if len(prompt) >= self.context_length:
            await _send(
                p.Error(
                    id=req.id,
                    code="context_length_exceeded",
                    message=f"prompt of {len(prompt)} tokens >= context {self.context_length}",
                )
            )
            return
        # Admitted at once, nothing cached (the real engine's Started carries its prefix match).
        await _send(p.Started(id=req.id, prompt_tokens=len(prompt), cached_tokens=0))
        emitted = 0
        counted = 0
        reason = "stop"
        pos = 0
        first_event = True
        while True:
            await asyncio.sleep(self.delay)
            if req.id in self.cancelled:
                reason = "cancelled"
                break
            if not first_event and req.sampling.seed == 666:
                os._exit(17)
            if not first_event and req.sampling.seed == 667:
                await _send(p.Error(id=req.id, code="internal", message="fake failure"))
                return
            first_event = False
            chunk: list[int] = []
            stopped = False
            while len(chunk) < self.batch:
                if counted >= req.max_tokens:
                    break
                if pos >= len(prompt):  # the "model" emits its EOS
                    counted += 1
                    stopped = True
                    break
                tok = prompt[pos]
                pos += 1
                counted += 1
                if tok in req.stop_tokens:
                    stopped = True
                    break
                chunk.append(tok)
            if chunk:
                emitted += len(chunk)
                self.generated += len(chunk)
                lps = None
                n = req.sampling.top_logprobs
                if n >= 0:
                    lps = [
                        p.TokenLogprob(
                            logprob=-0.25,
                            top=[(t, -0.25)] + [(t + k, -1.0 - k) for k in range(1, n)],
                        )
                        for t in chunk
                    ]
                await _send(p.Tokens(id=req.id, tokens=chunk, logprobs=lps))
            if stopped:
                reason = "stop"
                break
            if counted >= req.max_tokens:
                reason = "length"
                break
        await _send(
            p.Done(
                id=req.id,
                finish_reason=reason,  # type: ignore[arg-type]
                prompt_tokens=len(prompt),
                completion_tokens=counted,
            )
        )

    def submit(self, req: p.Generate) -> None:
        task = asyncio.create_task(self.run(req))
        self.tasks[req.id] = task
        task.add_done_callback(lambda _t: self.tasks.pop(req.id, None))


async def main() -> int:
    parser = argparse.ArgumentParser(description="fake llmd worker (test double)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--context-length", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--kv-budget", type=int, default=0)
    parser.add_argument("--max-sequences", type=int, default=8)
    parser.add_argument("--kv-type", default="")
    args = parser.parse_args()

    fatal = os.environ.get("FAKE_WORKER_FATAL")
    if fatal:
        await _send(p.Fatal(code="load_failed", message=fatal))
        return 3
    context = args.context_length or int(os.environ.get("FAKE_WORKER_CONTEXT", "256"))
    engine = FakeEngine(
        context,
        int(os.environ.get("FAKE_WORKER_BATCH", "1")),
        float(os.environ.get("FAKE_WORKER_TOKEN_DELAY", "0")),
    )
    log_path = os.environ.get("FAKE_WORKER_LOG")
    await _send(
        p.Ready(
            backend="fake",
            device="none",
            model=p.ModelFacts(
                architecture="fake",
                vocab_size=49152,
                context_length=context,
                n_layers=1,
                n_heads=1,
                n_kv_heads=1,
                hidden_size=1,
                weight_format="fake",
            ),
            context_length=context,
            max_sequences=args.max_sequences,
            kv_budget_bytes=args.kv_budget,
            kv_type=args.kv_type,
        )
    )
    print(f"fake worker ready for {args.model}", file=sys.stderr, flush=True)

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        if log_path:
            with open(log_path, "ab") as f:
                f.write(line.strip() + b"\n")
        msg = p.decode_daemon_message(line)
        if isinstance(msg, p.Generate):
            engine.submit(msg)
        elif isinstance(msg, p.Score):
            lps = [p.TokenLogprob(logprob=-1.0, top=[]) for _ in msg.tokens[1:]]
            await _send(p.Scored(id=msg.id, logprobs=lps))
        elif isinstance(msg, p.Cancel):
            engine.cancelled.add(msg.id)
        elif isinstance(msg, p.StatsRequest):
            await _send(
                p.Stats(
                    active_sequences=len(engine.tasks),
                    queued_requests=0,
                    steps=0,
                    tokens_generated=engine.generated,
                    kv_bytes=0,
                )
            )
        elif isinstance(msg, p.Shutdown):
            break
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
