"""Online RL (TRAIN_METHOD=grpo/rloo) on TRL's GRPOTrainer/RLOOTrainer, with trainkit's machinery.

The prompts are the records the checks read (trainer.config.Inputs.prompts), each row carrying its file:line for the
reward functions' errors (trainer.run.rewards takes it off again before a user function sees the columns). The
policy is SFT's model (preset or folder, LoRA applied) with Transformers' own attention (it generates, with left
padding); Transformers' generate makes the completions inside this process, or vLLM (TRAIN_RL_ENGINE=vllm:
trainer.run.vllm_engine). The trainer is made atomic
(trainer.run.checkpoint.atomic_trainer): checkpoints, final/, SIGTERM stops, resume and metrics.jsonl are SFT's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trainer.config.method import trainer_class
from trainer.data.prompts import WHERE
from trainer.errors import ConfigError
from trainer.run import kit
from trainer.run.vision import refuse_image_method

if TYPE_CHECKING:
    from trainer.config.run_config import RunConfig

log = logging.getLogger("trainer")


def prepare(setup: kit.Setup) -> kit.Prepared:
    """TRL's GRPO/RLOO trainer, the rewards checked before the model loads; the sampled completions with their
    rewards logged from the main process."""
    from pathlib import Path

    from trainer.config.online import reward_files
    from trainer.config.rl_tools import file_hashes
    from trainer.run.samples import SAMPLES, CompletionSamplesCallback

    cfg, args = setup.cfg, setup.args
    rows = training_rows(cfg)
    refuse_image_method(cfg.inputs, rows)
    toolbox = tools_of(cfg, setup.tokenizer)
    check_prompt_lengths(cfg, setup.tokenizer, rows, toolbox.offered() if toolbox else None)
    rewards = reward_functions(cfg, rows)
    model = setup.model(lambda: build_policy(cfg, setup.tokenizer))
    record = kit.learned(setup.start, args, cfg.decisions, len(rows), model)
    callbacks = setup.callbacks(model, record)
    trainer = build_trainer(cfg, args, setup.tokenizer, model, rows, rewards, callbacks, toolbox)
    main = args.process_index == 0
    samples = (CompletionSamplesCallback(trainer, Path(cfg.settings.output_dir) / SAMPLES),) if main else ()
    provenance = None
    if args.should_save:  # provenance.json's part of online RL
        provenance = {"reward_files": reward_files(cfg.settings.reward), "tool_files": file_hashes(cfg.settings),
                      "generation": generation_provenance(cfg.settings.rl_engine)}  # fmt: skip
    return kit.Prepared(trainer, record, after_trackers=samples, provenance=provenance)


def training_rows(cfg: RunConfig) -> list[dict[str, Any]]:
    """TRL's rows: the prompt, every other column, and where the record came from."""
    from trainer.data.mixed import training_prompts

    s = cfg.settings
    records, _ = training_prompts(cfg.inputs.prompts, list(cfg.inputs.mix.entries), s.seed)
    for line in records.skipped:
        log.warning("data: skipped %s (TRAIN_DATA_MAX_BAD_LINES=%d)", line, s.data_max_bad_lines)
    if not records.rows:
        raise ConfigError(f"TRAIN_DATA: no prompt to train on ({len(records.skipped)} records skipped)")
    rows = [{**row, WHERE: where} for row, where in zip(records.rows, records.wheres, strict=True)]
    columns = sorted({k for row in rows for k in row} - {"prompt", WHERE})
    log.info("data: %d prompts (%s) for TRAIN_METHOD=%s; columns given to the rewards: %s", len(rows),
             "messages, rendered with the chat template" if records.chat else "text", s.method,
             ", ".join(columns) or "none")  # fmt: skip
    return rows


def check_prompt_lengths(cfg: RunConfig, tokenizer: Any, rows: list[dict[str, Any]], tools: list[Any] | None = None
                         ) -> None:  # fmt: skip
    """Every prompt, as the model is given it (with the `tools` described), with TRAIN_RL_MAX_NEW_TOKENS after it,
    must fit the model's context: one that does not is refused (exit 2) naming its file:line, before the model loads
    (as `generate` refuses it)."""
    import json
    from pathlib import Path

    from trainer.config.presets import is_preset
    from trainer.config.rope import context_length, readable_model_config
    from trainer.data.prompts import rendered

    s = cfg.settings
    config = readable_model_config(s)
    if config is None and not is_preset(s.model):
        try:
            config = json.loads((Path(str(cfg.decisions.model.value)) / "config.json").read_text())
        except (OSError, ValueError):
            return
    limit = context_length(config) if isinstance(config, dict) and s.rope_scaling == "none" else None
    if not limit:
        return
    texts = [rendered(tokenizer, row["prompt"], tools) for row in rows]
    chat = isinstance(rows[0]["prompt"], list)
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=not chat)["input_ids"]]
    over = [(n, where) for n, where in zip(lengths, (row[WHERE] for row in rows), strict=True)
            if n + s.rl_max_new_tokens > limit]  # fmt: skip
    if over:
        longest = max(n for n, _ in over)
        raise ConfigError(
            f"TRAIN_DATA: the prompt at {over[0][1]} is {over[0][0]} tokens; with TRAIN_RL_MAX_NEW_TOKENS="
            f"{s.rl_max_new_tokens} it exceeds the model's context of {limit} tokens ({len(over)} of {len(rows)} "
            f"prompts do, the longest {longest} tokens). Such prompts are refused, not cut: shorten them or leave "
            "them out, or lower TRAIN_RL_MAX_NEW_TOKENS"
        )


def reward_functions(cfg: RunConfig, rows: list[dict[str, Any]]) -> list[Any]:
    """TRAIN_REWARD's functions, imported and checked against the data's columns before the model loads."""
    from trainer.run.rewards import build_rewards

    s = cfg.settings
    columns = frozenset({k for row in rows for k in row} - {"prompt", WHERE})
    rewards = build_rewards(cfg.inputs.rewards, columns, s.rl_max_new_tokens, s.rl_reward_timeout)
    names = [getattr(r, "__name__", r) for r in rewards]
    log.info("rewards: %s (weights %s), each logged as rewards/NAME/mean", ", ".join(map(str, names)),
             cfg.training_arguments.get("reward_weights"))  # fmt: skip
    return rewards


def tools_of(cfg: RunConfig, tokenizer: Any) -> Any:
    """TRAIN_RL_TOOLS and TRAIN_RL_ENVIRONMENT imported and checked with the chat template, before the model loads
    (trainer.run.tools); None when neither is set."""
    from trainer.run.tools import check_template, load_toolbox

    s = cfg.settings
    if not (s.rl_tools or s.rl_environment):
        return None
    toolbox = load_toolbox(s.rl_tools, s.rl_environment)
    check_template(tokenizer, cfg.inputs.template().origin)
    log.info("tools: %s; at most %d assistant turns per episode (TRAIN_RL_MAX_TURNS), each tool call at most %gs "
             "(TRAIN_RL_TOOL_TIMEOUT)", toolbox.described(), s.rl_max_turns, s.rl_tool_timeout)  # fmt: skip
    return toolbox


def build_policy(cfg: RunConfig, tokenizer: Any) -> Any:
    from trainer.run.training_model import build_model

    return build_model(cfg, tokenizer, packed=False)


def build_trainer(cfg: RunConfig, args: Any, tokenizer: Any, model: Any, rows: list[dict[str, Any]],
                  rewards: list[Any], callbacks: list[Any], toolbox: Any = None) -> Any:  # fmt: skip
    """TRL's trainer for cfg.settings.method with atomic checkpoints, ready for `train`; with a `toolbox`
    (trainer.run.tools) multi-turn, its tools and environments handed to TRL (trainer.run.multi_turn)."""
    from datasets import Dataset

    from trainer.run import vllm_engine
    from trainer.run.checkpoint import atomic_trainer
    from trainer.run.multi_turn import multi_turn
    from trainer.run.online_resume import resumable_online
    from trainer.run.rollout_timing import timed_generation

    s = cfg.settings
    where = ("Transformers' generate in this process" if s.rl_engine == "transformers" else
             f"the vLLM server at {s.rl_vllm_url} (TRL's server mode)" if s.rl_vllm_url else
             f"vLLM in this process (TRL's colocate mode, TRAIN_RL_VLLM_MEMORY={s.rl_vllm_memory:g})")  # fmt: skip
    log.info(
        "generation: %s, %d completions per prompt, at most %d new tokens, temperature %g",
        where,
        cfg.settings.rl_generations,
        cfg.settings.rl_max_new_tokens,
        cfg.settings.rl_temperature,
    )
    log.info("reference: %s (%s)", cfg.decisions.reference.value, cfg.decisions.reference.reason)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    vllm_engine.prepare(s)
    base = resumable_online(trainer_class(s.method))
    extra: dict[str, Any] = {}
    if toolbox is not None:
        base = multi_turn(base)
        extra = {"tools": list(toolbox.tools), "environment_factory": toolbox.factory}
    with vllm_engine.building(s, cfg.decisions.compile):
        trainer = atomic_trainer(timed_generation(base))(
            model=model,
            reward_funcs=rewards,
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=callbacks,
            **extra,
        )
    vllm_engine.after_build(trainer, s)
    if toolbox is not None:
        trainer.setup_turns(turn_end(tokenizer), s.rl_tool_timeout, s.rl_max_turns)
    return trainer


def turn_end(tokenizer: Any) -> str | None:
    """Where the chat template ends an assistant turn (e.g. `<|im_end|>`), unless that is the EOS token already."""
    from trainer.answers.decoding import end_of_turn

    end = end_of_turn(tokenizer, tokenizer.chat_template)
    return None if end is None or end == tokenizer.eos_token else end


def generation_provenance(engine: str = "transformers") -> dict[str, Any]:
    """What generated the completions, for provenance.json (vllm: the vLLM in this process, and its distribution)."""
    from trainer.compat import installed_version
    from trainer.vllm_compat import installed_vllm

    if engine != "vllm":
        return {"engine": engine, "version": installed_version(engine)}
    found = installed_vllm()
    return {"engine": engine, "version": found[1] if found else None, "distribution": found[0] if found else None}
