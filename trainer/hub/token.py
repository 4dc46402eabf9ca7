"""Where the Hub token comes from: HF_TOKEN, or a file named by HF_TOKEN_PATH (the documented way: a mounted secret
file stays out of `docker inspect`, job files and the process environment). huggingface_hub reads both itself
(HF_TOKEN first); trainkit only checks that a named file can be read and says in its messages which one is used,
never the token.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainer.errors import ConfigError

PATH_VARIABLE = "HF_TOKEN_PATH"
MOUNT_HINT = (
    "mount the token file there (compose: TRAINKIT_HF_TOKEN_FILE; scripts/run.py --hf-token-file; Kubernetes: the "
    "Secret's volume), or unset HF_TOKEN_PATH"
)


def check_token_file() -> None:
    """A named token file that is missing or unreadable is a mistake: huggingface_hub would go on without a token
    (a gated model then looks like an access problem) or fail with a raw PermissionError."""
    named = os.environ.get(PATH_VARIABLE, "")
    if not named or os.environ.get("HF_TOKEN"):
        return
    try:
        Path(named).read_text()
    except FileNotFoundError:
        raise ConfigError(f"{PATH_VARIABLE}={named}: no such file; {MOUNT_HINT}") from None
    except OSError as exc:
        raise ConfigError(
            f"{PATH_VARIABLE}={named}: cannot be read ({exc.strerror}); make it readable by uid {os.getuid()}, the "
            "user the trainer runs as"
        ) from None


def token_source() -> str:
    """Which token a Hub request carried, for messages."""
    if os.environ.get("HF_TOKEN"):
        return "HF_TOKEN is set"
    named = os.environ.get(PATH_VARIABLE, "")
    if named:
        has_token = Path(named).is_file() and Path(named).read_text().strip()
        return f"the token is read from {PATH_VARIABLE}={named}" if has_token else f"{PATH_VARIABLE}={named} is empty"
    return "HF_TOKEN is not set, nor HF_TOKEN_PATH"
