"""Worker process main: load the engine, announce ``ready``, then pump messages both ways.

Two threads: one reads daemon messages from stdin and calls the engine (submit, cancel,
stats); the main thread drains engine events and writes them to stdout. The engine's own C++
thread runs the batching loop; the GIL is released whenever it computes.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import ValidationError

from llmd.limits import KV_TYPES, available_host_memory, kv_budget_share, process_rss
from llmd.runtime import protocol as p
from llmd.runtime.blas import loaded_blas
from llmd.store.dense_modules import DenseHead
from llmd.store.vocabulary import vocabulary_mismatch
from llmd.worker.grammar import GrammarFactory
from llmd.worker.model_digest import model_digest, with_vision_tower
from llmd.worker.pooled import PooledRequests
from llmd.worker.vision import ImageEncoder, ImageRequests


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}{k}.", v, out)
    elif isinstance(value, list):  # per-layer lists (layer_types) as ``key.0``, ``key.1``, ...
        for i, v in enumerate(value):
            _flatten(f"{prefix}{i}.", v, out)
    elif isinstance(value, (bool, int, float, str)):
        out[prefix[:-1]] = value


def hf_config(model_path: str) -> dict[str, Any]:
    """config.json of a Hugging Face directory, nested keys flattened as ``a.b`` (list items
    as ``a.0``)."""
    path = Path(model_path)
    if not path.is_dir():
        return {}
    config = json.loads((path / "config.json").read_text())
    if "text_config" in config and "num_hidden_layers" not in config:
        # A multimodal wrapper: the text model's keys win; top-level ones such as
        # tie_word_embeddings still apply to it.
        outer = {
            k: v
            for k, v in config.items()
            if not k.endswith("_config") or k == "quantization_config"
        }
        config = {
            **outer,
            **config["text_config"],
            "model_type": config["text_config"].get("model_type", ""),
        }
    flat: dict[str, Any] = {}
    _flatten("", config, flat)
    return flat


def multimodal_config(model_path: str) -> dict[str, Any] | None:
    """The whole config.json of a multimodal Hugging Face directory, flattened as hf_config
    flattens (``vision_config.hidden_size``, ``mm_tokens_per_image``, ...): what the vision
    tower loads from. None for a GGUF file or a checkpoint without a vision_config."""
    path = Path(model_path)
    if not path.is_dir():
        return None
    config = json.loads((path / "config.json").read_text())
    if not isinstance(config.get("vision_config"), dict):
        return None
    flat: dict[str, Any] = {}
    _flatten("", config, flat)
    return flat


class Writer:
    """Serialises JSONL writes from both threads."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, message: p.BaseModel) -> None:
        data = p.encode(message)
        with self._lock:
            self._stream.write(data)
            self._stream.flush()


def _logprobs(raw: list[dict[str, Any]] | None) -> list[p.TokenLogprob] | None:
    if raw is None:
        return None
    return [p.TokenLogprob(logprob=x["logprob"], top=x["top"]) for x in raw]


def _score(engine: Any, msg: p.Score, writer: Writer) -> None:
    """Teacher-forced logprobs of the prompt's own tokens (the engine's synchronous scorer)."""
    import numpy as np

    logits = engine.score(msg.tokens, 1)  # rows predict tokens[1:] (and one more)
    out = []
    for i, token in enumerate(msg.tokens[1:]):
        row = logits[i].astype(np.float64)
        log_z = float(np.logaddexp.reduce(row))
        top = []
        if msg.top_logprobs > 0:
            ids = np.argsort(-row, kind="stable")[: msg.top_logprobs]
            top = [(int(t), float(row[t] - log_z)) for t in ids]
        out.append(p.TokenLogprob(logprob=float(row[token] - log_z), top=top))
    writer.send(p.Scored(id=msg.id, logprobs=out))


def _message_id(line: bytes) -> str | None:
    """The `id` of a daemon message that failed validation, when it has a readable one."""
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    rid = raw.get("id") if isinstance(raw, dict) else None
    return rid if isinstance(rid, str) else None


def _submit(
    engine: Any,
    msg: p.Generate,
    seed: int,
    constraint: Any,
    prompt: list[int] | None = None,
    embedded: list | None = None,
) -> None:
    s = msg.sampling
    engine.submit(
        msg.id,
        msg.prompt if prompt is None else prompt,
        msg.max_tokens,
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        min_p=s.min_p,
        seed=seed & 0xFFFFFFFFFFFFFFFF,
        stop_tokens=msg.stop_tokens,
        session=msg.session,
        frequency_penalty=s.frequency_penalty,
        presence_penalty=s.presence_penalty,
        repetition_penalty=s.repetition_penalty,
        repetition_window=s.repetition_window,
        logit_bias=list(s.logit_bias.items()),
        top_logprobs=s.top_logprobs,
        constraint=constraint,
        prefill_of=msg.prefill_of,
        max_draft=msg.max_draft,
        draft_model=msg.draft_model,
        mtp=msg.mtp,
        embedded=embedded or [],
    )


def _read_commands(
    engine: Any,
    writer: Writer,
    stop: threading.Event,
    grammars: GrammarFactory,
    pooled: PooledRequests,
    images: ImageRequests | None = None,
) -> None:
    for raw in sys.stdin.buffer:
        line = raw.strip()
        if not line:
            continue
        try:
            msg = p.decode_daemon_message(line)
        except ValidationError as exc:
            # Answer the request it names, if any, so its client does not wait forever.
            writer.send(
                p.Error(
                    id=_message_id(line), code="invalid_message", message=str(exc).splitlines()[0]
                )
            )
            continue
        if isinstance(msg, p.Generate):
            s = msg.sampling
            seed = s.seed if s.seed is not None else random.getrandbits(63)
            constraint = None
            if msg.grammar is not None:
                try:
                    constraint = grammars.constraint(msg.grammar)
                except ValueError as exc:
                    writer.send(p.Error(id=msg.id, code="invalid_request", message=str(exc)))
                    continue
            if msg.images:
                if images is None:
                    writer.send(
                        p.Error(
                            id=msg.id,
                            code="model_cannot_see",
                            message="this model does not take images in llmd",
                        )
                    )
                    continue
                # Encoded on the image thread, which then submits it with its image rows.
                submit = functools.partial(_submit, engine, msg, seed, constraint)
                images.put(msg.id, msg.prompt, msg.images, submit)
                continue
            try:
                _submit(engine, msg, seed, constraint)
            except (TypeError, ValueError, OverflowError) as exc:
                # A value the engine's types cannot hold: that request fails, the loop goes on.
                writer.send(p.Error(id=msg.id, code="invalid_request", message=str(exc)))
        elif isinstance(msg, p.Embed):
            try:
                pooled.submit(engine, msg)
            except (TypeError, ValueError, OverflowError) as exc:
                pooled.forget(msg.id)
                writer.send(p.Error(id=msg.id, code="invalid_request", message=str(exc)))
        elif isinstance(msg, p.Score):
            try:
                _score(engine, msg, writer)
            except Exception as exc:  # noqa: BLE001 - a failed score fails that request only
                writer.send(p.Error(id=msg.id, code="internal", message=f"scoring failed: {exc}"))
        elif isinstance(msg, p.Cancel):
            if images is not None and images.cancel(msg.id):
                continue
            if not pooled.cancel(engine, msg.id):
                engine.cancel(msg.id)
        elif isinstance(msg, p.Unpin):
            engine.unpin(msg.session)
        elif isinstance(msg, p.StatsRequest):
            st = {
                **engine.stats(),
                **mlx_memory(engine.info()["backend"]),
                **(images.stats() if images is not None else {}),
            }
            writer.send(
                p.Stats(
                    active_sequences=st["active_sequences"],
                    queued_requests=st["queued_requests"],
                    steps=st["steps"],
                    tokens_generated=st["tokens_generated"],
                    kv_bytes=st["kv_bytes"],
                    extra={k: v for k, v in st.items() if k not in p.Stats.model_fields},
                )
            )
        elif isinstance(msg, p.Shutdown):
            break
    stop.set()


def auto_kv_budget(backend: str) -> int:
    """A quarter of the memory free now, clamped to [256 MiB, 16 GiB]: the GPU's free memory
    when the engine will run there (CUDA), else host memory (CPU, and Metal's unified memory).
    Why a quarter: weights, activations, other models and the rest of the machine share it;
    the prefix cache then keeps as much as it can and evicts LRU past the budget."""
    free = available_host_memory()
    if backend in ("cuda", "auto"):
        from llmd import _engine

        # A build with native/cuda on a GPU ("auto" runs llama/qwen GGUFs there): the device's
        # free memory.
        if _engine.cuda_available():
            return kv_budget_share(int(_engine.cuda_memory_info()["free"]))
    if backend in ("auto", "gpu") and sys.platform != "darwin":
        try:
            import mlx.core as mx

            if mx.is_available(mx.gpu):
                free = int(mx.device_info(mx.gpu).get("free_memory", free))
        except Exception:  # noqa: BLE001 - no usable MLX GPU: host memory it is
            pass
    return kv_budget_share(free)


def mlx_memory(engine_backend: str) -> dict[str, dict[str, int]]:
    """MLX's own allocator counters where the engine runs on an MLX device (Metal's unified
    memory, CUDA, MLX's CPU device): the worker's RSS does not show a GPU's memory, and on a
    Mac it is the number that competes with every other app. Empty on llmd's CPU kernels."""
    if engine_backend in ("cpu", "cuda"):  # llmd's own kernels: MLX allocates nothing there
        return {}
    try:
        import mlx.core as mx

        return {
            "device_memory": {
                "active_bytes": int(mx.get_active_memory()),
                "peak_bytes": int(mx.get_peak_memory()),
                "cache_bytes": int(mx.get_cache_memory()),
            }
        }
    except Exception:  # noqa: BLE001 - an MLX without the counters: nothing to report
        return {}


def _backend_name(engine_backend: str) -> str:
    """The ready handshake's backend: llmd's CPU kernels, or MLX on a GPU (CUDA or Metal)."""
    if engine_backend == "gpu":
        return "mlx-metal" if sys.platform == "darwin" else "mlx-cuda"
    if engine_backend in ("cpu", "cuda"):
        return f"llmd-{engine_backend}"
    return engine_backend


def _draft_row_cost() -> float:
    """LLMD_DRAFT_ROW_COST, a benchmark and test hook: a fixed cost of a step's extra row (in
    one-row steps) for speculative decoding's cost model instead of the measured one; 0 drafts
    whatever the draft length allows, as before the cost model. Unset: measured."""
    value = os.environ.get("LLMD_DRAFT_ROW_COST", "")
    return float(value) if value else -1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmd.worker", description=__doc__)
    parser.add_argument("--model", required=True, help="GGUF file or Hugging Face directory")
    parser.add_argument("--context-length", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--max-sequences", type=int, default=8)
    parser.add_argument("--step-tokens", type=int, default=512)
    parser.add_argument(
        "--kv-budget", type=int, default=0, help="KV cache bytes (0: a quarter of free memory)"
    )
    parser.add_argument(
        "--kv-type",
        default="f16",
        choices=KV_TYPES,
        help="element type of the KV cache: f16, or GGML's q8_0 / q4_0 blocks",
    )
    parser.add_argument(
        "--kv-disk",
        type=int,
        default=0,
        help="bytes of the KV cache's disk tier under --kv-disk-dir, shared by all models (0: off)",
    )
    parser.add_argument("--kv-disk-dir", default="", help="directory of the KV disk tier")
    parser.add_argument(
        "--model-digest",
        default="",
        help="sha256:<hex> of the model (the store's); computed from the file when absent",
    )
    parser.add_argument(
        "--backend",
        default=os.environ.get("LLMD_BACKEND", "auto"),
        choices=["auto", "cpu", "gpu", "mlx-cpu", "cuda"],
        help="auto: llmd's CUDA kernels for llama/qwen GGUFs in a -DLLMD_CUDA=ON build on a GPU, "
        "else the GPU when MLX has one, else llmd's CPU kernels; cuda: llmd's own CUDA kernels",
    )
    parser.add_argument(
        "--draft-model",
        default="",
        help="a model with the same vocabulary, loaded beside the model to draft tokens for "
        "speculative decoding (requests with draft_model)",
    )
    parser.add_argument(
        "--mmproj",
        default="",
        help="llama.cpp's mmproj GGUF of a GGUF model: its vision tower (images in)",
    )
    args = parser.parse_args(argv)

    writer = Writer(sys.stdout.buffer)
    try:
        from llmd import _engine  # the native extension; imported only in workers
    except ImportError as exc:
        hint = (
            " (no MLX backend is installed: pip install 'llmd[cpu]', or 'llmd[cuda]' on NVIDIA)"
            if "libmlx" in str(exc)
            else ""
        )
        writer.send(
            p.Fatal(code="engine_unavailable", message=f"native engine missing: {exc}{hint}")
        )
        return 2
    if args.threads:
        _engine.set_threads(args.threads)
    rss_before = process_rss() or 0
    started = time.perf_counter()
    kv_budget = args.kv_budget or auto_kv_budget(args.backend)
    kv_disk = args.kv_disk if args.kv_disk_dir else 0
    digest = args.model_digest
    if kv_disk and not digest:
        digest = model_digest(args.model)
    if kv_disk and args.mmproj:
        digest = with_vision_tower(digest, args.mmproj)
    if args.draft_model:
        # Token ids pass between the two models: the same count of tokens (the engine's own
        # check) is not enough, every id must be the same token.
        try:
            problem = vocabulary_mismatch(args.model, args.draft_model)
        except (OSError, ValueError) as exc:
            problem = f"its vocabulary could not be read: {exc}"
        if problem:
            writer.send(
                p.Fatal(
                    code="load_failed",
                    message=f"draft model {args.draft_model} cannot draft for {args.model}: {problem}",
                )
            )
            return 3
    try:
        engine = _engine.Engine(
            args.model,
            context_length=args.context_length,
            max_sequences=args.max_sequences,
            step_token_budget=args.step_tokens,
            kv_budget_bytes=kv_budget,
            hf_config=hf_config(args.model),
            backend=args.backend,
            kv_type=args.kv_type,
            kv_disk_dir=args.kv_disk_dir,
            kv_disk_bytes=kv_disk,
            model_digest=digest,
            draft_model_path=args.draft_model,
            draft_hf_config=hf_config(args.draft_model) if args.draft_model else {},
            draft_row_cost=_draft_row_cost(),
        )
    except Exception as exc:  # noqa: BLE001 - every load failure is reported, then exit
        writer.send(p.Fatal(code="load_failed", message=str(exc)))
        return 3
    info = engine.info()
    try:
        head = DenseHead.load(Path(args.model), info["hidden_size"])
    except ValueError as exc:
        writer.send(p.Fatal(code="load_failed", message=str(exc)))
        return 3
    images = None
    try:
        encoder = ImageEncoder.load(
            args.model, engine, multimodal_config(args.model), args.mmproj or None
        )
    except Exception as exc:  # noqa: BLE001 - the text model still serves; images are refused
        print(f"llmd worker: images off: {exc}", file=sys.stderr, flush=True)
        encoder = None
    if encoder is not None:
        images = ImageRequests(
            encoder,
            engine,
            lambda rid, code, message: writer.send(p.Error(id=rid, code=code, message=message)),
        )
    load_ms = (time.perf_counter() - started) * 1000
    paths = engine.matmul_paths()
    kv = engine.kv_cache()
    disk = engine.stats()["kv_disk"]
    if kv_disk and not disk["enabled"]:
        print(f"llmd worker: KV disk tier off: {disk['off_reason']}", file=sys.stderr, flush=True)
    writer.send(
        p.Ready(
            backend=_backend_name(info["backend"]),
            device=info["device_name"],
            model=p.ModelFacts(
                architecture=info["architecture"],
                vocab_size=info["vocab_size"],
                context_length=info["context_length"],
                n_layers=info["n_layers"],
                n_heads=info["n_heads"],
                n_kv_heads=info["n_kv_heads"],
                hidden_size=info["hidden_size"],
                weight_format=info["weight_format"],
            ),
            context_length=engine.context_length,
            max_sequences=engine.max_sequences,
            kernels={"isa": _engine.active_kernel_path(), "attention": kv["attention"], **paths},
            blas=loaded_blas(),
            features=[
                "continuous_batching",
                "cancel",
                "embed",
                *(["vision"] if images is not None else []),
                *(["speculative_ngram"] if engine.supports_speculation else []),
                *(
                    ["speculative_draft_model"]
                    if engine.supports_speculation and engine.draft_model is not None
                    else []
                ),
                *(["speculative_mtp"] if engine.supports_speculation and engine.has_mtp else []),
            ],
            draft_model=args.draft_model,
            load_ms=load_ms,
            kv_budget_bytes=kv_budget,
            kv_type=kv["type"],
            kv_bytes_per_token=kv["bytes_per_token"],
            kv_capacity_tokens=kv["capacity_tokens"],
            kv_disk_bytes=kv_disk if disk["enabled"] else 0,
            threads=_engine.thread_count(),
            vision=p.VisionFacts(**encoder.facts()) if encoder is not None else None,
            memory={
                "rss_before_load": rss_before,
                "rss_after_load": (process_rss() or 0),
                "device_total": info["device_memory_bytes"],
            },
        )
    )

    stop = threading.Event()
    grammars = GrammarFactory(args.model, info["vocab_size"])
    pooled = PooledRequests(head)
    reader = threading.Thread(
        target=_read_commands, args=(engine, writer, stop, grammars, pooled, images), daemon=True
    )
    reader.start()
    while not stop.is_set():
        for ev in engine.poll(50, started=True):
            handled, answers = pooled.on_event(engine, ev)
            for answer in answers:
                writer.send(answer)
            if handled:
                continue
            kind = ev["type"]
            if kind == "started":
                writer.send(
                    p.Started(
                        id=ev["id"],
                        prompt_tokens=ev["prompt_tokens"],
                        cached_tokens=ev["cached_tokens"],
                    )
                )
            elif kind == "tokens":
                writer.send(
                    p.Tokens(
                        id=ev["id"],
                        tokens=ev["tokens"],
                        logprobs=_logprobs(ev.get("logprobs")),
                        speculative=ev.get("speculative"),
                    )
                )
            elif kind == "done":
                writer.send(
                    p.Done(
                        id=ev["id"],
                        finish_reason=ev["finish_reason"],
                        prompt_tokens=ev["prompt_tokens"],
                        completion_tokens=ev["completion_tokens"],
                        cached_tokens=ev["cached_tokens"],
                        timings=p.Timings(**ev["timings"]),
                        drafted_tokens=ev.get("drafted_tokens", 0),
                        accepted_tokens=ev.get("accepted_tokens", 0),
                    )
                )
            else:
                writer.send(p.Error(id=ev["id"], code=ev["code"], message=ev["message"]))
    engine.shutdown()  # with the GIL released: a constraint callback may be waiting for it
    return 0
