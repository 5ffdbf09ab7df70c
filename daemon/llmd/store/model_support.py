"""What the engine can run, in one place: model architectures and GGUF tensor types.

Pulls consult this before downloading anything, so a model the engine cannot run is refused
with a message naming the reason instead of failing at its first request. When the engine
learns a new architecture or a new kernel, extend the constants here and nothing else. (A GGUF's
tokenizer is checked at pull time as well: ``gguf_tokenizer_problem`` below.)

Conversion decision (measured, see ``CONVERSION_TARGET``): GGUF tensors of a type the engine
has no kernel for are converted at pull time, re-encoded without loss where the source is a
special case of a native type (below), otherwise dequantized and re-quantized to **Q8_0**. On
heavy-tailed
weight-like rows (Student-t, 1024x4096) the relative RMS error of a Q5_1 source is 4.35 %;
re-quantized to Q8_0 it becomes 4.40 % (+1 %), to Q4_1 9.6 % (2x). Q8_0's own error (0.7 %)
adds in quadrature, so it keeps the quality the user chose for every source type, IQ*
included, where a 4-bit target would add an error as large as the source's own. The price is
memory (8.5 bits per weight instead of 2-6); the pull says so and names the ratio. Sources that
are a special case of a native type keep every code (block_repack.py): IQ4_XS becomes **IQ4_NL**
(native: its kernels look the 16 levels up), 4.5 bits per weight instead of 8.5, with the same
codes under each 32 weights' scale rounded to fp16; IQ3_S becomes **Q4_K** (4.5 bits instead of
8.5: a 1B IQ3_M file installs as 914 MB instead of 1,473, and decodes 1.6x faster), IQ3_XXS
**Q6_K** (every weight exact, 6.56 bits instead of 8.5). Q5_0 and Q5_1, which llama.cpp writes into
the K-quant files of models whose rows are no multiple of 256 (Qwen2.5-0.5B's 896: 132 of 169
matrices of its Q4_K_M file), run on kernels of their own: as Q8_0 they took 5.5 / 6 bits per
weight to 8.5 and the worker's memory past 1.2x llama-server's. Q5_K, the bulk of Q5_K_M/Q5_K_S files
(and part of Q3_K_L's), has kernels of its own: converting it cost 8.5 bits per weight instead
of 5.5 and made decode on such files memory-bound at ~1.5x llama.cpp's time. So have Q2_K and
Q3_K (the Q2_K and Q3_K_S/M/L files' bulk): converted to Q8_0 and Q6_K, a 1B Q2_K file read
3.2x its bytes per decoded token and decoded at 0.44x llama.cpp's speed (bench/README.md).
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as T

# `general.architecture` values (GGUF) / `model_type` values (config.json) the engine runs
# (native/mlx/model_registry.cpp). Gemma 3 is `gemma3` in GGUF and in multimodal configs (whose
# text_config is a `gemma3_text`), `gemma3_text` in text-only configs; Gemma 4 likewise;
# Qwen3.5-MoE is `qwen3_5_moe` (multimodal) and `qwen3_5_moe_text` in configs, `qwen35moe` in
# GGUF (llama.cpp's converter; its vision tower is a `qwen3vl_merger` mmproj beside it); the
# dense Qwen3.5 likewise `qwen3_5`, `qwen3_5_text` and `qwen35`.
SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "llama",
    "qwen2",
    "qwen3",
    "gemma3",
    "gemma3_text",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
    "qwen35moe",
    "qwen3_5",
    "qwen3_5_text",
    "qwen35",
    "gemma4",
    "gemma4_text",
    # encoders (embedding only): BERT / XLM-RoBERTa (GGUF `bert` holds both), nomic-bert
    "bert",
    "xlm-roberta",
    "nomic_bert",
    "nomic-bert",
)

# Architectures the engine runs from Hugging Face safetensors directories only: GGUF files of
# them are refused at pull time (llmd has no loader for llama.cpp's layout of them yet).
SAFETENSORS_ONLY_ARCHITECTURES: frozenset[str] = frozenset({"gemma4"})

# GGUF tensor types with a native kernel (native/mlx/kernels) or a float path.
NATIVE_GGUF_TYPES: frozenset[int] = frozenset(
    {
        T.F32,
        T.F16,
        T.BF16,
        T.Q8_0,
        T.Q4_0,
        T.Q4_1,
        T.Q5_0,
        T.Q5_1,
        T.Q2_K,
        T.Q3_K,
        T.Q4_K,
        T.Q5_K,
        T.Q6_K,
        T.IQ4_NL,
    }
)

# Types converted at pull time -> the type they become. gguf-py dequantizes all of these
# (names an older gguf-py lacks are skipped: it could not read such files anyway).
_CONVERTED = (
    "IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ4_XS TQ1_0 TQ2_0 MXFP4 NVFP4"
).split()
CONVERSION_TARGET: dict[int, int] = {T[n]: T.Q8_0 for n in _CONVERTED if n in T.__members__}
# IQ4_XS is IQ4_NL's codes under per-32 6-bit scales of one fp16 d: each 32 weights become an
# IQ4_NL block whose d is their scale rounded to fp16 (at most 2^-11 of it), 4.5 bits per weight.
CONVERSION_TARGET[T.IQ4_XS] = T.IQ4_NL
# IQ3_S (the bulk of IQ3_S and IQ3_M files) is a Q4_K sub-block in disguise: its signed odd grid
# values are 2q - 15, so each 32 weights keep their codes under Q4_K's scale and min 1 + 2s
# (block_repack.py), 4.5 bits per weight instead of Q8_0's 8.5.
CONVERSION_TARGET[T.IQ3_S] = T.Q4_K
# IQ3_XXS's grid values are even, so each 32 weights are two Q6_K halves of the same scale, every
# weight exact (block_repack.py), 6.5625 bits per weight.
CONVERSION_TARGET[T.IQ3_XXS] = T.Q6_K

# Type ids llama.cpp used once and removed (ARM-repacked Q4_0); gguf-py no longer knows them.
RETIRED_GGUF_TYPES: dict[int, str] = {31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8"}


def type_name(type_id: int) -> str:
    """``Q4_K`` for 12; retired and unknown ids are named as well as can be."""
    try:
        return T(type_id).name
    except ValueError:
        return RETIRED_GGUF_TYPES.get(type_id, f"type {type_id}")


# MLX-quantized safetensors (mlx-lm's `quantization` block: affine groups, weights packed in
# uint32 with per-group scales and biases) the engine runs without expanding them to float
# (native/mlx/decoder.h Checkpoint): every architecture it runs from safetensors, with these
# bits and group sizes.
MLX_QUANTIZED_ARCHITECTURES: frozenset[str] = frozenset(SUPPORTED_ARCHITECTURES)
MLX_QUANT_BITS: tuple[int, ...] = (4, 8)
MLX_QUANT_GROUP_SIZES: tuple[int, ...] = (32, 64, 128)


def quantization_problem(config: dict, arch: str) -> str | None:
    """Why the engine cannot run a config's quantization (None when it can, or there is none).
    mlx-lm writes `quantization` (and the same dict as `quantization_config`); a
    `quant_method` there is another tool's format."""
    outer = [config]
    if isinstance(config.get("text_config"), dict):
        outer.append(config["text_config"])
    for c in outer:
        for key in ("quantization", "quantization_config"):
            q = c.get(key)
            if not isinstance(q, dict) or not q:
                continue
            if "quant_method" in q:
                return (
                    f"its weights are quantized with '{q['quant_method']}', which llmd cannot run "
                    "(it runs MLX affine 4/8-bit safetensors, GGUF, and float safetensors)"
                )
            mode = q.get("mode", "affine")
            if mode != "affine":
                return f"its MLX quantization mode '{mode}' is not supported (affine only)"
            # The default, then mlx-lm's per-module settings ({"model.layers.0.mlp.gate": {...}}).
            settings = [("", q)] + [(f" ({k})", v) for k, v in q.items() if isinstance(v, dict)]
            for where, setting in settings:
                bits, group = setting.get("bits"), setting.get("group_size")
                if bits not in MLX_QUANT_BITS:
                    return f"its MLX quantization has {bits} bits{where}; llmd runs {MLX_QUANT_BITS} bits"
                if group not in MLX_QUANT_GROUP_SIZES:
                    return (
                        f"its MLX quantization has group_size {group}{where}; llmd runs group "
                        f"sizes {MLX_QUANT_GROUP_SIZES}"
                    )
            if arch not in MLX_QUANTIZED_ARCHITECTURES:
                return (
                    f"MLX-quantized '{arch}' checkpoints are not supported yet (llmd runs them "
                    f"for {', '.join(sorted(MLX_QUANTIZED_ARCHITECTURES))}); pull the original "
                    "bf16 repository or a GGUF"
                )
    return None


def architecture_supported(arch: str) -> bool:
    return arch in SUPPORTED_ARCHITECTURES


def gguf_architecture_supported(arch: str) -> bool:
    return architecture_supported(arch) and arch not in SAFETENSORS_ONLY_ARCHITECTURES


def unsupported_architecture_message(arch: str, what: str) -> str:
    return (
        f"{what} is a '{arch or 'unknown'}' model; llmd's engine runs "
        f"{', '.join(SUPPORTED_ARCHITECTURES)} models only so far."
    )


def unsupported_gguf_message(arch: str, what: str) -> str:
    if arch in SAFETENSORS_ONLY_ARCHITECTURES:
        return (
            f"{what} is a '{arch}' GGUF; llmd runs {arch} models from Hugging Face safetensors "
            "directories only so far (pull the original repository instead)."
        )
    return unsupported_architecture_message(arch, what)


# ---------------------------------------------------------------------- tokenizers
# The GGUF tokenizers text/tokenizer.py rebuilds exactly (checked id for id against llama.cpp),
# by `tokenizer.ggml.model` and `tokenizer.ggml.pre`; anything else is refused at pull time.
# Digits split one by one, then GPT-2's byte-level regex.
DIGITS_THEN_GPT2_PRE = ("smollm", "starcoder", "refact", "command-r")
GPT2_PRE = ("gpt2", "gpt-2", "mpt", "olmo", "jais")
LLAMA3_PRE = ("llama-bpe", "llama3", "llama-v3", "dbrx", "smaug-bpe")
QWEN2_PRE = ("qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan")
QWEN35_PRE = ("qwen35",)
SUPPORTED_PRE_TOKENIZERS = frozenset(
    DIGITS_THEN_GPT2_PRE + GPT2_PRE + LLAMA3_PRE + QWEN2_PRE + QWEN35_PRE
)
# Pre-tokenizers whose words are taken whole when the vocabulary has them, before any merge
# (Llama 3's tokenizer.json `ignore_merges`; llama.cpp sets it for these names).
IGNORE_MERGES_PRE = ("llama-bpe", "llama3", "llama-v3")
# GGUF tokenizer models: byte-level BPE, and the SentencePiece-style ones (spm_tokenizer.py).
SENTENCEPIECE_MODELS = ("llama", "gemma4")
# WordPiece (encoders: BERT, nomic-bert), wpm_tokenizer.py.
WORDPIECE_MODELS = ("bert",)
# SentencePiece unigram, as llama.cpp's converter names XLM-RoBERTa's vocabulary
# (unigram_tokenizer.py), and the architectures it is rebuilt for: XLM-R's encoders, written as
# `bert`. The rebuild wraps inputs as XLM-R does ("<s> A </s>"); T5 and other unigram models
# add their special tokens otherwise, so they stay refused.
UNIGRAM_MODELS = ("t5",)
UNIGRAM_ARCHITECTURES = ("bert",)
SUPPORTED_TOKENIZER_MODELS = ("gpt2", *SENTENCEPIECE_MODELS, *WORDPIECE_MODELS, *UNIGRAM_MODELS)


def gguf_tokenizer_problem(
    model: str | None, pre: str | None, arch: str | None = None
) -> str | None:
    """Why llmd cannot rebuild a GGUF's tokenizer from `tokenizer.ggml.model` and
    `tokenizer.ggml.pre` (for `arch`, its general.architecture), or None when it can (or the
    file names no tokenizer model). Pulls ask this of the header, before downloading the
    weights."""
    if model in UNIGRAM_MODELS and arch not in UNIGRAM_ARCHITECTURES:
        return (
            f"GGUF tokenizer model '{model}' (SentencePiece unigram) is supported for "
            f"XLM-RoBERTa encoders (architecture {', '.join(UNIGRAM_ARCHITECTURES)}) only, "
            f"not for '{arch or 'unknown'}'; the model's Hugging Face repository (safetensors "
            "with tokenizer.json) can be pulled instead"
        )
    if model is None or model in SENTENCEPIECE_MODELS + WORDPIECE_MODELS + UNIGRAM_MODELS:
        return None
    if model != "gpt2":
        return (
            f"GGUF tokenizer model '{model}' is not supported yet (supported: "
            f"{', '.join(SUPPORTED_TOKENIZER_MODELS)}); the model's Hugging Face repository "
            "(safetensors with tokenizer.json) can be pulled instead"
        )
    if (pre or "") not in SUPPORTED_PRE_TOKENIZERS:
        # llama.cpp's "default" (a GGUF without `tokenizer.ggml.pre`) uses its own regex set;
        # better to refuse than to tokenize differently from the model's training.
        return (
            f"GGUF pre-tokenizer '{pre or 'default'}' is not supported yet "
            f"(supported: {', '.join(sorted(SUPPORTED_PRE_TOKENIZERS))})"
        )
    return None
