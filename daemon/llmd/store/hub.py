"""Talking to the Hugging Face Hub (or a mirror): repo metadata, file metadata, clear errors.

The conventions followed are huggingface_hub's own (file_download.get_hf_file_metadata,
HfApi.model_info): ``GET {endpoint}/api/models/{repo}[/revision/{rev}]?blobs=true`` lists a
repo's files with their LFS sha256 and size; ``HEAD {endpoint}/{repo}/resolve/{rev}/{file}``,
read without following the redirect, gives ``X-Repo-Commit``, ``X-Linked-Etag`` (an LFS file's
sha256), ``X-Linked-Size`` and the CDN ``Location`` to download from. The endpoint is
``HF_ENDPOINT`` (default https://huggingface.co); the token is ``huggingface_hub.get_token()``
(``HF_TOKEN``, else the file ``huggingface-cli login`` wrote). The token is sent to the
endpoint's host only, never to the CDN a download is redirected to.

Errors are `HubError`s whose message says what to do: 401/403 (gated or private: accept the
license, set HF_TOKEN), 404 (which repo/file/revision), and an unreachable endpoint (offline:
mention HF_ENDPOINT).
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import aiohttp

from llmd.store.manifests import StoreError

DEFAULT_ENDPOINT = "https://huggingface.co"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_META_TIMEOUT = aiohttp.ClientTimeout(total=60, connect=15)


class HubError(StoreError):
    code = "hub_error"
    status = 502


class HubAccessDenied(HubError):
    code = "hub_access_denied"
    status = 403


class HubNotFound(HubError):
    code = "model_not_found"
    status = 404


class HubUnreachable(HubError):
    code = "hub_unreachable"
    status = 502


class IntegrityError(HubError):
    code = "integrity_error"
    status = 502


def hub_endpoint(override: str | None = None) -> str:
    return (override or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_token(override: str | None = None) -> str | None:
    """A token given with the request, else huggingface_hub's (HF_TOKEN or its token file)."""
    if override:
        return override
    try:
        from huggingface_hub import get_token
    except ImportError:  # pragma: no cover - a dependency of tokenizers
        return os.environ.get("HF_TOKEN") or None
    return get_token()


@dataclass(frozen=True)
class Sibling:
    name: str
    size: int | None = None
    sha256: str | None = None  # LFS files only


@dataclass(frozen=True)
class RepoInfo:
    repo: str
    sha: str  # the commit every file is then fetched at, so a pull is one consistent snapshot
    siblings: dict[str, Sibling] = field(default_factory=dict)
    gated: Any = False


@dataclass(frozen=True)
class RemoteFile:
    repo: str
    revision: str
    filename: str
    url: str  # where the bytes are (the CDN location for LFS files)
    size: int
    sha256: str | None  # LFS sha256 (X-Linked-Etag); None for small git files
    git_sha1: str | None  # ETag of a small git file (its git blob sha1)
    send_token: bool  # whether `url` is on the hub's own host


class HubClient:
    """Hub metadata over a shared aiohttp session."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        endpoint: str | None = None,
        token: str | None = None,
    ) -> None:
        self.session = session
        self.endpoint = hub_endpoint(endpoint)
        self.token = token
        self._host = urlsplit(self.endpoint).netloc

    def headers_for(self, url: str) -> dict[str, str]:
        headers = {"User-Agent": "llmd", "Accept-Encoding": "identity"}
        if self.token and urlsplit(url).netloc == self._host:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def repo_url(self, repo: str) -> str:
        return f"{self.endpoint}/{repo}"

    def resolve_url(self, repo: str, revision: str, filename: str) -> str:
        return f"{self.endpoint}/{repo}/resolve/{quote(revision, safe='')}/{quote(filename)}"

    async def model_info(self, repo: str, revision: str | None = None) -> RepoInfo:
        url = f"{self.endpoint}/api/models/{repo}"
        if revision:
            url += f"/revision/{quote(revision, safe='')}"
        async with self._request("GET", url, params={"blobs": "true"}) as r:
            await self.raise_for(r, repo, revision=revision)
            data = await r.json(content_type=None)
        siblings = {}
        for s in data.get("siblings") or []:
            lfs = s.get("lfs") or {}
            sha = lfs.get("sha256") or lfs.get("oid")
            siblings[s["rfilename"]] = Sibling(
                name=s["rfilename"],
                size=lfs.get("size") or s.get("size"),
                sha256=sha if isinstance(sha, str) and _SHA256.match(sha) else None,
            )
        return RepoInfo(
            repo=data.get("id") or repo,
            sha=data.get("sha") or revision or "main",
            siblings=siblings,
            gated=data.get("gated", False),
        )

    async def file_meta(self, repo: str, revision: str, filename: str) -> RemoteFile:
        """HEAD the resolve URL without following the CDN redirect (as huggingface_hub)."""
        url = self.resolve_url(repo, revision, filename)
        for _ in range(5):
            async with self._request("HEAD", url, allow_redirects=False) as r:
                await self.raise_for(r, repo, filename=filename, revision=revision)
                h = r.headers
                location = h.get("Location")
                linked = _etag(h.get("X-Linked-Etag"))
                if 300 <= r.status < 400 and location and not linked:
                    target = urljoin(url, location)
                    if urlsplit(target).netloc == self._host:  # a renamed repo: follow
                        url = target
                        continue
                etag = linked or _etag(h.get("ETag"))
                size_header = h.get("X-Linked-Size") or (
                    None if 300 <= r.status < 400 else h.get("Content-Length")
                )
                download = urljoin(url, location) if location else url
                break
        else:
            raise HubError(f"too many redirects resolving {filename} in {repo}")
        if size_header is None:
            raise HubError(f"the hub gave no size for {filename} in {repo}")
        return RemoteFile(
            repo=repo,
            revision=h.get("X-Repo-Commit") or revision,
            filename=filename,
            url=download,
            size=int(size_header),
            sha256=etag if etag and _SHA256.match(etag) else None,
            git_sha1=etag if etag and _SHA1.match(etag) else None,
            send_token=urlsplit(download).netloc == self._host,
        )

    def _request(self, method: str, url: str, **kwargs: Any) -> Any:
        return _Guarded(self, method, url, kwargs)

    async def raise_for(
        self,
        r: aiohttp.ClientResponse,
        repo: str,
        *,
        filename: str | None = None,
        revision: str | None = None,
    ) -> None:
        """A HubError saying what to do, for any non-success answer."""
        if r.status < 400:
            return
        code = r.headers.get("X-Error-Code", "")
        page = self.repo_url(repo)
        if r.status in (401, 403) and code != "RepoNotFound":
            if self.token:
                raise HubAccessDenied(
                    f"the hub refused access to {repo} with your token (HTTP {r.status}). "
                    f"If it is gated, accept its license at {page} with the account the "
                    "token belongs to; check that HF_TOKEN (or `huggingface-cli login`) holds "
                    "a valid read token."
                )
            raise HubAccessDenied(
                f"{repo} is gated or private: the hub answered HTTP {r.status} to a request "
                f"without a token. Accept its license at {page} if it is gated, then give "
                "llmd a read token (https://huggingface.co/settings/tokens): `export "
                "HF_TOKEN=hf_...` or `huggingface-cli login`, and pull again."
            )
        if r.status in (401, 403, 404) and code == "RepoNotFound":
            private = "" if self.token else " (a private repo needs HF_TOKEN)"
            raise HubNotFound(
                f"repository {repo} was not found on {self.endpoint}{private}; check the "
                "name (ORG/REPO, as in the hub's URL)."
            )
        if r.status == 404 and code == "RevisionNotFound":
            raise HubNotFound(f"revision '{revision}' of {repo} was not found")
        if r.status == 404 and filename:
            raise HubNotFound(f"file {filename} was not found in {repo} (revision {revision})")
        if r.status == 404:
            raise HubNotFound(f"repository {repo} was not found on {self.endpoint}")
        message = r.headers.get("X-Error-Message") or r.reason or ""
        raise HubError(
            f"the hub answered HTTP {r.status} for {repo}"
            + (f"/{filename}" if filename else "")
            + (f": {message}" if message else "")
            + ("; try again in a while" if r.status >= 500 or r.status == 429 else "")
        )

    def unreachable(self, exc: BaseException) -> HubUnreachable:
        return HubUnreachable(
            f"could not reach the Hugging Face hub at {self.endpoint} "
            f"({exc.__class__.__name__}: {exc or 'timed out'}). Check the network connection; "
            "to use a mirror, set HF_ENDPOINT where the llmd daemon runs (or in the shell "
            "running `llmd pull`)."
        )


class _Guarded:
    """``async with client._request(...) as r``: connection failures become HubUnreachable."""

    def __init__(self, client: HubClient, method: str, url: str, kwargs: dict[str, Any]):
        self.client = client
        self.method = method
        self.url = url
        self.kwargs = kwargs
        self._cm: Any = None

    async def __aenter__(self) -> aiohttp.ClientResponse:
        headers = {**self.client.headers_for(self.url), **self.kwargs.pop("headers", {})}
        self.kwargs.setdefault("timeout", _META_TIMEOUT)
        self._cm = self.client.session.request(
            self.method, self.url, headers=headers, **self.kwargs
        )
        try:
            return await self._cm.__aenter__()
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError, OSError) as exc:
            raise self.client.unreachable(exc) from exc

    async def __aexit__(self, *exc: Any) -> None:
        await self._cm.__aexit__(*exc)


def _etag(value: str | None) -> str | None:
    if not value:
        return None
    return value.removeprefix("W/").strip('"').lower() or None


# ---------------------------------------------------------------------- repo references

_QUANT_TAG = re.compile(
    r"(?i)(?:^|[-._])((?:IQ|Q|TQ)\d+(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4)(?=$|[-._])"
)
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
DEFAULT_TAGS = ("Q4_K_M", "Q4_0", "Q8_0", "Q4_K_S", "Q6_K")


@dataclass(frozen=True)
class RepoRef:
    repo: str
    tag: str | None
    revision: str | None = None


def parse_repo_ref(source: str) -> RepoRef | None:
    """``hf.co/ORG/REPO[:TAG]`` (also ``huggingface.co/...``, ``https://...``); None if
    `source` is not one. A revision can follow ``@`` (``hf.co/ORG/REPO@rev:TAG``)."""
    s = source.strip()
    for prefix in ("https://", "http://"):
        s = s.removeprefix(prefix)
    for prefix in ("hf.co/", "huggingface.co/"):
        if s.startswith(prefix):
            s = s[len(prefix) :]
            break
    else:
        return None
    tag = None
    if ":" in s:
        s, tag = s.rsplit(":", 1)
        tag = tag or None
    revision = None
    if "@" in s:
        s, revision = s.split("@", 1)
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", s):
        raise HubNotFound(f"'{source}' is not a hub repo reference: use hf.co/ORG/REPO[:QUANT]")
    return RepoRef(repo=s, tag=tag, revision=revision)


def quant_tag(filename: str) -> str | None:
    """The quantization label in a GGUF file name (``Q4_K_M`` in ``x-Q4_K_M.gguf``)."""
    stem = re.sub(r"(?i)\.gguf$", "", _SPLIT.sub(".gguf", filename.rsplit("/", 1)[-1]))
    found = _QUANT_TAG.findall(stem)
    return found[-1].upper() if found else None


def gguf_files(info: RepoInfo) -> list[str]:
    return sorted(n for n in info.siblings if n.lower().endswith(".gguf"))


# The mmproj precisions llmd takes, best first: float16 is what llama.cpp's repos (ggml-org,
# unsloth, bartowski) publish and recommend (a vision tower loses more to quantization than a
# decoder does); bf16 and f32 are exact too, q8_0 the smallest.
_MMPROJ_PREFERENCE = ("F16", "BF16", "F32", "Q8_0")


def choose_mmproj(info: RepoInfo, model_file: str) -> str | None:
    """The repo's llama.cpp vision tower for `model_file`: an `mmproj*.gguf` in the same folder
    (the repos that ship one put it beside the quantizations), in the preferred precision;
    None when the repo has none."""
    folder = model_file.rpartition("/")[0]
    return pick_mmproj([f for f in gguf_files(info) if f.rpartition("/")[0] == folder])


def pick_mmproj(names: list[str]) -> str | None:
    """The llama.cpp vision tower among GGUF file names (`mmproj*.gguf`), in the preferred
    precision; None when there is none."""
    found = sorted(n for n in names if n.rpartition("/")[2].lower().startswith("mmproj"))
    for tag in _MMPROJ_PREFERENCE:
        for f in found:
            if quant_tag(f) == tag:
                return f
    return found[0] if found else None


def choose_gguf(info: RepoInfo, tag: str | None) -> str:
    """The GGUF file of `info` for `tag` (by default Q4_K_M, else the most common choices);
    HubNotFound listing the tags that exist."""
    files = [f for f in gguf_files(info) if "mmproj" not in f.lower()]
    by_tag: dict[str, list[str]] = {}
    for f in files:
        t = quant_tag(f)
        if t:
            by_tag.setdefault(t, []).append(f)
    wanted = [tag.upper()] if tag else [*DEFAULT_TAGS]
    for t in wanted:
        if t in by_tag:
            chosen = by_tag[t]
            singles = [f for f in chosen if not _SPLIT.search(f)]
            if not singles:
                raise HubNotFound(
                    f"{info.repo}:{t} is split into {len(chosen)} parts "
                    f"({chosen[0]}, ...); split GGUF files are not supported yet: pick "
                    "another quantization or a repo with single-file GGUFs"
                )
            return singles[0]
    if not tag and len(files) == 1:
        return files[0]
    available = ", ".join(sorted(by_tag)) or "none"
    if tag:
        raise HubNotFound(
            f"{info.repo} has no {tag} GGUF file. Quantization tags it has: {available} "
            f"(pull one as hf.co/{info.repo}:TAG)"
        )
    raise HubNotFound(
        f"{info.repo} has several GGUF files; name one: hf.co/{info.repo}:TAG with TAG one of "
        f"{available}"
    )
