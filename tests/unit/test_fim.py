"""Fill-in-the-middle: FIM token discovery (GGUF metadata, then well-known vocabulary names),
the prompt (PSM order, repo-level form, trimming to fit), the stops that end a middle, the
400 for a model without FIM tokens, and the request checks of the three routes."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmd.api.infill_api import EditorLimits, parse_infill, pick_fields
from llmd.errors import ApiError
from llmd.store.gguf_metadata import _Cursor, _value
from llmd.text.fim import (
    ExtraFile,
    FimTokens,
    build_fim_prompt,
    find_fim_tokens,
    model_fim_tokens,
    require_fim,
    with_fim_stops,
)
from llmd.text.openai_schemas import CompletionRequest, parse_request
from tests.unit.fake_api import api


def lookup(*names: str):  # type: ignore[no-untyped-def]
    """token_to_id over a vocabulary holding `names` at ids 100, 101, ..."""
    vocab = {name: 100 + i for i, name in enumerate(names)}
    return vocab.get


# ---------------------------------------------------------------------- discovery


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (  # Qwen2.5-Coder
            (
                "<|fim_prefix|>",
                "<|fim_suffix|>",
                "<|fim_middle|>",
                "<|fim_pad|>",
                "<|repo_name|>",
                "<|file_sep|>",
            ),
            FimTokens(100, 101, 102, pad=103, repo=104, file_sep=105),
        ),
        (  # StarCoder2
            (
                "<fim_prefix>",
                "<fim_middle>",
                "<fim_suffix>",
                "<fim_pad>",
                "<repo_name>",
                "<file_sep>",
            ),
            FimTokens(100, 102, 101, pad=103, repo=104, file_sep=105),
        ),
        (  # CodeGemma
            ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|file_separator|>"),
            FimTokens(100, 102, 101, file_sep=103),
        ),
        (  # CodeLlama (SentencePiece)
            ("▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"),
            FimTokens(100, 101, 102),
        ),
        (  # DeepSeek-Coder
            ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
            FimTokens(100, 101, 102),
        ),
    ],
)
def test_fim_tokens_are_found_by_their_well_known_names(names, expected) -> None:  # type: ignore[no-untyped-def]
    assert find_fim_tokens(lookup(*names), 1000) == expected


def test_a_vocabulary_without_prefix_suffix_and_middle_has_no_fim() -> None:
    # A file separator alone (SmolLM2 has StarCoder's <repo_name>/<file_sep>) is no FIM.
    assert find_fim_tokens(lookup("<repo_name>", "<file_sep>", "<fim_prefix>"), 1000) is None


def test_metadata_ids_win_over_names_and_invalid_ones_are_ignored() -> None:
    meta = {
        "tokenizer.ggml.fim_pre_token_id": 7,
        "tokenizer.ggml.fim_suf_token_id": 8,
        "tokenizer.ggml.fim_mid_token_id": -1,  # invalid: the name decides
        "tokenizer.ggml.fim_sep_token_id": 5000,  # outside the vocabulary
    }
    names = lookup("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
    assert find_fim_tokens(names, 1000, meta) == FimTokens(7, 8, 102)


def test_older_prefix_suffix_middle_keys_are_read() -> None:
    meta = {
        "tokenizer.ggml.prefix_token_id": 1,
        "tokenizer.ggml.suffix_token_id": 2,
        "tokenizer.ggml.middle_token_id": 3,
    }
    assert find_fim_tokens(lookup(), 1000, meta) == FimTokens(1, 2, 3)


def test_the_test_model_has_no_fim_tokens(text_model, model_path: Path) -> None:  # type: ignore[no-untyped-def]
    served = SimpleNamespace(
        text=text_model, record=SimpleNamespace(path=str(model_path), format="gguf")
    )
    assert model_fim_tokens(served) is None  # type: ignore[arg-type]
    with pytest.raises(ApiError) as err:
        require_fim(served, "smollm2-135m", "suffix")  # type: ignore[arg-type]
    assert err.value.status == 400 and err.value.param == "suffix"
    assert "smollm2-135m" in err.value.message
    assert "no fill-in-the-middle tokens" in err.value.message


# ---------------------------------------------------------------------- the prompt

# SmolLM2's own control tokens stand in for FIM tokens: 11-13 as prefix/suffix/middle,
# its StarCoder-style <repo_name> (3) and <file_sep> (5) as repo and file separator.
FIM = FimTokens(11, 12, 13, repo=3, file_sep=5)


def encode(text_model, s: str) -> list[int]:  # type: ignore[no-untyped-def]
    return text_model.tokenizer.encode(s, add_special_tokens=False).ids


def test_psm_prompt_is_prefix_suffix_middle_in_order(text_model) -> None:  # type: ignore[no-untyped-def]
    pre, suf = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
    fp = build_fim_prompt(text_model, FIM, pre, suf)
    assert fp.ids == [11, *encode(text_model, pre), 12, *encode(text_model, suf), 13]
    assert not fp.truncated


def test_code_that_spells_a_special_token_stays_text(text_model) -> None:  # type: ignore[no-untyped-def]
    fp = build_fim_prompt(text_model, FIM, 'eos = "<|endoftext|>"', "<file_sep>")
    eos = text_model.tokenizer.token_to_id("<|endoftext|>")
    assert eos not in fp.ids and fp.ids.count(5) == 0
    # ... while the shared tokenizer (chat templates) still reads them as special tokens.
    assert eos in encode(text_model, "<|endoftext|>")


def test_cursor_text_follows_the_prefix(text_model) -> None:  # type: ignore[no-untyped-def]
    fp = build_fim_prompt(text_model, FIM, "x = ", "\n", cursor="compute(")
    pre, cur = encode(text_model, "x = "), encode(text_model, "compute(")
    assert fp.ids[: 1 + len(pre) + len(cur) + 1] == [11, *pre, *cur, 12]


def test_repo_level_prompt_names_the_files(text_model) -> None:  # type: ignore[no-untyped-def]
    extra = [ExtraFile("import os\n", "util.py"), ExtraFile("X = 1\n")]
    fp = build_fim_prompt(text_model, FIM, "a", "b", extra=extra, repo_level=True)
    text = text_model.tokenizer.decode(fp.ids, skip_special_tokens=False)
    assert text == (
        "<repo_name>myproject\n<file_sep>util.py\nimport os\n<file_sep>tmp\nX = 1\n"
        "<file_sep>filename\n<jupyter_start>a<jupyter_text>b<jupyter_code>"
    )


def test_without_a_file_separator_files_are_joined_as_snippets(text_model) -> None:  # type: ignore[no-untyped-def]
    fim = FimTokens(11, 12, 13)
    fp = build_fim_prompt(text_model, fim, "a", "b", extra=[ExtraFile("X = 1")], repo_level=True)
    text = text_model.tokenizer.decode(fp.ids, skip_special_tokens=False)
    assert text == "\n\n--- snippet ---\n\nX = 1<jupyter_start>a<jupyter_text>b<jupyter_code>"


def test_a_bos_model_gets_its_bos_first(text_model) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    bos_model = replace(text_model, add_bos=True)
    fp = build_fim_prompt(bos_model, FIM, "a", "b", extra=[ExtraFile("c")], repo_level=True)
    assert fp.ids[0] == text_model.bos_id and fp.ids[1] == 3


def test_trimming_drops_files_first_then_keeps_prefix_end_and_suffix_start(text_model) -> None:  # type: ignore[no-untyped-def]
    pre = "".join(f"line{i} = {i}\n" for i in range(200))
    suf = "".join(f"after{i}()\n" for i in range(200))
    pre_ids, suf_ids = encode(text_model, pre), encode(text_model, suf)
    extra = [ExtraFile("x" * 400, "big.py")]
    # Room for prefix and suffix whole, and part of the file: its end is kept.
    whole = build_fim_prompt(text_model, FIM, pre, suf, extra=extra, repo_level=True)
    limit = len(whole.ids) - 10
    fp = build_fim_prompt(
        text_model, FIM, pre, suf, extra=extra, repo_level=True, max_prompt_tokens=limit
    )
    assert fp.truncated and len(fp.ids) == limit
    assert fp.ids[-(len(suf_ids) + 1) :] == [*suf_ids, 13]
    assert fp.ids[: len(whole.ids) - limit] != whole.ids[: len(whole.ids) - limit]
    # No room for everything: files go, prefix keeps its end, suffix its start, 3:1.
    fp = build_fim_prompt(
        text_model, FIM, pre, suf, extra=extra, repo_level=True, max_prompt_tokens=403
    )
    assert fp.truncated and len(fp.ids) == 403
    room = 400
    kept_suf, kept_pre = room // 4, room - room // 4
    assert fp.ids == [11, *pre_ids[-kept_pre:], 12, *suf_ids[:kept_suf], 13]


def test_a_short_suffix_leaves_its_room_to_the_prefix(text_model) -> None:  # type: ignore[no-untyped-def]
    pre = "".join(f"v{i} = {i}\n" for i in range(300))
    fp = build_fim_prompt(text_model, FIM, pre, "end()\n", max_prompt_tokens=103)
    suf_ids = encode(text_model, "end()\n")
    assert fp.ids[-(len(suf_ids) + 2) :] == [12, *suf_ids, 13]
    assert len(fp.ids) == 103


def test_end_tokens_become_stops_the_generation_shows(text_model) -> None:  # type: ignore[no-untyped-def]
    fp = build_fim_prompt(text_model, FimTokens(11, 12, 13, pad=0, repo=3, file_sep=5), "a", "b")
    # <|endoftext|> (0) already stops the worker; <repo_name> and <file_sep> end the middle
    # through the stop matcher, so the generation must show them as text.
    assert fp.stops == ("<repo_name>", "<file_sep>")
    assert fp.show_tokens == frozenset({3, 5})
    req = CompletionRequest.model_validate({"model": "m", "prompt": "a", "stop": "\n\n"})
    assert with_fim_stops(req, fp).stop_list() == ["\n\n", "<repo_name>", "<file_sep>"]
    assert req.stop_list() == ["\n\n"]  # the request itself is unchanged


# ---------------------------------------------------------------------- request checks


def test_completions_take_suffix_but_not_with_echo_or_token_ids() -> None:
    req = parse_request({"model": "m", "prompt": "def f(", "suffix": "):"}, CompletionRequest)
    assert req.suffix == "):"
    assert parse_request({"model": "m", "prompt": "a", "suffix": ""}, CompletionRequest)
    with pytest.raises(ApiError) as err:
        parse_request({"model": "m", "prompt": "a", "suffix": "b", "echo": True}, CompletionRequest)
    assert err.value.param == "echo"
    with pytest.raises(ApiError) as err:
        parse_request({"model": "m", "prompt": [1, 2], "suffix": "b"}, CompletionRequest)
    assert err.value.param == "suffix"


def test_infill_body_checks() -> None:
    req = parse_infill(
        {
            "input_prefix": "a",
            "input_suffix": "b",
            "input_extra": [{"filename": "x.py", "text": "y", "time": 3}],
            "prompt": "c",
            "n_predict": 16,
            "top_k": 40,
            "top_p": 0.99,
            "samplers": ["top_k", "top_p", "infill"],
            "cache_prompt": True,
            "t_max_prompt_ms": 500,
            "t_max_predict_ms": 1000,
            "id_slot": 0,
            "stop": "\n\n",
        }
    )
    internal = req.sampling("m", [1, 2, 3])
    assert internal.max_tokens == 16 and internal.top_k == 40 and internal.seed is None
    assert internal.stop_list() == ["\n\n"]
    assert parse_infill({"input_prefix": "", "input_suffix": "", "n_predict": 0}).max_tokens() == 1
    for body, param in [
        ({"input_suffix": ""}, "input_prefix"),
        ({"input_prefix": ""}, "input_suffix"),
        ({"input_prefix": "", "input_suffix": "", "mirostat": 2}, "mirostat"),
        (
            {"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]},
            "input_extra.0.text",
        ),
        ({"input_prefix": "", "input_suffix": "", "temperature": 5}, "temperature"),
        ({"input_prefix": "", "input_suffix": "", "n_cmpl": 2}, "n_cmpl"),
    ]:
        with pytest.raises(ApiError) as err:
            parse_infill(body)
        assert err.value.status == 400 and err.value.param == param, body


def test_n_indent_ends_at_a_less_indented_line() -> None:
    limits = EditorLimits(n_indent=4)
    assert limits.feed("x = 1\n", 0) == ("x = 1\n", False)  # the first line is never checked
    assert limits.feed("    y = 2\n  ", 0) == ("    y = 2\n  ", False)
    assert limits.feed("z", 0) == ("", True)  # cut where the line's text starts
    assert limits.text == "x = 1\n    y = 2\n  "


def test_t_max_predict_ms_ends_at_the_next_new_line() -> None:
    limits = EditorLimits(t_max_ms=100)
    assert limits.feed("a\n", 50) == ("a\n", False)
    assert limits.feed("b", 150) == ("b", False)
    assert limits.feed("c\n", 160) == ("c\n", True)


def test_response_fields_pick_paths() -> None:
    body = {"content": "x", "timings": {"prompt_n": 3}, "truncated": False}
    got = pick_fields(body, ["content", "timings/prompt_n", "timings/missing", "nope"])
    assert got == {"content": "x", "timings/prompt_n": 3}


# ---------------------------------------------------------------------- served (fake worker)

# SmolLM2's <jupyter_start>, <jupyter_text>, <jupyter_code> named as its FIM tokens.
FIM_IDS = {"pre": 11, "suf": 12, "mid": 13}


def with_fim_metadata(src: Path, dst: Path) -> None:
    """Copy a GGUF, adding `tokenizer.ggml.fim_{pre,suf,mid}_token_id` (uint32) to its
    metadata. Tensor offsets are relative to the data section, which only moves to the next
    alignment boundary, so the weights are copied as they are."""
    with open(src, "rb") as f:
        cur = _Cursor(f)
        magic, version = cur.take(4), cur.unpack("<I")
        n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
        kv_start = f.tell()
        alignment = 32
        for _ in range(n_kv):
            key = cur.string()
            value = _value(cur, cur.unpack("<I"))
            if key == "general.alignment":
                alignment = value
        kv_end = f.tell()
        for _ in range(n_tensors):
            cur.string()
            dims = cur.unpack("<I")
            cur.take(8 * dims + 4 + 8)
        infos_end = f.tell()
        data_start = -(-infos_end // alignment) * alignment
        f.seek(kv_start)
        kv = f.read(kv_end - kv_start)
        infos = f.read(infos_end - kv_end)
        f.seek(data_start)
        with open(dst, "wb") as out:
            out.write(magic + struct.pack("<IQQ", version, n_tensors, n_kv + len(FIM_IDS)))
            out.write(kv)
            for role, tid in FIM_IDS.items():
                key = f"tokenizer.ggml.fim_{role}_token_id".encode()
                out.write(struct.pack("<Q", len(key)) + key + struct.pack("<II", 4, tid))
            out.write(infos)
            out.write(b"\0" * (-out.tell() % alignment))
            shutil.copyfileobj(f, out, 1 << 20)


async def test_a_fim_end_token_ends_the_middle(llmd_home: Path, model_path: Path) -> None:
    """The fake worker answers with the prompt's own tokens: /infill's repo-level prompt
    starts with <repo_name>, a FIM end token, so the middle ends at once with nothing shown
    (without the stop, the hidden control tokens would let the echoed files through)."""
    from llmd.paths import get_paths
    from llmd.store.install import import_local
    from llmd.store.model_store import ModelStore

    fim_file = llmd_home / "fim.gguf"
    with_fim_metadata(model_path, fim_file)
    import_local(ModelStore(get_paths()), fim_file, "smollm2-fim", None)
    fim_file.unlink()
    async with api(llmd_home, context=512) as client:
        body = {"model": "smollm2-fim", "input_prefix": "a = ", "input_suffix": "\n"}
        resp = await client.post("/infill", json={**body, "input_extra": [{"text": "x"}]})
        out = await resp.json()
        assert resp.status == 200, out
        assert out["content"] == "" and out["stop_type"] == "eos"
        assert out["tokens_predicted"] == 1
        assert out["prompt"].startswith("<repo_name>myproject\n<file_sep>tmp\nx<file_sep>")
        # /v1/completions: no repo header; the echo runs to the prompt's end, FIM tokens hidden.
        resp = await client.post(
            "/v1/completions", json={"model": "smollm2-fim", "prompt": "a = ", "suffix": "1"}
        )
        out = await resp.json()
        assert resp.status == 200, out
        assert out["choices"][0]["text"] == "a = 1" and out["usage"]["prompt_tokens"] == 7
