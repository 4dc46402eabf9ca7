"""Preference tuning (TRAIN_METHOD=dpo/orpo/kto/simpo/reward) on TRL's trainers, with trainkit's machinery.

`build_trainer` turns the checked records (trainer.config.method.records_of: the same read the checks made) into
TRL's rows, holds out evaluation pairs, applies TRAIN_LONG_RECORDS, builds the policy (trainer.run.training_model, LoRA
included) and the reference the way cfg.decisions.reference says, and returns TRL's trainer made atomic
(trainer.run.checkpoint.atomic_trainer): checkpoints, final/, SIGTERM stops, resume and metrics.jsonl are SFT's.
TRL tokenizes: conversations through the tokenizer's chat template (TRAIN_CHAT_TEMPLATE or the model's own, set
by trainer.tokenizer as for SFT), text with EOS after each answer.
"""

from __future__ import annotations

import copy
import logging
from typing import TYPE_CHECKING, Any

from trainer.config.method import records_of, trainer_class
from trainer.data.preference import encoded, limit_prompts, longest, unpaired_from_pairs
from trainer.errors import ConfigError
from trainer.methods import of
from trainer.run import kit
from trainer.run.vision import refuse_image_method

if TYPE_CHECKING:
    from torch.nn import Module
    from transformers import PreTrainedTokenizerBase, TrainingArguments

    from trainer.config.run_config import RunConfig

log = logging.getLogger("trainer")


def prepare(setup: kit.Setup) -> kit.Prepared:
    """TRL's trainer for TRAIN_METHOD, with the same callbacks and checkpoints as SFT."""
    cfg = setup.cfg
    rows = training_rows(cfg, setup.tokenizer)
    refuse_image_method(cfg.inputs, rows[0])
    model = setup.model(lambda: build_policy(cfg, setup.tokenizer))
    record = kit.learned(setup.start, setup.args, cfg.decisions, len(rows[0]), model)
    callbacks = setup.callbacks(model, record)
    return kit.Prepared(build_trainer(cfg, setup.args, setup.tokenizer, model, rows, callbacks), record)


def training_rows(
    cfg: RunConfig, tokenizer: PreTrainedTokenizerBase
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(train rows, eval rows or None) as the method's TRL trainer takes them, long pairs dropped or left to TRL's
    truncation (TRAIN_LONG_RECORDS), every count logged."""
    s = cfg.settings
    records = records_of(cfg.inputs)
    for line in records.skipped:
        log.warning("data: skipped %s (TRAIN_DATA_MAX_BAD_LINES=%d)", line, s.data_max_bad_lines)
    rows = list(records.rows)
    evaluation = list(records_of(cfg.inputs, "eval_data").rows) if s.eval_data else None
    if s.eval_split > 0:
        held = max(1, int(len(rows) * s.eval_split))
        rows, evaluation = rows[:-held], rows[-held:]
        log.info("eval: the last %d of %d pairs held out (TRAIN_EVAL_SPLIT=%g)", held, held + len(rows), s.eval_split)
    rows = _prompts_limited(rows, tokenizer, cfg, "train")
    evaluation = _prompts_limited(evaluation, tokenizer, cfg, "eval") if evaluation else evaluation
    method = of(s.method)
    long_records = "drop" if method.classifier else s.long_records  # a reward model scores whole pairs
    rows = _kept(rows, tokenizer, s.seq_len, long_records, "train")
    evaluation = _kept(evaluation, tokenizer, s.seq_len, long_records, "eval") if evaluation else evaluation
    if method.unpaired and records.paired:
        log.info("data: KTO on pairs: each of %d pairs is two examples (chosen: label true, rejected: false)",
                 len(rows))
        rows = unpaired_from_pairs(rows)
        evaluation = unpaired_from_pairs(evaluation) if evaluation else evaluation
    if not rows:
        raise ConfigError(f"TRAIN_DATA: no pair left to train on ({len(records.rows)} read); see the log above")
    log.info("data: %d %s for TRAIN_METHOD=%s (%s)", len(rows), "examples" if method.unpaired else "pairs",
             s.method, ", ".join(records.layouts))  # fmt: skip
    return rows, evaluation


def _prompts_limited(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, cfg: RunConfig, what: str
) -> list[dict[str, Any]]:
    """TRAIN_PREF_MAX_PROMPT_LEN (TRL 1.16's configs have no prompt limit of their own): long prompts cut from the
    left, one cut for both sides, or their records dropped; both counted."""
    s = cfg.settings
    limited = limit_prompts(rows, tokenizer, s.pref_max_prompt_len, s.long_records)
    limit = f"TRAIN_PREF_MAX_PROMPT_LEN={s.pref_max_prompt_len}"
    if limited.cut:
        log.warning("data: %d of %d %s prompts longer than %s tokens cut from the left, the same cut for chosen and "
                    "rejected (TRAIN_LONG_RECORDS=truncate)", limited.cut, len(rows), what, limit)  # fmt: skip
    if limited.dropped:
        why = ("TRAIN_LONG_RECORDS=drop" if s.long_records == "drop"
               else "no cut fits: the chat template's own tokens are longer")  # fmt: skip
        log.warning("data: %d of %d %s records dropped, their prompt longer than %s tokens (%s)",
                    limited.dropped, len(rows), what, limit, why)  # fmt: skip
    return limited.rows


def _kept(rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, seq_len: int, long_records: str, what: str
          ) -> list[dict[str, Any]]:  # fmt: skip
    """Rows whose prompt and longest side fit TRAIN_SEQ_LEN, or all of them (truncate: TRL keeps the shared prompt
    and cuts each answer at the same length); the long ones are counted either way."""
    lengths = [longest(encoded(tokenizer, row)) for row in rows]
    long = [i for i, n in enumerate(lengths) if n > seq_len]
    if not long:
        return rows
    if long_records == "drop":
        log.warning("data: %d of %d %s pairs longer than TRAIN_SEQ_LEN=%d dropped (TRAIN_LONG_RECORDS=drop; a "
                    "reward model always drops them: it scores whole answers)",
                    len(long), len(rows), what, seq_len)  # fmt: skip
        skip = set(long)
        return [row for i, row in enumerate(rows) if i not in skip]
    log.warning("data: %d of %d %s pairs longer than TRAIN_SEQ_LEN=%d: each side cut after %d tokens, the prompt "
                "they share kept whole (TRAIN_LONG_RECORDS=truncate; a prompt that fills it alone is dropped by TRL)",
                len(long), len(rows), what, seq_len, seq_len)  # fmt: skip
    return rows


def build_policy(cfg: RunConfig, tokenizer: PreTrainedTokenizerBase) -> Any:
    """The model to train: SFT's (preset or folder, LoRA/QLoRA applied), or for `reward` a one-score classifier."""
    from trainer.run.training_model import build_model, build_reward_model

    if not of(cfg.settings.method).classifier:
        return build_model(cfg, tokenizer)
    return build_reward_model(cfg, tokenizer)


def reference_model(cfg: RunConfig, model: Module) -> Any:
    """A frozen copy of the starting policy where the reference decision asks for one; else None (TRL then uses
    the adapter-disabled base with LoRA, or its precomputed log-probs)."""
    if cfg.decisions.reference.value != "frozen copy":
        return None
    reference = copy.deepcopy(model)
    reference.eval()
    reference.requires_grad_(False)
    return reference


def build_trainer(cfg: RunConfig, args: TrainingArguments, tokenizer: PreTrainedTokenizerBase, model: Module,
                  rows: tuple[list[dict[str, Any]], list[dict[str, Any]] | None], callbacks: list[Any]) -> Any:
    """TRL's trainer for cfg.settings.method on `rows` (training_rows) with atomic checkpoints, ready for `train`."""
    from datasets import Dataset

    from trainer.run.checkpoint import atomic_trainer

    s = cfg.settings
    train_rows, evaluation = rows
    kwargs: dict[str, Any] = {}
    if of(s.method).reference:
        kwargs["ref_model"] = reference_model(cfg, model)
    log.info("reference: %s (%s)", cfg.decisions.reference.value, cfg.decisions.reference.reason)
    policy_bytes = parameter_bytes(model.parameters())
    trainer = atomic_trainer(trainer_class(s.method))(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(train_rows),
        eval_dataset=Dataset.from_list(evaluation) if evaluation else None,
        processing_class=tokenizer,
        callbacks=callbacks,
        **kwargs,
    )
    log.info("memory: %s of model parameters held after setup, the policy's own %s (a second copy of the model would "
             "double it)", _megabytes(parameter_bytes_held()), _megabytes(policy_bytes))
    fitted = len(trainer.train_dataset)
    if fitted < len(train_rows):
        log.warning("data: TRL dropped %d of %d examples whose prompt alone fills TRAIN_SEQ_LEN=%d",
                    len(train_rows) - fitted, len(train_rows), s.seq_len)  # fmt: skip
    return trainer


def parameter_bytes(parameters: Any) -> int:
    """Bytes of the distinct storages behind `parameters` (tied or shared weights counted once)."""
    storages = {}
    for p in parameters:
        if p.device.type != "meta":
            storage = p.untyped_storage()
            storages[(p.device, storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


def parameter_bytes_held() -> int:
    """Bytes of every model parameter alive in this process (policy, reference, whatever TRL keeps): what a second
    copy of the model would show, measured rather than assumed."""
    import gc

    import torch

    return parameter_bytes(o for o in gc.get_objects() if issubclass(type(o), torch.nn.Parameter))


def _megabytes(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"
