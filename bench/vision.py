"""One 896x896 image through Gemma 3's vision tower: llmd vs llama-server with `--mmproj`.

Both servers load the same two files, written as llama.cpp's converter writes them: a Gemma 3
text GGUF and, beside it, an mmproj GGUF (`convert_hf_to_gguf.py --mmproj --outtype f16`'s
metadata, names and types: tests/native/tiny_models.write_gemma3_mmproj, checked against the
converter's own output by tests/native/test_gemma3_mmproj.py). Random weights in real shapes:

- vision: gemma-3-4b's tower (SigLIP so400m: 27 layers, hidden 1152, FFN 4304, 16 heads,
  896x896 images in 14x14 patches, a 64x64 grid pooled 4x4 into 256 image tokens) and its
  projector, F16, as the published `mmproj-*-f16.gguf` files;
- text: gemma-3-270m's decoder (18 layers, hidden 640, 4 heads of 256, one KV head, FFN 2048,
  262,144-token vocabulary, tied embeddings), F16; its width is the projector's output.

Random weights change no cost: every image runs the same layers whatever the numbers.

Each request is one chat turn ("ab", the image, "ab"; the tiny vocabulary's tokens) with a
new image (so neither server's prompt or image cache can answer it), `max_tokens: 1`: its
wall time is the time to first token, the image's decoding, resizing, encoding and the
prefill of its 256 rows included. The encode time is each server's own account: llama-server
logs "image slice encoded in N ms" (the tower and projector; the prefill of the rows is its
"image decoded" line), llmd counts `llmd_image_encode_seconds` on /metrics (the tower and
projector, pixels in, rows out).

Both servers are timed from ready: llama-server answers /health once its model and mmproj are
loaded, llmd is started with `--preload` and the bench waits for /status to show the model
loaded and warmed up (each row of a first image records that start, and llmd's load and
warmup, apart). Without it llmd's first image carried the model's on-demand load (3-6 s).

On a 2-core machine one encode takes minutes, so one invocation measures one server (its
first image, then `--images` more) and a run alternates invocations, each under
/tmp/w/quiet.sh, with the model written once into `--dir`:

    python -m bench.vision --dir /tmp/vision-bench --server llmd
    python -m bench.vision --dir /tmp/vision-bench --server llama.cpp

Results are appended to DIR/results.jsonl; `--report` prints the medians of what is there.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from bench.servers import (
    DEFAULT_LLAMA_SERVER,
    LLMD_BENCH_MODEL,
    ManagedServer,
    free_port,
    llama_server,
    llmd_env,
)

# gemma-3-4b-it's vision_config (SigLIP so400m at 896 / 14).
VISION = {
    "model_type": "siglip_vision_model",
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_channels": 3,
    "image_size": 896,
    "patch_size": 14,
    "layer_norm_eps": 1e-6,
    "hidden_act": "gelu_pytorch_tanh",
    "vision_use_head": False,
}
# gemma-3-270m's text config (the released file's sizes; its sliding window and local rope).
TEXT = {
    "model_type": "gemma3_text",
    "architectures": ["Gemma3ForCausalLM"],
    "hidden_size": 640,
    "intermediate_size": 2048,
    "num_hidden_layers": 18,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "max_position_embeddings": 32768,
    "vocab_size": 262144,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 1.0},
    "sliding_window": 512,
    "query_pre_attn_scalar": 256,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "hidden_activation": "gelu_pytorch_tanh",
    "tie_word_embeddings": True,
}
CONTROL = 3  # llama.cpp's token type for special tokens
# Gemma 3's ids for its image markers (the released tokenizer's).
BOI, EOI, SOFT = 255999, 256000, 262144 - 1
VOCABULARY = {
    0: ("<pad>", CONTROL),
    1: ("<eos>", CONTROL),
    2: ("<bos>", CONTROL),
    BOI: ("<start_of_image>", CONTROL),
    EOI: ("<end_of_image>", CONTROL),
    SOFT: ("<image_soft_token>", CONTROL),
}
# Text parts as they are; an image part as Gemma 3's marker (llmd expands it to the image's
# rows, llama-server's parts arrive as its media marker's text, which libmtmd replaces).
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m.content is string %}{{ m.content }}"
    "{% else %}{% for c in m.content %}{% if c.type == 'image' %}<start_of_image>"
    "{% else %}{{ c.text }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
)
TEXT_FILE, MMPROJ_FILE = "gemma3-bench-F16.gguf", "mmproj-gemma3-bench-F16.gguf"


def write_models(directory: Path, layers: int) -> tuple[Path, Path]:
    """The text GGUF and a `layers`-layer tower's mmproj beside it, in directory/layers-N
    (kept: writing them takes minutes; the text file is written once and linked)."""
    import os

    from tests.native.tiny_models import gemma3_vision_weights, write_gemma3_mmproj, write_gguf

    shared, here = directory / TEXT_FILE, directory / f"layers-{layers}"
    here.mkdir(parents=True, exist_ok=True)
    text, mmproj = here / TEXT_FILE, here / MMPROJ_FILE
    if not shared.exists():
        write_gguf(
            shared.with_suffix(".tmp"),
            "gemma3_text",
            quant="F16",
            config=TEXT,
            vocabulary=VOCABULARY,
            extra_strings={"tokenizer.chat_template": TEMPLATE},
        )
        shared.with_suffix(".tmp").rename(shared)
    if not text.exists():
        os.link(shared, text)
    if not mmproj.exists():
        vision = {**VISION, "num_hidden_layers": layers}
        # Spread scaled down with the width, so the layers stay far from float16's range.
        tensors = gemma3_vision_weights(vision=vision, text_hidden=TEXT["hidden_size"], scale=0.2)
        write_gemma3_mmproj(mmproj.with_suffix(".tmp"), "F16", vision, TEXT["hidden_size"], tensors)
        mmproj.with_suffix(".tmp").rename(mmproj)
    return text, mmproj


def llmd_home(directory: Path, layers: int) -> Path:
    """An LLMD_HOME beside the files with the text GGUF pulled into it as LLMD_BENCH_MODEL
    (the mmproj beside it comes along), once: a pull copies the files, which no timed run
    should wait for."""
    text, _ = write_models(directory, layers)
    home = text.parent / "home"
    if not (home / "pulled").exists():
        cmd = [sys.executable, "-m", "llmd", "pull", str(text), "--name", LLMD_BENCH_MODEL]
        subprocess.run(cmd, env=llmd_env(home), check=True)
        (home / "pulled").touch()
    return home


def image(seed: int, size: int = 896) -> bytes:
    """A photo-like JPEG (smooth colour fields, edges and grain), a new one for each seed."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8))
    base = np.asarray(coarse.resize((size, size), Image.Resampling.BICUBIC), dtype=np.float32)
    grain = rng.normal(0, 12, (size, size, 3))
    pixels = np.clip(base + grain, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.loads(r.read())


def ask(base_url: str, model: str, jpeg: bytes) -> tuple[float, dict]:
    """(seconds to the first token, the response) for one turn with the image."""
    url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
    content = [
        {"type": "text", "text": "ab"},
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "ab"},
    ]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1,
        "temperature": 0,
    }
    started = time.perf_counter()
    out = post(base_url + "/v1/chat/completions", body)
    return time.perf_counter() - started, out


def llmd_encode_seconds(base_url: str) -> float:
    """llmd_image_encode_seconds_total summed over the loaded models."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^llmd_image_encode_seconds_total\{[^}]*\} (\S+)$", text, re.M)
    )


def _log_seconds(stamp: str) -> float:
    """llama.cpp's log timestamp (minutes.seconds.milliseconds.microseconds since start)."""
    minutes, seconds, ms, us = (int(x) for x in stamp.split("."))
    return 60 * minutes + seconds + ms / 1e3 + us / 1e6


def llama_encode_ms(log: str) -> list[float]:
    """Each image batch's encode in llama-server's log (at `-lv 4`): from the server's
    "encoding mtmd batch" line (just before `mtmd_batch_encode`) to libmtmd's "decoding image
    batch" (the first thing after it). llama-server logs no duration of its own for it."""
    stamp = r"^(\d+\.\d+\.\d+\.\d+) "
    starts = re.findall(stamp + r".*encoding mtmd batch", log, re.M)
    ends = re.findall(stamp + r".*decoding image batch 1/", log, re.M)
    return [1000 * (_log_seconds(b) - _log_seconds(a)) for a, b in zip(starts, ends, strict=False)]


def llama_prefill_ms(log: str) -> list[float]:
    """Each "image decoded (batch i/n) in N ms": the image rows' prefill in the text model."""
    return [float(x) for x in re.findall(r"image decoded \(batch \d+/\d+\) in (\d+) ms", log)]


def llmd_wait_loaded(base_url: str, model: str, timeout: float = 600.0) -> dict:
    """The /status entry of `model` once its --preload load and warmup are done (llama-server
    answers /health only once its model and mmproj are loaded: llmd's first image is then
    timed from the same point, not with the model's load in it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(base_url + "/status", timeout=30) as r:
            models = {m["name"]: m for m in json.loads(r.read()).get("models", [])}
        entry = models.get(model)
        if entry and entry.get("state") == "ready":
            return entry
        if entry and entry.get("last_error"):
            raise RuntimeError(f"llmd could not load {model}: {entry['last_error']}")
        time.sleep(0.2)
    raise RuntimeError(f"llmd did not load {model} within {timeout:.0f} s")


def measure(args: argparse.Namespace) -> None:
    text, mmproj = write_models(args.dir, args.layers)
    home = llmd_home(args.dir, args.layers)
    seeds = json.loads((args.dir / "seed").read_text()) if (args.dir / "seed").exists() else 0
    (args.dir / "seed").write_text(json.dumps(seeds + args.images + 1))
    if args.server == "llmd":
        port = free_port()
        argv = [sys.executable, "-m", "llmd", "serve", "--port", str(port)]
        argv += ["--threads", str(args.threads), "--max-sequences", "1"]
        argv += ["--preload", LLMD_BENCH_MODEL]
        server = ManagedServer("llmd", argv, port, env=llmd_env(home))
        model = LLMD_BENCH_MODEL
    else:
        server = llama_server(
            args.llama_server,
            text,
            threads=args.threads,
            slots=1,
            ctx_per_slot=4096,
            extra=["--mmproj", str(mmproj), "--no-mmproj-offload", "-lv", "4"],
        )
        model = "bench"
    with server:
        started = time.perf_counter()
        server.start(timeout=600)
        load: dict = {}
        if args.server == "llmd":
            entry = llmd_wait_loaded(server.base_url, model)
            load = {"load_ms": entry["load_ms"], "warmup_ms": (entry.get("warmup") or {}).get("ms")}
        start_ms = round(1000 * (time.perf_counter() - started), 1)
        for i in range(args.images + 1):
            jpeg = image(seeds + i)
            before = llmd_encode_seconds(server.base_url) if args.server == "llmd" else 0.0
            ttft, out = ask(server.base_url, model, jpeg)
            if args.server == "llmd":
                encode_ms = 1000 * (llmd_encode_seconds(server.base_url) - before)
                prefill_ms = None
            else:
                log = server.log.read_text(errors="replace")
                encode_ms, prefill_ms = llama_encode_ms(log)[-1], llama_prefill_ms(log)[-1]
            row = {
                "server": args.server,
                "layers": args.layers,
                "first": i == 0,
                "image_bytes": len(jpeg),
                "prompt_tokens": out["usage"]["prompt_tokens"],
                "ttft_ms": round(1000 * ttft, 1),
                "encode_ms": round(encode_ms, 1),
                "image_prefill_ms": prefill_ms,
                # Spawn to ready (llmd: its --preload model loaded and warmed up): not in the TTFT.
                "start_ms": start_ms if i == 0 else None,
                **(load if i == 0 else {}),
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            print(json.dumps(row), flush=True)
            with open(args.dir / "results.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")


def report(directory: Path) -> None:
    rows = [json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines()]
    for layers, server in sorted({(r.get("layers", 27), r["server"]) for r in rows}):
        mine = [r for r in rows if r["server"] == server and r.get("layers", 27) == layers]
        for first in (True, False):
            part = [r for r in mine if r["first"] == first]
            if not part:
                continue
            label = "first image" if first else "later images"
            enc = statistics.median(r["encode_ms"] for r in part)
            ttft = statistics.median(r["ttft_ms"] for r in part)
            print(
                f"{layers} layers, {server} {label} (n={len(part)}): encode median {enc:,.0f} ms, "
                f"TTFT median {ttft:,.0f} ms, prompt tokens {part[0]['prompt_tokens']}"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dir", type=Path, required=True, help="model files and results.jsonl")
    ap.add_argument("--server", choices=["llmd", "llama.cpp"])
    ap.add_argument("--images", type=int, default=0, help="images after the first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--layers",
        type=int,
        default=27,
        help="tower layers (27: gemma-3-4b's; fewer: a quicker run)",
    )
    ap.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA_SERVER)
    ap.add_argument(
        "--write-only", action="store_true", help="write the model files, pull them, stop"
    )
    ap.add_argument("--report", action="store_true", help="summarize DIR/results.jsonl")
    args = ap.parse_args(argv)
    # A timeout's SIGTERM unwinds like Ctrl-C: the server this run started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.report:
        report(args.dir)
    elif args.write_only:
        llmd_home(args.dir, args.layers)
    elif args.server:
        measure(args)
    else:
        ap.error("--server, --write-only or --report")
    return 0


if __name__ == "__main__":
    sys.exit(main())
