"""Typed messages of the daemon <-> worker JSONL protocol.

The daemon lives in the text world and the worker in the token world; this module is
the only contract between them. One JSON object per line, in both directions, over the
worker's stdin (daemon -> worker) and stdout (worker -> daemon). The worker's stderr is
its log.

Principles (DESIGN.md §3):
- the worker's first line is ``ready`` (or ``fatal`` if the model cannot load);
- many requests may be in flight; events of different requests interleave;
- each request ends with exactly one ``done`` or one ``error``; the worker keeps serving;
- ``cancel`` takes effect at the next engine step and still ends with ``done``
  (``finish_reason="cancelled"``);
- the worker never sees text, only token ids.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- daemon -> worker


INT32_MAX = 2**31 - 1  # the engine's token counts and windows are int32
Int32 = Annotated[int, Field(ge=-(2**31), le=INT32_MAX)]


class SamplingParams(_Message):
    """Per-request sampling; temperature 0 means greedy."""

    # Integers are bounded by the engine's C++ types, so a value it cannot hold is refused
    # (an `error` naming the request) before it reaches the binding.
    temperature: float = 0.0
    top_k: Int32 = 0  # 0 = disabled
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)  # None: a fresh seed
    frequency_penalty: float = 0.0  # OpenAI's: generated tokens only
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0  # HF/vLLM's: prompt and generated tokens
    repetition_window: Int32 = 0  # the latest tokens the repetition penalty covers; 0: all
    logit_bias: dict[Int32, float] = {}
    top_logprobs: Int32 = -1  # -1: none; 0: the sampled token's logprob; n: and n alternatives


class ImageInput(_Message):
    """One preprocessed image (or pan-and-scan crop) for the worker's vision tower: float32
    pixels, little-endian, base64; shape (channels, height, width) for a tower of fixed-size
    images (Gemma 3), (grid height, grid width, values per patch) of flattened patches for one
    of any size (Qwen3.5, Gemma 4). Its rows in the prompt are the next run of the model's image
    placeholder tokens (one run per image, in order)."""

    pixels: str
    shape: Annotated[list[Annotated[int, Field(ge=1, le=8192)]], Field(min_length=3, max_length=3)]


class Generate(_Message):
    type: Literal["generate"] = "generate"
    id: str
    prompt: list[Int32]
    max_tokens: Int32
    sampling: SamplingParams = SamplingParams()
    stop_tokens: list[Int32] = []
    session: str = ""  # named session: its KV stays pinned when the request ends
    # A llguidance grammar (JSON schema, Lark, regex; llguidance's serialized form) the
    # output must follow: enforced token by token in the worker.
    grammar: str | None = None
    # A sibling choice: the id of an earlier request with the same prompt whose prefill (KV
    # and last logits) this one starts from, so an `n > 1` prompt is prefilled once.
    prefill_of: str = ""
    # Speculative decoding with prompt-lookup (n-gram) drafts: at most this many drafted
    # tokens verified per step (0: off). Lossless: output is the same with or without.
    max_draft: Annotated[int, Field(ge=0, le=32)] = 0
    # With max_draft: the drafts come from the worker's draft model (`--draft-model`; the
    # `speculative_draft_model` feature) instead of prompt lookup.
    draft_model: bool = False
    # With max_draft: the drafts come from the model's own MTP head (Qwen3.5's `mtp.*`; the
    # `speculative_mtp` feature).
    mtp: bool = False
    # Images, encoded in the worker (the `vision` feature) and fed at the prompt's image
    # placeholder runs, in order.
    images: list[ImageInput] = []


class Embed(_Message):
    """Prompts that prefill and end without sampling, queued together so the engine admits
    them into the same steps (beside any generation): answered by one `pooled` per prompt as
    each is ready, with the final-norm hidden state pooled over the prompt (`embedding`: last
    token or mean, L2-normalised when asked) or the raw next-token logits of `logit_tokens`
    after it (`token_logits`: a reranker's yes/no scores), then one `done` (token counts of
    all prompts). One failing prompt fails the request (`error`); `cancel` of the id cancels
    all of them."""

    type: Literal["embed"] = "embed"
    id: str
    prompts: list[list[Int32]] = Field(min_length=1)
    output: Literal["embedding", "token_logits"] = "embedding"
    pooling: Literal["last", "mean", "cls"] = "last"
    normalize: bool = False
    logit_tokens: list[Int32] = []


class Score(_Message):
    """Log probabilities of a prompt's own tokens (legacy completions `echo` + `logprobs`):
    answered by one `scored` message."""

    type: Literal["score"] = "score"
    id: str
    tokens: list[int]
    top_logprobs: int = 0


class Cancel(_Message):
    type: Literal["cancel"] = "cancel"
    id: str


class Unpin(_Message):
    """A named session is over (idle TTL, DELETE): its KV goes back to the evictable cache."""

    type: Literal["unpin"] = "unpin"
    session: str


class StatsRequest(_Message):
    type: Literal["stats"] = "stats"


class Shutdown(_Message):
    type: Literal["shutdown"] = "shutdown"


DaemonMessage = Annotated[
    Generate | Embed | Score | Cancel | Unpin | StatsRequest | Shutdown, Field(discriminator="type")
]

# ---------------------------------------------------------------- worker -> daemon


class ModelFacts(_Message):
    architecture: str
    vocab_size: int
    context_length: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden_size: int
    weight_format: str  # e.g. "gguf:Q4_1", "safetensors:bf16"


class VisionFacts(_Message):
    """The vision tower the worker loaded beside the model (images in), as part of the model's
    load: its weights are read and laid out for the kernels before `ready`, so no image
    request pays for that."""

    architecture: str  # "gemma3", "qwen3_5"
    tokens_per_image: int  # prompt rows per image (0: a count per image, from its size)
    load_ms: float  # its share of the load


class Ready(_Message):
    type: Literal["ready"] = "ready"
    backend: (
        str  # "llmd-cpu"/"llmd-cuda" (llmd's kernels), "mlx-cuda", "mlx-metal", "mlx-cpu" (tests)
    )
    device: str
    model: ModelFacts
    context_length: int  # the context the engine serves (--context-length may exceed the model's)
    max_sequences: int
    kernels: dict[str, str] = {}  # which matmul path / SIMD level the engine uses
    blas: str = ""  # BLAS library the backend resolved, e.g. "openblas"
    features: list[str] = []
    load_ms: float = 0.0
    kv_budget_bytes: int = 0  # KV cache memory the engine may use (prefix cache included)
    # The KV cache's element type ("f16"), what one position of context costs in it (all
    # layers) and how many positions the budget holds.
    kv_type: str = ""
    kv_bytes_per_token: int = 0
    kv_capacity_tokens: int = 0
    # The disk tier's bound (0: off for this model; the stats' kv_disk.off_reason says why).
    kv_disk_bytes: int = 0
    # The draft model loaded beside the model for speculative decoding (its file), or "".
    draft_model: str = ""
    threads: int = 0
    # Resident memory of the worker before and after the weights were loaded (bytes).
    memory: dict[str, int] = {}
    # The vision tower loaded with the model (None: the model takes no images).
    vision: VisionFacts | None = None


class Fatal(_Message):
    """The worker could not start (bad model file, unsupported architecture)."""

    type: Literal["fatal"] = "fatal"
    code: str
    message: str


class TokenLogprob(_Message):
    """A sampled token's log probability under the model (raw logits: before penalties,
    bias, grammar and temperature) and the likeliest alternatives as (id, logprob)."""

    logprob: float
    top: list[tuple[int, float]] = []


class Started(_Message):
    """A request was admitted: its prompt was matched against the prefix cache and its
    prefill begins. Sent before any token, so a protocol whose first event reports the cache
    split (Anthropic's `message_start`) can report it."""

    type: Literal["started"] = "started"
    id: str
    prompt_tokens: int
    cached_tokens: int


class Tokens(_Message):
    """New tokens of one request, in order. May carry several tokens."""

    type: Literal["tokens"] = "tokens"
    id: str
    tokens: list[int]
    logprobs: list[TokenLogprob] | None = None  # one per token, when the request asked
    # Speculative decoding so far (drafted tokens, of which accepted), when the request drafts:
    # a request ended by a stop string is cancelled before its `done`, yet reports them.
    speculative: tuple[int, int] | None = None


class Scored(_Message):
    """Answer to `score`: entry i is token i+1's logprob given tokens[:i+1] (the first token
    has no context, so it has no entry)."""

    type: Literal["scored"] = "scored"
    id: str
    logprobs: list[TokenLogprob]


class Timings(_Message):
    queued_ms: float = 0.0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0


class Done(_Message):
    type: Literal["done"] = "done"
    id: str
    finish_reason: Literal["stop", "length", "cancelled"]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    timings: Timings = Timings()
    # Speculative decoding: tokens drafted and verified, and how many of them were kept.
    drafted_tokens: int = 0
    accepted_tokens: int = 0


class Pooled(_Message):
    """One prompt's result of an `embed` request (prompts[index]). One line per prompt keeps
    every line small, whatever the number of inputs and the width of the model."""

    type: Literal["pooled"] = "pooled"
    id: str
    index: int
    values: list[float]


class Error(_Message):
    """A request failed (id set) or a daemon message was malformed (id None)."""

    type: Literal["error"] = "error"
    id: str | None = None
    code: str  # "invalid_request", "context_length_exceeded", "internal", ...
    message: str


class Stats(_Message):
    type: Literal["stats"] = "stats"
    active_sequences: int
    queued_requests: int
    steps: int
    tokens_generated: int
    kv_bytes: int
    extra: dict[str, object] = {}


WorkerMessage = Annotated[
    Ready | Fatal | Started | Tokens | Scored | Pooled | Done | Error | Stats,
    Field(discriminator="type"),
]

daemon_message_adapter: TypeAdapter[DaemonMessage] = TypeAdapter(DaemonMessage)
worker_message_adapter: TypeAdapter[WorkerMessage] = TypeAdapter(WorkerMessage)


def encode(message: BaseModel) -> bytes:
    """One JSONL line."""
    return message.model_dump_json().encode() + b"\n"


def decode_daemon_message(line: bytes | str) -> DaemonMessage:
    return daemon_message_adapter.validate_json(line)


def decode_worker_message(line: bytes | str) -> WorkerMessage:
    return worker_message_adapter.validate_json(line)
