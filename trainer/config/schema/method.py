"""The TRAIN_* settings of the group "Method: SFT, preference tuning or online RL".

Fields only: the group's rules (checks, decisions, its TrainingArguments) live in trainer/config/method.py;
trainer.config.schema assembles the groups.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from trainer.config.schema.fields import DATA, FIXED, FREE, setting


class MethodSettings(BaseModel):
    # method (trainer/methods.py: the table of methods, which this Literal equals: tests/test_methods.py); the method
    # and its options are FIXED on resume
    method: Literal["sft", "dpo", "orpo", "kto", "simpo", "reward", "grpo", "rloo"] = setting(
        "sft", "method",
        "sft: supervised fine-tuning / pre-training on text, prompt/completion or conversations. Preference tuning on "
        "pairs (prompt/chosen/rejected, as text or messages) through TRL's trainers: dpo, orpo, simpo, reward (a "
        "reward model); kto also on prompt/completion/label records. Online RL on prompts, the completions generated "
        "in training and scored by TRAIN_REWARD: grpo, rloo (TRL's GRPOTrainer, RLOOTrainer). Further TRL config "
        "fields go in TRAIN_ARGS.",
        on_resume=FIXED)  # fmt: skip
    pref_beta: float = setting(
        0.0, "method",
        "dpo/orpo/kto/simpo: beta (how far the policy may move from the reference; ORPO's lambda). 0: TRL's default "
        "for the method (0.1; simpo 2.0).", ge=0, on_resume=FIXED)  # fmt: skip
    pref_loss: Literal[
        "auto", "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
        "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm",
    ] = setting("auto", "method", "dpo: TRL's DPO loss_type. auto: sigmoid (the DPO paper's loss).", on_resume=FIXED)
    pref_reference: Literal["auto", "copy", "precompute"] = setting(
        "auto", "method",
        "dpo/kto: the reference model. auto: with TRAIN_LORA=1 the base with a frozen copy of the starting adapter (no "
        "second copy of the model), else a frozen copy; precompute: the reference log-probs computed once before "
        "training (TRL's precompute_ref_log_probs), so no copy is held while training; copy: a frozen copy.",
        on_resume=FIXED)  # fmt: skip
    pref_max_prompt_len: int = setting(
        0, "method",
        "Preference methods: a prompt longer than this many tokens is cut from the left (text: its start; a "
        "conversation: its earliest messages first), one cut for chosen and rejected; with TRAIN_LONG_RECORDS=drop "
        "its record is dropped instead. Counted in the log. 0: no limit of its own (TRAIN_SEQ_LEN bounds the prompt "
        "and answer together).", ge=0, on_resume=FIXED)  # fmt: skip

    # online RL (trainer/config/online.py, trainer/run/online.py, trainer/run/rewards.py)
    reward: str = setting(
        "", "method",
        "grpo/rloo: the rewards, a comma list, each optionally NAME:WEIGHT (default weight 1). Built-ins: exact (the "
        "completion equals the record's `answer`, whitespace and case normalised), contains (the answer appears in "
        "it), regex=PATTERN (it matches), length[=N] (0 up to N tokens, falling to -1 at 2N; N defaults to "
        "TRAIN_RL_MAX_NEW_TOKENS/2); a user function path/file.py:function (TRL's signature: prompts, completions, "
        "**columns -> list[float]); a reward model folder (TRAIN_METHOD=reward's final/). A changed list or reward "
        "file is refused on resume (TRAIN_RESUME_CHANGED_DATA=1 allows it).",
        on_resume=DATA)  # fmt: skip
    rl_generations: int = setting(
        4, "method", "grpo/rloo: completions generated per prompt (the group whose rewards are compared); "
        "TRAIN_BATCH_SIZE x TRAIN_GRAD_ACCUM counts completions and must be a multiple of it.", ge=2,
        on_resume=DATA)  # fmt: skip
    rl_max_new_tokens: int = setting(
        256, "method", "grpo/rloo: the longest completion, in tokens.", ge=1, on_resume=DATA
    )
    rl_temperature: float = setting(1.0, "method", "grpo/rloo: the sampling temperature.", gt=0, on_resume=DATA)
    rl_reward_timeout: float = setting(
        600.0, "method", "grpo/rloo: seconds one call of a reward function (a batch of completions) may take; past "
        "it the run ends with exit 2 naming the function, as a reward that raises does. 0: no limit.", ge=0,
        on_resume=FREE)  # fmt: skip
    rl_beta: float = setting(
        0.0, "method", "grpo/rloo: the KL coefficient against the starting model; 0 (TRL GRPO's default): no KL term "
        "and no reference model held.", ge=0, on_resume=FIXED)  # fmt: skip
    rl_loss: Literal["auto", "grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"] = setting(
        "auto", "method", "grpo: TRL's GRPO loss_type. auto: dapo (TRL's default).", on_resume=FIXED)  # fmt: skip
    rl_engine: Literal["transformers", "vllm"] = setting(
        "transformers", "method", "grpo/rloo: what generates the completions. transformers: generate inside the "
        "training process (every stack). vllm: vLLM, in the training process (colocate) or on TRAIN_RL_VLLM_URL "
        "(server), where the stack has a vLLM TRL supports (docs/running.md, 'Online RL').",
        on_resume=DATA)  # fmt: skip
    rl_vllm_url: str = setting("", "method", "TRAIN_RL_ENGINE=vllm: the generation server, e.g. http://vllm:8000 "
                               "(compose's `vllm` service; TRL's server mode, a CUDA device). Empty: vLLM runs in the "
                               "training process (TRL's colocate mode).", on_resume=FREE)  # fmt: skip
    rl_vllm_memory: float = setting(
        0.3, "method", "TRAIN_RL_ENGINE=vllm in colocate mode: the share of the device's memory vLLM takes for its "
        "weights and KV cache (TRL's vllm_gpu_memory_utilization; on the CPU a share of the host's memory).",
        gt=0, le=1, on_resume=FREE)  # fmt: skip
    rl_vllm_timeout: float = setting(
        300, "method", "TRAIN_RL_ENGINE=vllm in server mode: seconds the server may take for one call (the checks "
        "at start, a generation, a weight sync; TRL's retries included); past it the run ends with exit 2 naming the "
        "server, its last checkpoint kept.", gt=0, on_resume=FREE)  # fmt: skip

    # multi-turn online RL (trainer/config/rl_tools.py, trainer/run/tools.py, trainer/run/multi_turn.py)
    rl_tools: str = setting(
        "", "method",
        "grpo: tools the model may call, TRL's way: path/tools.py:fn1,fn2 (plain Python functions with type hints and "
        "a docstring with Args:; a bare name continues the file before it). They run in the training process; the "
        "model's arguments are checked against the hints, a raise or a timeout becomes an error message the model "
        "reads. The prompts must be conversations. A changed list or file is refused on resume "
        "(TRAIN_RESUME_CHANGED_DATA=1 allows it).",
        on_resume=DATA)  # fmt: skip
    rl_environment: str = setting(
        "", "method",
        "grpo: an environment class, TRL's environment_factory: path/env.py:Class (one instance per rollout; reset(**"
        "record columns) starts an episode, its public methods are tools, an optional get_reward() scores it), or "
        "name=path/env.py:Class,... chosen per record by its `environment` column. Checked and refused on resume as "
        "TRAIN_RL_TOOLS.",
        on_resume=DATA)  # fmt: skip
    rl_max_turns: int = setting(
        8, "method", "grpo with TRAIN_RL_TOOLS/TRAIN_RL_ENVIRONMENT: the most assistant turns in an episode (a turn "
        "after each round of tool results); episodes still calling tools at the limit are counted "
        "(tools/turn_limit). TRAIN_RL_MAX_NEW_TOKENS bounds the whole episode's tokens.", ge=1,
        on_resume=DATA)  # fmt: skip
    rl_tool_timeout: float = setting(
        60.0, "method", "grpo with tools: seconds one tool call may take; past it the call is ended and the model "
        "reads that it timed out (counted as tools/timeouts). 0: no limit (a stop signal still ends a call after a "
        "30 s grace).", ge=0, on_resume=FREE)  # fmt: skip
