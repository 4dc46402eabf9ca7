"""TRAIN_MODEL, TRAIN_TOKENIZER (org/name[@revision]) and TRAIN_DATA, TRAIN_EVAL_DATA (hf://datasets/...) given as
Hub IDs: resolved once per run (trainer.config.inputs calls `resolve_hub`), into HF_HOME's cache. Each source of a
list (a mix in TRAIN_DATA, named eval sets) is resolved and pinned on its own, under its `entry_key`.

A run that resumes uses the commit its checkpoint recorded (the pins trainer.config.resume reads from the checkpoint),
even if the branch has moved since; a fresh run resolves the revision asked for. The result is what the checks
report (stage 1, before torch), what `config` and run_config.json show, and the folder the run loads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError
from trainer.hub.download import Snapshot, snapshot
from trainer.hub.ids import HubRef, parse_dataset_id, parse_model_id

log = logging.getLogger("trainer")

KEYS = ("model", "tokenizer", "data", "eval_data")  # the settings that may name the Hub
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")  # any one: a tokenizer
TOKENIZER_PATTERNS = (
    "tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json", "*.model", "*.tiktoken",
    "config.json", "chat_template*",
)  # fmt: skip


def entry_key(key: str, name: str) -> str:
    """The key of one source of a list (TRAIN_DATA's mix, TRAIN_EVAL_DATA's named sets), e.g. `data:chat`: its
    snapshot, its problems and its pin in run_config.json and the checkpoint record go under it."""
    return f"{key}:{name}"


def setting_of(key: str) -> str:
    """The setting a key belongs to ("data" for both "data" and "data:chat")."""
    return key.partition(":")[0]


def _label(key: str) -> str:
    """A key as users read it: TRAIN_DATA, or TRAIN_DATA[chat] for one source of a list."""
    setting, _, name = key.partition(":")
    return f"TRAIN_{setting.upper()}" + (f"[{name}]" if name else "")


@dataclass(frozen=True)
class DatasetFiles:
    """What of a dataset repository is data, told by the data layer (trainer.data.hub_datasets.DATA_FILES): the
    patterns to download for a reference, and the problem with a download that holds no data file (None: it holds
    some); its arguments: the variable, the snapshot's folder, the reference and the commit."""

    patterns: Callable[[HubRef], tuple[str, ...]]
    missing: Callable[[str, Path, HubRef, str], str | None]


@dataclass(frozen=True)
class HubSources:
    """What the settings that name the Hub resolved to, by key ("model", "tokenizer", "data", "eval_data", or one
    source of a list: `entry_key`), and what went wrong, per key."""

    found: dict[str, Snapshot] = field(default_factory=dict)  # key -> its snapshot
    pinned: dict[str, str] = field(default_factory=dict)  # key -> the checkpoint that pinned its commit
    problems_of: dict[str, list[str]] = field(default_factory=dict)  # key -> what went wrong

    @property
    def problems(self) -> list[str]:
        return [p for problems in self.problems_of.values() for p in problems]

    @property
    def model(self) -> Snapshot | None:
        return self.found.get("model")

    def snapshot(self, key: str) -> Snapshot | None:
        """The snapshot of one key; None: not a Hub ID, or refused."""
        return self.found.get(key)

    def folder(self, key: str, value: str) -> str:
        """Where the setting `key` set to `value` is read from: its snapshot's folder, else the value itself."""
        snap = self.snapshot(key)
        return str(snap.path) if snap else value

    def snapshots(self) -> dict[str, Snapshot]:
        """{TRAIN_DATA or TRAIN_DATA[name]: snapshot} for every setting (or source of a list) that named the Hub."""
        return {_label(key): snap for key, snap in self.found.items()}

    def record(self) -> dict[str, Any]:
        """The `hub` entry of run_config.json and of every checkpoint's record (a resume's pins: resolve_hub)."""
        return {key: snap.record() for key, snap in self.found.items()}


def hub_ref(spec: str) -> HubRef | None:
    """The Hub reference in a TRAIN_MODEL/TRAIN_TOKENIZER value; None for presets, empty values and existing paths."""
    if not spec or Path(spec).exists():
        return None
    return parse_model_id(spec)


def _ref_of(key: str, spec: str) -> HubRef | None:
    return parse_dataset_id(spec) if key in ("data", "eval_data") else hub_ref(spec)


def _allowed(key: str, ref: HubRef, datasets: DatasetFiles) -> tuple[str, ...] | None:
    if key in ("data", "eval_data"):
        return datasets.patterns(ref)
    return TOKENIZER_PATTERNS if key == "tokenizer" else None


def resolve_hub(wanted: Mapping[str, str], pins: Mapping[str, Mapping[str, str]], datasets: DatasetFiles
                ) -> HubSources:  # fmt: skip
    """What each Hub ID among `wanted` ({"model": TRAIN_MODEL's value, "data:chat": a mix's source, ...}) resolves
    to, downloaded into HF_HOME's cache; `pins` ({key: {repo_id, sha, checkpoint}}, from the checkpoint a run resumes
    from) fix their commits; `datasets` says what of a dataset repository is data. Downloads happen here: the run's
    configuration calls it once (trainer.config.inputs)."""
    found: dict[str, Snapshot] = {}
    pinned: dict[str, str] = {}
    problems_of: dict[str, list[str]] = {}
    for key, value in wanted.items():
        setting = setting_of(key)
        variable = f"TRAIN_{setting.upper()}"
        ref = _ref_of(setting, value)
        if ref is None:
            continue
        pin = pins.get(key, {})
        revision = pin.get("sha") if pin.get("repo_id") == ref.repo_id else None
        try:
            snap = snapshot(ref, variable, revision=revision, allow=_allowed(setting, ref, datasets))
        except ConfigError as exc:
            problems_of[key] = exc.problems
            continue
        empty = datasets.missing(variable, snap.path, ref, snap.sha) if ref.repo_type == "dataset" else None
        if empty:
            problems_of[key] = [empty]
            continue
        found[key] = snap
        if revision:
            pinned[key] = pin["checkpoint"]
            log.info("%s: %s pinned to commit %s by %s (resume)", _label(key), ref, revision, pin["checkpoint"])
    return HubSources(found, pinned, problems_of)
