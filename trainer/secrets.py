"""The one rule for which variables, flags and values hold secrets, and the masking built on it.

A secret is the value of a variable or flag whose name says so (HF_TOKEN, --hub_token), or a value shaped like
one whatever its name (an hf_... token, the user:password of a URL such as HF_ENDPOINT=https://u:p@mirror).
Used by the trainer (run_config.json, logs, the TRAIN_ARGS check), the launcher (the command it prints) and the
host scripts (run.py's log, cluster.py's Kubernetes Secret and Slurm secrets file). Torch-free and docker-free.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
# Names that contain a secret word but hold no secret (token counts, tokenizer switches): shown as they are.
NOT_SECRET = frozenset(
    {
        "TOKENIZERS_PARALLELISM",
        "AVERAGE_TOKENS_ACROSS_DEVICES",
        "INCLUDE_NUM_INPUT_TOKENS_SEEN",
        "TOKENS_PER_S",
        "INCLUDE_TOKENS_PER_SECOND",
        "LEFT_OUT_TOKENS_PER_EPOCH",
        "TRAIN_RL_MAX_NEW_TOKENS",  # masked, a GRPO run could not be reproduced from its run_config.json
        "MAX_NEW_TOKENS",
    }
)
MASK = "***"
_HF_TOKEN_RE = re.compile(r"\bhf_[A-Za-z0-9]{8,}")
_URL_CREDENTIALS_RE = re.compile(r"(\b[a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@")  # https://user:password@host


def mask_url_credentials(text: str) -> str:
    """`https://user:password@mirror/...` -> `https://***@mirror/...` (HF_ENDPOINT, proxies, mirrors)."""
    return _URL_CREDENTIALS_RE.sub(rf"\1{MASK}@", text)


def mask_value(text: str) -> str:
    """`text` with every hf_ token and URL user:password in it masked (whatever its variable is called)."""
    return mask_url_credentials(_HF_TOKEN_RE.sub(MASK, text))


def is_secret_name(name: str) -> bool:
    """True for a variable name (HF_TOKEN) or a flag (--hub-token, --hub_token=x) that holds a secret."""
    upper = name.split("=", 1)[0].upper().lstrip("-").replace("-", "_")
    return upper not in NOT_SECRET and any(word in upper for word in SECRET_WORDS)


def is_secret_value(text: str) -> bool:
    """True for a value that holds a secret whatever its variable is called: an hf_ token, a URL's user:password,
    or a command line (TRAIN_ARGS) with a secret flag in it."""
    if _HF_TOKEN_RE.search(text) or _URL_CREDENTIALS_RE.search(text):
        return True
    return any(word.startswith("-") and is_secret_name(word) for word in text.split())


def holds_secret(name: str, value: str) -> bool:
    """The one rule: a variable is secret by its name or by its value."""
    return is_secret_name(name) or is_secret_value(value)


def mask_args(args: Sequence[str]) -> list[str]:
    """An argument list with the value after (or in) each secret flag, and anything shaped like an HF token, masked."""
    masked: list[str] = []
    hide_next = False
    for arg in args:
        secret_flag = arg.startswith("-") and is_secret_name(arg)
        if hide_next and not arg.startswith("--"):
            masked.append(MASK)
        elif secret_flag and "=" in arg:
            masked.append(arg.split("=", 1)[0] + "=" + MASK)
        else:
            masked.append(mask_value(arg))
        hide_next = secret_flag and "=" not in arg
    return masked


def mask_args_text(text: str) -> str:
    """A command line held in one string (TRAIN_ARGS) masked as mask_args does."""
    return " ".join(mask_args(text.split()))


def mask_secrets(data: Any, key: str = "") -> Any:
    """Copy of `data` with every value under a key naming a secret masked, and secret flags in strings masked."""
    if isinstance(data, dict):
        return {k: mask_secrets(v, str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [mask_secrets(v, key) for v in data]
    if is_secret_name(key) and data not in (None, "", False):
        return MASK
    if isinstance(data, str):
        if "--" in data or _HF_TOKEN_RE.search(data):
            return mask_args_text(data)
        return mask_url_credentials(data)
    return data
