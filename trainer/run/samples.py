"""TRAIN_EVAL_GENERATE=N: at each evaluation the model answers the first N questions of TRAIN_EVAL_DATA (its
prompt/completion records and conversations, read as `eval` reads them: trainer.answers.references), so a user
sees the answers improve, not only the loss. Decoding is `generate`'s (trainer.answers.decoding: the run's chat
template, end of turn), greedy with at most MAX_NEW_TOKENS new tokens; one prompt at a time, so no padding meets
the training model's attention (which keeps packed records apart and is given no padding mask), on the main
process only. Each answer is one strict JSON line of OUTPUT_DIR/samples.jsonl (secrets masked; a resumed run drops
the lines after its checkpoint, as metrics.jsonl does), and the trackers get them (trainer.trackers.samples).
Off (0), nothing of this is imported or installed.

Online RL (TRAIN_METHOD=grpo/rloo) writes the same file with what it trains on: at each logging step the first
COMPLETIONS_PER_LOG completions TRL sampled in that step (whole groups of one prompt, in order), each with every
reward by name and their weighted total (CompletionSamplesCallback; the same resume rule, the trackers' table
`train/completions`)."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from trainer.errors import ConfigError
from trainer.jsonl import append_line, json_line
from trainer.run.metrics import finite_float, truncate_after
from trainer.secrets import mask_value

if TYPE_CHECKING:
    from torch.nn import Module
    from transformers import PreTrainedTokenizerBase, Trainer, TrainerControl, TrainerState, TrainingArguments

    from trainer.answers.references import Reference
    from trainer.config.inputs import Inputs
    from trainer.config.run_config import RunConfig

log = logging.getLogger("trainer")

COMPLETIONS_PER_LOG = 8  # a few rows per logging step: the file stays small over a long run
MAX_NEW_TOKENS = 64  # enough for an answer to show; bounded so an evaluation's cost stays small and known
SAMPLES = "samples.jsonl"


@dataclass
class _TrainingModel:
    """What the decoding reads of a loaded model (trainer.generate.loading.Loaded), for the model being trained."""

    model: Module
    tokenizer: PreTrainedTokenizerBase
    chat_template: str | None

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device


def questions(inputs: Inputs, wanted: int) -> list[Reference]:
    """The first `wanted` questions of TRAIN_EVAL_DATA; a ConfigError when it holds none."""
    from trainer.answers.references import references

    s = inputs.settings
    found, without = references(inputs.eval_data, s.text_field, s.loss_on)
    if not found:
        raise ConfigError(f"TRAIN_EVAL_GENERATE={wanted}: TRAIN_EVAL_DATA={s.eval_data} holds no prompt/completion "
                          f"records or conversations to ask ({without} record(s) of text only); give such an eval "
                          "set, or TRAIN_EVAL_GENERATE=0")  # fmt: skip
    if len(found) < wanted:
        log.warning("TRAIN_EVAL_GENERATE=%d: TRAIN_EVAL_DATA holds %d question(s); all of them are asked", wanted,
                    len(found))  # fmt: skip
    return found[:wanted]


def masked(value: Any) -> Any:
    """Every text in a row with the secrets in it masked (trainer.secrets: hf_ tokens, URL passwords)."""
    if isinstance(value, str):
        return mask_value(value)
    if isinstance(value, dict):
        return {k: masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


class EvalSamplesCallback(TrainerCallback):
    """After each evaluation (main process): answer the questions, append them to samples.jsonl, log them."""

    def __init__(self, asked: list[Reference], generator: Any, path: Path, callbacks: list[Any]) -> None:
        self.asked, self.generator, self.path, self.callbacks = asked, generator, path, callbacks
        self.failed: set[str] = set()  # trackers that refused the samples once (logged once, then left out)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: object) -> None:  # fmt: skip
        if state.is_world_process_zero:
            truncate_after(self.path, state.global_step)  # a resumed run: answers past its checkpoint go

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    model: Module | None = None, **kwargs: object) -> None:  # fmt: skip
        if not state.is_world_process_zero:
            return
        from trainer.trackers.samples import log_samples

        rows = [masked(row) for row in self.answer(model, state.global_step)]
        for row in rows:
            append_line(self.path, json_line(row))
        log_samples(self.callbacks, state.global_step, rows, self.failed)

    def answer(self, model: Module, step: int) -> list[dict[str, Any]]:
        import torch

        training = model.training
        model.eval()
        # compiled layers (TRAIN_COMPILE) run eager here: generation's growing shapes would recompile them (torch 2.6+)
        eager = getattr(torch.compiler, "set_stance", None)
        try:
            with eager("force_eager") if eager else contextlib.nullcontext(), torch.no_grad():
                answers = [self.generator.generate([asked.prompt])[0] for asked in self.asked]
        finally:
            model.train(training)
        return [{"step": step, "where": asked.where, **asked.shown(), "reference": asked.reference,
                 "response": answer.text, "completion_tokens": answer.completion_tokens}
                for asked, answer in zip(self.asked, answers, strict=True)]  # fmt: skip


def _room(generator: Any, reference: Reference) -> int | None:
    """How many tokens the model's context leaves after the question (up to MAX_NEW_TOKENS); None (named in the
    log) when it leaves none or the question cannot be rendered."""
    try:
        generator.encode(reference.prompt)
        return MAX_NEW_TOKENS
    except ConfigError as exc:
        if not reference.prompt.ids:  # not rendered (e.g. a conversation and no chat template)
            log.warning("TRAIN_EVAL_GENERATE: %s left out: %s", reference.where, exc.message)
            return None
    room = generator.context - len(reference.prompt.ids)
    if room > 0:  # the question fits, with fewer new tokens
        return room
    log.warning("TRAIN_EVAL_GENERATE: %s left out: the question is %d tokens, the model's context %d",
                reference.where, len(reference.prompt.ids), generator.context)  # fmt: skip
    return None


def install_samples(trainer: Trainer, cfg: RunConfig, tokenizer: PreTrainedTokenizerBase) -> None:
    """TRAIN_EVAL_GENERATE's callback on the Trainer (main process); the questions that do not fit the context are
    named and left out (the others are asked)."""
    from trainer.answers.decoding import Generator, Sampling

    inputs, output_dir, wanted = cfg.inputs, Path(cfg.settings.output_dir), cfg.settings.eval_generate
    stage = ((cfg.deepspeed or {}).get("zero_optimization") or {}).get("stage")
    if stage == 3:  # TRAIN_DEEPSPEED_CONFIG's (the settings' own ZeRO-3 is refused by trainer.config.evaluation)
        raise ConfigError(f"TRAIN_EVAL_GENERATE={wanted} generates on the main process alone, which cannot hold a "
                          "model sharded by ZeRO-3 (TRAIN_DEEPSPEED_CONFIG); set it to 0")  # fmt: skip
    loaded = _TrainingModel(trainer.model, tokenizer, getattr(tokenizer, "chat_template", None) or None)
    generator = Generator(loaded, Sampling(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS))
    asked, rooms = [], []
    for reference in questions(inputs, wanted):
        room = _room(generator, reference)
        if room is not None:
            asked.append(reference)
            rooms.append(room)
    if not asked:
        raise ConfigError(f"TRAIN_EVAL_GENERATE={wanted}: no question of TRAIN_EVAL_DATA can be asked (each is named "
                          "above); set TRAIN_EVAL_GENERATE=0")  # fmt: skip
    generator.config.max_new_tokens = min(MAX_NEW_TOKENS, *rooms)  # a short context (TRAIN_SEQ_LEN): fewer tokens
    log.info("eval: each evaluation answers %d question(s) of the eval set (%s) into %s", len(asked),
             generator.describe(), output_dir / SAMPLES)  # fmt: skip
    callbacks = trainer.callback_handler.callbacks  # the trackers' callbacks, read at each evaluation
    trainer.add_callback(EvalSamplesCallback(asked, generator, output_dir / SAMPLES, callbacks))


class CompletionSamplesCallback(TrainerCallback):
    """Online RL: at each logging step (main process), the step's first sampled completions with their rewards to
    samples.jsonl and the trackers. TRL's trainer keeps its latest generation batch in `_logs` (prompt, completion,
    each reward function's values), filled whether or not its own completion logging is on."""

    def __init__(self, trainer: Trainer, path: Path) -> None:
        from trainer.trackers.samples import completions_table

        self.trainer, self.path = trainer, path
        self.table = completions_table(list(trainer.reward_func_names), bool(getattr(trainer, "tools", None)))
        self.failed: set[str] = set()

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: object) -> None:  # fmt: skip
        if state.is_world_process_zero:
            truncate_after(self.path, state.global_step)  # a resumed run: samples past its checkpoint go

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: object) -> None:  # fmt: skip
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        from trainer.trackers.samples import log_samples

        rows = [masked(row) for row in completion_rows(self.trainer, state.global_step)]
        for row in rows:
            append_line(self.path, json_line(row))
        log_samples(self.trainer.callback_handler.callbacks, state.global_step, rows, self.failed, self.table)


def completion_rows(trainer: Any, step: int) -> list[dict[str, Any]]:
    """The first COMPLETIONS_PER_LOG of TRL's latest sampled completions: prompt and completion as text, each
    reward by name (null where a function gave none), `reward` their total at TRAIN_REWARD's weights. With tools
    (trainer.run.multi_turn) the completion is the episode, one line per turn (`transcript`), and `turns` counts
    the model's turns."""
    from trainer.run.rewards import text_of
    from trainer.trackers.samples import question_of

    logs, names = trainer._logs, list(trainer.reward_func_names)
    weights = [float(w) for w in trainer.reward_weights]
    episodes = bool(getattr(trainer, "tools", None))
    rows = []
    for i, (prompt, completion) in enumerate(zip(logs["prompt"], logs["completion"], strict=False)):
        if i == COMPLETIONS_PER_LOG:
            break
        rewards = {name: finite_float(logs["rewards"][name][i]) for name in names}
        scored = [w * r for w, r in zip(weights, rewards.values(), strict=True) if r is not None]
        prompt_text = question_of({"messages": prompt} if isinstance(prompt, list) else {"prompt": prompt})
        shown = transcript(completion) if episodes else text_of(completion)
        turns = {"turns": sum(m.get("role") == "assistant" for m in completion)} if episodes else {}
        rows.append({"step": step, "prompt": prompt_text, "completion": shown, **turns, "rewards": rewards,
                     "reward": finite_float(sum(scored)) if scored else None})  # fmt: skip
    return rows


def transcript(completion: Any) -> str:
    """An episode as lines: `assistant: TEXT` with its calls as `-> name({arguments})`, `tool NAME: RESULT`."""
    import json

    if not isinstance(completion, list):
        return str(completion)
    lines = []
    for message in completion:
        if message.get("role") == "tool":
            lines.append(f"tool {message.get('name', '')}: {message.get('content', '')}")
            continue
        calls = [call.get("function", call) for call in message.get("tool_calls") or []]
        said = [str(message.get("content") or "")] + [f"-> {c.get('name')}({json.dumps(c.get('arguments'))})"
                                                      for c in calls]  # fmt: skip
        lines.append("assistant: " + " ".join(part for part in said if part))
    return "\n".join(lines)
