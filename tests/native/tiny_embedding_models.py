"""Tiny random Qwen3 embedding and reranker directories, laid out as the real ones are, built
with numpy only: the tests pull them into llmd and the fixture recorder
(tests/fixtures/record_embeddings.py) runs transformers on the very same files.

- Qwen3-Embedding style: the bare decoder saved by sentence-transformers (tensor names without
  ``model.``, no lm_head, tied embeddings), ``modules.json`` naming a Pooling module (last
  token, or mean) and, for last-token pooling, a Normalize module; its tokenizer appends the
  end token to every input, the token last-token pooling reads.
- Qwen3-Reranker style: a whole Qwen3ForCausalLM (untied lm_head) whose vocabulary has "yes"
  and "no"; the directory name says "reranker", which is how llmd recognises one.

The word-level tokenizer maps ``wN`` to id N (as tests/native/test_architectures.py's).
"""

from __future__ import annotations

import json
from pathlib import Path

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
