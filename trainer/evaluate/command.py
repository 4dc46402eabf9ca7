"""`python -m trainer eval MODEL --data DATA --output DIR`: score a model on your own eval set.

- loss and perplexity on the trained tokens, with the masking training used (trainer.evaluate.loss);
- for prompt/completion records and conversations: the model's greedy answer to each question, scored against the
  reference (exact_match, contains, and with --regex, regex: trainer.evaluate.metrics);
- for preference pairs: each side's mean log-probability per answer token, the reward accuracy and the mean margin
  (trainer.evaluate.pairs).
DIR receives records.jsonl (one line per question, or per pair: where, scores, token counts)
and eval_results.json (the summary, also printed as a table). Both are written to a staging folder next to DIR
and renamed into place once complete, so DIR holds a whole evaluation or nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.data.vision import has_images
from trainer.errors import EXIT_OK, ConfigError

if TYPE_CHECKING:
    from trainer.data.spec import DataSpec

RESULTS = "eval_results.json"
RECORDS = "records.jsonl"
NUMERIC = ("loss", "perplexity", "exact_match", "contains", "regex", "reward_accuracy", "margin", "chosen_logp",
           "rejected_logp")  # fmt: skip


def register(parser: argparse.ArgumentParser) -> None:
    """`eval`'s arguments, on the parser trainer/__main__.py made for it (trainer/commands.py)."""
    from trainer.generate.command import add_decoding_arguments, add_model_arguments

    parser.description = (
        "Loss and perplexity on the trained tokens of --data (read and masked as training reads it, "
        "with the run's data settings), and for prompt/completion records and conversations the model's answers "
        "scored against the references; preference pairs by how much likelier each chosen answer is than the "
        "rejected one (reward accuracy, margin). Results go to --output DIR (eval_results.json, records.jsonl)."
    )
    add_model_arguments(parser)
    add_decoding_arguments(parser)
    parser.add_argument("--data", metavar="DATA", help="the eval set: a file, folder or glob in any layout training "
                        "takes")  # fmt: skip
    parser.add_argument("--output", required=True, metavar="DIR", help="the folder to write (new, or empty)")
    parser.add_argument("--tasks", metavar="T1,T2", help="lm-eval-harness tasks (offline: `python -m trainer fetch "
                        "--tasks T1,T2` first)")  # fmt: skip
    parser.add_argument("--limit", type=float, help="--tasks: at most N examples per task (a fraction below 1)")
    parser.add_argument("--num-fewshot", type=int, metavar="K", help="--tasks: K examples in each prompt")
    parser.add_argument("--include-path", metavar="DIR", help="--tasks: a folder of your own lm-eval task YAML files")
    parser.add_argument("--regex", metavar="PATTERN", help="also score whether each answer matches PATTERN")
    parser.add_argument("--seq-len", type=int, metavar="N", help="pack the data into N-token sequences (default: "
                        "the run's TRAIN_SEQ_LEN)")  # fmt: skip
    parser.add_argument("--no-generate", action="store_true", help="loss and perplexity only")
    parser.set_defaults(func=main)


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"eval --output {out}: a file is in the way; give a folder")
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"eval --output {out}: the folder is not empty; give a new folder (nothing was overwritten)")


def _pattern(text: str | None) -> re.Pattern[str] | None:
    if text is None:
        return None
    try:
        return re.compile(text)
    except re.error as exc:
        raise ConfigError(f"eval --regex {text!r}: not a regular expression ({exc})") from None


def main(args: argparse.Namespace) -> int:
    from trainer.errors import raise_on_stop_signals
    from trainer.evaluate.loss import eval_source, eval_spec
    from trainer.generate.command import check_arguments, load_for
    from trainer.generate.loading import memory_report, plan_of
    from trainer.output_lock import lock_beside

    raise_on_stop_signals()  # SIGTERM as Ctrl-C: nothing is published but a whole evaluation (write_atomically)
    check_arguments(args)
    if not args.data and not args.tasks:
        raise ConfigError("eval: give --data (your eval set), --tasks (lm-eval-harness tasks), or both")
    out = Path(args.output)
    lock_beside(out, "eval")  # two evals into one DIR: the second exits 2 naming the first (one staging folder)
    _check_out(out)
    pattern = _pattern(args.regex)
    plan = plan_of(args.model, args.adapter, "eval")  # the run's record, before any weights are read
    tasks = _tasks(args)  # an unknown task, or one not fetched, exits here too
    pairs = None
    if args.data:
        overrides = {"TRAIN_SEQ_LEN": str(args.seq_len)} if args.seq_len else {}
        spec = eval_spec(plan.run, overrides)  # the DataSpec the run recorded
        source = eval_source(args.data, spec)
        pairs = _pairs(args, source, spec)  # read and checked before any weights are
    loaded, generator = load_for(args, "eval")
    results: dict[str, Any] = {"model": plan.described}
    records: list[dict[str, Any]] = []
    if tasks:  # first: the loss below switches the model's KV cache off, which generating tasks want on
        from trainer.evaluate.harness import run_tasks

        results["tasks"] = run_tasks(loaded, tasks, args.limit, args.num_fewshot, args.batch_size)
    if pairs is not None:
        from trainer.evaluate.pairs import Limits, score_pairs

        settings = plan.run.settings if plan.run is not None else None
        limits = Limits(spec.seq_len, settings.pref_max_prompt_len if settings else 0, spec.long_records)
        scored, records = score_pairs(loaded, pairs, limits, args.batch_size)
        results.update({"data": args.data, **scored})
    elif args.data and has_images(source.layouts):
        from trainer.evaluate.images import score_images

        scored, records = score_images(loaded, generator, source, spec, pattern, args.batch_size,
                                       not args.no_generate)  # fmt: skip
        results.update({"data": args.data, **_summary(args, generator, None, records, 0, pattern is not None),
                        **scored})  # fmt: skip
    elif args.data:
        records, without = ([], 0) if args.no_generate else _generate(generator, source, spec, pattern,
                                                                      args.batch_size)  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="trainkit-eval-cache-") as cache:
            from trainer.evaluate.loss import loss_on, packed

            dataset = packed(spec, source, loaded.tokenizer, Path(cache))
            loss = loss_on(loaded.model, dataset, args.batch_size, loaded.device)
        results.update(_summary(args, generator, loss, records, without, pattern is not None))
    results["time"] = time.time()
    write_atomically(out, results, records if args.data else None)
    print_table(results, out)
    if plan.run_dir is not None and plan.folder is not None:
        record_in_run(plan, results)
    print(memory_report(loaded), file=sys.stderr)
    return EXIT_OK


def _pairs(args: argparse.Namespace, source: Any, spec: DataSpec) -> Any:
    """The pairs of --data when it holds preference pairs (trainer.evaluate.pairs), else None."""
    from trainer.evaluate.loss import is_pairs
    from trainer.evaluate.pairs import read_pairs

    if not is_pairs(source):
        return None
    if args.regex:
        raise ConfigError(f"eval --data {args.data}: preference pairs are scored by each side's likelihood and no "
                          "answer is generated, so --regex has nothing to match; leave it out")  # fmt: skip
    return read_pairs(source, spec.max_bad_lines)


def _generate(generator: Any, source: Any, spec: DataSpec, pattern: Any, batch_size: int
              ) -> tuple[list[dict[str, Any]], int]:  # fmt: skip
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from trainer.answers.references import references
    from trainer.evaluate.metrics import scores

    found, without = references(source, spec.text_field, spec.loss_on)
    for reference in found:
        try:
            generator.encode(reference.prompt)
        except ConfigError as exc:
            raise ConfigError(f"eval --data {reference.where}: {exc.message}") from None
    records = []
    with Progress(TextColumn("answering"), BarColumn(), MofNCompleteColumn(), console=Console(stderr=True)) as bar:
        task = bar.add_task("eval", total=len(found))
        for start in range(0, len(found), batch_size):
            chunk = found[start : start + batch_size]
            for reference, answer in zip(chunk, generator.generate([r.prompt for r in chunk]), strict=True):
                records.append({"where": reference.where, **reference.shown(), "reference": reference.reference,
                                "response": answer.text, **scores(answer.text, reference.reference, pattern),
                                "prompt_tokens": answer.prompt_tokens,
                                "completion_tokens": answer.completion_tokens})  # fmt: skip
            bar.advance(task, len(chunk))
    return records, without


def _tasks(args: argparse.Namespace) -> Any:
    if args.tasks is None:
        if args.limit is not None or args.num_fewshot is not None or args.include_path:
            raise ConfigError("--limit, --num-fewshot and --include-path go with --tasks")
        return None
    from trainer.evaluate.harness import load_tasks, split_tasks

    return load_tasks(split_tasks(args.tasks), args.include_path)


def _summary(args: argparse.Namespace, generator: Any, loss: Any, records: list[dict[str, Any]], without: int,
             regex: bool) -> dict[str, Any]:  # fmt: skip
    from trainer.evaluate.metrics import mean_of, perplexity

    results: dict[str, Any] = {"data": args.data}
    if loss is not None:  # records with images: the caller adds theirs (trainer.evaluate.images)
        results.update(loss=loss.loss, perplexity=perplexity(loss.loss), trained_tokens=loss.trained_tokens,
                       sequences=loss.sequences)  # fmt: skip
    if not args.no_generate:
        results.update(exact_match=mean_of(records, "exact_match"), contains=mean_of(records, "contains"),
                       records_generated=len(records), records_without_reference=without)  # fmt: skip
        if regex:
            results.update(regex=mean_of(records, "regex"), regex_pattern=args.regex)
        results["decoding"] = generator.describe()
    return results


def write_atomically(out: Path, results: dict[str, Any], records: list[dict[str, Any]] | None) -> None:
    """DIR complete or not at all: written in a staging folder next to it, fsynced, then renamed."""
    staging = out.parent / f".tmp-eval-{out.name}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        if records is not None:
            with open(staging / RECORDS, "w", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
                fh.flush()
                os.fsync(fh.fileno())
        with open(staging / RESULTS, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(results, indent=2) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if out.is_dir():
            out.rmdir()  # empty (checked before the work)
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def numeric_metrics(results: dict[str, Any]) -> dict[str, float]:
    """The summary's numbers by name (`exact_match`, `loss`, `arc_easy/acc`...), for the trackers."""
    found = {name: float(results[name]) for name in NUMERIC if isinstance(results.get(name), int | float)}
    for task, metrics in results.get("tasks", {}).items():
        found.update({f"{task}/{name}": float(v) for name, v in metrics.items() if isinstance(v, int | float)})
    return found


def record_in_run(plan: Any, results: dict[str, Any]) -> None:
    """The summary in the run the model came from: a line of OUTPUT_DIR/evals.jsonl (export's model card shows it)
    and its tracker runs (trainer.trackers.results)."""
    from trainer.evaluate.metrics import summary_rows
    from trainer.export.model_card import EVALS
    from trainer.jsonl import append_line, json_line
    from trainer.trackers.results import report_to_run

    metrics = numeric_metrics(results)
    record = {"folder": plan.folder.name, "step": plan.step, "data": results.get("data"),
              "tasks": sorted(results.get("tasks", {})), "time": results["time"], "metrics": metrics,
              "rows": summary_rows(results)}  # fmt: skip
    try:
        append_line(plan.run_dir / EVALS, json_line(record))
        where = f"recorded in {plan.run_dir / EVALS} (export's model card shows it)"
    except OSError as exc:  # a read-only run folder (/models): the evaluation itself is written
        where = f"not recorded in {plan.run_dir / EVALS} ({exc.strerror}): export's model card will not show it"
    reported = report_to_run(plan.run_dir, metrics, plan.step)
    print(f"eval: {where}" + (f"; sent to the run's {', '.join(reported)}" if reported else ""), file=sys.stderr)


def print_table(results: dict[str, Any], out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from trainer.evaluate.metrics import summary_rows

    console = Console(highlight=False, width=max(100, Console().width))
    console.print(f"eval: {results['model']}" + (f" on {results['data']}" if results.get("data") else ""))
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in summary_rows(results):
        table.add_row(name, value)
    console.print(table)
    console.print(f"written: {out / RESULTS}" + (f", {out / RECORDS}" if results.get("data") else ""))
