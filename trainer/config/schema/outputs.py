"""The TRAIN_* settings of the group "Trackers and Hub push".

Fields only: the group's rules (checks, decisions, its TrainingArguments) live in trainer/config/outputs.py;
trainer.config.schema assembles the groups.
"""

from __future__ import annotations

from pydantic import BaseModel, field_validator

from trainer.config.schema.fields import FREE, setting


class OutputSettings(BaseModel):
    # outputs: trackers (trainer/trackers/) and the Hub push (trainer/hub/push.py)
    report_to: str = setting(
        "tensorboard", "outputs",
        "Experiment trackers, a comma list of tensorboard, wandb, mlflow, or none (Transformers' own callbacks; only "
        "rank 0 reports; params are the resolved TRAIN_* with secrets masked). wandb: offline under OUTPUT_DIR/wandb "
        "unless WANDB_API_KEY is set; mlflow: MLFLOW_TRACKING_URI (default OUTPUT_DIR/mlruns), MLFLOW_EXPERIMENT_NAME.",
        on_resume=FREE,
    )
    push_to_hub: str = setting(
        "", "outputs",
        "org/name[@branch]: at the end of a successful run, export final/ (merged, verified, with a model card) to "
        "OUTPUT_DIR/export and upload it to this Hub repository (created private). Token: HF_TOKEN or HF_TOKEN_PATH.",
        on_resume=FREE,
    )

    @field_validator("report_to")
    @classmethod
    def _tracker_list(cls, value: str) -> str:
        from trainer.trackers.choice import normalized

        return normalized(value)

    @field_validator("push_to_hub")
    @classmethod
    def _hub_repo(cls, value: str) -> str:
        from trainer.hub.ids import parse_model_id

        if value and parse_model_id(value) is None:
            raise ValueError("expected org/name or org/name@branch")
        return value
