"""Preference pairs scored by `eval`: how much likelier the model finds each chosen answer than its rejected twin.

The pairs are read as training reads them (trainer.data.preference: every layout, every check, bad records named by
file and line) and each side is tokenized as TRL tokenizes it for training (the prompt through the model's chat
template, the answer after it; text with EOS after the answer). A side's score is the mean log-probability per token
of its answer given the prompt, cut as training cuts it (the run's TRAIN_PREF_MAX_PROMPT_LEN from the left, then
the sequence length, the start kept). The summary:
`reward_accuracy`, the share of pairs whose chosen answer scores above the rejected one, and `margin`, the mean of
chosen minus rejected. Unlike TRL's rewards these need no reference model: they are the model's own preference.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.data.discovery import DataSource
    from trainer.data.preference import PreferenceRecords

log = logging.getLogger("trainer")
SIDES = ("chosen", "rejected")


def read_pairs(source: DataSource, max_bad_lines: int) -> PreferenceRecords:
    """Every pair of --data, checked before any weights are read; a problem is a ConfigError naming file:line."""
    from trainer.data.preference import read_records

    records = read_records(source, max_bad_lines)
    if records.problems:
        raise ConfigError(*records.problems)
    for line in records.skipped:
        print(f"eval: skipped {line} (TRAIN_DATA_MAX_BAD_LINES={max_bad_lines})", file=sys.stderr)
    if not records.rows:
        raise ConfigError(f"eval --data {source.spec}: no pair in it; add prompt/chosen/rejected records")
    return records


@dataclass
class Side:
    ids: list[int]  # prompt + answer, cut at the sequence length
    first: int  # index of the answer's first token in `ids`

    @property
    def start(self) -> int:
        return max(self.first, 1)  # a first token with no prompt before it has nothing to be predicted from

    @property
    def scored(self) -> int:
        return len(self.ids) - self.start


def sides_of(tokenizer: Any, row: dict[str, Any], seq_len: int) -> dict[str, Side]:
    """Both sides of a pair as TRL tokenizes them (trainer.data.preference.encoded), each cut at `seq_len`."""
    from trainer.data.preference import encoded

    tokens = encoded(tokenizer, row)
    prompt = tokens["prompt_ids"]
    return {side: Side((prompt + tokens[f"{side}_ids"])[:seq_len], len(prompt)) for side in SIDES}


def mean_logprobs(model: Any, sides: list[Side], pad_id: int, device: Any) -> list[float]:
    """The mean log-probability per answer token of each side (one batch, padded on the right)."""
    import torch

    width = max(len(side.ids) for side in sides)
    ids = torch.tensor([side.ids + [pad_id] * (width - len(side.ids)) for side in sides], device=device)
    mask = torch.tensor([[1] * len(side.ids) + [0] * (width - len(side.ids)) for side in sides], device=device)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return [float(logprobs[row, side.start - 1 : len(side.ids) - 1].mean()) for row, side in enumerate(sides)]


@dataclass(frozen=True)
class Limits:
    """How training cut each pair: TRAIN_SEQ_LEN, and the run's TRAIN_PREF_MAX_PROMPT_LEN with its
    TRAIN_LONG_RECORDS (0: no prompt limit)."""

    seq_len: int
    prompt_len: int = 0
    long_records: str = "truncate"


def score_pairs(loaded: Any, records: PreferenceRecords, limits: Limits, batch_size: int
                ) -> tuple[dict[str, Any], list[dict[str, Any]]]:  # fmt: skip
    """(summary, one record per pair): each side's mean log-prob per answer token, the margin, whether chosen won.
    A pair training would drop (its prompt over the prompt limit with no cut that fits, or filling the sequence
    length on a side) is counted, not scored."""
    from trainer.data.preference import limit_prompts

    tokenizer, model = loaded.tokenizer, loaded.model
    model.eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    seq_len = limits.seq_len
    kept = []
    for where, row in zip(records.wheres, records.rows, strict=True):
        cut = limit_prompts([row], tokenizer, limits.prompt_len, limits.long_records).rows
        sides = sides_of(tokenizer, cut[0], seq_len) if cut else None
        if sides and min(side.scored for side in sides.values()) > 0:
            kept.append((where, sides))
    if not kept:
        cap = limits.prompt_len
        limit = f" or has no cut under the run's TRAIN_PREF_MAX_PROMPT_LEN={cap}" if cap else ""
        raise ConfigError(f"eval --data: no pair left to score: every prompt fills the sequence length ({seq_len} "
                          f"tokens){limit}; raise --seq-len")  # fmt: skip
    out = []
    for start in range(0, len(kept), max(1, batch_size)):
        chunk = kept[start : start + max(1, batch_size)]
        scores = mean_logprobs(model, [sides[name] for _, sides in chunk for name in SIDES], pad_id, loaded.device)
        for n, (where, sides) in enumerate(chunk):
            chosen, rejected = scores[2 * n], scores[2 * n + 1]
            out.append({"where": where, "chosen_logp": chosen, "rejected_logp": rejected, "margin": chosen - rejected,
                        "chosen_won": chosen > rejected, "chosen_tokens": sides["chosen"].scored,
                        "rejected_tokens": sides["rejected"].scored})  # fmt: skip
    return summary(out, len(records.rows) - len(kept), seq_len), out


def summary(out: list[dict[str, Any]], without_room: int, seq_len: int) -> dict[str, Any]:
    count = len(out)
    result = {"pairs": count, "reward_accuracy": sum(r["chosen_won"] for r in out) / count,
              "margin": sum(r["margin"] for r in out) / count,
              "chosen_logp": sum(r["chosen_logp"] for r in out) / count,
              "rejected_logp": sum(r["rejected_logp"] for r in out) / count,
              "pairs_without_room": without_room}  # fmt: skip
    unscored = (f"; {without_room} pair(s) not scored: training would drop them (a prompt that fills {seq_len} "
                "tokens or has no cut under TRAIN_PREF_MAX_PROMPT_LEN)") if without_room else ""  # fmt: skip
    log.info("eval: %d pairs: reward accuracy %.4f (chosen's mean log-prob per answer token above rejected's), mean "
             "margin %.4f (chosen %.4f, rejected %.4f)%s", count, result["reward_accuracy"], result["margin"],
             result["chosen_logp"], result["rejected_logp"], unscored)  # fmt: skip
    return result
