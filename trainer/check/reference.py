"""What `check` holds an endpoint to: the export's prompts and its reference answers (the unquantized export's first
greedy answer tokens, Transformers float32: trainer/export/answer_agreement.py's one rule).

The answers export recorded in OUT/quant_report.json (`export --quant`) are taken as they are, for the prompts it
recorded. Otherwise they are computed now by that same rule on OUT (an adapter: on its base with the adapter): for
--prompts FILE, for an export without --quant, and for one whose prompts came from the run's own data, which the
report names by sha256 only (the export does not publish its data); trainkit's fixed prompts stand in for those.
A tokenizer without a chat template gets plain-text prompts, sent through /v1/completions.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError
from trainer.export import answer_agreement
from trainer.export.answer_agreement import FIXED_ORIGIN, FIXED_PROMPTS, Job
from trainer.export.artifacts import ADAPTER, Artifact, artifacts, read_json

log = logging.getLogger("trainer")
RECORDED = "recorded by export in OUT/quant_report.json (Transformers, float32)"
COMPUTED = "computed now on OUT by export's rule (Transformers, float32)"


@dataclass(frozen=True)
class Reference:
    job: Job
    answers: list[list[int]]  # per prompt: the reference's answer ids, its stop token last where it stopped
    source: str  # RECORDED or COMPUTED, and why
    tokenizer: Any
    markers: tuple[str, ...]  # text no answer may hold unless the reference's does: stop texts, template markers

    def text(self, ids: list[int]) -> str:
        """The answer as a server returns it: no stop token, no special tokens, no bytes that are no whole UTF-8
        character (a byte tokenizer's; servers drop them, Transformers' decode shows U+FFFD)."""
        kept = [i for i in ids if i not in self.job.stops]
        return str(self.tokenizer.decode(kept, skip_special_tokens=True)).replace("\ufffd", "")

    def stopped(self, n: int) -> bool:
        return bool(self.answers[n]) and self.answers[n][-1] in self.job.stops

    def prompt_text(self, n: int) -> str:
        """What the model is fed for prompt n: the chat template's rendering, or the plain text."""
        user = self.job.texts[n]
        return answer_agreement.rendered(self.tokenizer, user) if self.job.chat else user


def read_prompts(path: Path) -> list[str]:
    """--prompts FILE: a user turn per line (.txt), or {"prompt": text} per line (.jsonl)."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"check --prompts {path}: cannot read it ({exc})") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
                raise ConfigError(f'check --prompts {path}:{number}: expected {{"prompt": "text"}} per line')
            line = record["prompt"]
        prompts.append(line)
    if not prompts:
        raise ConfigError(f"check --prompts {path}: no prompt in it")
    return prompts


def _positions(folder: Path) -> int:
    config = read_json(folder / "config.json", "check")
    return int(config.get("text_config", config).get("max_position_embeddings") or 2048)


def _model_folder(out: Path) -> Path:
    """The model folder the reference answers come from: OUT, or an adapter export's base (with the adapter)."""
    own = artifacts(out)
    if own and own[0].name == ADAPTER:
        base = Path(own[0].base or "")
        if not (base / "config.json").is_file():
            raise ConfigError(f"check --against {out}: the adapter's base {own[0].base} is not here; the reference "
                              "answers need it (export the merged model and check against that)")  # fmt: skip
        return base
    if not (out / "config.json").is_file():
        raise ConfigError(f"check --against {out}: no config.json; give an export folder")
    return out


def _recorded(out: Path) -> dict[str, Any] | None:
    from trainer.export.quant import read_report

    report = read_report(out)
    found = (report or {}).get("answers") or {}
    return found if found.get("measured") else None


def _job(tokenizer: Any, users: list[str], origin: str, positions: int, tokens: int) -> Job:
    job = answer_agreement.job_for(tokenizer, users, origin, positions, tokens, count=len(users))
    if job.none or len(job.prompts) != len(users):
        left = [u[:40] for u in users if u not in job.texts]
        raise ConfigError(f"check: prompts the model cannot be asked ({job.none or 'too long for its context'}): "
                          f"{left}")  # fmt: skip
    return job


def load(out: Path, artifact: Artifact | None, prompts: Path | None) -> Reference:
    """The reference for OUT (module docstring); `artifact`: what the endpoint serves, where known."""
    from transformers import AutoTokenizer

    if not (out / "tokenizer_config.json").is_file():
        raise ConfigError(f"check --against {out}: no tokenizer saved in it; give an export folder")
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    folder = _model_folder(out)
    recorded = None if prompts else _recorded(out)
    if recorded is not None and "prompts" in recorded:
        job = _job(tokenizer, recorded["prompts"], recorded["origin"], _positions(folder), recorded["tokens"])
        if list(job.stops) == recorded["stop_ids"]:
            return Reference(job, recorded["reference_answers"], RECORDED, tokenizer, markers(tokenizer, artifact))
    users, origin = (read_prompts(prompts), f"--prompts {prompts.name}") if prompts else (list(FIXED_PROMPTS),
                                                                                          FIXED_ORIGIN)  # fmt: skip
    why = ("OUT records no reference answers (exported without --quant)" if recorded is None and not prompts else
           "OUT's answer prompts are the run's data, which it names by sha256 only" if recorded else origin)
    job = _job(tokenizer, users, origin, _positions(folder), answer_agreement.ANSWER_TOKENS)
    log.info("check: reference answers %s: %s", COMPUTED, why)
    return Reference(job, _compute(out, folder, job, tokenizer), f"{COMPUTED}: {why}", tokenizer,
                     markers(tokenizer, artifact))  # fmt: skip


def _compute(out: Path, folder: Path, job: Job, tokenizer: Any) -> list[list[int]]:
    from trainer.model.loading import LoadHow, Weights, load

    adapter = out if folder != out else None
    model = load(Weights(folder=str(folder), adapter=adapter, tokenizer=tokenizer if adapter else None),
                 LoadHow(dtype="float32")).eval()  # fmt: skip
    return answer_agreement.transformers_answers(model, job)


def _modelfile_stops(path: Path | None) -> list[str]:
    if path is None:
        return []
    return [json.loads(m) for m in re.findall(r'^PARAMETER stop (".*")$', path.read_text(), flags=re.M)]


def markers(tokenizer: Any, artifact: Artifact | None) -> tuple[str, ...]:
    """The stop texts (the Modelfile's beside a GGUF file, else those export writes into it), the chat template's
    role markers and the special tokens: text that ends or frames a turn, never part of an answer."""
    from trainer.export.modelfile import chat_template, stop_tokens

    template = chat_template(tokenizer)
    found = _modelfile_stops(artifact.modelfile if artifact else None) or stop_tokens(tokenizer, template)
    if template is not None:
        found += [piece.strip() for pair in template.affixes.values() for piece in pair]
        found.append(template.generation.strip())
    found += list(getattr(tokenizer, "all_special_tokens", []))
    return tuple(dict.fromkeys(m for m in found if m and not m.replace(" ", "").isalnum()))
