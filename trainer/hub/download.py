"""The one call into huggingface_hub: a repository snapshot in HF_HOME's cache, or a ConfigError saying why not.

huggingface_hub does the protocol, the cache layout, the token (HF_TOKEN or the file HF_TOKEN_PATH names, read by the
library, never passed on or stored by trainkit: token.py), HF_ENDPOINT and HF_HUB_OFFLINE. A snapshot lives at
HF_HOME/hub/<repo>/snapshots/<commit>/, so the folder's name is the commit sha the revision resolved to.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer.errors import ConfigError
from trainer.hub.ids import HubRef
from trainer.hub.token import check_token_file, token_source
from trainer.secrets import mask_url_credentials

# Weights in formats the trainer never loads (the original checkpoint of Llama repos, GGUF, ONNX, TF, Flax...).
MODEL_IGNORE = (
    "original/*", "*.gguf", "*.onnx", "*.onnx_data", "onnx/*", "*.msgpack", "*.h5", "*.ot", "*.tflite", "coreml/*",
)  # fmt: skip
FETCH_HINT = "run `python -m trainer fetch` (or `python scripts/run.py fetch`) where the Hub can be reached"


@dataclass(frozen=True)
class Snapshot:
    ref: HubRef
    path: Path
    sha: str

    def record(self) -> dict[str, str]:
        """What run_config.json and checkpoints record (no token, no host-specific path)."""
        return {"repo_id": self.ref.repo_id, "repo_type": self.ref.repo_type,
                "revision": self.ref.wanted_revision, "sha": self.sha}  # fmt: skip


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def snapshot(
    ref: HubRef, variable: str, revision: str | None = None, allow: tuple[str, ...] | None = None
) -> Snapshot:
    """Download (or find in the cache, offline) `ref` at `revision` (default: the ref's own), only the files matching
    `allow` if given; ConfigError on failure."""
    from huggingface_hub import snapshot_download

    check_token_file()
    wanted = revision or ref.wanted_revision
    ignore = list(MODEL_IGNORE) if ref.repo_type == "model" and allow is None else None
    try:
        folder = snapshot_download(
            ref.repo_id, repo_type=ref.repo_type, revision=wanted, ignore_patterns=ignore,
            allow_patterns=list(allow) if allow else None,
        )  # fmt: skip
    except Exception as exc:  # every failure of the library becomes one message; unknown ones are re-raised
        raise ConfigError(_explain(exc, ref, variable, wanted)) from None
    path = Path(folder)
    return Snapshot(ref, path, path.name)


def _explain(exc: Exception, ref: HubRef, variable: str, revision: str) -> str:
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = mask_url_credentials(constants.ENDPOINT)
    name = f"{variable}={ref}"
    page = f"{endpoint}/{'datasets/' if ref.repo_type == 'dataset' else ''}{ref.repo_id}"
    token = token_source()
    if isinstance(exc, GatedRepoError):
        return (f"{name}: gated repository: accept its conditions at {page} with your account, then pass a token of "
                f"that account with read access in HF_TOKEN or HF_TOKEN_PATH ({token})")  # fmt: skip
    if isinstance(exc, RepositoryNotFoundError):
        return (f"{name}: not found on the Hub ({endpoint}) and no such local folder: check the spelling, or, for a "
                f"private repository, pass a token that may read it (HF_TOKEN or HF_TOKEN_PATH; {token})")  # fmt: skip
    if isinstance(exc, RevisionNotFoundError):
        return f"{name}: the repository has no revision {revision!r}; use a branch, tag or commit sha listed at {page}"
    if isinstance(exc, LocalEntryNotFoundError):
        return _not_cached(name, revision, exc)
    if isinstance(exc, HfHubHTTPError) and exc.response is not None and exc.response.status_code in (401, 403):
        return (f"{name}: unauthorized ({exc.response.status_code}): the Hub refused the token (invalid, expired or "
                f"without read access); create a read token at {endpoint}/settings/tokens "
                f"({token})")  # fmt: skip
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        return f"{name}: the Hub answered {status}: {mask_url_credentials(str(exc))}"
    if isinstance(exc, OSError):
        return f"{name}: cannot write the cache {cache_dir()} ({exc}); make HF_HOME a writable folder"
    raise exc


def _not_cached(name: str, revision: str, exc: Exception) -> str:
    where = f"the cache {cache_dir()} (HF_HOME)"
    if offline():
        return (f"{name}: revision {revision!r} is not in {where}, and HF_HUB_OFFLINE=1 forbids downloading; "
                f"{FETCH_HINT}, then copy or mount that cache here")  # fmt: skip
    cause = exc.__cause__ or exc
    return (f"{name}: the Hub cannot be reached ({type(cause).__name__}) and revision {revision!r} is not in {where}; "
            f"check the network or proxy (HF_ENDPOINT), or {FETCH_HINT} and set HF_HUB_OFFLINE=1")  # fmt: skip
