"""`generate --input prompts.jsonl --output out.jsonl`: one request per line (`prompt` text or `messages`), each
answer appended as one complete line (the input's fields + `response`, `prompt_tokens`, `completion_tokens`), so an
interrupted run keeps every line already written and `--resume` continues after them."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.answers.decoding import Generator, Prompt
from trainer.errors import EXIT_OK, EXIT_SIGINT, ConfigError, Interrupted

ADDED = ("response", "prompt_tokens", "completion_tokens")
SHOWN_BAD = 5


@dataclass
class Request:
    line: int
    row: dict[str, Any]
    prompt: Prompt


def prompt_of(row: Any, base: Path = Path(".")) -> Prompt:
    """A line's request (a record with images: its images read and checked, paths relative to `base`, the input
    file's folder); ValueError says what is wrong with it."""
    from trainer.data.chat import BadRecord, _side

    if not isinstance(row, dict):
        raise ValueError(f"a JSON {type(row).__name__}, not an object with `prompt` or `messages`")
    clash = [key for key in ADDED if key in row]
    if clash:
        raise ValueError(f"it holds {', '.join(clash)} already, which the output adds; rename that field")
    try:
        if image_layout(row):
            return _image_prompt(row, base)
        if "messages" in row:
            return Prompt(messages=_side(row["messages"], "user", "messages"))
        if isinstance(row.get("prompt"), list):
            return Prompt(messages=_side(row["prompt"], "user", "prompt"))
    except BadRecord as exc:
        raise ValueError(str(exc)) from None
    if isinstance(row.get("prompt"), str):
        return Prompt(text=row["prompt"])
    raise ValueError("no `prompt` text or `messages` list")


def image_layout(row: dict[str, Any]) -> str | None:
    from trainer.data.vision import layout_of_record

    return layout_of_record(row)


def _image_prompt(row: dict[str, Any], base: Path) -> Prompt:
    """A request in one of the layouts of records with images (trainer.data.vision), its images checked now."""
    from trainer.data.images import read_image
    from trainer.data.vision import record_of

    layout = image_layout(row)
    assert layout is not None
    record = record_of(row, layout, "", base)
    for ref in record.images:
        read_image(ref)
    return Prompt(messages=record.conversation.messages, images=record.images)


def read_requests(path: Path, max_bad_lines: int) -> tuple[list[Request], list[str]]:
    """(requests, bad lines "file:line: why") of the file, read before the model is loaded; `check_bad` decides."""
    if not path.is_file():
        raise ConfigError(f"generate --input {path}: no such file; give a JSON Lines file of {{\"prompt\": ...}} or "
                          "{\"messages\": [...]} lines")  # fmt: skip
    requests, bad, blank = [], [], 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                blank += 1
                continue
            try:
                row = json.loads(line)
                requests.append(Request(number, row, prompt_of(row, path.parent)))
            except ValueError as exc:
                bad.append(f"{path}:{number}: {exc}")
    check_bad(path, bad, len(requests) + len(bad), max_bad_lines)
    if not requests:
        what = f"all {len(bad)} line(s) are bad, the first {bad[0]}" if bad else (
            f"it holds only {blank} blank line(s)" if blank else "it is empty")  # fmt: skip
        raise ConfigError(f"generate --input {path}: no prompt to answer ({what}); give a JSON Lines file of "
                          "{\"prompt\": ...} or {\"messages\": [...]} lines")  # fmt: skip
    if blank:
        print(f"generate: {blank} blank line(s) in {path} (no request)", file=sys.stderr)
    return requests, bad


def encode_requests(path: Path, requests: list[Request], bad: list[str], generator: Generator, max_bad_lines: int
                    ) -> list[Request]:  # fmt: skip
    """The requests the model can take (a chat template where messages need one, room in its context); the others
    are bad lines too."""
    from trainer.data.chat import in_file_order

    kept, total = [], len(requests) + len(bad)
    for request in requests:
        try:
            generator.encode(request.prompt)
            kept.append(request)
        except ConfigError as exc:
            bad.append(f"{path}:{request.line}: {exc.message}")
    bad[:] = in_file_order(bad)
    check_bad(path, bad, total, max_bad_lines)
    for message in bad:
        print(f"skipped (--max-bad-lines {max_bad_lines}): {message}", file=sys.stderr)
    if not kept:
        raise ConfigError(f"generate --input {path}: no prompt left to answer: all {total} are bad lines (named "
                          "above)")  # fmt: skip
    print(f"generate: {len(kept)} request(s) from {path}" + (f", {len(bad)} bad line(s) skipped" if bad else ""),
          file=sys.stderr)  # fmt: skip
    return kept


def check_bad(path: Path, bad: list[str], total: int, max_bad_lines: int) -> None:
    """More bad lines than --max-bad-lines: a ConfigError naming the first ones by file:line."""
    if len(bad) <= max_bad_lines:
        return
    more = f"\n  ... and {len(bad) - SHOWN_BAD} more" if len(bad) > SHOWN_BAD else ""
    shown = "\n  ".join(bad[:SHOWN_BAD]) + more
    raise ConfigError(f"generate --input {path}: {len(bad)} bad line(s) of {total}:\n  {shown}\nfix them, or pass "
                      "--max-bad-lines N to skip up to N (each is named)")  # fmt: skip


def drop_partial_line(out: Path) -> None:
    """Cut a last line the interruption left incomplete: the file holds whole answers only."""
    if not out.is_file():
        return
    with open(out, "r+b") as fh:
        data = fh.read()
        fh.truncate(data.rfind(b"\n") + 1)


def make_folder_of(out: Path) -> None:
    """OUT's folder, made when it does not exist yet (before the model loads: a mistake there costs no load time)."""
    folder = out.parent
    if folder.is_dir():
        return
    try:
        folder.mkdir(parents=True)
    except OSError as exc:
        raise ConfigError(f"generate --output {out}: cannot make its folder {folder} ({exc.strerror}); give a path "
                          "in a writable folder") from None  # fmt: skip
    print(f"generate: made the folder {folder} for --output", file=sys.stderr)


def done_lines(out: Path, resume: bool) -> int:
    """Complete lines already in OUT (a partial last line, cut by a kill, is removed); 0 for a new file."""
    if not out.exists() or out.stat().st_size == 0:
        return 0
    if out.is_dir():
        raise ConfigError(f"generate --output {out}: a folder; give a file name (out.jsonl)")
    data = out.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    lines = complete.count(b"\n")
    if not resume:
        raise ConfigError(f"generate --output {out}: exists ({lines} lines); pass --resume to continue "
                          "after its complete lines, or give a new file (nothing was overwritten)")  # fmt: skip
    if len(complete) != len(data):
        drop_partial_line(out)
    return lines


def run_batch(generator: Generator, requests: list[Request], out: Path, batch_size: int, skip: int) -> int:
    """Generate for requests[skip:] in batches, appending each answer as one line; Ctrl-C keeps the lines written."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    todo = requests[skip:]
    if skip:
        print(f"generate: --resume: {skip} answer(s) already in {out}; {len(todo)} to go", file=sys.stderr)
    written = 0
    columns = (TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    try:
        with open(out, "a", encoding="utf-8") as fh, Progress(*columns, console=Console(stderr=True)) as bar:
            task = bar.add_task("generate", total=len(todo))
            for start in range(0, len(todo), batch_size):
                chunk = todo[start : start + batch_size]
                answers = generator.generate([r.prompt for r in chunk])
                for request, answer in zip(chunk, answers, strict=True):
                    record = {**request.row, "response": answer.text, "prompt_tokens": answer.prompt_tokens,
                              "completion_tokens": answer.completion_tokens}  # fmt: skip
                    fh.write(json.dumps(record, ensure_ascii=False) + "\n")
                    fh.flush()
                    written += 1
                os.fsync(fh.fileno())
                bar.advance(task, len(chunk))
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (trainer.errors.Interrupted)
        drop_partial_line(out)
        kept = out.read_bytes().count(b"\n") if out.is_file() else 0
        print(f"interrupted: {kept} of {len(requests)} answers are in {out} (complete lines); "
              "run again with --resume to continue", file=sys.stderr)  # fmt: skip
        return exc.exit_code if isinstance(exc, Interrupted) else EXIT_SIGINT
    rate = generator.generated_tokens / generator.seconds if generator.seconds else 0.0
    print(f"generate: {written} answer(s) appended to {out}; {generator.generated_tokens} tokens generated in "
          f"{generator.seconds:.1f}s ({rate:.1f} tokens/s)", file=sys.stderr)  # fmt: skip
    return EXIT_OK
