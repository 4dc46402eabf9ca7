"""A LoRA adapter merged into the base its run recorded.

The base is, in order: `--base`; the Hub commit the checkpoint's record (or run_config.json) pinned, from HF_HOME's
cache or downloaded; the run's model folder; the adapter's own base_model_name_or_path. A quantized base (QLoRA) is
loaded unquantized in the run's compute dtype, so the merged weights are plain tensors.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from trainer.config.precision import compute_dtype_name
from trainer.config.presets import MODEL_PRESETS
from trainer.config.run_record import RunRecord
from trainer.config.schema import TrainSettings
from trainer.errors import ConfigError
from trainer.export.source import Source
from trainer.hub.ids import HubRef, parse_model_id

log = logging.getLogger("trainer")


def run_dtype_name(source: Source) -> str:
    """The run's compute dtype (its precision decision); fp32 when nothing was recorded."""
    return compute_dtype_name(source.run.decisions.precision.value if source.run else "fp32")


def _recorded_hub_model(source: Source) -> dict[str, Any] | None:
    return source.record.hub.get("model") or (source.run.hub.get("model") if source.run else None)


def _snapshot(repo_id: str, revision: str, what: str) -> str:
    from trainer.hub.download import snapshot

    return str(snapshot(HubRef(repo_id, revision), what, revision=revision).path)


def base_folder(source: Source, override: str | None, command: str = "export",
                fix: str = "pass --base FOLDER or --base org/name@revision") -> tuple[str, str]:
    """(folder, how it was found): the base model the adapter was trained on; `command` and `fix` word the message
    when it is missing."""
    if override:
        ref = None if Path(override).is_dir() else parse_model_id(override)
        if ref is not None:
            return _snapshot(ref.repo_id, ref.wanted_revision, "--base"), f"--base {override}"
        if not Path(override).is_dir():
            raise ConfigError(f"export --base {override}: no such folder, and not a Hub ID org/name[@revision]")
        return override, f"--base {override}"
    hub = _recorded_hub_model(source)
    if hub:
        folder = _snapshot(hub["repo_id"], hub["sha"], "export base (recorded TRAIN_MODEL)")
        return folder, f"Hub {hub['repo_id']}@{hub['sha']} (recorded by the run)"
    model = source.run.settings.model if source.run else None
    if model in MODEL_PRESETS:
        raise ConfigError(f"{command} {source.folder}: the run trained LoRA on the preset {model!r}, whose base "
                          "weights were initialized at random and saved nowhere but in the run's final/ (merged); "
                          f"{command} final/ instead")  # fmt: skip
    candidates = list(dict.fromkeys(c for c in (model, _adapter_base(source)) if c))  # each path named once
    for candidate in candidates:
        if Path(candidate).is_dir():
            return candidate, f"{candidate} (recorded by the run)"
    recorded = " or ".join(candidates)
    raise ConfigError(f"{command} {source.folder}: the base model the run recorded ({recorded}) is not here; {fix}")


def recorded_base_here(source: Source) -> str | None:
    """The folder of the base the run recorded, where it is on this machine without a download (a local folder, or
    the pinned Hub commit in HF_HOME's cache); None otherwise. export checks a merge into `--base` against it."""
    hub = _recorded_hub_model(source)
    if hub:
        from huggingface_hub import snapshot_download

        try:
            return str(snapshot_download(hub["repo_id"], revision=hub["sha"], local_files_only=True))
        except Exception:  # not in the cache (or the cache unreadable): nothing to check against
            return None
    try:
        return base_folder(source, None)[0]
    except ConfigError:
        return None


def _adapter_base(source: Source) -> str | None:
    import json

    if source.adapter is None:
        return None
    try:
        return json.loads((source.adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, TypeError):
        return None


def recorded_scaling(run: RunRecord | None) -> TrainSettings | None:
    """The settings of a run that scaled RoPE (TRAIN_ROPE_SCALING, its factor, TRAIN_SEQ_LEN); None otherwise."""
    return run.settings if run is not None and run.settings.rope_scaling != "none" else None


def load_base(folder: str, dtype_name: str, run: RunRecord | None = None,
              adapter: Path | None = None, tokenizer: Any = None) -> Any:  # fmt: skip
    """The base in `dtype_name`, never quantized (a QLoRA run's bitsandbytes settings are not applied), with the
    RoPE scaling the run trained it with (TRAIN_ROPE_SCALING), unless the base already carries one; with `adapter`,
    that adapter attached through PEFT, unmerged (the reference the export is checked against)."""
    from trainer.model.loading import LoadHow, Weights, load

    how = LoadHow(dtype=dtype_name, recorded_rope=recorded_scaling(run))
    return load(Weights(folder=folder, adapter=adapter, tokenizer=tokenizer), how)
