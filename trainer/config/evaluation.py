"""The evaluation group's home (TRAIN_EVAL_DATA, TRAIN_EVAL_SPLIT, TRAIN_EVAL_STEPS, TRAIN_EVAL_GENERATE,
TRAIN_KEEP_BEST): their checks and TrainingArguments (the group decides nothing). The eval dataset is made by
trainer/run/evaluation.py, TRAIN_EVAL_GENERATE's answers by trainer/run/samples.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.config.decision import Decision, Decisions, SoFar
from trainer.data.mix import eval_set_names, eval_set_problems
from trainer.methods import of

if TYPE_CHECKING:
    from trainer.config.inputs import Inputs
    from trainer.config.schema import TrainSettings
    from trainer.machine.hardware import Hardware


def has_evaluation(s: TrainSettings) -> bool:
    return bool(s.eval_data) or s.eval_split > 0


def _setting_problems(s: TrainSettings) -> list[str]:
    problems = []
    if s.eval_data and s.eval_split > 0:
        problems.append(f"TRAIN_EVAL_DATA and TRAIN_EVAL_SPLIT={s.eval_split} both choose evaluation data; set one")
    if not has_evaluation(s) and (s.eval_steps or s.keep_best):
        what = "TRAIN_KEEP_BEST=1" if s.keep_best else f"TRAIN_EVAL_STEPS={s.eval_steps}"
        problems.append(f"{what} needs evaluation data: set TRAIN_EVAL_DATA or TRAIN_EVAL_SPLIT (e.g. 0.05)")
    if s.eval_generate and not s.eval_data:
        problems.append(f"TRAIN_EVAL_GENERATE={s.eval_generate} answers prompts of TRAIN_EVAL_DATA (prompt/completion "
                        "records or conversations); set TRAIN_EVAL_DATA, or TRAIN_EVAL_GENERATE=0")  # fmt: skip
    if s.eval_generate and of(s.method).family != "sft":
        problems.append(f"TRAIN_EVAL_GENERATE={s.eval_generate} works with TRAIN_METHOD=sft only; set it to 0")
    if s.eval_generate and (s.fsdp != "none" or s.zero_stage == 3):
        problems.append(f"TRAIN_EVAL_GENERATE={s.eval_generate} generates on the main process alone, which cannot "
                        "hold a model sharded by FSDP or ZeRO-3; set it to 0, or run `python -m trainer eval` on the "
                        "checkpoints")  # fmt: skip
    if s.keep_best and s.eval_steps and s.save_steps % s.eval_steps:
        problems.append(
            f"TRAIN_KEEP_BEST=1 keeps an evaluated checkpoint, so TRAIN_SAVE_STEPS={s.save_steps} must be a multiple "
            f"of TRAIN_EVAL_STEPS={s.eval_steps}; e.g. TRAIN_EVAL_STEPS=0 (evaluate at every save)"
        )
    return problems


def _eval_data_problems(inputs: Inputs) -> list[str]:
    """The scan's problems; a Hub dataset is scanned after it is fetched (Inputs.hub_problems)."""
    eval_data = inputs.settings.eval_data
    if inputs.on_hub("eval_data"):
        return eval_set_problems(eval_data)
    return list(inputs.eval_data.problems) if eval_data else []


def problems(inputs: Inputs) -> list[str]:
    return [*_setting_problems(inputs.settings), *_eval_data_problems(inputs)]


def decide(inputs: Inputs, hardware: Hardware, so_far: SoFar) -> dict[str, Decision]:
    return {}


def arguments(settings: TrainSettings, decisions: Decisions, hardware: Hardware) -> dict[str, Any]:
    """Transformers' own evaluation schedule; TRAIN_KEEP_BEST is load_best_model_at_end on eval_loss, which also
    keeps the best checkpoint out of rotation. Only the loss is computed (logits are not gathered)."""
    s = settings
    if not has_evaluation(s):
        return {"eval_strategy": "no"}
    args: dict[str, Any] = {
        "eval_strategy": "steps",
        "eval_steps": s.eval_steps or s.save_steps,
        "per_device_eval_batch_size": s.batch_size,
        "prediction_loss_only": True,
    }
    if s.keep_best:
        first = eval_set_names(s.data, s.eval_data, s.eval_split)[:1]  # several eval sets: the first one decides
        metric = f"eval_{first[0]}_loss" if first else "eval_loss"
        args.update(load_best_model_at_end=True, metric_for_best_model=metric, greater_is_better=False)
    return args
