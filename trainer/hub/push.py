"""Upload a model folder to the Hub: for `python -m trainer push SRC org/name[@branch]` (trainer/push_command.py), and
TRAIN_PUSH_TO_HUB at the end of a successful run (trainer/export/publish.py).

Through huggingface_hub (create_repo, create_branch, upload_folder). The token is huggingface_hub's own: HF_TOKEN,
else the file HF_TOKEN_PATH names; trainkit never writes it anywhere. The repository is created private unless
`--public`. Every failure is one ConfigError naming the case (no token, refused, not found, network), and the local
folder is left as it was. The upload is one commit (huggingface_hub's upload_folder): an interrupted push (exit
128+N) leaves the branch with all of the folder or none of it, and two pushes to one branch at once are two whole
commits, the later one its head.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from trainer.errors import ConfigError
from trainer.hub.ids import HubRef, parse_model_id
from trainer.hub.weights import check_weights
from trainer.secrets import mask_url_credentials

log = logging.getLogger("trainer")
PUSH_FAILED_MARKER = "push_failed"  # OUTPUT_DIR/push_failed: a multi-process run finished but its push failed
OFFLINE_VALUES = ("1", "true", "yes", "on")
NO_TOKEN = ("no Hub token: set HF_TOKEN (a token with write access, from {endpoint}/settings/tokens) or HF_TOKEN_PATH "
            "(a file holding it)")  # fmt: skip


def offline_refusal(variable: str) -> str | None:
    """The problem when the user asked for offline mode (HF_HUB_OFFLINE=1) yet wants to push."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in OFFLINE_VALUES:
        return f"{variable} uploads to the Hub, but HF_HUB_OFFLINE=1 forbids network access; unset it for the push"
    return None


def hub_token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


@contextlib.contextmanager
def _online() -> Iterator[None]:
    """The trainer runs with HF_HUB_OFFLINE=1 by default (set_offline_env); a push is the one step that goes online."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = False
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


class PushSettings(Protocol):
    """TRAIN_PUSH_TO_HUB (trainer.config.schema.TrainSettings has it; this floor cannot import it). Read-only, as the
    frozen settings are."""

    @property
    def push_to_hub(self) -> str: ...


def push_problems(settings: PushSettings) -> list[str]:
    """TRAIN_PUSH_TO_HUB's problems found before training: offline mode asked for, or no token."""
    if not settings.push_to_hub:
        return []
    from huggingface_hub import constants

    refusal = offline_refusal("TRAIN_PUSH_TO_HUB")
    if refusal:
        return [refusal]
    if not hub_token():
        return [f"TRAIN_PUSH_TO_HUB={settings.push_to_hub}: " + NO_TOKEN.format(endpoint=mask_url_credentials(
            constants.ENDPOINT))]  # fmt: skip
    return []


def push_folder(folder: Path, spec: str, private: bool = True, variable: str = "TRAIN_PUSH_TO_HUB",
                check_offline: bool = True) -> str:  # fmt: skip
    """Create REPO (private by default) and its branch if missing, upload `folder`; returns the commit URL.
    `check_offline=False`: the run set HF_HUB_OFFLINE itself (its start checked that the user did not)."""
    from huggingface_hub import HfApi, constants

    ref = parse_model_id(spec)
    if ref is None:
        raise ConfigError(f"{variable}: {spec!r} is not a Hub repository; expected org/name or org/name@branch")
    check_weights(folder, f"{variable} {folder}")  # nothing damaged or non-finite is uploaded
    endpoint = mask_url_credentials(constants.ENDPOINT)
    refusal = offline_refusal(variable) if check_offline else None
    if refusal:
        raise ConfigError(refusal)
    token = hub_token()
    if not token:
        raise ConfigError(f"{variable}={spec}: " + NO_TOKEN.format(endpoint=endpoint))
    api = HfApi(token=token)
    try:
        with _online():
            api.create_repo(ref.repo_id, private=private, exist_ok=True)
            if ref.revision:
                api.create_branch(ref.repo_id, branch=ref.revision, exist_ok=True)
            info = api.upload_folder(folder_path=str(folder), repo_id=ref.repo_id, revision=ref.revision,
                                     commit_message=f"trainkit: upload {folder.name}")  # fmt: skip
    except Exception as exc:  # every failure of the library becomes one message; unknown ones are re-raised
        raise ConfigError(_explain(exc, ref, variable, endpoint)) from None
    log.info("push: %s uploaded to %s/%s (%s)", folder, endpoint, ref, "private" if private else "public")
    return str(info.commit_url) if hasattr(info, "commit_url") else str(info)


def _explain(exc: Exception, ref: HubRef, variable: str, endpoint: str) -> str:
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    name = f"{variable}={ref}"
    kept = "the local model is kept"
    status = exc.response.status_code if isinstance(exc, HfHubHTTPError) and exc.response is not None else None
    if isinstance(exc, RepositoryNotFoundError) or status == 404:
        return (f"{name}: not found at {endpoint}: the organization or repository does not exist or the token cannot "
                f"see it; check the name ({kept})")  # fmt: skip
    if status in (401, 403):
        return (f"{name}: refused ({status}): the Hub did not accept the token for writing to {ref.repo_id}; use a "
                f"token with write access to that namespace ({kept})")  # fmt: skip
    if isinstance(exc, HfHubHTTPError):
        return f"{name}: the Hub answered {status}: {mask_url_credentials(str(exc))} ({kept})"
    kind = type(exc).__name__
    if isinstance(exc, (OSError, ConnectionError)) or "Connect" in kind or "Timeout" in kind:
        return f"{name}: the Hub ({endpoint}) cannot be reached ({kind}); check the network or HF_ENDPOINT ({kept})"
    raise exc
