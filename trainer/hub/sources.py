"""TRAIN_MODEL, TRAIN_TOKENIZER (org/name[@revision]) and TRAIN_DATA, TRAIN_EVAL_DATA (hf://datasets/...) given as
Hub IDs: resolved once per run (trainer.config.inputs calls `resolve_hub`), into HF_HOME's cache.

A run that resumes uses the commit its checkpoint recorded (the pins trainer.run.resume reads from the checkpoint),
even if the branch has moved since; a fresh run resolves the revision asked for. The result is what the checks
report (stage 1, before torch), what `config` and run_config.json show, and the folder the run loads.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError
from trainer.hub.datasets import data_patterns, no_files_problem
from trainer.hub.download import Snapshot, snapshot
from trainer.hub.ids import HubRef, parse_dataset_id, parse_model_id

log = logging.getLogger("trainer")

KEYS = ("model", "tokenizer", "data", "eval_data")  # the settings that may name the Hub
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")  # any one: a tokenizer
TOKENIZER_PATTERNS = (
    "tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json", "*.model", "*.tiktoken",
    "config.json", "chat_template*",
)  # fmt: skip


@dataclass(frozen=True)
class HubSources:
    """What TRAIN_MODEL, TRAIN_TOKENIZER, TRAIN_DATA and TRAIN_EVAL_DATA resolved to on the Hub (None: not a Hub
    ID), and what went wrong, per setting."""

    model: Snapshot | None = None
    tokenizer: Snapshot | None = None
    data: Snapshot | None = None
    eval_data: Snapshot | None = None
    pinned: dict[str, str] = field(default_factory=dict)  # key -> the checkpoint that pinned its commit
    problems_of: dict[str, list[str]] = field(default_factory=dict)  # key -> what went wrong

    @property
    def problems(self) -> list[str]:
        return [p for key in KEYS if key in self.problems_of for p in self.problems_of[key]]

    def snapshot(self, key: str) -> Snapshot | None:
        """The snapshot of one setting ("model", "tokenizer", "data", "eval_data"); None: not a Hub ID, or refused."""
        return {"model": self.model, "tokenizer": self.tokenizer, "data": self.data, "eval_data": self.eval_data}[key]

    def folder(self, key: str, value: str) -> str:
        """Where the setting `key` set to `value` is read from: its snapshot's folder, else the value itself."""
        snap = self.snapshot(key)
        return str(snap.path) if snap else value

    def snapshots(self) -> dict[str, Snapshot]:
        """{variable: snapshot} for every setting that named the Hub."""
        found = {f"TRAIN_{key.upper()}": getattr(self, key) for key in KEYS}
        return {name: snap for name, snap in found.items() if snap is not None}

    def record(self) -> dict[str, Any]:
        """The `hub` entry of run_config.json and of every checkpoint's marker."""
        found = {key: getattr(self, key) for key in KEYS}
        return {key: snap.record() for key, snap in found.items() if snap is not None}


def hub_ref(spec: str) -> HubRef | None:
    """The Hub reference in a TRAIN_MODEL/TRAIN_TOKENIZER value; None for presets, empty values and existing paths."""
    if not spec or Path(spec).exists():
        return None
    return parse_model_id(spec)


def _ref_of(key: str, spec: str) -> HubRef | None:
    return parse_dataset_id(spec) if key in ("data", "eval_data") else hub_ref(spec)


def _allowed(key: str, ref: HubRef) -> tuple[str, ...] | None:
    return {"tokenizer": TOKENIZER_PATTERNS, "data": data_patterns(ref), "eval_data": data_patterns(ref)}.get(key)


def resolve_hub(wanted: Mapping[str, str], pins: Mapping[str, Mapping[str, str]]) -> HubSources:
    """What each Hub ID among `wanted` ({"model": TRAIN_MODEL's value, ...}) resolves to, downloaded into HF_HOME's
    cache; `pins` ({key: {repo_id, sha, checkpoint}}, from the checkpoint a run resumes from) fix their commits.
    Downloads happen here: the run's configuration calls it once (trainer.config.inputs)."""
    found: dict[str, Snapshot] = {}
    pinned: dict[str, str] = {}
    problems_of: dict[str, list[str]] = {}
    for key in KEYS:
        variable = f"TRAIN_{key.upper()}"
        ref = _ref_of(key, wanted.get(key, ""))
        if ref is None:
            continue
        pin = pins.get(key, {})
        revision = pin.get("sha") if pin.get("repo_id") == ref.repo_id else None
        try:
            snap = snapshot(ref, variable, revision=revision, allow=_allowed(key, ref))
        except ConfigError as exc:
            problems_of[key] = exc.problems
            continue
        empty = no_files_problem(variable, snap.path, ref, snap.sha) if key in ("data", "eval_data") else None
        if empty:
            problems_of[key] = [empty]
            continue
        found[key] = snap
        if revision:
            pinned[key] = pin["checkpoint"]
            log.info("%s: %s pinned to commit %s by %s (resume)", variable, ref, revision, pin["checkpoint"])
    return HubSources(**found, pinned=pinned, problems_of=problems_of)
