"""The one rule for which variables, flags and values hold secrets, and the masking built on it.

A secret is a value shaped like one whatever its name (an hf_... token, the user:password of a URL such as
HF_ENDPOINT=https://u:p@mirror, a secret flag's value in a command line), or a credential-shaped value of a variable or
flag whose name says it holds one: a word of the name is TOKEN, KEY, SECRET, PASSWORD, ... (HF_TOKEN, WANDB_API_KEY,
--hub_token), not a word that merely contains one (RL_MAX_NEW_TOKENS, TOKENIZERS_PARALLELISM, `tokenizers`). What
the value is decides too: a number, a boolean (not text) or a version is never a credential, so no setting
(TRAIN_RL_MAX_NEW_TOKENS=6) and no library version is masked in a record (run_config.json, provenance.json, a
checkpoint's record).
Used by the trainer (run_config.json, logs, the TRAIN_ARGS check), the launcher (the command it prints) and the
host scripts (run.py's log, cluster.py's Kubernetes Secret and Slurm secrets file). Torch-free and docker-free.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

SECRET_WORDS = frozenset({"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "CREDENTIALS"})
_VERSION_RE = re.compile(r"v?\d+(\.\d+)+((a|b|rc|\.?dev|\.?post)\d*)*(\+[\w.]+)?")  # 0.22.1, 2.13.0+cpu, 1.2rc1
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
    """True for a variable name (HF_TOKEN) or a flag (--hub-token, --hub_token=x) that says it holds a secret: one of
    its words (split at _ and -) is a secret word."""
    upper = name.split("=", 1)[0].upper().lstrip("-").replace("-", "_")
    return any(word in SECRET_WORDS for word in upper.split("_"))


def could_be_credential(value: Any) -> bool:
    """False for what no credential is: nothing, a number or a boolean (not text), blank text, a version (`0.22.1`,
    `2.13.0+cpu`)."""
    return isinstance(value, str) and bool(value.strip()) and not _VERSION_RE.fullmatch(value.strip())


def is_secret_value(text: str) -> bool:
    """True for a value that holds a secret whatever its variable is called: an hf_ token, a URL's user:password,
    or a command line (TRAIN_ARGS) with a secret flag in it."""
    if _HF_TOKEN_RE.search(text) or _URL_CREDENTIALS_RE.search(text):
        return True
    return any(word.startswith("-") and is_secret_name(word) for word in text.split())


def holds_secret(name: str, value: str) -> bool:
    """The one rule: a variable holds a secret by its value, or by its name where the value could be a credential."""
    return (is_secret_name(name) and could_be_credential(value)) or is_secret_value(value)


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
    if is_secret_name(key) and could_be_credential(data):
        return MASK
    if isinstance(data, str):
        if "--" in data or _HF_TOKEN_RE.search(data):
            return mask_args_text(data)
        return mask_url_credentials(data)
    return data
