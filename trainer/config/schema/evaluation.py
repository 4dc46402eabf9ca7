"""The TRAIN_* settings of the group "Evaluation".

Fields only: the group's rules (checks, decisions, its TrainingArguments) live in trainer/config/evaluation.py;
trainer.config.schema assembles the groups.
"""

from __future__ import annotations

from pydantic import BaseModel

from trainer.config.schema.fields import DATA, FREE, setting


class EvalSettings(BaseModel):
    eval_data: str = setting(
        "", "evaluation",
        "Evaluation data, in any form TRAIN_DATA takes (a hub-style folder or Hub dataset gives its validation "
        "split). Eval loss and perplexity go to metrics.jsonl and TensorBoard. Several sets: NAME=SOURCE,NAME=SOURCE, "
        "each reported as eval_NAME_loss.",
        on_resume=FREE,
    )
    eval_split: float = setting(
        0.0, "evaluation",
        "Hold out this fraction of the training data's packed sequences (the last ones) for evaluation; 0: none. "
        "Use either this or TRAIN_EVAL_DATA.",
        ge=0,
        lt=0.5,
        on_resume=DATA,
    )
    eval_steps: int = setting(
        0, "evaluation", "Evaluate every N optimizer steps; 0: every TRAIN_SAVE_STEPS (needs evaluation data).", ge=0,
        on_resume=FREE,
    )
    eval_generate: int = setting(
        0, "evaluation",
        "At each evaluation, answer the first N prompts of TRAIN_EVAL_DATA (its prompt/completion records or "
        "conversations; greedy, at most 64 new tokens) and log them: OUTPUT_DIR/samples.jsonl, TensorBoard text, a "
        "W&B table, an MLflow artifact; 0: off.",
        ge=0,
        on_resume=FREE,
    )
    keep_best: bool = setting(
        False, "evaluation",
        "Keep the checkpoint with the lowest eval loss (never rotated away) and make it final/ at the end "
        "(Transformers' load_best_model_at_end with metric_for_best_model=eval_loss).",
        on_resume=FREE,
    )
