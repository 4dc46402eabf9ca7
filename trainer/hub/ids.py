"""Hub names as trainkit accepts them (pure parsing: no huggingface_hub import, no file system access).

- a model or tokenizer: `org/name` or `org/name@revision` (a branch, tag or commit sha);
- a dataset: `hf://datasets/org/name[@revision][/path/in/repo]`, the form huggingface_hub's file system uses; the
  path picks a config folder or files inside the repository.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DATASET_PREFIX = "hf://datasets/"
_PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?"
_REVISION = r"[\w./-]+"
_MODEL_RE = re.compile(rf"^(?P<repo>{_PART}/{_PART})(?:@(?P<revision>{_REVISION}))?$")
_DATASET_RE = re.compile(rf"^(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[\w.-]+))?(?:/(?P<path>[^\s]*))?$")
DEFAULT_REVISION = "main"


@dataclass(frozen=True)
class HubRef:
    """A repository on the Hub at a revision (None: the default branch), optionally a path inside it."""

    repo_id: str
    revision: str | None = None
    repo_type: str = "model"
    path: str = ""

    @property
    def wanted_revision(self) -> str:
        return self.revision or DEFAULT_REVISION

    def __str__(self) -> str:
        at = f"@{self.revision}" if self.revision else ""
        if self.repo_type == "dataset":
            return f"{DATASET_PREFIX}{self.repo_id}{at}" + (f"/{self.path}" if self.path else "")
        return f"{self.repo_id}{at}"


def parse_model_id(text: str) -> HubRef | None:
    """`org/name[@revision]` -> HubRef; None when `text` is not shaped like a Hub model ID."""
    match = _MODEL_RE.match(text.strip())
    if match is None or ".." in text:
        return None
    return HubRef(match["repo"], match["revision"] or None)


def parse_dataset_id(text: str) -> HubRef | None:
    """`hf://datasets/org/name[@revision][/path]` -> HubRef; None when `text` does not start with hf://datasets/."""
    if not text.startswith(DATASET_PREFIX):
        return None
    match = _DATASET_RE.match(text[len(DATASET_PREFIX) :])
    if match is None or ".." in text:
        return None
    return HubRef(match["repo"], match["revision"] or None, "dataset", (match["path"] or "").strip("/"))
