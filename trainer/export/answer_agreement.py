"""Whether a quantized artifact answers as the export does: the first greedy answer tokens of a few chat prompts.

For an export whose tokenizer has a chat template: PROMPTS user prompts (the first user turns of the gate's text's
first conversations when it is chat data, else FIXED_PROMPTS), each rendered alone with
`apply_chat_template(add_generation_prompt=True)` and tokenized once, are decoded greedily for at most ANSWER_TOKENS
tokens by the reference (the unquantized export, Transformers float32) and by each artifact in its own runtime
(llama.cpp for GGUF, the compressed-tensors model in trainer/export/compress_run.py's child), all fed the same prompt
ids and all by `greedy` below. An answer stops early at a stop token (the eos, or the template's end of turn where
that is one token); one that stops is its tokens up to and including the stop. Per artifact: the share of prompts
whose answer equals the reference's, and the mean length of the prefix it shares with the reference's.

It reports and never gates: one flipped token changes everything decoded after it, so on a small model, whose top
two logits are often close, a harmless rounding difference can turn a whole answer; the perplexity ratio is the gate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from trainer.export.quality import EvalText

PROMPTS = 4
# At most this many answer tokens are compared: enough for the start of an answer (a few words of a subword
# vocabulary, a word or two of bytes), few enough that the prompts cost seconds per artifact on a CPU, and early
# enough that an answer that turns is seen where it turns (the agreeing prefix) rather than only as "differs".
ANSWER_TOKENS = 16
MAX_PROMPT_TOKENS = 256  # a longer user turn of the gate's text is passed over: its prefill would cost the most
FIXED_ORIGIN = "trainkit's fixed prompts"
FIXED_PROMPTS = ("What is the capital of France?", "Write one sentence about the sea.", "Name three colors.",
                 "How do I boil an egg?")  # fmt: skip

Feed = Callable[[list[int]], Any]  # ids appended to the sequence -> the logits after its last token


@dataclass(frozen=True)
class Job:
    """The prompts every runtime answers, or why there are none (`none`)."""

    prompts: list[list[int]]  # rendered and tokenized
    texts: list[str]  # the user turns, for the report
    origin: str
    tokens: int = ANSWER_TOKENS
    stops: tuple[int, ...] = ()
    none: str | None = None
    chat: bool = True  # the prompts are user turns rendered by the chat template; False: plain text (`check` of a
    # model without one, through /v1/completions)

    @property
    def context(self) -> int:
        return max(map(len, self.prompts)) + self.tokens

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def job(tokenizer: PreTrainedTokenizerBase, text: EvalText, positions: int) -> Job:
    """The prompts for this export (module docstring): none, saying why, without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return Job([], [], "", none="the export's tokenizer has no chat template, so it has no answers to compare")
    users = _user_turns(text)
    found = job_for(tokenizer, users, f"the first user turns of {text.origin}", positions) if users else None
    if found is None or found.none == _no_fit(positions):  # no chat data, or none of its turns fits
        return job_for(tokenizer, list(FIXED_PROMPTS), FIXED_ORIGIN, positions)
    return found


def _no_fit(positions: int) -> str:
    return f"no prompt fits in {min(MAX_PROMPT_TOKENS, positions - ANSWER_TOKENS)} tokens with the chat template"


def job_for(tokenizer: PreTrainedTokenizerBase, users: list[str], origin: str, positions: int,
            tokens: int = ANSWER_TOKENS, count: int = PROMPTS) -> Job:  # fmt: skip
    """`users` (the first `count` of those that fit) as the chat template renders each alone, or none saying why; a
    tokenizer without a chat template: as plain text (`chat` False), for /v1/completions."""
    limit = min(MAX_PROMPT_TOKENS, positions - tokens)
    if not getattr(tokenizer, "chat_template", None):
        found = [(t, ids) for t in users if len(ids := list(tokenizer(t)["input_ids"])) <= limit][:count]
        eos = getattr(tokenizer, "eos_token_id", None)
        return Job([ids for _, ids in found], [t for t, _ in found], origin, tokens,
                   () if eos is None else (int(eos),), None if found else _no_fit(positions), chat=False)  # fmt: skip
    try:
        found = _render(tokenizer, users, limit, count)
    except Exception as exc:  # a template that refuses a lone user turn (Jinja's raise_exception, a missing key)
        return Job([], [], "", none=f"the chat template refused a conversation of one user turn: {exc}")
    if not found:
        return Job([], [], "", none=_no_fit(positions))
    return Job([ids for _, ids in found], [user for user, _ in found], origin, tokens, stops=_stops(tokenizer))


def rendered(tokenizer: PreTrainedTokenizerBase, user: str) -> str:
    """One user turn as the chat template renders it for an answer (what every runtime is fed)."""
    return str(tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                             add_generation_prompt=True))  # fmt: skip


def _user_turns(text: EvalText) -> list[str]:
    """The first user turn of each conversation of the gate's text, in order (none for text that is not chat)."""
    from trainer.data.chat import CHAT_LAYOUTS, BadRecord, conversation_of, layout_of_record
    from trainer.export.quality import records

    turns = []
    for piece, record in ((p, r) for p in text.pieces() if p.path is not None for r in records(p.path, p.part)):
        layout = layout_of_record(record, "text") if isinstance(record, dict) else None
        if layout not in CHAT_LAYOUTS:
            continue
        try:
            messages = conversation_of(record, str(layout), str(piece.path)).messages
        except BadRecord:
            continue
        first = next((m["content"] for m in messages if m["role"] == "user" and m.get("content")), None)
        if first:
            turns.append(str(first))
    return turns


def _render(tokenizer: PreTrainedTokenizerBase, users: list[str], limit: int, count: int
            ) -> list[tuple[str, list[int]]]:  # fmt: skip
    found = []
    for user in users:
        ids = list(tokenizer(rendered(tokenizer, user), add_special_tokens=False)["input_ids"])
        if len(ids) <= limit:
            found.append((user, ids))
        if len(found) == count:
            break
    return found


def _stops(tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """The ids an answer stops at: the Modelfile's stop texts (eos, the template's end of turn) that are one token."""
    from trainer.export.modelfile import chat_template, stop_tokens

    stops = []
    for text in stop_tokens(tokenizer, chat_template(tokenizer)):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            stops.append(int(ids[0]))
    return tuple(dict.fromkeys(stops))


def greedy(feed: Feed, prompt: list[int], tokens: int, stops: tuple[int, ...]) -> list[int]:
    """The rule every runtime answers by: the top logit's token, at most `tokens` of them, ending at a stop."""
    import numpy as np

    answer: list[int] = []
    logits = feed(prompt)
    while True:
        answer.append(int(np.argmax(np.asarray(logits, dtype=np.float32))))
        if len(answer) == tokens or answer[-1] in stops:
            return answer
        logits = feed(answer[-1:])


def transformers_answers(model: Any, job: Job) -> list[list[int]]:
    """A Transformers model's answers (the reference's; the compressed folders' in their child), its KV cache kept
    from one token to the next."""
    if not job.prompts:
        return []
    import torch

    def feed_for() -> Feed:
        past: list[Any] = [None]

        def feed(ids: list[int]) -> Any:
            out = model(input_ids=torch.tensor([ids]), past_key_values=past[0], use_cache=True)
            past[0] = out.past_key_values
            return out.logits[0, -1].float().numpy()

        return feed

    with torch.no_grad():
        return [greedy(feed_for(), prompt, job.tokens, job.stops) for prompt in job.prompts]


def llama_cpp_answers(path: Any, job: Job, threads: int) -> list[list[int]]:
    """A GGUF file's answers in llama.cpp (llama-cpp-python), its KV cache kept from one token to the next."""
    if not job.prompts:
        return []
    from llama_cpp import Llama

    model = Llama(model_path=str(path), n_ctx=job.context, n_batch=job.context, logits_all=True, n_threads=threads,
                  verbose=False)  # fmt: skip

    def feed(ids: list[int]) -> Any:
        model.eval(ids)
        return model.scores[model.n_tokens - 1]

    answers = []
    try:
        for prompt in job.prompts:
            model.reset()
            answers.append(greedy(feed, prompt, job.tokens, job.stops))
    finally:
        model.close()
    return answers


def agreement(reference: list[list[int]], answers: list[list[int]], job: Job) -> dict[str, Any]:
    """The report's figures for one artifact: how many prompts, the answer length, the share of prompts whose answer
    equals the reference's, the mean length of the prefix it shares with it."""
    if job.none:
        return {"measured": False, "why": job.none}
    prefixes = [_shared(a, b) for a, b in zip(reference, answers, strict=True)]
    same = sum(a == b for a, b in zip(reference, answers, strict=True))
    return {"measured": True, "prompts": len(reference), "tokens": job.tokens, "agree": same / len(reference),
            "mean_prefix": sum(prefixes) / len(prefixes), "answers": answers}  # fmt: skip


def _shared(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def summary(job: Job, reference: list[list[int]]) -> dict[str, Any]:
    """The report's account of the prompts (module docstring) and the reference's answers, or why there are none.
    Prompts taken from the run's data are named by their sha256 only: the export does not publish its data."""
    import hashlib

    if job.none:
        return {"measured": False, "why": job.none, "gates": False}
    shown = ({"prompts": job.texts} if job.origin == FIXED_ORIGIN else
             {"prompt_sha256": [hashlib.sha256(t.encode()).hexdigest() for t in job.texts]})  # fmt: skip
    return {"measured": True, "origin": job.origin, **shown, "tokens": job.tokens, "stop_ids": list(job.stops),
            "reference_answers": reference, "gates": False}  # fmt: skip


def cell(row: dict[str, Any]) -> str:
    """The model card's cell for one artifact's agreement."""
    found = row.get("answer_agreement") or {}
    if not found.get("measured"):
        return "-"
    agreeing = round(found["agree"] * found["prompts"])
    return f"{agreeing}/{found['prompts']} (prefix {found['mean_prefix']:.1f} of {found['tokens']})"
