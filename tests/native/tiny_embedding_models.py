"""Tiny random Qwen3 embedding and reranker directories, laid out as the real ones are, built
with numpy only: the tests pull them into llmd and the fixture recorder
(tests/fixtures/record_embeddings.py) runs transformers on the very same files.

- Qwen3-Embedding style: the bare decoder saved by sentence-transformers (tensor names without
  ``model.``, no lm_head, tied embeddings), ``modules.json`` naming a Pooling module (last
  token, or mean) and, for last-token pooling, a Normalize module; its tokenizer appends the
  end token to every input, the token last-token pooling reads.
- Qwen3-Reranker style: a whole Qwen3ForCausalLM (untied lm_head) whose vocabulary has "yes"
  and "no"; the directory name says "reranker", which is how llmd recognises one.
- EmbeddingGemma style (google/embeddinggemma-300m's layout): a Gemma3TextModel with
  ``use_bidirectional_attention``, saved by sentence-transformers (no ``model.`` prefix, no
  lm_head, float32), mean pooling, two bias-free identity Dense modules (hidden -> 4 x hidden ->
  hidden) and Normalize; its tokenizer wraps every input in <bos> ... <eos>.

The word-level tokenizer maps ``wN`` to id N (as tests/native/test_architectures.py's).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.native.tiny_models import CONFIGS, weights, write_gguf, write_safetensors

YES_ID, NO_ID = 50, 51


def write_tokenizer(directory: Path, *, append_eos: bool = False, yes_no: bool = False) -> None:
    """tokenizer.json + tokenizer_config.json over the tiny vocabulary (ids 1 and 2 are
    <bos>/<eos>; with `yes_no`, ids 50/51 are the words "yes"/"no")."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = CONFIGS["qwen3"]["vocab_size"]
    words = {f"w{i}": i for i in range(vocab)}
    words.update({"<bos>": 1, "<eos>": 2})
    del words["w1"], words["w2"]
    if yes_no:
        del words[f"w{YES_ID}"], words[f"w{NO_ID}"]
        words.update({"yes": YES_ID, "no": NO_ID})
    tk = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.add_special_tokens(["<bos>", "<eos>"])
    if append_eos:  # as Qwen3-Embedding's tokenizer appends <|endoftext|>
        tk.post_processor = processors.TemplateProcessing(
            single="$A <eos>", special_tokens=[("<eos>", 2)]
        )
    tk.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": "{% for m in messages %}{{ m.content }} {% endfor %}",
                "bos_token": "<bos>",
                "eos_token": "<eos>",
                "add_bos_token": False,
            }
        )
    )


def write_embedding_dir(directory: Path, pooling: str = "last", seed: int = 3) -> None:
    """A Qwen3-Embedding-shaped directory; `pooling` "last" (normalised, as Qwen3-Embedding)
    or "mean" (not normalised)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {**CONFIGS["qwen3"], "tie_word_embeddings": True}
    w = weights("qwen3", seed, config)
    write_safetensors(
        directory / "model.safetensors", {k.removeprefix("model."): v for k, v in w.items()}
    )
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if pooling == "last":
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (directory / "modules.json").write_text(json.dumps(modules, indent=1))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": config["hidden_size"],
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": pooling == "mean",
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
                "pooling_mode_weightedmean_tokens": False,
                "pooling_mode_lasttoken": pooling == "last",
                "include_prompt": True,
            }
        )
    )
    write_tokenizer(directory, append_eos=True)


def write_embedding_gguf(path: Path, pooling_type: int = 3, seed: int = 3) -> None:
    """The embedding directory's weights as an F32 GGUF with llama.cpp's
    ``qwen3.pooling_type`` (1 mean, 2 cls, 3 last, 4 rank), as its converter writes an
    embedding or rerank file (its own byte-level tokenizer: feed it token ids)."""
    config = {**CONFIGS["qwen3"], "tie_word_embeddings": True}
    write_gguf(path, "qwen3", seed, config=config, extra_uints={"qwen3.pooling_type": pooling_type})


def write_reranker_dir(directory: Path, seed: int = 5) -> None:
    """A Qwen3-Reranker-shaped directory (name it "...reranker...")."""
    directory.mkdir(parents=True, exist_ok=True)
    w = weights("qwen3", seed)
    write_safetensors(directory / "model.safetensors", w)
    (directory / "config.json").write_text(json.dumps(CONFIGS["qwen3"], indent=1))
    write_tokenizer(directory, yes_no=True)


# Inputs of the recorded fixture: texts of the tiny vocabulary, of different lengths.
EMBED_TEXTS = [
    "w17 w99 w5",
    "w64 w3 w120 w33 w8 w71 w44 w90 w12",
    "w7",
    "w101 w56 w23 w88 w3 w65 w17 w17 w17 w40 w41 w42 w43 w44 w45 w46 w47 w48 w49 w52",
]
RERANK_QUERY = "w10 w11 w12"
RERANK_DOCUMENTS = [
    "w10 w11 w12 w13",
    "w90 w91",
    "w12 w77 w78 w79 w80 w81",
    "w5",
    "w33 w10 w44 w11 w55 w12",
]


# EmbeddingGemma's config.json keys (its real values: 24 layers, hidden 768, 3 heads of 256, one
# KV head, window 512), scaled down. transformers halves the stored sliding window for a
# bidirectional model (window // 2 + 1 = 5 here: a token sees the tokens fewer than 5 away),
# so inputs longer than 5 tokens tell bidirectional windows from whole-prompt attention.
# Layer 3 is global, as every 6th of the real model's layers.
EMBEDDINGGEMMA_CONFIG: dict = {
    "architectures": ["Gemma3TextModel"],
    "model_type": "gemma3_text",
    "use_bidirectional_attention": True,
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "layer_types": [
        "sliding_attention",
        "sliding_attention",
        "full_attention",
        "sliding_attention",
    ],
    "sliding_window": 8,
    "query_pre_attn_scalar": 24,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": None,
    "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 128,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "dtype": "float32",
}
IDENTITY = "torch.nn.modules.linear.Identity"
# A model card that, as EmbeddingGemma's, says it was trained with Matryoshka Representation
# Learning (so ``dimensions`` is allowed).
EMBEDDINGGEMMA_CARD = (
    "# tiny EmbeddingGemma\n\nTrained with Matryoshka Representation Learning (MRL).\n"
)


def embeddinggemma_dense_weights(seed: int = 9) -> list[np.ndarray]:
    """The two Dense modules' weights ([out, in], no bias): hidden -> 4 x hidden -> hidden."""
    h = EMBEDDINGGEMMA_CONFIG["hidden_size"]
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((4 * h, h)) * h**-0.5).astype(np.float32),
        (rng.standard_normal((h, 4 * h)) * (4 * h) ** -0.5).astype(np.float32),
    ]


def write_embeddinggemma_dir(directory: Path, seed: int = 7, *, card: bool = True) -> None:
    """An EmbeddingGemma-shaped sentence-transformers directory (see the module docstring)."""
    directory.mkdir(parents=True, exist_ok=True)
    c = EMBEDDINGGEMMA_CONFIG
    w = weights("gemma3_text", seed, c)
    write_safetensors(
        directory / "model.safetensors",
        {k.removeprefix("model."): v for k, v in w.items()},
        dtype="F32",
    )
    (directory / "config.json").write_text(json.dumps(c, indent=1))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"},
        {
            "idx": 4,
            "name": "4",
            "path": "4_Normalize",
            "type": "sentence_transformers.models.Normalize",
        },
    ]
    (directory / "modules.json").write_text(json.dumps(modules, indent=1))
    (directory / "4_Normalize").mkdir(exist_ok=True)
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": c["hidden_size"],
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": True,
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
                "pooling_mode_weightedmean_tokens": False,
                "pooling_mode_lasttoken": False,
                "include_prompt": True,
            }
        )
    )
    for name, weight in zip(("2_Dense", "3_Dense"), embeddinggemma_dense_weights(), strict=True):
        (directory / name).mkdir(exist_ok=True)
        config = {
            "in_features": weight.shape[1],
            "out_features": weight.shape[0],
            "bias": False,
            "activation_function": IDENTITY,
        }
        (directory / name / "config.json").write_text(json.dumps(config))
        write_safetensors(
            directory / name / "model.safetensors", {"linear.weight": weight}, dtype="F32"
        )
    (directory / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": c["max_position_embeddings"], "do_lower_case": False})
    )
    _write_gemma_tokenizer(directory)
    if card:
        (directory / "README.md").write_text(EMBEDDINGGEMMA_CARD)


def _write_gemma_tokenizer(directory: Path) -> None:
    """A word-level tokenizer with Gemma's special ids (<pad> 0, <eos> 1, <bos> 2, <unk> 3) that
    wraps every input in <bos> ... <eos>, as EmbeddingGemma's does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = {f"w{i}": i for i in range(4, EMBEDDINGGEMMA_CONFIG["vocab_size"])}
    words.update({"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3})
    tk = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.add_special_tokens(["<pad>", "<eos>", "<bos>", "<unk>"])
    tk.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", 2), ("<eos>", 1)]
    )
    tk.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                # The tokenizer file as it is (transformers would otherwise rebuild a Gemma
                # tokenizer from the model type, over a vocabulary this one does not have).
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<bos>",
                "eos_token": "<eos>",
                "pad_token": "<pad>",
                "unk_token": "<unk>",
                "model_max_length": EMBEDDINGGEMMA_CONFIG["max_position_embeddings"],
            }
        )
    )


# Inputs of the EmbeddingGemma fixture: one shorter than the sliding window, the rest longer.
EMBEDDINGGEMMA_TEXTS = [
    "w17 w99",
    "w64 w3 w120 w33 w8 w71 w44 w90 w12",
    "w101 w56 w23 w88 w3 w65 w17 w17 w17 w40 w41 w42 w43 w44 w45 w46 w47 w48 w49 w52",
    " ".join(f"w{5 + (i * 7) % 120}" for i in range(45)),
]
