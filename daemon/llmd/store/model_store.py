"""The model store as its users see it: the manifests and blobs (manifests.py) plus the
operations that install from a local source (install.py) - `llmd pull FILE|DIR|CATALOG-NAME`
in this process, `llmd cp`, `llmd set`. Why two modules: installing needs the store's layout,
and the layout must not need the installer, so imports run one way.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from llmd.store.catalog import builtin_file, install_hint, load_catalog
from llmd.store.install import import_local
from llmd.store.manifests import Manifests, ModelRecord, StoreError, validate_name
from llmd.store.vocabulary import vocabulary_mismatch


class ModelStore(Manifests):
    """Installed models under one llmd home, and installing local sources into it."""

    def pull(
        self,
        source: str,
        name: str | None = None,
        progress: Callable[[str, int, int], None] | None = None,
        kind: str | None = None,
    ) -> ModelRecord:
        """Install a package-shipped catalog entry or a local GGUF file / HF directory, in
        this process (no network). Hub sources go through the daemon (pulls.py). `kind`
        (generate, embed, rerank) overrides what a directory's files say (model_kind.py)."""
        catalog = load_catalog()
        if source in catalog:
            entry = catalog[source]
            path = builtin_file(entry)
            if path is None:
                raise StoreError(
                    f"'{source}' is on the Hugging Face hub ({entry.repo}); "
                    f"`llmd pull {source}` downloads it through the daemon",
                    code="needs_download",
                )
            return import_local(
                self, path, validate_name(name or source), f"catalog:{source}", progress, kind
            )
        local = Path(source).expanduser()
        if local.exists():
            default = local.stem if local.is_file() else local.name
            return import_local(self, local, validate_name(name or default), None, progress, kind)
        if source.startswith(("hf.co/", "huggingface.co/", "https://huggingface.co/")):
            raise StoreError(
                f"'{source}' is on the Hugging Face hub; `llmd pull {source}` downloads it "
                "through the daemon",
                code="needs_download",
            )
        raise StoreError(
            f"'{source}' is neither a catalog name, a hub repo (hf.co/ORG/REPO[:QUANT]) nor a "
            f"local file. {install_hint(source)}",
            code="model_not_found",
            status=404,
        )

    def copy(self, src: str, dst: str) -> ModelRecord:
        """`llmd cp`: a second name for the same weights (no bytes copied)."""
        record = self.resolve(src)
        if record is None:
            raise StoreError(f"model '{src}' is not installed", code="model_not_found", status=404)
        validate_name(dst)
        if record.source.startswith("package:"):  # pin the package file into the store
            record = self.pull(src, dst)
            return record
        return self.write_manifest(
            dataclasses.replace(record, name=dst, modified=time.time(), source=record.source)
        )

    def configure(
        self, name: str, *, kv_type: str | None = None, draft_model: str | None = None
    ) -> ModelRecord:
        """`llmd set`: the model's own load settings (None: unchanged; "": back to the
        daemon's), written into its manifest. A model served from a Python package is pinned
        into the store first (as `copy` does). A draft model must be installed and have the
        model's vocabulary: refused here rather than at its next load."""
        record = self.resolve(name)
        if record is None:
            raise StoreError(f"model '{name}' is not installed", code="model_not_found", status=404)
        if draft_model:
            draft = self.resolve(draft_model)
            if draft is None:
                raise StoreError(
                    f"draft model '{draft_model}' is not installed",
                    code="model_not_found",
                    status=404,
                )
            problem = vocabulary_mismatch(record.path, draft.path)
            if problem:
                raise StoreError(
                    f"'{draft_model}' cannot draft for '{name}': {problem}",
                    code="draft_model_mismatch",
                    status=400,
                )
        if record.source.startswith("package:"):
            record = self.pull(name, name)
        changes: dict[str, str] = {}
        if kv_type is not None:
            changes["kv_type"] = kv_type
        if draft_model is not None:
            changes["draft_model"] = draft_model
        return self.write_manifest(dataclasses.replace(record, **changes))
