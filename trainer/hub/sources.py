"""TRAIN_MODEL, TRAIN_TOKENIZER (org/name[@revision]) and TRAIN_DATA, TRAIN_EVAL_DATA (hf://datasets/...) given as
Hub IDs: resolved once per settings object, into HF_HOME's cache.

A run that resumes uses the commit its checkpoint recorded (trainer.run.resume reads the checkpoint's marker),
even if the branch has moved since; a fresh run resolves the revision asked for. The result is what the checks
report (stage 1, before torch), what `config` and run_config.json show, and the folder the run loads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError
from trainer.hub.datasets import data_patterns, no_files_problem
from trainer.hub.download import Snapshot, snapshot
from trainer.hub.ids import HubRef, parse_dataset_id, parse_model_id
from trainer.run.resume import hub_pins

log = logging.getLogger("trainer")

_ATTR = "_trainkit_hub_sources"
KEYS = ("model", "tokenizer", "data", "eval_data")  # the settings that may name the Hub
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")  # any one: a tokenizer
TOKENIZER_PATTERNS = (
    "tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json", "*.model", "*.tiktoken",
    "config.json", "chat_template*",
)  # fmt: skip


@dataclass
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


def hub_sources(settings: Any) -> HubSources:
    """The resolution of every Hub ID in the settings, made once per settings object (downloads happen here)."""
    found = getattr(settings, _ATTR, None)
    if found is None:
        found = _resolve(settings)
        setattr(settings, _ATTR, found)
    return found


def model_folder(settings: Any) -> str:
    """The folder (or preset name) the run loads TRAIN_MODEL from."""
    snap = hub_sources(settings).model
    return str(snap.path) if snap else settings.model


def tokenizer_folder(settings: Any) -> str:
    """The folder TRAIN_TOKENIZER names (its Hub snapshot), or "" when it is not set."""
    snap = hub_sources(settings).tokenizer
    return str(snap.path) if snap else settings.tokenizer


def _ref_of(key: str, spec: str) -> HubRef | None:
    return parse_dataset_id(spec) if key in ("data", "eval_data") else hub_ref(spec)


def _allowed(key: str, ref: HubRef) -> tuple[str, ...] | None:
    return {"tokenizer": TOKENIZER_PATTERNS, "data": data_patterns(ref), "eval_data": data_patterns(ref)}.get(key)


def _resolve(settings: Any) -> HubSources:
    sources = HubSources()
    pins = hub_pins(settings)  # the commits the checkpoint this run resumes from recorded
    for key in KEYS:
        variable = f"TRAIN_{key.upper()}"
        ref = _ref_of(key, getattr(settings, key))
        if ref is None:
            continue
        pin = pins.get(key, {})
        revision = pin.get("sha") if pin.get("repo_id") == ref.repo_id else None
        try:
            snap = snapshot(ref, variable, revision=revision, allow=_allowed(key, ref))
        except ConfigError as exc:
            sources.problems_of[key] = exc.problems
            continue
        empty = no_files_problem(variable, snap.path, ref, snap.sha) if key in ("data", "eval_data") else None
        if empty:
            sources.problems_of[key] = [empty]
            continue
        setattr(sources, key, snap)
        if revision:
            sources.pinned[key] = pin["checkpoint"]
            log.info("%s: %s pinned to commit %s by %s (resume)", variable, ref, revision, pin["checkpoint"])
    return sources
