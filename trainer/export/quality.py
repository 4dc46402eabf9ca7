"""What a quantized export costs, measured where it runs: perplexity and greedy agreement on one text.

The text is, in order: `--eval-data FILE`; the run's eval sets (TRAIN_EVAL_DATA, local files, each whole, in equal
shares); the tail of the run's training data (TRAIN_DATA: named so in the report, since the run trained on it): of each
source of a mix, in the mix's proportions (TAIL_BYTES of each, the windows shared out by its weights), else of its one
source (the embedded corpus where the run trained on it). w4a16's calibration text is read by the same code: the
training data before that tail ("head"). A source the run named that is not here any more (moved, deleted, a Hub
dataset) is refused naming it and the option that gives the text instead: never another text in its place. The
text is tokenized by the export's tokenizer, cut into windows of the context (the run's TRAIN_SEQ_LEN, at most the
model's positions), at most MAX_WINDOWS of them, and each window is scored by the reference (the unquantized export,
in Transformers, float32) and by each quantized file in its own runtime. Per window: the next-token negative
log-likelihood at every position but the last, and whether both put their top logit on the same token. Perplexity is
exp(mean nll).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.data.mix import parse_eval_sets
from trainer.errors import ConfigError
from trainer.hub.ids import parse_dataset_id

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from trainer.config.run_record import RunRecord

MAX_WINDOWS = 16
TAIL_BYTES = 64 * 1024  # of the training data, when it is the text
HEAD_BYTES = 4 * 1024 * 1024  # of the training data before that tail: w4a16's calibration text
TEXT_SUFFIXES = (".txt", ".md", ".jsonl", ".json")  # what read_text takes of a data folder


@dataclass(frozen=True)
class EvalText:
    text: str
    origin: str  # what it is, for the report
    path: Path | None  # its file (None for several sources: each names its own)
    part: str = "all"  # of the file (read_text's `part`), for the answer prompts read from its records
    share: float = 1.0  # of the windows, as one of several sources
    sources: tuple[EvalText, ...] = ()  # several sources (a mix, eval sets): each one's text; `text` is theirs joined

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def pieces(self) -> tuple[EvalText, ...]:
        return self.sources or (self,)


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
    """The text the gate scores on (module docstring): --eval-data, else the run's eval sets, else its data's tail."""
    if eval_data:
        path = Path(eval_data)
        return EvalText(read_text(path, f"--eval-data {eval_data}"), f"--eval-data {path.name}", path)
    value = str(getattr(run.settings, "eval_data", "") or "") if run is not None else ""
    named = parse_eval_sets(value) or ([(Path(value).name, value)] if value else [])
    if named and not any(parse_dataset_id(source) for _, source in named):
        pieces = [_piece(source, "TRAIN_EVAL_DATA", "all", "--eval-data", 1 / len(named)) for _, source in named]
        return _joined(pieces, f"the run's eval set{'s' * (len(pieces) > 1)} TRAIN_EVAL_DATA="
                               f"{', '.join(p.path.name for p in pieces if p.path)}")  # fmt: skip
    return run_text(run, "tail", "--eval-data")


def run_text(run: RunRecord | None, part: str, option: str) -> EvalText:
    """The run's training data (TRAIN_DATA): each source's `part` ("tail": the gate's text; "head": w4a16's
    calibration text), several in the mix's proportions; ConfigError naming `option` where there is none."""
    from trainer.data.discovery import EMBEDDED_CORPUS
    from trainer.data.mix import parse_mix

    if run is None:
        raise ConfigError(f"export --quant: SRC is not a run's folder, so there is no training data to read text from; "
                          f"give {option} FILE (.txt, .jsonl or .json)")  # fmt: skip
    value = str(getattr(run.settings, "data", "") or "")
    if getattr(getattr(run, "decisions", None), "data", None) is not None and run.decisions.data.value == "embedded":
        value = ""  # the run found no data where TRAIN_DATA pointed and trained on the embedded corpus
    mix = parse_mix(value) if value else None
    if mix is not None and mix.problems:
        raise ConfigError(f"export --quant: the run's TRAIN_DATA={value} does not read now ({mix.problems[0]}); give "
                          f"{option} FILE (.txt, .jsonl or .json)")  # fmt: skip
    entries = [(e.source, e.weight) for e in mix.entries] if mix is not None and mix.is_mix else [(value, 1.0)]
    total = sum(weight for _, weight in entries)
    pieces = [_piece(source, "TRAIN_DATA", part, option, weight / total, EMBEDDED_CORPUS if not source else None)
              for source, weight in entries]  # fmt: skip
    names = [p.path.name if p.path else p.origin for p in pieces]
    shares = ", ".join(f"{name} {p.share:.0%}" for name, p in zip(names, pieces, strict=True))
    if part == "tail":
        return _joined(pieces, f"the tail of the run's training data (not held out) TRAIN_DATA={names[0]}"
                       if len(pieces) == 1 else f"the tails of the run's training mix (not held out), in its "
                       f"proportions: {shares}")  # fmt: skip
    return _joined(pieces, f"the run's training data before the gate's tail TRAIN_DATA={names[0]}"
                   if len(pieces) == 1 else f"the run's training mix before the gate's tails, in its proportions: "
                   f"{shares}")  # fmt: skip


def _piece(source: str, variable: str, part: str, option: str, share: float, file: Path | None = None) -> EvalText:
    path = file or _readable_file(source, variable, option)
    text = read_text(path, f"{variable}={source}", part)
    return EvalText(text, f"{'the tail of ' if part == 'tail' else ''}{path.name}", path, part, share)


def paths(text: EvalText) -> str:
    """The file(s) of the text, for the report."""
    return ", ".join(str(p.path) for p in text.pieces())


def figures(text: EvalText, counts: list[int], context: int) -> dict[str, Any]:
    """The report's `eval_text`: what was scored (text_windows' `counts` of windows per source), to the byte."""
    found: dict[str, Any] = {"origin": text.origin, "path": paths(text), "sha256": text.sha256,
                             "tokens": sum(counts) * context, "windows": sum(counts), "context": context}  # fmt: skip
    if text.sources:
        found["sources"] = [{"origin": p.origin, "path": str(p.path), "share": p.share, "windows": count,
                             "sha256": p.sha256} for p, count in zip(text.sources, counts, strict=True)]  # fmt: skip
    return found


def _joined(pieces: list[EvalText], origin: str) -> EvalText:
    if len(pieces) == 1:
        return replace(pieces[0], origin=origin)
    return EvalText("\n\n".join(p.text for p in pieces), origin, None, pieces[0].part, 1.0, tuple(pieces))


def _readable_file(source: str, variable: str, option: str) -> Path:
    """The file of one source the gate reads: the file itself, or of a folder's or glob's data files (in the order
    the run reads them) the last one in a text format read_text takes; ConfigError naming it and `option`."""
    from trainer.data.discovery import discover

    fix = f"give {option} FILE (.txt, .jsonl or .json)"
    if parse_dataset_id(source):
        raise ConfigError(f"export --quant: the run's {variable} source {source} is a Hub dataset, which the quality "
                          f"gate does not read; {fix}")  # fmt: skip
    found = discover(source, split="eval" if variable == "TRAIN_EVAL_DATA" else "train")
    readable = [f for f in found.files if f.suffix in TEXT_SUFFIXES and f.is_file()]
    if readable:
        return readable[-1]
    if not found.files and not found.saved_dataset and not _exists(source):
        raise ConfigError(f"export --quant: the run's {variable} {source} is not here any more (moved or deleted since "
                          f"the run); {fix}, e.g. that data where it is now")  # fmt: skip
    raise ConfigError(f"export --quant: the run's {variable}={source} holds no .txt, .md, .jsonl or .json file the "
                      f"quality gate reads; {fix}")  # fmt: skip


def _exists(source: str) -> bool:
    import glob

    return Path(source).exists() or bool(glob.glob(source))


def windows(ids: list[int], context: int, origin: str, limit: int = MAX_WINDOWS, what: str = "eval text",
            option: str = "--eval-data") -> list[list[int]]:  # fmt: skip
    """`ids` cut into whole windows of `context` tokens (at most `limit`); exit 2 when not even one fits."""
    if len(ids) < context:
        raise ConfigError(f"export --quant: the {what} ({origin}) has {len(ids)} tokens, fewer than the context of "
                          f"{context} the gate scores in; give a longer {option} FILE or a smaller "
                          "--eval-context N")  # fmt: skip
    count = min(len(ids) // context, limit)
    return [ids[i * context:(i + 1) * context] for i in range(count)]


def text_windows(tokenizer: Any, text: EvalText, context: int, limit: int = MAX_WINDOWS, what: str = "eval text",
                 option: str = "--eval-data") -> tuple[list[list[int]], list[int]]:  # fmt: skip
    """The windows of `text` and how many are each source's: of each by its share of `limit` (each at least one,
    none more than it holds; fewer in all where a source is short, so the shares hold); exit 2 when a source fills not
    one."""
    ids = [list(tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in text.pieces()]
    for piece, found in zip(text.pieces(), ids, strict=True):
        windows(found, context, piece.origin, 1, what, option)  # a source shorter than one window: exit 2
    counts = window_counts([p.share for p in text.pieces()], [len(i) // context for i in ids], limit)
    return [w for found, count in zip(ids, counts, strict=True) for w in windows(found, context, "", count)], counts


def window_counts(shares: list[float], available: list[int], limit: int) -> list[int]:
    """Windows per source: the largest total up to `limit` whose split by `shares` (largest remainders, at least one
    each) fits what each source holds."""
    for total in range(min(limit, sum(available)), len(shares) - 1, -1):
        counts = _split(shares, total)
        if all(c <= a for c, a in zip(counts, available, strict=True)):
            return counts
    return [1] * len(shares)


def _split(shares: list[float], total: int) -> list[int]:
    wanted = [total * share for share in shares]
    counts = [max(1, math.floor(w)) for w in wanted]
    while sum(counts) < total:
        counts[max(range(len(counts)), key=lambda i: wanted[i] - counts[i])] += 1
    while sum(counts) > total:
        counts[max((i for i in range(len(counts)) if counts[i] > 1), key=lambda i: counts[i] - wanted[i])] -= 1
    return counts


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
