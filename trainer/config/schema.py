"""The TRAIN_* schema: the one place every environment variable of the trainer is declared.

Parsing, validation, `python -m trainer config`, the README table and `.env.example`
are all derived from `TrainSettings`. This module must stay importable without torch.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "TRAIN_"

Toggle = Literal["auto", "0", "1"]


# Field groups, in the order docs present them.
GROUPS = {
    "paths": "Paths and data",
    "method": "Method: SFT, preference tuning or online RL",
    "precision": "Precision",
    "optim": "Optimizer and batch",
    "memory": "Memory: checkpointing, ZeRO, FSDP",
    "speed": "Speed: compile and attention",
    "adapters": "LoRA / QLoRA",
    "schedule": "Schedule, checkpoints and resume",
    "eval": "Evaluation",
    "debug": "Profiling and reproducibility",
    "outputs": "Trackers and Hub push",
    "launch": "Launch",
}


class OnResume(str, Enum):
    """What a change of a setting means when a run resumes from a checkpoint (trainer.config.resume.check_drift)."""

    FIXED = "cannot change"  # the checkpoint cannot continue with another value: exit 2
    DATA = "changes the data"  # the training data or its order: exit 2 unless TRAIN_RESUME_CHANGED_DATA=1
    FREE = "may change"  # the run goes on, and its log names the change
    NOT_RECORDED = "not recorded"  # steers this start (where, whether to resume): neither recorded nor compared


FIXED, DATA, FREE, NOT_RECORDED = OnResume.FIXED, OnResume.DATA, OnResume.FREE, OnResume.NOT_RECORDED


def _f(default: Any, group: str, doc: str, *, on_resume: OnResume, **kw: Any) -> Any:
    """A field with its documentation group (`doc` feeds the README and .env.example) and its resume rule."""
    return Field(default, description=doc, json_schema_extra={"group": group, "on_resume": on_resume.value}, **kw)


class TrainSettings(BaseSettings):
    """Every TRAIN_* variable. Field name `foo_bar` is environment variable `TRAIN_FOO_BAR`."""

    model_config = SettingsConfigDict(  # allow_inf_nan: TRAIN_ROPE_FACTOR=inf or TRAIN_LR=nan exit 2 at the check
        env_prefix=ENV_PREFIX, extra="ignore", case_sensitive=False, validate_default=True, frozen=True,
        allow_inf_nan=False)  # fmt: skip

    # paths and data
    model: str = _f(
        "tiny", "paths",
        "A preset for training from scratch: tiny, 125m, 350m, 1b (Llama architecture); a local Hugging Face "
        "model folder; or a Hub ID org/name[@revision], downloaded into HF_HOME (HF_TOKEN for gated and private "
        "models; with HF_HUB_OFFLINE=1 only the cache is used). The resolved commit is recorded and kept on resume.",
        on_resume=FIXED,
    )
    tokenizer: str = _f(
        "", "paths",
        "Tokenizer: a folder or Hub ID org/name[@revision] (only its tokenizer files are fetched). Empty: the model "
        "folder's own tokenizer, else the byte-level one (presets).",
        on_resume=FIXED,
    )
    data: str = _f(
        "/data", "paths",
        "Training data: a file, folder or glob of .txt, .jsonl/.json (also .gz/.zst/.bz2/.xz), .parquet, .arrow, "
        ".csv; a hub-style dataset folder (data/train-*.parquet) or a datasets.save_to_disk folder; or a Hub dataset "
        "hf://datasets/org/name[@revision][/config-folder or file glob] (its data files are fetched into HF_HOME, "
        "then read like a local folder: the train split). Missing or empty default: a small embedded corpus. Several "
        "sources (local or Hub datasets) mixed by weight: SOURCE:WEIGHT,SOURCE:WEIGHT (a weight is a share of the "
        "trained tokens), or a NAME.mix.json file (docs/running.md, 'Mixing sources').",
        on_resume=DATA,
    )
    output_dir: str = _f("/output", "paths", "Where checkpoints, the final model, metrics and logs go (unset outside "
                         "the image: ./output of the current folder).", on_resume=NOT_RECORDED)  # fmt: skip
    text_field: str = _f("text", "paths", "Field holding the text in .jsonl/.json/.parquet/.csv data.", on_resume=DATA)
    seq_len: int = _f(512, "paths", "Tokens per packed training sequence.", ge=8, on_resume=DATA)
    rope_scaling: Literal["none", "linear", "dynamic", "yarn", "llama3"] = _f(
        "none", "paths",
        "RoPE scaling, to train a context longer than the model's max_position_embeddings: linear, dynamic (NTK), "
        "yarn or llama3. It is written into the trained model's config.json (final/, exports, pushes load with it).",
        on_resume=FIXED,
    )
    rope_factor: float = _f(
        0.0, "paths",
        "How far TRAIN_ROPE_SCALING stretches the context (2: twice max_position_embeddings). 0: TRAIN_SEQ_LEN "
        "divided by the model's max_position_embeddings.",
        on_resume=FIXED,
    )
    data_max_bad_lines: int = _f(
        0, "paths",
        "Malformed records to skip (JSON Lines that do not parse, conversations that cannot be trained on; each is "
        "reported by file and line); 0: the first one stops the run.",
        ge=0,
        on_resume=DATA,
    )
    # conversations (trainer/data/chat.py)
    chat_template: str = _f(
        "", "paths",
        "Chat template for messages/conversations data: a built-in name (chatml) or a Jinja file; it replaces the "
        "tokenizer's own and is saved with final/ and every checkpoint. Empty: the tokenizer's own template.",
        on_resume=DATA,
    )
    loss_on: Literal["assistant", "last", "all"] = _f(
        "assistant", "paths",
        "Tokens the loss is taken on in conversations: assistant (every assistant turn with its end-of-turn "
        "tokens), last (the last assistant turn only), all (every token, system and user turns included). "
        "prompt/completion records train on the completion, or on everything with all.",
        on_resume=DATA,
    )
    # packing (#25, trainer/data/packing.py)
    packing: Literal["auto", "stream", "records"] = _f(
        "auto", "paths",
        "How records become TRAIN_SEQ_LEN sequences. records: whole records, best-fit packed, position ids restarting "
        "and attention kept inside each record, padding never trained; stream: one token stream cut into windows "
        "(a record may span two sequences and sees the ones before it). auto: records for prompt/completion and "
        "conversations, stream for plain text.",
        on_resume=DATA,
    )
    long_records: Literal["truncate", "drop"] = _f(
        "truncate", "paths",
        "A record longer than TRAIN_SEQ_LEN when records are packed: truncate it to TRAIN_SEQ_LEN, or drop it. "
        "Either way the log and meta.json count them.",
        on_resume=DATA,
    )

    # method (trainer/config/methods.py, trainer/run/preference.py); the method and its options are FIXED on resume
    method: Literal["sft", "dpo", "orpo", "kto", "simpo", "reward", "grpo", "rloo"] = _f(
        "sft", "method",
        "sft: supervised fine-tuning / pre-training on text, prompt/completion or conversations. Preference tuning on "
        "pairs (prompt/chosen/rejected, as text or messages) through TRL's trainers: dpo, orpo, simpo, reward (a "
        "reward model); kto also on prompt/completion/label records. Online RL on prompts, the completions generated "
        "in training and scored by TRAIN_REWARD: grpo, rloo (TRL's GRPOTrainer, RLOOTrainer). Further TRL config "
        "fields go in TRAIN_ARGS.",
        on_resume=FIXED)  # fmt: skip
    pref_beta: float = _f(
        0.0, "method",
        "dpo/orpo/kto/simpo: beta (how far the policy may move from the reference; ORPO's lambda). 0: TRL's default "
        "for the method (0.1; simpo 2.0).", ge=0, on_resume=FIXED)  # fmt: skip
    pref_loss: Literal[
        "auto", "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
        "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm",
    ] = _f("auto", "method", "dpo: TRL's DPO loss_type. auto: sigmoid (the DPO paper's loss).", on_resume=FIXED)
    pref_reference: Literal["auto", "copy", "precompute"] = _f(
        "auto", "method",
        "dpo/kto: the reference model. auto: with TRAIN_LORA=1 the base with a frozen copy of the starting adapter (no "
        "second copy of the model), else a frozen copy; precompute: the reference log-probs computed once before "
        "training (TRL's precompute_ref_log_probs), so no copy is held while training; copy: a frozen copy.",
        on_resume=FIXED)  # fmt: skip
    pref_max_prompt_len: int = _f(
        0, "method",
        "Preference methods: a prompt longer than this many tokens is cut from the left (text: its start; a "
        "conversation: its earliest messages first), one cut for chosen and rejected; with TRAIN_LONG_RECORDS=drop "
        "its record is dropped instead. Counted in the log. 0: no limit of its own (TRAIN_SEQ_LEN bounds the prompt "
        "and answer together).", ge=0, on_resume=FIXED)  # fmt: skip

    # online RL (trainer/config/online.py, trainer/run/online.py, trainer/run/rewards.py)
    reward: str = _f(
        "", "method",
        "grpo/rloo: the rewards, a comma list, each optionally NAME:WEIGHT (default weight 1). Built-ins: exact (the "
        "completion equals the record's `answer`, whitespace and case normalised), contains (the answer appears in "
        "it), regex=PATTERN (it matches), length[=N] (0 up to N tokens, falling to -1 at 2N; N defaults to "
        "TRAIN_RL_MAX_NEW_TOKENS/2); a user function path/file.py:function (TRL's signature: prompts, completions, "
        "**columns -> list[float]); a reward model folder (TRAIN_METHOD=reward's final/). A changed list or reward "
        "file is refused on resume (TRAIN_RESUME_CHANGED_DATA=1 allows it).",
        on_resume=DATA)  # fmt: skip
    rl_generations: int = _f(
        4, "method", "grpo/rloo: completions generated per prompt (the group whose rewards are compared); "
        "TRAIN_BATCH_SIZE x TRAIN_GRAD_ACCUM counts completions and must be a multiple of it.", ge=2,
        on_resume=DATA)  # fmt: skip
    rl_max_new_tokens: int = _f(256, "method", "grpo/rloo: the longest completion, in tokens.", ge=1, on_resume=DATA)
    rl_temperature: float = _f(1.0, "method", "grpo/rloo: the sampling temperature.", gt=0, on_resume=DATA)
    rl_beta: float = _f(
        0.0, "method", "grpo/rloo: the KL coefficient against the starting model; 0 (TRL GRPO's default): no KL term "
        "and no reference model held.", ge=0, on_resume=FIXED)  # fmt: skip
    rl_loss: Literal["auto", "grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"] = _f(
        "auto", "method", "grpo: TRL's GRPO loss_type. auto: dapo (TRL's default).", on_resume=FIXED)  # fmt: skip
    rl_engine: Literal["transformers", "vllm"] = _f(
        "transformers", "method", "grpo/rloo: what generates the completions. transformers: generate inside the "
        "training process (every stack). vllm: vLLM, in the training process (colocate) or on TRAIN_RL_VLLM_URL "
        "(server), where the stack has a vLLM TRL supports (docs/running.md, 'Online RL').",
        on_resume=DATA)  # fmt: skip
    rl_vllm_url: str = _f("", "method", "TRAIN_RL_ENGINE=vllm: the generation server, e.g. http://vllm:8000 "
                          "(compose's `vllm` service; TRL's server mode, a CUDA device). Empty: vLLM runs in the "
                          "training process (TRL's colocate mode).", on_resume=FREE)  # fmt: skip
    rl_vllm_memory: float = _f(
        0.3, "method", "TRAIN_RL_ENGINE=vllm in colocate mode: the share of the device's memory vLLM takes for its "
        "weights and KV cache (TRL's vllm_gpu_memory_utilization; on the CPU a share of the host's memory).",
        gt=0, le=1, on_resume=FREE)  # fmt: skip
    rl_vllm_timeout: float = _f(
        300, "method", "TRAIN_RL_ENGINE=vllm in server mode: seconds the server may take to answer one request "
        "(the checks at start, a generation, a weight sync); past it the run ends with exit 2 naming the server, its "
        "last checkpoint kept.", gt=0, on_resume=FREE)  # fmt: skip

    # precision
    precision: Literal["auto", "fp32", "fp16", "bf16", "fp8"] = _f(
        "auto", "precision", "Mixed precision. auto: bf16 where the GPU supports it, else fp16 on GPUs, fp32 on CPU. "
        "fp8 (opt-in): torchao's float8 matmuls in the decoder's linear layers inside bf16 autocast (GPUs with FP8 "
        "tensor cores: compute capability 8.9+); its MFU is bf16-equivalent.", on_resume=FREE,
    )
    tf32: Toggle = _f(
        "auto", "precision", "TensorFloat-32 matmuls. auto: on for Ampere and newer GPUs.", on_resume=FREE
    )

    # optimizer and batch
    optim: str = _f(
        "auto", "optim",
        "Any optimizer name Transformers accepts (adamw_torch, adamw_torch_fused, adamw_apex_fused, "
        "adamw_bnb_8bit, adafactor, ...). auto: adamw_torch_fused (on CPU: where torch has it, else adamw_torch).",
        on_resume=FREE,
    )
    lr: float = _f(3e-4, "optim", "Peak learning rate.", gt=0, on_resume=FREE)
    batch_size: int = _f(8, "optim", "Per-device micro-batch size (sequences).", ge=1, on_resume=DATA)
    grad_accum: int = _f(1, "optim", "Gradient accumulation steps.", ge=1, on_resume=DATA)
    auto_batch: Toggle = _f(
        "auto", "optim", "Before training, search the largest per-device batch that fits in GPU memory (all ranks "
        "agree; run_config.json records it). If TRAIN_BATCH_SIZE or TRAIN_GRAD_ACCUM is set, their product (the "
        "effective batch) is kept by gradient accumulation. auto: on with one GPU per process (no DeepSpeed, FSDP or "
        "quantization); off on CPU.",
        on_resume=FREE,
    )
    num_workers: int = _f(2, "optim", "DataLoader worker processes.", ge=0, on_resume=FREE)
    pin_memory: Toggle = _f("auto", "optim", "Pin DataLoader memory. auto: on when a GPU is used.", on_resume=FREE)

    # memory
    grad_ckpt: bool = _f(False, "memory", "Gradient (activation) checkpointing.", on_resume=FREE)
    zero_stage: int = _f(0, "memory", "DeepSpeed ZeRO stage, 0 (off) to 3.", ge=0, le=3, on_resume=FIXED)
    zero_offload: Literal["none", "cpu", "nvme"] = _f(
        "none", "memory", "Offload ZeRO optimizer state (and parameters at stage 3) to CPU or NVMe.",
        on_resume=FREE,
    )
    nvme_path: str = _f("/nvme", "memory", "Folder on a fast local disk for TRAIN_ZERO_OFFLOAD=nvme.", on_resume=FREE)
    deepspeed_config: str = _f(
        "", "memory", "Path to a DeepSpeed JSON config; wins over the generated one.",
        on_resume=FREE,
    )
    fsdp: Literal["none", "full_shard", "shard_grad_op", "hybrid_shard", "no_shard"] = _f(
        "none", "memory", "PyTorch FSDP sharding strategy (with auto-wrap of decoder layers).",
        on_resume=FIXED,
    )

    # speed
    compile: Toggle = _f(
        "auto", "speed", "torch.compile the model. auto: on for a GPU run of TRAIN_MAX_STEPS -1 (epochs) or at "
        "least 200 steps, on a stack where it is known to work; off on CPU.",
        on_resume=FREE,
    )
    compile_scope: Literal["layers", "model"] = _f(
        "layers", "speed", "What torch.compile compiles. layers: each decoder layer in place, one compile reused by "
        "all (regional; the shortest compile); model: the whole model's forward, the embeddings, mask and LM head "
        "included (a longer compile that may fuse more).",
        on_resume=FREE,
    )
    compile_backend: str = _f("inductor", "speed", "torch.compile backend.", on_resume=FREE)
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = _f(
        "default", "speed", "torch.compile mode.",
        on_resume=FREE,
    )
    attn: Literal["auto", "sdpa", "flash_attention_2", "flash_attention_4", "eager"] = _f(
        "auto", "speed", "Attention implementation (flash_attention_4: the flash-attn-4 package, Hopper and newer). "
        "auto: the measured best for the GPU generation (trainer.config.speed), else flash_attention_2 when "
        "installed and supported, else sdpa.",
        on_resume=FREE,
    )
    liger: Toggle = _f(
        "auto", "speed", "Liger fused kernels (RMSNorm, SwiGLU, RoPE, fused cross-entropy) through Transformers' "
        "use_liger_kernel; needs liger-kernel and a GPU. auto: on where measured faster (none yet: off).",
        on_resume=FREE,
    )

    # adapters
    lora: bool = _f(
        False, "adapters", "Train LoRA adapters instead of all weights (on a model folder or a preset).",
        on_resume=FIXED,
    )
    lora_r: int = _f(16, "adapters", "LoRA rank.", ge=1, on_resume=FIXED)
    lora_alpha: int = _f(32, "adapters", "LoRA alpha.", ge=1, on_resume=FIXED)
    lora_dropout: float = _f(0.05, "adapters", "LoRA dropout.", ge=0, lt=1, on_resume=FREE)
    lora_targets: str = _f(
        "all-linear", "adapters", "Comma-separated module names for LoRA, or all-linear.", on_resume=FIXED
    )
    quant: Literal["none", "4bit", "8bit"] = _f(
        "none", "adapters", "Load the base model quantized with bitsandbytes (QLoRA); needs TRAIN_LORA=1.",
        on_resume=FIXED,
    )
    neftune_alpha: float = _f(0.0, "adapters", "NEFTune noise alpha; 0 turns it off.", ge=0, on_resume=FREE)

    # schedule
    max_steps: int = _f(-1, "schedule", "Stop after this many optimizer steps; -1 uses TRAIN_EPOCHS.", on_resume=FREE)
    epochs: float = _f(1.0, "schedule", "Epochs over the data when TRAIN_MAX_STEPS is -1.", gt=0, on_resume=FREE)
    save_steps: int = _f(
        200, "schedule", "Write a checkpoint every N steps (and always on interruption).", ge=1, on_resume=FREE
    )
    save_total_limit: int = _f(3, "schedule", "Keep at most this many checkpoints.", ge=1, on_resume=FREE)
    log_steps: int = _f(10, "schedule", "Log metrics every N steps.", ge=1, on_resume=FREE)
    on_nan: Literal["stop", "skip"] = _f(
        "stop", "schedule",
        "A non-finite loss or gradient norm (a diverged run, e.g. TRAIN_LR=3e4 for 3e-4). stop: end the run with "
        "exit 4, no checkpoint of non-finite weights, no final/, nothing pushed (checked at logging steps and before "
        "every save, without a per-step GPU synchronization). skip: skip that optimizer step (one synchronization "
        "per step) and stop like `stop` after 10 skipped in a row.",
        on_resume=FREE,
    )
    seed: int = _f(42, "schedule", "Random seed.", on_resume=DATA)
    resume: str = _f(
        "auto", "schedule",
        "auto: resume from the newest complete checkpoint in the output folder; never; or a checkpoint PATH.",
        on_resume=NOT_RECORDED,
    )
    resume_changed_data: bool = _f(
        False, "schedule",
        "Resume although the data settings (TRAIN_DATA, TRAIN_SEQ_LEN, TRAIN_SEED, the batch...) changed since the "
        "checkpoint; without it such a resume exits 2 naming the changes.",
        on_resume=NOT_RECORDED,
    )
    start_over: bool = _f(
        False, "schedule",
        "With TRAIN_RESUME=never in a folder holding an earlier run: move its checkpoints, final/ and metrics.jsonl "
        "to previous-runs/<time>/ and start over (without it, such a start exits 2).",
        on_resume=NOT_RECORDED,
    )
    args: str = _f(
        "", "schedule",
        "Further TrainingArguments flags, e.g. '--lr_scheduler_type cosine --warmup_steps 0.05 --weight_decay 0.1'; "
        "they win over values trainkit derives.",
        on_resume=FREE,
    )

    # evaluation
    eval_data: str = _f(
        "", "eval",
        "Evaluation data, in any form TRAIN_DATA takes (a hub-style folder or Hub dataset gives its validation "
        "split). Eval loss and perplexity go to metrics.jsonl and TensorBoard. Several sets: NAME=SOURCE,NAME=SOURCE, "
        "each reported as eval_NAME_loss.",
        on_resume=FREE,
    )
    eval_split: float = _f(
        0.0, "eval",
        "Hold out this fraction of the training data's packed sequences (the last ones) for evaluation; 0: none. "
        "Use either this or TRAIN_EVAL_DATA.",
        ge=0,
        lt=0.5,
        on_resume=DATA,
    )
    eval_steps: int = _f(
        0, "eval", "Evaluate every N optimizer steps; 0: every TRAIN_SAVE_STEPS (needs evaluation data).", ge=0,
        on_resume=FREE,
    )
    eval_generate: int = _f(
        0, "eval",
        "At each evaluation, answer the first N prompts of TRAIN_EVAL_DATA (its prompt/completion records or "
        "conversations; greedy, at most 64 new tokens) and log them: OUTPUT_DIR/samples.jsonl, TensorBoard text, a "
        "W&B table, an MLflow artifact; 0: off.",
        ge=0,
        on_resume=FREE,
    )
    keep_best: bool = _f(
        False, "eval",
        "Keep the checkpoint with the lowest eval loss (never rotated away) and make it final/ at the end "
        "(Transformers' load_best_model_at_end with metric_for_best_model=eval_loss).",
        on_resume=FREE,
    )

    # debug
    deterministic: bool = _f(False, "debug", "Deterministic algorithms (slower; for bisecting).", on_resume=FREE)
    profile: bool = _f(
        False, "debug",
        "torch.profiler traces of steps 3-5 under OUTPUT_DIR/profile, viewable in TensorBoard, and "
        "summary-rank<N>.txt there: the operators that took the most time.",
        on_resume=FREE,
    )
    memory_snapshot: bool = _f(
        False, "debug", "Write a CUDA memory snapshot (OUTPUT_DIR/memory_snapshot.pickle) for pytorch.org/memory_viz.",
        on_resume=FREE,
    )

    # outputs: trackers (trainer/trackers/) and the Hub push (trainer/hub/push.py)
    report_to: str = _f(
        "tensorboard", "outputs",
        "Experiment trackers, a comma list of tensorboard, wandb, mlflow, or none (Transformers' own callbacks; only "
        "rank 0 reports; params are the resolved TRAIN_* with secrets masked). wandb: offline under OUTPUT_DIR/wandb "
        "unless WANDB_API_KEY is set; mlflow: MLFLOW_TRACKING_URI (default OUTPUT_DIR/mlruns), MLFLOW_EXPERIMENT_NAME.",
        on_resume=FREE,
    )
    push_to_hub: str = _f(
        "", "outputs",
        "org/name[@branch]: at the end of a successful run, export final/ (merged, verified, with a model card) to "
        "OUTPUT_DIR/export and upload it to this Hub repository (created private). Token: HF_TOKEN or HF_TOKEN_PATH.",
        on_resume=FREE,
    )

    # launch
    nproc_per_node: str = _f("auto", "launch", "Processes per node. auto: one per visible GPU (one on CPU). A resume "
                             "on another count keeps the effective batch (docs/running.md).", on_resume=FREE)
    max_restarts: int = _f(
        3, "launch", "Elastic restarts of the worker group (torchrun --max-restarts) before the job fails; "
        "each restart resumes from the newest checkpoint.", ge=0,
        on_resume=FREE,
    )
    rdzv_timeout: int = _f(
        600, "launch", "Seconds the nodes of a multi-node job wait for each other at start and after a restart.", ge=1,
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

    @field_validator("nproc_per_node")
    @classmethod
    def _auto_or_positive_int(cls, value: str) -> str:
        if value != "auto" and not (value.isdigit() and int(value) >= 1):
            raise ValueError("expected auto or a whole number >= 1")
        return value


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def field_of_env(name: str) -> str | None:
    """`TRAIN_LORA_R` -> `lora_r`; None for a name that is no field."""
    if not name.upper().startswith(ENV_PREFIX):
        return None
    field = name[len(ENV_PREFIX) :].lower()
    return field if field in TrainSettings.model_fields else None


def field_names() -> list[str]:
    return list(TrainSettings.model_fields)


def resume_rule(field: str) -> OnResume:
    """What a change of `field` means on resume; KeyError or ValueError for a field declared without one."""
    extra = TrainSettings.model_fields[field].json_schema_extra
    return OnResume((extra if isinstance(extra, dict) else {})["on_resume"])
