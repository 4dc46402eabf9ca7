"""README.md of an exported model: base model, data (with Hub commits), the resolved config (masked), last losses,
and the run's provenance (image, data sha256, libraries)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer import provenance
from trainer.export.source import Source
from trainer.secrets import mask_secrets, mask_value


def last_losses(run_dir: Path | None, step: int | None) -> dict[str, Any]:
    """The last train loss and eval loss in metrics.jsonl at or before `step`."""
    found: dict[str, Any] = {}
    path = run_dir / "metrics.jsonl" if run_dir else None
    if path is None or not path.is_file():
        return found
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if step is not None and record.get("step", 0) > step:
            continue
        for key in ("loss", "eval_loss"):
            if record.get(key) is not None:
                found[key] = (record[key], record.get("step"))
    return found


EVALS = "evals.jsonl"  # OUTPUT_DIR's record of `python -m trainer eval` on its models (trainer.evaluate.command)


def evaluations(run_dir: Path | None, folder: Path) -> list[dict[str, Any]]:
    """The evaluations of `folder` (final/ or checkpoint-N) the run recorded, oldest first."""
    path = run_dir / EVALS if run_dir else None
    if path is None or not path.is_file():
        return []
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("folder") == folder.name:
            found.append(record)
    return found


def evaluation_section(run_dir: Path | None, folder: Path) -> list[str]:
    """## Evaluation: each `eval` of this model, its metrics as a table."""
    lines = []
    for record in evaluations(run_dir, folder):
        what = mask_value(str(record.get("data") or ", ".join(record.get("tasks") or []) or "?"))
        lines += ["", f"`python -m trainer eval` on `{what}`:", "", "| metric | value |", "| --- | --- |"]
        lines += [f"| {mask_value(str(name))} | {mask_value(str(value))} |" for name, value in record.get("rows", [])]
    return ["", "## Evaluation", *lines] if lines else []


def _front_matter(base: str | None, datasets: list[str], tags: list[str]) -> str:
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation"]
    if base:
        lines.append(f"base_model: {base}")
    if datasets:
        lines += ["datasets:", *(f"- {d}" for d in datasets)]
    lines += ["tags:", *(f"- {t}" for t in tags), "---", ""]
    return "\n".join(lines)


def model_card(source: Source, name: str, base_how: str | None, merged_adapter: bool) -> str:
    run = source.run  # the run's record (trainer.config.run_record); None for a folder outside a run
    hub = mask_secrets(run.hub) if run else {}
    settings = run.setting_values() if run else {}  # secrets masked
    model = hub.get("model")
    base_id = model["repo_id"] if model else None
    datasets = sorted({r["repo_id"] for key, r in hub.items() if r.get("repo_type") == "dataset"})
    tags = ["trainkit", *(["lora", "merged"] if merged_adapter else [])]
    lines = [_front_matter(base_id, datasets, tags), f"# {name}", "",
             f"Trained with trainkit; exported by `python -m trainer export` from `{source.folder.name}`"
             + (f" (step {source.step})." if source.step is not None else "."), ""]  # fmt: skip
    lines += ["## Base model", ""]
    if model:
        lines.append(f"- `{model['repo_id']}` at commit `{model['sha']}` (revision `{model.get('revision')}`)")
    elif run:
        lines.append(f"- `{settings['TRAIN_MODEL']}`")
    if base_how:
        lines.append(f"- LoRA adapter merged into the base: {base_how}")
    lines += ["", "## Data", ""]
    if run:
        lines.append(f"- {mask_secrets(run.decisions.data.value)}: {mask_secrets(run.decisions.data.reason)}")
    lines += [
        f"- `{r['repo_id']}` at commit `{r['sha']}` ({key})"
        for key, r in hub.items()
        if r.get("repo_type") == "dataset"
    ]
    losses = last_losses(source.run_dir, source.step)
    lines += ["", "## Results", ""]
    lines += [f"- last {k.replace('_', ' ')}: {v:.4f} (step {s})" for k, (v, s) in losses.items()] or [
        "- no metrics.jsonl"
    ]
    lines += evaluation_section(source.run_dir, source.folder)
    lines += ["", "## Configuration", "", "The run's resolved TRAIN_* settings (secrets masked):", "",
              "| variable | value |", "| --- | --- |"]  # fmt: skip
    lines += [f"| `{k}` | `{v}` |" for k, v in (run.setting_values(user_set_only=True) if run else {}).items()]
    decisions = run.decision_values() if run else {}
    lines += ["", "<details><summary>Every decision</summary>", "", "```json",
              json.dumps(decisions, indent=1, default=str), "```", "", "</details>", ""]  # fmt: skip
    return "\n".join(lines + provenance_section(source.run_dir))


def provenance_section(run_dir: Path | None) -> list[str]:
    """The run's provenance.json (trainer.provenance): the image, the data's sha256 and every library, in full."""
    record = provenance.read(run_dir) if run_dir else None
    if record is None:
        return ["## Provenance", "", "- no provenance.json (the run was made by an older trainkit)", ""]
    image = record.get("image") or {}
    lines = ["## Provenance", "", f"- image: `{image.get('reference')}`" if image else "- image: none (run outside "
             "any trainkit image)", f"- seed: {record.get('seed')}"]  # fmt: skip
    lines += [f"- `{path}`: sha256 `{entry.get('sha256')}`" for path, entry in (record.get("data") or {}).items()]
    lines += ["", "<details><summary>provenance.json</summary>", "", "```json",
              json.dumps(mask_secrets(record), indent=1), "```", "", "</details>", ""]  # fmt: skip
    return lines
