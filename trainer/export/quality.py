"""What a quantized export costs, measured where it runs: perplexity and greedy agreement on one text.

The text is, in order: `--eval-data FILE`, the run's eval set (TRAIN_EVAL_DATA, a local file), the tail of the run's
training data (TRAIN_DATA, a local file: named so in the report, since the run trained on it). It is tokenized once
by the export's tokenizer, cut into windows of the context (the run's TRAIN_SEQ_LEN, at most the model's positions),
at most MAX_WINDOWS of them, and each window is scored by the reference (the unquantized export, in Transformers,
float32) and by each quantized file in its own runtime. Per window: the next-token negative log-likelihood at every
position but the last, and whether both put their top logit on the same token. Perplexity is exp(mean nll).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.errors import ConfigError

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from trainer.config.run_record import RunRecord

MAX_WINDOWS = 16
TAIL_BYTES = 64 * 1024  # of the training data, when it is the text
HEAD_BYTES = 4 * 1024 * 1024  # of the training data before that tail: w4a16's calibration text


@dataclass(frozen=True)
class EvalText:
    text: str
    origin: str  # what it is, for the report
    path: Path
    part: str = "all"  # of the file (read_text's `part`), for the answer prompts read from its records

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


@dataclass(frozen=True)
class Scores:
    nll: list[float]  # per scored position
    top: list[int]  # the top token per scored position

    @property
    def perplexity(self) -> float:
        return math.exp(sum(self.nll) / len(self.nll))

    def agreement(self, other: Scores) -> float:
        return sum(a == b for a, b in zip(self.top, other.top, strict=True)) / len(self.top)


def _record_text(record: object) -> str:
    if isinstance(record, str):
        return record
    if not isinstance(record, dict):
        return ""
    if isinstance(record.get("text"), str):
        return str(record["text"])
    messages = record.get("messages") or record.get("conversations")
    if isinstance(messages, list):
        return "\n".join(str(m.get("content") or m.get("value") or "") for m in messages if isinstance(m, dict))
    return "\n".join(str(record[k]) for k in ("prompt", "completion") if isinstance(record.get(k), str))


def read_text(path: Path, what: str, part: str = "all") -> str:
    """A .txt/.md file's text, or a .jsonl/.json file's records' text (text, messages, prompt + completion). `part`:
    "all"; "tail", its last TAIL_BYTES (whole lines); "head", what comes before that tail (at most HEAD_BYTES, whole
    lines): w4a16's calibration text, never the text the gate scores on."""
    if not path.is_file():
        raise ConfigError(f"export {what}: {path} is not a file; give --eval-data FILE (.txt, .jsonl or .json)")
    if path.suffix in (".jsonl", ".json"):
        return "\n\n".join(t for t in map(_record_text, records(path, part)) if t)
    if path.suffix in (".txt", ".md", ""):
        return _part(path, part)
    raise ConfigError(f"export {what}: {path} is a {path.suffix} file; the quality gate reads .txt, .md, .jsonl or "
                      ".json: give --eval-data FILE")  # fmt: skip


def _part(path: Path, part: str) -> str:
    raw = path.read_bytes()
    start = 0
    if len(raw) > TAIL_BYTES:
        start = len(raw) - TAIL_BYTES
        start += raw[start:].find(b"\n") + 1  # whole lines only
    if part == "tail":
        raw = raw[start:]
    elif part == "head":
        raw = raw[: min(start, HEAD_BYTES)]
        raw = raw[: raw.rfind(b"\n") + 1] if len(raw) < start else raw
    return raw.decode("utf-8", errors="replace")


def records(path: Path, part: str = "all") -> list[Any]:
    """The JSON records of `part` of a .jsonl/.json file (read_text's parts; lines that are not JSON passed over);
    none for another kind of file."""
    if path.suffix not in (".jsonl", ".json"):
        return []
    data = _part(path, part)
    found: list[Any] = []
    for line in [data] if path.suffix == ".json" else data.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        found += value if isinstance(value, list) else [value]
    return found


def eval_text(eval_data: str | None, run: RunRecord | None) -> EvalText:
    """The text the gate scores on (module docstring): --eval-data, else the run's eval set, else its data's tail."""
    if eval_data:
        path = Path(eval_data)
        return EvalText(read_text(path, f"--eval-data {eval_data}"), f"--eval-data {path.name}", path)
    eval_set = _one_file(getattr(run.settings, "eval_data", None)) if run is not None else None
    if eval_set and Path(eval_set).is_file():
        path = Path(eval_set)
        return EvalText(read_text(path, f"TRAIN_EVAL_DATA={eval_set}"),
                        f"the run's eval set TRAIN_EVAL_DATA={path.name}", path)  # fmt: skip
    data = run_data_file(run)  # only where the run has no eval set: a folder's files are scanned to find it
    if data and Path(data).is_file():
        path = Path(data)
        return EvalText(read_text(path, f"TRAIN_DATA={data}", "tail"),
                        f"the tail of the run's training data (not held out) TRAIN_DATA={path.name}", path,
                        "tail")  # fmt: skip
    raise ConfigError("export --quant: no text to measure the quality on: the run names no local TRAIN_EVAL_DATA or "
                      "TRAIN_DATA file; give --eval-data FILE (.txt, .jsonl or .json)")  # fmt: skip


def run_data_file(run: RunRecord | None) -> str | None:
    """The file of the run's TRAIN_DATA the gate (its tail) and w4a16's calibration (its head) read: the embedded corpus
    where the setting is missing or empty, as the run itself did."""
    from trainer.data.discovery import EMBEDDED_CORPUS

    if run is None:
        return None
    data = str(getattr(run.settings, "data", "") or "")
    if not data or not (Path(data).is_file() or (Path(data).is_dir() and any(Path(data).iterdir()))):
        return str(EMBEDDED_CORPUS)
    return _one_file(data)


def _one_file(spec: Any) -> str | None:
    """A data setting as one file the gate can read: the file itself, or of a folder's or glob's data files (in the
    order the run reads them) the last one in a text format read_text takes."""
    if not spec or Path(str(spec)).is_file():
        return spec
    from trainer.data.discovery import discover

    readable = [f for f in discover(str(spec)).files if f.suffix in (".txt", ".md", ".jsonl", ".json") and f.is_file()]
    return str(readable[-1]) if readable else None


def windows(ids: list[int], context: int, origin: str, limit: int = MAX_WINDOWS, what: str = "eval text",
            option: str = "--eval-data") -> list[list[int]]:  # fmt: skip
    """`ids` cut into whole windows of `context` tokens (at most `limit`); exit 2 when not even one fits."""
    if len(ids) < context:
        raise ConfigError(f"export --quant: the {what} ({origin}) has {len(ids)} tokens, fewer than the context of "
                          f"{context} the gate scores in; give a longer {option} FILE or a smaller "
                          "--eval-context N")  # fmt: skip
    count = min(len(ids) // context, limit)
    return [ids[i * context:(i + 1) * context] for i in range(count)]


def judge(row: dict[str, Any], scores: Scores, reference: Scores, threshold: float) -> dict[str, Any]:
    """The gate's figures for one quantized artifact, into `row`: perplexity of both, their ratio, the increase in
    percent, the top-token agreement, and whether the increase is within `threshold` percent."""
    ratio = scores.perplexity / reference.perplexity
    row.update(perplexity=scores.perplexity, reference_perplexity=reference.perplexity, ratio=ratio,
               increase_pct=(ratio - 1) * 100, agreement=scores.agreement(reference))  # fmt: skip
    row["pass"] = row["increase_pct"] <= threshold
    return row


def add_window(scores: Scores, logits: ArrayLike, ids: list[int]) -> None:
    """One window's next-token nll and top token at every position but the last, from its logits (positions x
    vocabulary, numpy), appended to `scores` (windows are scored one at a time: a large vocabulary's logits for
    every window would not fit)."""
    import numpy as np

    values = np.asarray(logits, dtype=np.float64)[: len(ids) - 1]
    shifted = values - values.max(axis=1, keepdims=True)
    logz = np.log(np.exp(shifted).sum(axis=1))
    targets = np.asarray(ids[1:])
    scores.nll.extend((logz - shifted[np.arange(len(targets)), targets]).tolist())
    scores.top.extend(values.argmax(axis=1).tolist())


def reference_model(folder: Path) -> Any:
    """The unquantized export in Transformers, float32: the reference every quantized artifact is held against."""
    from trainer.model.loading import LoadHow, Weights, load

    return load(Weights(folder=str(folder)), LoadHow(dtype="float32")).eval()


def transformers_scores(model: Any, chunks: list[list[int]]) -> Scores:
    """A Transformers model's scores on the windows (the reference's; the compressed folders' in their child)."""
    import torch

    scores = Scores([], [])
    with torch.no_grad():
        for ids in chunks:
            add_window(scores, model(input_ids=torch.tensor([ids])).logits[0].float().numpy(), ids)
    return scores


def llama_cpp_run(path: Path, chunks: list[list[int]], text: str, threads: int) -> tuple[list[int], Scores]:
    """A GGUF file in llama.cpp (llama-cpp-python): its own ids for `text` (its vocabulary, no bos: to hold against
    the tokenizer's), and its scores, fed the same token ids as the reference."""
    from llama_cpp import Llama

    context = len(chunks[0])
    model = Llama(model_path=str(path), n_ctx=context, n_batch=context, n_ubatch=context, logits_all=True,
                  n_threads=threads, verbose=False)  # fmt: skip
    scores = Scores([], [])
    try:
        tokens = list(model.tokenize(text.encode(), add_bos=False, special=False))
        for ids in chunks:
            model.reset()
            model.eval(ids)
            add_window(scores, model.scores[: len(ids)], ids)
    finally:
        model.close()
    return tokens, scores
