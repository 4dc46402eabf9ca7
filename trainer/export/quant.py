"""`export --quant TYPE` (repeatable): quantized files beside the verified export, each gated on measured quality.

Planned before any work (`plan`): every type known, the tools installed, the converter able to take the model's
architecture and tokenizer (when SRC holds config.json; a LoRA checkpoint's base is checked by the conversion itself,
before anything is published), the eval text found, w4a16's calibration text found. Made after the full-precision
export is written and verified in the staging folder (`produce`), all scored against the export in Transformers on
one text (trainer/export/quality.py): GGUF types by one conversion and one quantization each, scored in llama.cpp,
an Ollama Modelfile beside each (OUT/gguf/); fp8 and w4a16 by llmcompressor, scored in Transformers' compressed-tensors
loader (trainer/export/compressed.py; OUT/fp8/, OUT/w4a16/). For a chat model each also answers a few prompts, held
against the export's answers (trainer/export/answer_agreement.py: reported, not gated). Then OUT/quant_report.json,
a table in the model card and OUT/provenance.json (the run's, with these figures). A type over its threshold raises
QualityLoss (exit 1, the staging folder removed) unless --allow-quality-loss.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer import provenance
from trainer.errors import ConfigError
from trainer.export import answer_agreement, compressed, gguf, quality

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from trainer.config.run_record import RunRecord
    from trainer.export.options import QuantRequest
    from trainer.export.source import Source

log = logging.getLogger("trainer")
REPORT = "quant_report.json"
GGUF_DIR = "gguf"
# Largest perplexity increase (percent over the unquantized export) each type may cost by default: bounds, not
# measurements. On the tiny preset f16 cost 0.0002 %, q8_0 0.011 %, q4_k_m 0.031 % (docs/running.md's export section);
# q8_0's 1 % is the issue's bound, the rest were chosen (f16 half of it, fewer bits more); no larger model was measured.
MAX_PPL_INCREASE = {"f32": 0.1, "f16": 0.5, "bf16": 2.0, "q8_0": 1.0, "q6_k": 5.0, "q5_k_m": 5.0, "q5_k_s": 5.0,
                    "q5_0": 5.0, "q5_1": 5.0, "q4_k_m": 5.0, "q4_k_s": 10.0, "q4_0": 10.0, "q4_1": 10.0,
                    "iq4_nl": 10.0, "q3_k_l": 25.0, "q3_k_m": 25.0, "q3_k_s": 25.0, "q2_k": 50.0,
                    "fp8": 2.0, "w4a16": 10.0}  # fmt: skip
# fp8 and w4a16 are bounds too, as bf16's and q4_0's: on the tiny preset fp8 cost -0.014 % and w4a16 +0.004 % (its
# down_proj unquantized; docs/running.md's export section).


@dataclass(frozen=True)
class Reference:
    """The unquantized export's figures every artifact is held against (Transformers, float32)."""

    scores: quality.Scores
    job: answer_agreement.Job  # the answer prompts (trainer/export/answer_agreement.py)
    answers: list[list[int]]


class QualityLoss(Exception):
    """A quantized file costs more than its threshold: exit 1, nothing published."""


@dataclass(frozen=True)
class Plan:
    types: list[str]
    tools: gguf.Tools | None  # None without a GGUF type
    compressed: compressed.Plan | None  # fp8 / w4a16
    text: quality.EvalText
    max_increase: float | None  # --max-ppl-increase, for every type
    allow_loss: bool
    context: int | None  # --eval-context


def plan(types: list[str], source: Source, max_increase: float | None, allow_loss: bool, eval_data: str | None,
         context: int | None, calibration_data: str | None = None) -> Plan | None:  # fmt: skip
    """What `--quant` asks, checked before any work (module docstring); None without --quant."""
    if not types:
        return None
    wanted = list(dict.fromkeys(t.lower() for t in types))
    unknown = [t for t in wanted if t not in gguf.GGUF_TYPES and t not in compressed.TYPES]
    if unknown:
        raise ConfigError(f"export --quant {','.join(unknown)}: unknown type; GGUF types: "
                          f"{', '.join(gguf.GGUF_TYPES)}; compressed-tensors: "
                          f"{', '.join(compressed.TYPES)}")  # fmt: skip
    text = quality.eval_text(eval_data, source.run)
    compressing = compressed.plan(wanted, source.run, calibration_data)
    gguf_types = [t for t in wanted if t in gguf.GGUF_TYPES]
    tools = gguf.tools(gguf_types) if gguf_types else None
    from trainer.export.vision import refuse_quantized  # a vision-language model: refused, naming why

    refuse_quantized(wanted, source, tools.converter if tools else None, tools.version if tools else None)
    if tools is not None and (source.folder / "config.json").is_file():
        gguf.check_convertible(tools, source.folder)
    return Plan(wanted, tools, compressing, text, max_increase, allow_loss, context)


def plan_request(request: QuantRequest | None, source: Source, adapter_only: bool, tokenizer: bool = True
                 ) -> Plan | None:  # fmt: skip
    """`plan` for export's QuantRequest (trainer/export/options.py); None without one. `tokenizer`: whether SRC (or
    its base) holds one, which the gate tokenizes its text with."""
    if request is None or not request.types:
        return None
    if adapter_only:
        raise ConfigError("export --adapter-only --quant: a quantized file needs the merged model; drop one of them")
    if not tokenizer:
        raise ConfigError(f"export --quant: {source.folder} holds no tokenizer (no tokenizer_config.json), and the "
                          "quality gate scores text tokenized by the export's tokenizer; copy the model's tokenizer "
                          "files there")  # fmt: skip
    return plan(request.types, source, request.max_ppl_increase, request.allow_quality_loss, request.eval_data,
                request.eval_context, request.calibration_data)  # fmt: skip


def _positions(staging: Path) -> int:
    return int(json.loads((staging / "config.json").read_text()).get("max_position_embeddings") or 2048)


def _context(plan: Plan, staging: Path, run: RunRecord | None) -> int:
    wanted = plan.context or (run.settings.seq_len if run is not None else 512)
    return int(min(wanted, _positions(staging)))


def _reference(staging: Path, chunks: list[list[int]], tokenizer: PreTrainedTokenizerBase, text: quality.EvalText
               ) -> Reference:  # fmt: skip
    model = quality.reference_model(staging)
    job = answer_agreement.job(tokenizer, text, _positions(staging))
    said = answer_agreement.transformers_answers(model, job)
    reference = Reference(quality.transformers_scores(model, chunks), job, said)
    log.info("export: answer agreement: %s", f"{len(job.prompts)} prompts ({job.origin}), at most {job.tokens} "
             "greedy tokens each" if not job.none else f"not measured: {job.none}")  # fmt: skip
    return reference


def _threads() -> int:
    return int(os.environ.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0)) or 1)


def produce(plan: Plan, staging: Path, name: str, run: RunRecord | None, run_dir: Path | None = None) -> dict[str, Any]:
    """The quantized files in staging, scored and written down; QualityLoss when one fails its gate."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(staging))
    ids = list(tokenizer(plan.text.text, add_special_tokens=False)["input_ids"])
    context = _context(plan, staging, run)
    chunks, counts = quality.text_windows(tokenizer, plan.text, context)
    log.info("export: scoring on %s: %d windows of %d tokens (sha256 %s)", plan.text.origin, len(chunks), context,
             plan.text.sha256[:12])  # fmt: skip
    reference = _reference(staging, chunks, tokenizer, plan.text)
    rows: dict[str, dict[str, Any]] = {}
    if plan.tools is not None:
        rows.update(_gguf_rows(plan, plan.tools, staging, name, tokenizer, reference, chunks, ids))
    if plan.compressed is not None:
        work = staging / ".compress-work"
        work.mkdir()
        for row, scores, said in compressed.produce(plan.compressed, staging, tokenizer, chunks, reference.job, work):
            row["answer_agreement"] = answer_agreement.agreement(reference.answers, said, reference.job)
            rows[row["type"]] = _judged(plan, row, scores, reference.scores)
        shutil.rmtree(work)
    report: dict[str, Any] = {"eval_text": quality.figures(plan.text, counts, context),
                              "reference": {"runtime": "transformers (float32, CPU)",
                                            "perplexity": reference.scores.perplexity},
                              "answers": answer_agreement.summary(reference.job, reference.answers),
                              "types": [rows[kind] for kind in plan.types], "allow_quality_loss": plan.allow_loss}
    (staging / REPORT).write_text(json.dumps(report, indent=1) + "\n")
    with (staging / "README.md").open("a") as card:
        card.write("\n".join(card_section(report)) + "\n")
    run_provenance = provenance.read(run_dir) if run_dir else None
    provenance.write(staging, provenance.exported(run_provenance, _figures(report, staging)))
    failed = [r for r in report["types"] if not r["pass"]]
    if failed and not plan.allow_loss:
        raise QualityLoss("; ".join(_failure(r) for r in failed))
    for row in failed:
        log.warning("export: %s published although over its threshold (--allow-quality-loss): %s", row["type"],
                    _failure(row))  # fmt: skip
    return report


def _gguf_rows(plan: Plan, tools: gguf.Tools, staging: Path, name: str, tokenizer: PreTrainedTokenizerBase,
               reference: Reference, chunks: list[list[int]], ids: list[int]) -> dict[str, Any]:  # fmt: skip
    work, folder = staging / ".gguf-work", staging / GGUF_DIR
    work.mkdir()
    folder.mkdir()
    config = json.loads((staging / "config.json").read_text())
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    source = gguf.convert(tools, staging, work / f"{name}.{gguf.SOURCE_TYPE.get(dtype, 'f32')}.gguf", dtype, name)
    rows = {}
    for kind in plan.types:
        if kind not in gguf.GGUF_TYPES:
            continue
        path = gguf.quantize(tools, source, folder / f"{name}.{kind}.gguf", kind)
        row = rows[kind] = _score(plan, tools, kind, path, reference, chunks, ids)
        text, templated = _modelfile(path, tokenizer)
        (folder / f"{name}.{kind}.Modelfile").write_text(text)
        row["modelfile"] = {"file": f"{GGUF_DIR}/{name}.{kind}.Modelfile", "chat_template": templated}
    shutil.rmtree(work)
    return rows


def read_report(out: Path) -> dict[str, Any] | None:
    """OUT/quant_report.json as `produce` wrote it (its one reader: `check`), None for an export without --quant."""
    path = out / REPORT
    if not path.is_file():
        return None
    try:
        found = json.loads(path.read_text())
    except ValueError as exc:
        raise ConfigError(f"{path}: damaged ({exc}); export again") from None
    return found if isinstance(found, dict) else None


def _figures(report: dict[str, Any], staging: Path) -> dict[str, Any]:
    """What provenance keeps of the report: per type its file's sha256 (a folder's weights') and the gate's figures."""
    keep = ("type", "file", "bytes", "runtime", "made_by", "perplexity", "reference_perplexity", "ratio",
            "agreement", "answer_agreement", "max_ppl_increase_pct", "pass")  # fmt: skip
    types = []
    for row in report["types"]:
        path = staging / row["file"]
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        types.append({**{k: row[k] for k in keep if k in row},
                      "sha256": {str(f.relative_to(staging)): provenance.file_sha256(f) for f in files},
                      **({"calibration_sha256": row["calibration"]["sha256"]} if "calibration" in row else {})})
    return {"eval_text_sha256": report["eval_text"]["sha256"], "allow_quality_loss": report["allow_quality_loss"],
            "reference_perplexity": report["reference"]["perplexity"], "types": types}  # fmt: skip


def _modelfile(path: Path, tokenizer: PreTrainedTokenizerBase) -> tuple[str, bool]:
    from trainer.export.modelfile import modelfile

    return modelfile(path.name, tokenizer)


def _score(plan: Plan, tools: gguf.Tools, kind: str, path: Path, reference: Reference, chunks: list[list[int]],
           ids: list[int]) -> dict[str, Any]:  # fmt: skip
    row: dict[str, Any] = {"type": kind, "file": f"{GGUF_DIR}/{path.name}", "bytes": path.stat().st_size,
                           "runtime": tools.runtime}  # fmt: skip
    tokens, scores = quality.llama_cpp_run(path, chunks, plan.text.text, _threads())
    said = answer_agreement.llama_cpp_answers(path, reference.job, _threads())
    row["answer_agreement"] = answer_agreement.agreement(reference.answers, said, reference.job)
    row["tokenizer_agrees"] = tokens == ids
    if not row["tokenizer_agrees"]:
        pairs = enumerate(zip(tokens, ids, strict=False))
        first = next((i for i, (a, b) in pairs if a != b), min(len(tokens), len(ids)))
        row.update(perplexity=None, ratio=None, agreement=None, increase_pct=None, **{"pass": False},
                   max_ppl_increase_pct=_threshold(plan, kind))  # fmt: skip
        row["problem"] = (f"llama.cpp tokenizes the eval text differently from the export's tokenizer (first at "
                          f"token {first}: {tokens[first:first + 5]} against {ids[first:first + 5]})")  # fmt: skip
        return row
    return _judged(plan, row, scores, reference.scores)


def _threshold(plan: Plan, kind: str) -> float:
    return plan.max_increase if plan.max_increase is not None else MAX_PPL_INCREASE[kind]


def _judged(plan: Plan, row: dict[str, Any], scores: quality.Scores, reference: quality.Scores) -> dict[str, Any]:
    threshold = row["max_ppl_increase_pct"] = _threshold(plan, row["type"])
    quality.judge(row, scores, reference, threshold)
    log.info("export: %s %.1f MB: perplexity %.4f against %.4f (ratio %.4f), top-token agreement %.4f, answers "
             "agreeing %s: %s", row["type"], row["bytes"] / 1e6, row["perplexity"], reference.perplexity, row["ratio"],
             row["agreement"], answer_agreement.cell(row),
             "pass" if row["pass"] else f"over the {threshold:g}% threshold")  # fmt: skip
    return row


def _failure(row: dict[str, Any]) -> str:
    if row.get("problem"):
        return f"{row['type']}: {row['problem']}"
    return (f"{row['type']}: perplexity {row['perplexity']:.4f} against the export's {row['reference_perplexity']:.4f}"
            f" (+{row['increase_pct']:.2f}%, threshold {row['max_ppl_increase_pct']:g}%; top-token agreement "
            f"{row['agreement']:.3f}); raise it with --max-ppl-increase PCT or publish anyway with "
            "--allow-quality-loss")  # fmt: skip


def _answers_note(found: dict[str, Any]) -> str:
    if not found["measured"]:
        return f"Answers agreeing: not measured ({found['why']})."
    count = len(found.get("prompts") or found["prompt_sha256"])
    return (f"Answers agreeing: of {count} prompts ({found['origin']}), those whose first "
            f"{found['tokens']} greedy answer tokens equal this export's, and the mean length of the prefix they "
            "share; reported, not gated (one flipped token changes every token after it).")


def card_section(report: dict[str, Any]) -> list[str]:
    """## Quantized files: the gate's table for the model card."""
    text = report["eval_text"]
    lines = ["", "## Quantized files", "",
             f"Scored on {text['origin']} (sha256 `{text['sha256']}`, {text['windows']} windows of {text['context']} "
             f"tokens) against this export in {report['reference']['runtime']}: perplexity "
             f"{report['reference']['perplexity']:.4f}.", "",
             "| type | file | size | runtime | perplexity | ratio | top-token agreement | answers agreeing | threshold "
             "| pass |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in report["types"]:
        ppl = f"{r['perplexity']:.4f}" if r.get("perplexity") else "-"
        ratio = f"{r['ratio']:.4f}" if r.get("ratio") else "-"
        agree = f"{r['agreement']:.4f}" if r.get("agreement") is not None else "-"
        lines.append(f"| {r['type']} | `{r['file']}` | {r['bytes'] / 1e6:.2f} MB | {r['runtime']} | {ppl} | {ratio} "
                     f"| {agree} | {answer_agreement.cell(r)} | +{r['max_ppl_increase_pct']:g}% | "
                     f"{'yes' if r['pass'] else 'NO'} |")  # fmt: skip
    lines += ["", _answers_note(report["answers"])]
    made = [r for r in report["types"] if r.get("made_by")]
    if made:
        lines += ["", "The compressed-tensors folders (for vLLM and SGLang) were scored on the CPU, where their GPU "
                  "kernels are absent: weights dequantized, fp8's activations quantized per token in software.", ""]
        lines += [f"- `{r['file']}`: {r['made_by']}; left unquantized: {', '.join(r['unquantized_layers'])}"
                  + (f"; calibrated on {r['calibration']['origin']}" if r.get("calibration") else "") for r in made]
    return lines
