"""The endpoint's replies held against the reference: per prompt the rendered prompt, the answer and its end; then
what differs, each named (`findings`: exit 1 when there is any).

Answers are compared by token ids where the server returns them (vLLM), else as text: the endpoint's against the
reference's ids decoded by OUT's tokenizer (special tokens, the final stop token and bytes that are no whole UTF-8
character left out, as servers leave them out); the agreeing prefix counts the reference's tokens the answer starts
with. The bar: as many prompts agreeing as the export measured for the served artifact in its
own runtime (trainer/check/identity.py), less a quarter of the prompts (rounded down): another runtime rounds
differently, and on a small model a near-tie between the top two tokens flips an answer (one flipped token changes
everything after it), as the export's report says of its own figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from trainer.check.probes import Reply
from trainer.check.reference import Reference


@dataclass
class Row:
    """One prompt's result."""

    prompt: str
    export_tokens: int  # the rendered prompt's length in OUT's tokenizer
    server_tokens: int | None  # usage.prompt_tokens
    rendering: str  # equal / equal in length / differs ... / not shown
    reference: str
    answer: str
    finish: str
    agrees: bool
    prefix: int
    tokens: int  # the reference answer's tokens (its stop token left out)
    stop: str | None = None  # what is wrong with how the answer ends

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Findings:
    items: list[dict[str, str]] = field(default_factory=list)

    def add(self, what: str, message: str) -> None:
        self.items.append({"what": what, "message": message})


def _shared(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def agreement(reference: Reference, ids: list[int], reply: Reply) -> tuple[bool, int]:
    """(the answer equals the reference's, how many of the reference's tokens it starts with): by token ids where
    the server returns them, else by text."""
    kept = [i for i in ids if i not in reference.job.stops]
    if reply.ids is not None:
        said = reply.ids[:-1] if reply.ids and reply.ids[-1] in reference.job.stops else reply.ids
        return said == kept, _shared(said, kept)
    text = reply.text
    shared = next((k for k in range(1, len(kept) + 1) if not text.startswith(reference.text(kept[:k]))), len(kept) + 1)
    return text == reference.text(kept), shared - 1


def rendering(reference: Reference, n: int, shown: list[int] | None, reply: Reply) -> str:
    """How the server's prompt compares with the export's (apply_chat_template's ids, or the plain text's)."""
    ids = reference.job.prompts[n]
    if shown is not None:
        if shown == ids:
            return "equal (the server's tokens)"
        first = next((i for i, (a, b) in enumerate(zip(shown, ids, strict=False)) if a != b), min(len(shown), len(ids)))
        return (f"differs from token {first}: the server's {reference.tokenizer.decode(shown[first:first + 12])!r}, "
                f"the export's {reference.tokenizer.decode(ids[first:first + 12])!r}")  # fmt: skip
    if reply.prompt_tokens is None:
        return "not shown"
    if reply.prompt_tokens == len(ids):
        return "equal in length (count only)"
    return f"differs: {reply.prompt_tokens} tokens, the export's {len(ids)}"


def stop_problem(reference: Reference, n: int, reply: Reply) -> str | None:
    """What is wrong with how the answer ends, against how the reference's does."""
    expected = reference.text(reference.answers[n])
    stray = [m for m in reference.markers if m in reply.text and m not in expected]
    if stray:
        return f"holds {stray[0]!r}, a marker of the chat template or a stop text, which the reference's does not"
    if reference.stopped(n) and reply.finish != "stop":
        return (f"does not end where the reference's does (it stopped after {len(reference.answers[n])} tokens): "
                f"finish_reason {reply.finish}")  # fmt: skip
    if not reference.stopped(n) and reply.finish == "stop" and len(reply.text) < len(expected):
        return "ends early where the reference's goes on: the server stops at a token the export does not"
    return None


def row(reference: Reference, n: int, shown: list[int] | None, reply: Reply) -> Row:
    ids = reference.answers[n]
    agrees, shared = agreement(reference, ids, reply)
    return Row(reference.job.texts[n], len(reference.job.prompts[n]), reply.prompt_tokens,
               rendering(reference, n, shown, reply), reference.text(ids), reply.text, reply.finish, agrees, shared,
               len([i for i in ids if i not in reference.job.stops]), stop_problem(reference, n, reply))  # fmt: skip


def required(share: float, prompts: int) -> int:
    """The bar (module docstring): agreeing prompts the endpoint needs."""
    return max(0, math.ceil(share * prompts - 1e-9) - prompts // 4)


def judge_rows(rows: list[Row], need: int, findings: Findings) -> dict[str, Any]:
    """The answers' figures, and findings for renderings, answers and ends that differ."""
    differ = [f"prompt {n}: {r.rendering}" for n, r in enumerate(rows, 1) if not r.rendering.startswith(
        ("equal", "not shown"))]  # fmt: skip
    if differ:
        findings.add("prompt", f"the server does not render chats as the export's chat template does ({len(differ)} of "
                     f"{len(rows)} prompts; {'; '.join(differ[:2])})")  # fmt: skip
    for number, found in enumerate(rows, 1):
        if found.stop:
            findings.add("stop", f"prompt {number}: the answer {found.stop}")
    agreeing = sum(r.agrees for r in rows)
    figures = {"prompts": len(rows), "agreeing": agreeing, "agree": agreeing / len(rows), "required": need,
               "mean_prefix": sum(r.prefix for r in rows) / len(rows), "tokens": max(r.tokens for r in rows)}
    if agreeing < need:
        findings.add("answers", f"{agreeing} of {len(rows)} answers equal the reference's (at least {need} needed; "
                     f"mean agreeing prefix {figures['mean_prefix']:.1f} tokens)")  # fmt: skip
    return figures
