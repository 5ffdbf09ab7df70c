"""What transformers' image processors made of the test images, as the recording scripts
(tests/fixtures/record_*_images.py) saved it in tests/fixtures/*_images_transformers.npz: the
images as PNG bytes, the cases (each a name and the processor settings it ran with), and the
prompt, word-level vocabulary and special tokens the processor's prompt layout was tokenized
with. One reader for every architecture's preprocessing tests."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from llmd.text.images import decode_image

FIXTURES = Path(__file__).parents[1] / "fixtures"


class ImageRecording:
    def __init__(self, filename: str) -> None:
        self.ref = np.load(FIXTURES / filename)
        self.cases: list[dict[str, Any]] = json.loads(self.ref["cases"].tobytes())

    @property
    def names(self) -> list[str]:
        return [c["name"] for c in self.cases]

    def image(self, name: str) -> Any:
        """The named image, decoded as the daemon decodes an upload."""
        return decode_image(self.ref[f"{name}.png"].tobytes(), "p").pixels

    def case(self, name: str) -> tuple[Any, dict[str, Any]]:
        """The case's image and its recorded case (its settings)."""
        return self.image(name), next(c for c in self.cases if c["name"] == name)

    @property
    def prompt(self) -> str:
        return self.ref["prompt"].tobytes().decode()

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """The recording's tokenizer: words, each space and newline a token (so the layout's
        blank lines count), special tokens whole."""
        tok = Tokenizer(
            models.WordLevel(json.loads(self.ref["vocab"].tobytes()), unk_token="<unk>")
        )
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s"), behavior="isolated")
        tok.add_special_tokens(json.loads(self.ref["special"].tobytes()))
        return tok
