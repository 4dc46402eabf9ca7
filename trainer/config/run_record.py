"""A run's record, OUTPUT_DIR/run_config.json, in one home: what the run resolved, typed, with its one writer and
its one reader (torch-free).

`RunRecord` holds the settings (parsed once, from the recorded values when read back), which of them the user set,
the decisions, the `DataSpec` the data was made with, the Hub commits, the hardware, what Transformers was given, the
environment, and what the run learned while starting: the training data's counts and the start-up phases (the
searched batch is in the decisions). The run writes it at most twice (trainer.run.train): at its start (`write_start`,
which keeps the earlier start's record in run_configs/), and once with what it learned (`write`). Secrets are masked
by the one rule (trainer.secrets) before anything is written or handed out.

Every command that reads a run (export, generate, eval, diff, reproduce, the model card, trackers, bench) reads it
here: `read` (None when the folder has no record) or `require`. A record that does not parse, or that does not fit
this version's types (an older or newer trainkit's), is one ConfigError (exit 2) naming the file and what to do. A
record without `format` is this layout before the DataSpec was written: its DataSpec is the one its settings made.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config.decision import Decision, Decisions
from trainer.config.schema import TrainSettings, env_name
from trainer.data.spec import DataSpec
from trainer.errors import ConfigError
from trainer.secrets import mask_secrets

if TYPE_CHECKING:
    from trainer.config.run_config import RunConfig

FILE = "run_config.json"
ARCHIVE = "run_configs"  # each earlier start's record, run_config-<time>.json
FORMAT = 2  # 1 (no `format` key): no data_spec
# Environment variables recorded besides TRAIN_* (secrets among them are masked).
RECORDED_ENV_PREFIXES = (
    "TRAIN_", "HF_", "CUDA_", "NCCL_", "TORCH", "PYTORCH_", "TRANSFORMERS_", "TOKENIZERS_", "WANDB_", "OMP_"
)  # fmt: skip


@dataclass(frozen=True)
class TrainingData:
    """How the DataLoader splits an epoch, and a mix's requested and achieved share per source (trainer.data.mix)."""

    sequences: int
    global_batch: int
    left_out_per_epoch: int
    left_out_tokens_per_epoch: int
    mix: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        found = dataclasses.asdict(self)
        return found if self.mix is not None else {k: v for k, v in found.items() if k != "mix"}


@dataclass(frozen=True)
class Startup:
    """Seconds from the process's start to the end of the first step, per phase (trainer.run.startup)."""

    to_first_step_s: float
    phases_s: dict[str, float]
    compile_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ComponentCount:
    """One row of the table of what the model is made of (trainer.model.components): parameters, those that train,
    those a token passes through (a mixture's routed experts: top-k of E)."""

    component: str
    parameters: int
    trainable: int
    active: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RunRecord:
    """What a run resolved and learned; `to_dict` is run_config.json (and `python -m trainer config --json`)."""

    settings: TrainSettings
    set_by_env: frozenset[str]  # field names the user set (the others are defaults)
    decisions: Decisions
    data_spec: DataSpec  # what shaped the packed data (trainer.data.spec)
    hub: dict[str, dict[str, Any]]  # the Hub commits, by setting (trainer.hub.sources)
    hardware: dict[str, Any]
    training_arguments: dict[str, Any]
    deepspeed: dict[str, Any] | None
    environment: dict[str, str]  # TRAIN_*, HF_*, CUDA_*... as the run started, and what the run set itself
    training_data: TrainingData | None = None  # learned: known once the data is packed and the batch chosen
    startup: Startup | None = None  # learned: known after the first step
    components: tuple[ComponentCount, ...] = ()  # learned: the model's component table, once it is built

    def to_dict(self) -> dict[str, Any]:
        data = {
            "format": FORMAT,
            "settings": {
                env_name(name): {"value": value, "source": "env" if name in self.set_by_env else "default"}
                for name, value in self.settings.model_dump().items()
            },
            "decisions": self.decisions.to_dict(),
            "data_spec": dataclasses.asdict(self.data_spec),
            "hardware": self.hardware,
            "training_arguments": self.training_arguments,
            "deepspeed": self.deepspeed,
            "hub": self.hub,
            "startup": self.startup.to_dict() if self.startup else {},
            "training_data": self.training_data.to_dict() if self.training_data else {},
            "components": [row.to_dict() for row in self.components],
            "environment": self.environment,
        }
        return mask_secrets(json.loads(json.dumps(data, default=str)))

    def setting_values(self, user_set_only: bool = False) -> dict[str, Any]:
        """TRAIN_* -> the value in force (secrets masked); only those the user set with `user_set_only`."""
        recorded = self.to_dict()["settings"].items()
        return {name: entry["value"] for name, entry in recorded if entry["source"] == "env" or not user_set_only}

    def decision_values(self) -> dict[str, Any]:
        """Each decision's name -> its value (secrets masked)."""
        return {name: entry["value"] for name, entry in self.to_dict()["decisions"].items()}

    def started_with(self) -> dict[str, str]:
        """The TRAIN_* variables the run was started with (secrets masked), to start it again."""
        return {k: v for k, v in self.environment.items() if k.startswith("TRAIN_")}


def started(cfg: RunConfig, environ: Mapping[str, str] | None = None) -> RunRecord:
    """The record of a resolved run as it starts; `environ` (os.environ) is read now."""
    environment = {**recorded_environment(os.environ if environ is None else environ), **cfg.env}
    return RunRecord(
        settings=cfg.settings, set_by_env=frozenset(cfg.settings.model_fields_set), decisions=cfg.decisions,
        data_spec=cfg.inputs.data_spec, hub=cfg.hub, hardware=cfg.hardware.to_dict(),
        training_arguments=cfg.training_arguments, deepspeed=cfg.deepspeed, environment=environment,
    )  # fmt: skip


def recorded_environment(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(environ.items()) if k.startswith(RECORDED_ENV_PREFIXES)}


# ---- write -------------------------------------------------------------------------------------------------------


def path(folder: str | Path) -> Path:
    return Path(folder) / FILE


def write(folder: str | Path, record: RunRecord) -> Path:
    """FOLDER/run_config.json (secrets masked), written whole or not at all."""
    target = path(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record.to_dict(), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    return target


def write_start(folder: str | Path, record: RunRecord) -> Path:
    """A start's record: the earlier start's is kept as run_configs/run_config-<time>.json, never overwritten."""
    _archive(Path(folder))
    return write(folder, record)


def _archive(folder: Path) -> None:
    current = path(folder)
    if not current.is_file():
        return
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(current.stat().st_mtime))
    target = folder / ARCHIVE / f"run_config-{stamp}.json"
    target.parent.mkdir(exist_ok=True)
    n = 1
    while target.exists():
        n += 1
        target = target.with_name(f"run_config-{stamp}-{n}.json")
    os.rename(current, target)


# ---- read --------------------------------------------------------------------------------------------------------


def present(folder: str | Path) -> bool:
    return path(folder).is_file()


def read(folder: str | Path) -> RunRecord | None:
    """FOLDER's record; None when it has none; ConfigError (exit 2) when it cannot be read as one."""
    where = path(folder)
    try:
        text = where.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise unreadable(where, exc.strerror or str(exc)) from None
    try:
        return from_dict(json.loads(text), where)
    except ValueError as exc:  # json.JSONDecodeError, and each shape check below
        raise unreadable(where, str(exc)) from None


def require(folder: str | Path, command: str) -> RunRecord:
    """FOLDER's record; ConfigError naming `command` when there is none."""
    record = read(folder)
    if record is None:
        raise ConfigError(f"{command} {folder}: no {FILE} in it, so the run's settings are unknown; give the output "
                          "folder of a run (TRAIN_OUTPUT_DIR)")  # fmt: skip
    return record


def unreadable(where: Path, why: str) -> ConfigError:
    """The one message for a record that cannot be read, whoever reads it."""
    return ConfigError(f"{where} cannot be read as a run record ({why}): it is damaged, or was written by another "
                       f"trainkit version. Restore it (each earlier start's copy is in {where.parent / ARCHIVE}/), or "
                       "train the run again with this version")  # fmt: skip


def from_dict(data: Any, where: Path | str = FILE) -> RunRecord:
    """The record `to_dict` wrote; ValueError naming the first part that does not fit."""
    data = _section(data, "the record", dict)
    version = data.get("format", 1)
    if version not in (1, FORMAT):
        raise ValueError(f"format {version!r}; this trainkit reads formats 1 and {FORMAT}")
    settings, set_by_env = _settings(_section(data.get("settings"), "settings", dict))
    spec = _data_spec(data.get("data_spec")) if version == FORMAT else _spec_of(settings)
    return RunRecord(
        settings=settings, set_by_env=set_by_env, decisions=_decisions(_section(data.get("decisions"), "decisions",
        dict)), data_spec=spec, hub=_section(data.get("hub") or {}, "hub", dict),
        hardware=_section(data.get("hardware") or {}, "hardware", dict),
        training_arguments=_section(data.get("training_arguments") or {}, "training_arguments", dict),
        deepspeed=_section(data.get("deepspeed"), "deepspeed", (dict, type(None))),
        environment={str(k): str(v) for k, v in _section(data.get("environment") or {}, "environment", dict).items()},
        training_data=_part(TrainingData, data.get("training_data"), "training_data"),
        startup=_part(Startup, data.get("startup"), "startup"),
        components=tuple(_part(ComponentCount, row, "components") for row in _section(data.get("components") or [],
                                                                                      "components", list)),
    )  # fmt: skip


def _section(value: Any, name: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(value, kind):
        raise ValueError(f"{name} is {type(value).__name__}, not {getattr(kind, '__name__', 'an object')}")
    return value


def _settings(recorded: dict[str, Any]) -> tuple[TrainSettings, frozenset[str]]:
    from trainer.config.parse import settings_from_values
    from trainer.config.schema import field_of_env

    entries = {name: _section(entry, f"settings.{name}", dict) for name, entry in recorded.items()}
    try:
        settings = settings_from_values({name: entry.get("value") for name, entry in entries.items()})
    except ConfigError as exc:
        raise ValueError("settings: " + "; ".join(exc.problems)) from None
    return settings, frozenset(str(field_of_env(n)) for n, e in entries.items() if e.get("source") == "env")


def _decisions(recorded: dict[str, Any]) -> Decisions:
    known = {f.name for f in fields(Decisions)}
    unknown = sorted(set(recorded) - known)
    if unknown:
        raise ValueError(f"decisions: unknown {', '.join(unknown)}")
    try:
        return Decisions(**{name: Decision(entry["value"], str(entry["reason"])) for name, entry in recorded.items()})
    except (TypeError, KeyError) as exc:
        raise ValueError(f"decisions: {exc}") from None


def _data_spec(recorded: Any) -> DataSpec:
    try:
        return DataSpec(**_section(recorded, "data_spec", dict))
    except TypeError as exc:
        raise ValueError(f"data_spec: {exc}") from None


def _spec_of(settings: TrainSettings) -> DataSpec:
    """A format-1 record's DataSpec: the one its settings made (trainer.config.inputs)."""
    from trainer.config.inputs import Inputs

    return Inputs(settings).data_spec


def _part(kind: type[TrainingData] | type[Startup] | type[ComponentCount], recorded: Any, name: str) -> Any:
    if not recorded:
        return None
    try:
        return kind(**_section(recorded, name, dict))
    except TypeError as exc:
        raise ValueError(f"{name}: {exc}") from None
