"""`python -m trainer check URL --against OUT`: does an OpenAI-compatible endpoint (serve's, llama.cpp's or vLLM's
started by hand, Ollama's at http://localhost:11434/v1, a remote vLLM) answer as the export OUT does?

It asks the endpoint which model it serves (trainer/check/identity.py), how it tokenizes, and, at temperature 0,
the reference's prompts (trainer/check/reference.py: the ones export recorded, or --prompts FILE; a model without a
chat template through /v1/completions), then forces each single-token stop of the export with logit_bias to see the
answer end there. It compares (trainer/check/judge.py) the rendered prompts, the first greedy answer tokens and how
each answer ends, writes check_report.json and prints a table. Exit 0 when all holds, 1 naming what differs, 2 for
an endpoint it cannot reach or that does not answer within --timeout, or a bad argument.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from trainer.check import judge, probes
from trainer.check.client import Endpoint
from trainer.errors import EXIT_CRASH, EXIT_OK
from trainer.export.artifacts import export_folder

TIMEOUT_S = 120.0  # one request: a CPU server answering 16 tokens of a small model takes seconds
PROBE_TEXT = " Tokenizers split 1234 and café, naïve façades: «quoted»."


def register(parser: argparse.ArgumentParser) -> None:
    """`check`'s arguments, on the parser trainer/__main__.py made for it (trainer/commands.py)."""
    parser.description = (
        "Hold an OpenAI-compatible endpoint to the export it serves: the rendered chat prompts, the first greedy "
        "answer tokens and where answers end, against the export's reference (Transformers on the unquantized "
        "export). Writes check_report.json; exit 0 when it agrees, 1 naming what differs, 2 when unreachable."
    )
    parser.add_argument("url", metavar="URL", help="the API's base, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--against", required=True, metavar="OUT", help="the export folder the endpoint serves")
    parser.add_argument("--model", help="the endpoint's model to check (default: the only one it serves)")
    parser.add_argument("--prompts", metavar="FILE", help="user prompts, one per line (.txt) or {\"prompt\": ...} "
                        "per line (.jsonl), instead of the export's")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="S",
                        help=f"seconds each request may take (default {TIMEOUT_S:g})")  # fmt: skip
    parser.add_argument("--report", default="check_report.json", metavar="FILE",
                        help="where to write the report (default ./check_report.json)")  # fmt: skip
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from trainer.check import reference as references
    from trainer.check.identity import identify
    from trainer.logs import setup_logging

    setup_logging()
    start = time.monotonic()
    out = export_folder(Path(args.against), "check --against")
    endpoint = Endpoint(args.url, args.timeout)
    entry = probes.served(endpoint, args.model)
    identity = identify(out, entry)
    reference = references.load(out, identity.artifact, Path(args.prompts) if args.prompts else None)
    report = run(endpoint, str(entry["id"]), out, identity, reference)
    report["seconds"] = round(time.monotonic() - start, 1)
    from trainer.check.report import table, write

    write(Path(args.report), report)
    print("\n".join(table(report)))
    print(f"report: {args.report}")
    return EXIT_CRASH if report["findings"] else EXIT_OK


def tokenizer_finding(endpoint: Endpoint, model: str, reference: Any, findings: judge.Findings) -> str:
    """Whether the server tokenizes as OUT's tokenizer does (where it shows its tokens)."""
    text = reference.prompt_text(0) + PROBE_TEXT
    ids = list(reference.tokenizer(text, add_special_tokens=False)["input_ids"])
    shown = probes.tokenized(endpoint, model, text)
    if shown is None:
        return "not shown by the server (only the prompts' token counts are compared)"
    tokens, route = shown
    bos = reference.tokenizer.bos_token_id
    if tokens == ids or (bos is not None and tokens == [bos, *ids]):
        return f"equal ({route}, {len(ids)} tokens)"
    first = next((i for i, (a, b) in enumerate(zip(tokens, ids, strict=False)) if a != b), min(len(tokens), len(ids)))
    findings.add("model", f"the server tokenizes differently from OUT's tokenizer ({route}: from token {first}, "
                 f"{tokens[first:first + 6]} against {ids[first:first + 6]}): it serves another model or tokenizer")
    return f"differs ({route}) from token {first}"


def end_of_turn(endpoint: Endpoint, model: str, reference: Any, plain: probes.Reply,
                findings: judge.Findings) -> list[str]:  # fmt: skip
    """Each single-token stop of the export forced by logit_bias: the answer must end there, empty."""
    said = []
    job = reference.job
    for stop in job.stops:
        name = reference.tokenizer.convert_ids_to_tokens(stop)
        forced = probes.forced(endpoint, model, job.texts[0], job.tokens, job.chat, stop)
        if forced is None or (forced.text, forced.finish) == (plain.text, plain.finish):
            said.append(f"{name} (id {stop}): not probed (the server {'refuses' if forced is None else 'ignores'} "
                        "logit_bias)")  # fmt: skip
        elif forced.finish == "stop" and not forced.text.strip():
            said.append(f"{name} (id {stop}): the answer ends there")
        else:
            said.append(f"{name} (id {stop}): the answer goes on ({forced.finish}, {forced.text[:40]!r})")
            findings.add("stop", f"forced to say {name} (id {stop}, the export's stop token), the server went on "
                         f"(finish_reason {forced.finish}, text {forced.text[:60]!r}): its stop token is not the "
                         "export's")  # fmt: skip
    return said


def plain_text_diagnosis(endpoint: Endpoint, model: str, reference: Any, need: int) -> str:
    """With answers below the bar: the same prompts as the export renders them, sent as plain text (the server's
    chat handling bypassed), tell a chat-template problem from other weights."""
    agreeing = 0
    for n in range(len(reference.job.prompts)):
        reply = probes.ask(endpoint, model, reference.prompt_text(n), reference.job.tokens, chat=False)
        agreeing += judge.agreement(reference, reference.answers[n], reply)[0]
    if agreeing >= need:
        return (f"sent as plain text in the export's rendering, {agreeing} agree: the server's chat handling (its "
                "template, or what it adds) differs from the export's")  # fmt: skip
    return (f"even sent as plain text in the export's rendering only {agreeing} agree: the served weights are not the "
            "export's (another model, or a damaged file)")  # fmt: skip


def run(endpoint: Endpoint, model: str, out: Path, identity: Any, reference: Any) -> dict[str, Any]:
    from trainer.check.identity import measured_share
    from trainer.check.reference import RECORDED
    from trainer.export.quant import read_report

    findings = judge.Findings()
    if identity.other_model:
        findings.add("model", f"the endpoint serves {identity.other_model}")
    tokenizer = tokenizer_finding(endpoint, model, reference, findings)
    rows, replies = [], []
    for n, user in enumerate(reference.job.texts):
        reply = probes.ask(endpoint, model, user, reference.job.tokens, reference.job.chat)
        shown = probes.rendered(endpoint, model, user) if reference.job.chat else None
        rows.append(judge.row(reference, n, shown, reply))
        replies.append(reply)
    report = read_report(out) if reference.source == RECORDED else None
    share, bar = measured_share(out, identity, report)
    need = judge.required(share, len(rows))
    answers = {**judge.judge_rows(rows, need, findings), "bar": bar}
    if answers["agreeing"] < need and reference.job.chat:
        findings.add("answers", plain_text_diagnosis(endpoint, model, reference, need))
    ends = end_of_turn(endpoint, model, reference, replies[0], findings)
    return {"endpoint": endpoint.url, "model": model, "against": str(out), "served": identity.said,
            "artifact": identity.artifact.name if identity.artifact else None,
            "reference": {"source": reference.source, "origin": reference.job.origin, "tokens": reference.job.tokens,
                          "chat": reference.job.chat, "stop_ids": list(reference.job.stops)},
            "tokenizer": tokenizer, "end_of_turn": ends, "prompts": [r.to_json() for r in rows], "answers": answers,
            "findings": findings.items, "pass": not findings.items}  # fmt: skip
