"""TRAIN_* -> resolved configuration -> TrainingArguments, for every variable.

Each scenario is one `python -m trainer config --json` run in pytest's process, under the environment a
subprocess would get (tests/trainer/conftest.py: run_trainer_in_process; it also builds the real
`transformers.TrainingArguments` from the result, so every kwarg is proven valid); the per-variable tests then
read from the cached output. Decision logic for GPUs this machine does not have is tested in-process on a
described `Hardware`, with no torch import.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainer import compat, config, transformers_names
from trainer.config import docs, run_record
from trainer.config.deepspeed import AIO_DEFAULTS
from trainer.config.schema import TrainSettings, env_name
from trainer.errors import ConfigError
from trainer.machine.hardware import Hardware

REPO = Path(__file__).resolve().parents[2]
SECRET = "hf_abcdefghijklmnopqrstuvwxyz123456"


# ---- scenarios: one `config --json` each, shared by the tests below ------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("config")
    (root / "data").mkdir()
    (root / "data" / "corpus.txt").write_text("hello world\n" * 50)
    (root / "pairs.jsonl").write_text(json.dumps({"prompt": "say hi", "chosen": "hi", "rejected": "HI"}) + "\n")
    (root / "prompts.jsonl").write_text(json.dumps({"prompt": "say hi", "answer": "hi"}) + "\n")
    chat = {"prompt": [{"role": "user", "content": "k1"}], "answer": "x"}
    (root / "chat_prompts.jsonl").write_text(json.dumps(chat) + "\n")
    (root / "tools.py").write_text('def lookup(key: str) -> str:\n    """Look up.\n\n    Args:\n'
                                   '        key: a key\n    """\n    return key\n')  # fmt: skip
    (root / "env.py").write_text("class Echo:\n    def reset(self, **columns):\n        pass\n")
    from vision_data import colour_data

    colour_data(root / "images", 2)
    (root / "checkpoint-5").mkdir()
    (root / "nvme").mkdir()
    (root / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 1}, "train_batch_size": "auto"}))
    (root / "home").mkdir()
    from trainer.tokenizer import byte_level_tokenizer

    byte_level_tokenizer().save_pretrained(root / "tokenizer")
    return root


def _base(root: Path, name: str) -> dict[str, str]:
    return {"HOME": str(root / "home"), "TRAIN_OUTPUT_DIR": str(root / f"out-{name}")}


def _scenario_env(root: Path, name: str) -> dict[str, str]:
    data = str(root / "data" / "corpus.txt")
    envs = {
        # every variable that can be shown together on a CPU
        "full": {
            "TRAIN_MODEL": "125m",
            "TRAIN_DATA": data,
            "TRAIN_TEXT_FIELD": "body",
            "TRAIN_DATA_MAX_BAD_LINES": "3",
            "TRAIN_CHAT_TEMPLATE": "chatml",
            "TRAIN_LOSS_ON": "last",
            "TRAIN_SEQ_LEN": "64",
            "TRAIN_PACKING": "records",
            "TRAIN_LONG_RECORDS": "drop",
            "TRAIN_PRECISION": "bf16",
            "TRAIN_TF32": "0",
            "TRAIN_OPTIM": "adafactor",
            "TRAIN_LR": "0.001",
            "TRAIN_BATCH_SIZE": "3",
            "TRAIN_GRAD_ACCUM": "4",
            "TRAIN_AUTO_BATCH": "1",
            "TRAIN_NUM_WORKERS": "0",
            "TRAIN_PIN_MEMORY": "1",
            "TRAIN_GRAD_CKPT": "1",
            "TRAIN_COMPILE": "1",
            "TRAIN_COMPILE_SCOPE": "model",
            "TRAIN_COMPILE_BACKEND": "inductor",
            "TRAIN_COMPILE_MODE": "reduce-overhead",
            "TRAIN_ATTN": "eager",
            "TRAIN_CROSS_ENTROPY": "chunked",
            "TRAIN_LORA": "1",
            "TRAIN_LORA_R": "4",
            "TRAIN_LORA_ALPHA": "8",
            "TRAIN_LORA_DROPOUT": "0.1",
            "TRAIN_LORA_TARGETS": "q_proj,v_proj",
            "TRAIN_QUANT": "4bit",
            "TRAIN_NEFTUNE_ALPHA": "5",
            "TRAIN_MAX_STEPS": "7",
            "TRAIN_EPOCHS": "2",
            "TRAIN_SAVE_STEPS": "3",
            "TRAIN_SAVE_TOTAL_LIMIT": "2",
            "TRAIN_LOG_STEPS": "1",
            "TRAIN_SEED": "7",
            "TRAIN_RESUME": str(root / "checkpoint-5"),
            "TRAIN_RESUME_CHANGED_DATA": "1",
            "TRAIN_START_OVER": "1",
            "TRAIN_ARGS": "--weight_decay 0.1 --lr_scheduler_type cosine --learning_rate 0.002",
            "TRAIN_DETERMINISTIC": "1",
            "TRAIN_PROFILE": "1",
            "TRAIN_MEMORY_CHECK": "off",
            "TRAIN_NPROC_PER_NODE": "1",
            "TRAIN_MAX_RESTARTS": "5",
            "TRAIN_RDZV_TIMEOUT": "60",
            "TRAIN_REPORT_TO": "tensorboard, MLflow",
            "HF_TOKEN": SECRET,
            "WANDB_API_KEY": "wandb-secret-value",
        },
        # nothing set: every auto decided for this CPU (and the default /data)
        "defaults": {},
        "zero3-nvme": {
            "TRAIN_DATA": data,
            "TRAIN_ZERO_STAGE": "3",
            "TRAIN_ZERO_OFFLOAD": "nvme",
            "TRAIN_NVME_PATH": str(root / "nvme"),
            "TRAIN_PRECISION": "bf16",
        },
        "deepspeed-json": {
            "TRAIN_DATA": data,
            "TRAIN_DEEPSPEED_CONFIG": str(root / "ds.json"),
            "TRAIN_ZERO_STAGE": "2",
            "TRAIN_ZERO_OFFLOAD": "cpu",
        },
        "fsdp": {"TRAIN_DATA": data, "TRAIN_FSDP": "shard_grad_op", "TRAIN_GRAD_CKPT": "1"},
        "eval": {
            "TRAIN_DATA": data,
            "TRAIN_EVAL_DATA": data,
            "TRAIN_EVAL_STEPS": "3",
            "TRAIN_EVAL_GENERATE": "4",
            "TRAIN_SAVE_STEPS": "6",
            "TRAIN_KEEP_BEST": "1",
            "TRAIN_TOKENIZER": str(root / "tokenizer"),
        },
        "eval-split": {"TRAIN_DATA": data, "TRAIN_EVAL_SPLIT": "0.05"},
        "dpo": {"TRAIN_DATA": str(root / "pairs.jsonl"), "TRAIN_METHOD": "dpo", "TRAIN_PREF_BETA": "0.2",
                "TRAIN_PREF_LOSS": "ipo", "TRAIN_PREF_REFERENCE": "precompute", "TRAIN_ARGS": "--use_weighting",
                "TRAIN_PREF_MAX_PROMPT_LEN": "16"},
        "grpo": {"TRAIN_DATA": str(root / "prompts.jsonl"), "TRAIN_METHOD": "grpo", "TRAIN_REWARD": "exact,length:0.5",
                 "TRAIN_RL_GENERATIONS": "2", "TRAIN_RL_MAX_NEW_TOKENS": "12", "TRAIN_RL_TEMPERATURE": "0.7",
                 "TRAIN_RL_REWARD_TIMEOUT": "30",
                 "TRAIN_RL_BETA": "0.04", "TRAIN_RL_LOSS": "dr_grpo", "TRAIN_LORA": "1", "TRAIN_BATCH_SIZE": "4",
                 "TRAIN_ARGS": "--top_p 0.9"},
        "tools": {"TRAIN_DATA": str(root / "chat_prompts.jsonl"), "TRAIN_METHOD": "grpo", "TRAIN_REWARD": "exact",
                  "TRAIN_CHAT_TEMPLATE": "chatml", "TRAIN_RL_TOOLS": f"{root / 'tools.py'}:lookup",
                  "TRAIN_RL_ENVIRONMENT": f"{root / 'env.py'}:Echo", "TRAIN_RL_MAX_TURNS": "3",
                  "TRAIN_RL_TOOL_TIMEOUT": "5"},
        "push": {"TRAIN_DATA": data, "TRAIN_PUSH_TO_HUB": "org/name@v1", "HF_TOKEN": SECRET, "HF_HUB_OFFLINE": "0"},
        "images": {"TRAIN_DATA": str(root / "images" / "train.jsonl"), "TRAIN_MODEL": "tiny-vl",
                   "TRAIN_TRAINABLE": "language,vision"},
        # a mixture of experts under DPO: TRL's trainer adds the load-balancing loss with its config's coefficient
        "moe": {"TRAIN_MODEL": "tiny-moe", "TRAIN_DATA": str(root / "pairs.jsonl"), "TRAIN_METHOD": "dpo",
                "TRAIN_MOE_IMPL": "eager", "TRAIN_MOE_AUX_LOSS": "0.02"},
    }
    return {**_base(root, name), **envs[name]}


# Where a setting's effect is not in `config --json`, a scenario shows it: "data" prepares the data as the run does
# (`python -m trainer data`: its log and the cache's meta.json), "model" builds the LoRA model in-process, "launch"
# decides the torchrun command in-process.
EFFECT_ENVS: dict[str, dict[str, str]] = {
    "data": {"TRAIN_TEXT_FIELD": "body", "TRAIN_DATA_MAX_BAD_LINES": "3", "TRAIN_SEQ_LEN": "64",
             "TRAIN_PACKING": "records", "TRAIN_LONG_RECORDS": "drop"},
    "model": {"TRAIN_LORA": "1", "TRAIN_LORA_R": "4", "TRAIN_LORA_ALPHA": "8", "TRAIN_LORA_DROPOUT": "0.1",
              "TRAIN_LORA_TARGETS": "q_proj,v_proj", "TRAIN_ROPE_SCALING": "yarn", "TRAIN_ROPE_FACTOR": "4"},
    "launch": {"TRAIN_NPROC_PER_NODE": "2", "TRAIN_MAX_RESTARTS": "5", "TRAIN_RDZV_TIMEOUT": "60", "NNODES": "2",
               "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"},
}  # fmt: skip


def _data_effects(root: Path, run_trainer) -> dict[str, Any]:
    """41 records under "body" only (one longer than 64 tokens) and 2 malformed lines, prepared as the run does."""
    data = root / "records.jsonl"
    lines = [json.dumps({"body": f"record {i}: a few words", "id": i}) for i in range(40)]
    lines[5:5] = ["{not json", "{nor this"]
    data.write_text("\n".join([*lines, json.dumps({"body": "x" * 300})]) + "\n")
    env = {**_base(root, "data"), **EFFECT_ENVS["data"], "TRAIN_DATA": str(data),
           "TRAIN_TOKENIZER": str(root / "tokenizer")}  # fmt: skip
    result = run_trainer(["data"], env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.splitlines()[-1])
    return {"meta": json.loads((Path(summary["folder"]) / "meta.json").read_text()), "log": result.stderr}


def _model_effects(root: Path) -> dict[str, Any]:
    """The tiny preset with the RoPE scaling and the LoRA settings applied, as the run builds it."""
    from transformers import AutoModelForCausalLM

    from trainer.config.rope import scale_rope
    from trainer.model.adapters import apply_lora
    from trainer.model.build import preset_config
    from trainer.tokenizer import byte_level_tokenizer

    settings = config.parse_settings({**_base(root, "model"), **EFFECT_ENVS["model"]})
    tokenizer = byte_level_tokenizer()
    preset = scale_rope(preset_config("tiny", len(tokenizer), 32, tokenizer), settings)
    model = apply_lora(AutoModelForCausalLM.from_config(preset), settings)
    adapted = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}
    q_proj = next(m for name, m in model.named_modules() if name.endswith("q_proj") and hasattr(m, "lora_A"))
    rotary = next(m for m in model.modules() if hasattr(m, "rope_type"))
    return {"adapted": adapted, "rank": q_proj.lora_A["default"].out_features, "scaling": q_proj.scaling["default"],
            "dropout": q_proj.lora_dropout["default"].p, "rope_type": rotary.rope_type,
            "attention_scaling": rotary.attention_scaling}  # fmt: skip


def _launch_effects(root: Path) -> dict[str, Any]:
    """The torchrun command the launcher decides for two nodes of two processes."""
    from trainer.launch.decide import decide

    plan = decide("train", [], {**_base(root, "launch"), **EFFECT_ENVS["launch"], "PATH": "/usr/bin:/bin"})
    words = plan.command
    return {option: words[words.index(f"--{option}") + 1] for option in ("max-restarts", "rdzv-conf")}


@pytest.fixture(scope="module")
def scenario(workdir: Path, config_json_in_process, run_trainer) -> Callable[[str], dict[str, Any]]:
    cache: dict[str, dict[str, Any]] = {}
    effects = {"data": lambda: _data_effects(workdir, run_trainer), "model": lambda: _model_effects(workdir),
               "launch": lambda: _launch_effects(workdir)}  # fmt: skip

    def get(name: str) -> dict[str, Any]:
        if name not in cache:
            cache[name] = (effects[name]() if name in effects
                           else config_json_in_process(_scenario_env(workdir, name)))  # fmt: skip
        return cache[name]

    return get


# (variable, scenario, check(resolved config json) -> bool)
MAPPING: list[tuple[str, str, Callable[[dict[str, Any]], bool]]] = [
    ("TRAIN_TOKENIZER", "data", lambda c: "tokenizer: loaded from " in c["log"] and "/tokenizer (259" in c["log"]),
    (
        "TRAIN_EVAL_DATA",
        "eval",
        lambda c: c["training_arguments"]["eval_strategy"] == "steps"
        and c["training_arguments"]["prediction_loss_only"] is True,
    ),
    ("TRAIN_EVAL_STEPS", "eval", lambda c: c["training_arguments"]["eval_steps"] == 3),
    ("TRAIN_EVAL_GENERATE", "eval", lambda c: c["settings"]["TRAIN_EVAL_GENERATE"]["value"] == 4),
    (
        "TRAIN_KEEP_BEST",
        "eval",
        lambda c: c["training_arguments"]["load_best_model_at_end"] is True
        and c["training_arguments"]["metric_for_best_model"] == "eval_loss"
        and c["training_arguments"]["greater_is_better"] is False,
    ),
    (
        "TRAIN_EVAL_SPLIT",
        "eval-split",
        lambda c: c["training_arguments"]["eval_strategy"] == "steps" and c["training_arguments"]["eval_steps"] == 200,
    ),
    ("TRAIN_MODEL", "full", lambda c: c["decisions"]["model"]["value"] == "125m"),
    ("TRAIN_DATA", "full", lambda c: c["decisions"]["data"]["value"].endswith("corpus.txt")),
    ("TRAIN_OUTPUT_DIR", "full", lambda c: c["training_arguments"]["output_dir"].endswith("out-full")),
    ("TRAIN_TEXT_FIELD", "data", lambda c: c["meta"]["records"] == 41 and c["meta"]["records_without_text"] == 0),
    ("TRAIN_DATA_MAX_BAD_LINES", "data", lambda c: len(c["meta"]["skipped_lines"]) == 2),  # the default, 0, exits 2
    ("TRAIN_METHOD", "dpo", lambda c: c["decisions"]["method"]["value"] == "dpo"
     and c["training_arguments"]["use_weighting"] is True),  # TRAIN_ARGS takes DPOConfig's own fields
    ("TRAIN_REWARD", "grpo", lambda c: c["training_arguments"]["reward_weights"] == [1.0, 0.5]
     and c["training_arguments"]["top_p"] == 0.9),  # TRAIN_ARGS takes GRPOConfig's own fields
    ("TRAIN_RL_GENERATIONS", "grpo", lambda c: c["training_arguments"]["num_generations"] == 2),
    ("TRAIN_RL_MAX_NEW_TOKENS", "grpo", lambda c: c["training_arguments"]["max_completion_length"] == 12),
    ("TRAIN_RL_TEMPERATURE", "grpo", lambda c: c["training_arguments"]["temperature"] == 0.7),
    ("TRAIN_RL_REWARD_TIMEOUT", "grpo", lambda c: c["settings"]["TRAIN_RL_REWARD_TIMEOUT"]["value"] == 30),
    ("TRAIN_RL_BETA", "grpo", lambda c: c["training_arguments"]["beta"] == 0.04
     and c["decisions"]["reference"]["value"] == "frozen adapter"),
    ("TRAIN_RL_LOSS", "grpo", lambda c: c["training_arguments"]["loss_type"] == "dr_grpo"
     and c["decisions"]["method"]["value"] == "grpo"),
    ("TRAIN_RL_ENGINE", "defaults", lambda c: c["settings"]["TRAIN_RL_ENGINE"]["value"] == "transformers"),  # vllm: 2
    # with TRAIN_RL_ENGINE=vllm it becomes GRPOConfig's vllm_server_base_url (test_vllm_server, on the settings alone)
    ("TRAIN_RL_VLLM_URL", "grpo", lambda c: c["settings"]["TRAIN_RL_VLLM_URL"]["value"] == ""
     and "vllm_server_base_url" not in c["training_arguments"]),
    # with TRAIN_RL_ENGINE=vllm: GRPOConfig's vllm_gpu_memory_utilization (colocate) and vllm_server_timeout (server),
    # proven where vLLM is installed (test_vllm_engine.py, the CPU RL venv)
    ("TRAIN_RL_VLLM_MEMORY", "grpo", lambda c: c["settings"]["TRAIN_RL_VLLM_MEMORY"]["value"] == 0.3
     and c["training_arguments"]["use_vllm"] is False and "vllm_gpu_memory_utilization" not in c["training_arguments"]),
    ("TRAIN_RL_TOOLS", "tools", lambda c: c["settings"]["TRAIN_RL_TOOLS"]["value"].endswith("tools.py:lookup")
     and c["training_arguments"]["max_tool_calling_iterations"] == 2),
    ("TRAIN_RL_ENVIRONMENT", "tools", lambda c: c["settings"]["TRAIN_RL_ENVIRONMENT"]["value"].endswith("env.py:Echo")),
    # the most assistant turns: TRL's tool-calling rounds are one fewer
    ("TRAIN_RL_MAX_TURNS", "tools", lambda c: c["training_arguments"]["max_tool_calling_iterations"] == 2),
    ("TRAIN_RL_TOOL_TIMEOUT", "tools", lambda c: c["settings"]["TRAIN_RL_TOOL_TIMEOUT"]["value"] == 5),
    ("TRAIN_RL_VLLM_TIMEOUT", "grpo", lambda c: c["settings"]["TRAIN_RL_VLLM_TIMEOUT"]["value"] == 300
     and "vllm_server_timeout" not in c["training_arguments"]),
    ("TRAIN_PREF_BETA", "dpo", lambda c: c["training_arguments"]["beta"] == 0.2),
    ("TRAIN_PREF_LOSS", "dpo", lambda c: c["training_arguments"]["loss_type"] == ["ipo"]),
    ("TRAIN_PREF_MAX_PROMPT_LEN", "dpo",
     lambda c: "TRAIN_PREF_MAX_PROMPT_LEN=16 tokens cut from the left" in c["decisions"]["method"]["reason"]),
    ("TRAIN_PREF_REFERENCE", "dpo", lambda c: c["training_arguments"]["precompute_ref_log_probs"] is True
     and c["decisions"]["reference"]["value"] == "precomputed"),
    ("TRAIN_CHAT_TEMPLATE", "full", lambda c: c["decisions"]["chat_template"]["value"].startswith("built-in chatml")),
    ("TRAIN_LOSS_ON", "full", lambda c: "TRAIN_LOSS_ON=last" in c["decisions"]["data_format"]["reason"]),
    ("TRAIN_SEQ_LEN", "data", lambda c: c["meta"]["seq_len"] == 64),
    (
        "TRAIN_PACKING",
        "data",
        lambda c: c["meta"]["packing"]["records_packed"] == 40 and c["meta"]["packing"]["stream_blocks"] == 0,
    ),
    ("TRAIN_LONG_RECORDS", "data", lambda c: c["meta"]["packing"]["records_dropped_too_long"] == 1),
    ("TRAIN_PRECISION", "full", lambda c: c["training_arguments"]["bf16"] and not c["training_arguments"]["fp16"]),
    ("TRAIN_TF32", "full", lambda c: c["decisions"]["tf32"] == {"value": False, "reason": "set by TRAIN_TF32"}),
    ("TRAIN_OPTIM", "full", lambda c: c["training_arguments"]["optim"] == "adafactor"),
    ("TRAIN_LR", "defaults", lambda c: c["training_arguments"]["learning_rate"] == 3e-4),
    ("TRAIN_BATCH_SIZE", "full", lambda c: c["training_arguments"]["per_device_train_batch_size"] == 3),
    ("TRAIN_GRAD_ACCUM", "full", lambda c: c["training_arguments"]["gradient_accumulation_steps"] == 4),
    (
        "TRAIN_AUTO_BATCH",
        "full",  # trainkit searches before training; Transformers' shrink-only retry loop stays off
        lambda c: "searched on the GPU" in c["decisions"]["batch_size"]["reason"]
        and c["training_arguments"]["auto_find_batch_size"] is False,
    ),
    ("TRAIN_NUM_WORKERS", "full", lambda c: c["training_arguments"]["dataloader_num_workers"] == 0),
    ("TRAIN_PIN_MEMORY", "full", lambda c: c["training_arguments"]["dataloader_pin_memory"] is True),
    (
        "TRAIN_GRAD_CKPT",
        "full",
        lambda c: (
            c["training_arguments"]["activation_checkpointing"] is True
            and c["training_arguments"]["activation_checkpointing_kwargs"] == {"use_reentrant": False}
        ),
    ),
    ("TRAIN_ZERO_STAGE", "zero3-nvme", lambda c: c["deepspeed"]["zero_optimization"]["stage"] == 3),
    (
        "TRAIN_ZERO_OFFLOAD",
        "zero3-nvme",
        lambda c: (
            c["deepspeed"]["zero_optimization"]["offload_optimizer"]["device"] == "nvme"
            and c["deepspeed"]["zero_optimization"]["offload_param"]["device"] == "nvme"
            and c["deepspeed"]["aio"] == AIO_DEFAULTS
            and c["decisions"]["optim"]["value"] == "deepspeed"
        ),
    ),
    (
        "TRAIN_NVME_PATH",
        "zero3-nvme",
        lambda c: c["deepspeed"]["zero_optimization"]["offload_optimizer"]["nvme_path"].endswith("nvme"),
    ),
    (
        "TRAIN_DEEPSPEED_CONFIG",
        "deepspeed-json",
        lambda c: (
            c["deepspeed"] == {"zero_optimization": {"stage": 1}, "train_batch_size": "auto"}
            and c["training_arguments"]["deepspeed"] == c["deepspeed"]
        ),
    ),
    (
        "TRAIN_FSDP",
        "fsdp",
        lambda c: (
            c["training_arguments"]["fsdp"] is True
            and c["training_arguments"]["fsdp_config"]["reshard_after_forward"] is False
            and c["training_arguments"]["fsdp_config"]["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]
            and c["training_arguments"]["fsdp_config"]["activation_checkpointing"] is True
            and "activation_checkpointing" not in c["training_arguments"]
        ),
    ),
    # the trainer compiles each decoder layer itself (trainer.run.training_model); Transformers compiles only under
    # DeepSpeed/FSDP (test_speed_decisions.py)
    ("TRAIN_COMPILE", "full", lambda c: c["decisions"]["compile"]["value"] is True
     and c["training_arguments"]["dataloader_drop_last"] is True),
    ("TRAIN_COMPILE_SCOPE", "full", lambda c: "TRAIN_COMPILE_SCOPE=model: the whole model" in
     c["decisions"]["compile"]["reason"]),
    ("TRAIN_COMPILE_BACKEND", "full", lambda c: "backend inductor" in c["decisions"]["compile"]["reason"]),
    ("TRAIN_COMPILE_MODE", "full", lambda c: "mode reduce-overhead" in c["decisions"]["compile"]["reason"]),
    ("TRAIN_ATTN", "full", lambda c: c["decisions"]["attn"]["value"] == "eager"),
    (
        "TRAIN_LIGER",
        "defaults",
        lambda c: c["training_arguments"]["use_liger_kernel"] is False
        and c["decisions"]["liger"] == {"value": False, "reason": "auto: off (no GPU)"},
    ),
    ("TRAIN_CROSS_ENTROPY", "full", lambda c: c["decisions"]["cross_entropy"]["value"] == "chunked"
     and c["decisions"]["cross_entropy"]["reason"].startswith("set by TRAIN_CROSS_ENTROPY")),
    ("TRAIN_LORA", "full", lambda c: c["decisions"]["lora"]["value"] is True),
    ("TRAIN_LORA_R", "model", lambda c: c["rank"] == 4),
    ("TRAIN_LORA_ALPHA", "model", lambda c: c["scaling"] == 8 / 4),
    ("TRAIN_LORA_DROPOUT", "model", lambda c: c["dropout"] == 0.1),
    ("TRAIN_LORA_TARGETS", "model", lambda c: c["adapted"] == {"q_proj", "v_proj"}),
    ("TRAIN_ROPE_SCALING", "model", lambda c: c["rope_type"] == "yarn"),
    ("TRAIN_ROPE_FACTOR", "model", lambda c: c["attention_scaling"] == pytest.approx(0.1 * math.log(4) + 1)),  # yarn's
    ("TRAIN_QUANT", "full", lambda c: c["decisions"]["quant"]["value"] == "4bit"),
    ("TRAIN_MOE_IMPL", "moe", lambda c: c["decisions"]["moe_impl"]["value"] == "eager"
     and c["decisions"]["moe_impl"]["reason"].startswith("set by TRAIN_MOE_IMPL")),
    ("TRAIN_MOE_AUX_LOSS", "moe", lambda c: c["decisions"]["moe_aux_loss"]["value"] == 0.02
     and c["training_arguments"]["router_aux_loss_coef"] == 0.02),
    ("TRAIN_NEFTUNE_ALPHA", "full", lambda c: c["training_arguments"]["neftune_noise_alpha"] == 5.0),
    ("TRAIN_TRAINABLE", "images", lambda c: c["decisions"]["trainable"]["value"] == ["vision", "language"]
     and "projector frozen (checked)" in c["decisions"]["trainable"]["reason"]),
    ("TRAIN_MAX_STEPS", "full", lambda c: c["training_arguments"]["max_steps"] == 7),
    ("TRAIN_EPOCHS", "full", lambda c: c["training_arguments"]["num_train_epochs"] == 2.0),
    (
        "TRAIN_SAVE_STEPS",
        "full",
        lambda c: c["training_arguments"]["save_steps"] == 3 and c["training_arguments"]["save_strategy"] == "steps",
    ),
    ("TRAIN_SAVE_TOTAL_LIMIT", "full", lambda c: c["training_arguments"]["save_total_limit"] == 2),
    ("TRAIN_ON_NAN", "defaults", lambda c: c["settings"]["TRAIN_ON_NAN"]["value"] == "stop"),
    ("TRAIN_LOG_STEPS", "full", lambda c: c["training_arguments"]["logging_steps"] == 1),
    ("TRAIN_SEED", "full", lambda c: c["training_arguments"]["seed"] == 7),
    ("TRAIN_RESUME", "full", lambda c: c["decisions"]["resume"]["value"].endswith("checkpoint-5")),
    (
        "TRAIN_ARGS",
        "full",
        lambda c: (
            c["training_arguments"]["weight_decay"] == 0.1
            and c["training_arguments"]["lr_scheduler_type"] == "cosine"
            and c["training_arguments"]["learning_rate"] == 0.002  # the user's flag wins over TRAIN_LR
            and "learning_rate" in c["decisions"]["args"]["reason"]
        ),
    ),
    ("TRAIN_DETERMINISTIC", "full", lambda c: c["training_arguments"]["full_determinism"] is True),
    ("TRAIN_PROFILE", "full", lambda c: c["decisions"]["profile"]["value"] is True),
    ("TRAIN_MEMORY_CHECK", "full", lambda c: "TRAIN_MEMORY_CHECK=off" in c["decisions"]["memory"]["reason"]),
    ("TRAIN_MEMORY_SNAPSHOT", "defaults", lambda c: c["decisions"]["memory_snapshot"]["value"] is False),
    ("TRAIN_NPROC_PER_NODE", "full", lambda c: c["decisions"]["nproc_per_node"]["value"] == 1),
    ("TRAIN_MAX_RESTARTS", "launch", lambda c: c["max-restarts"] == "5"),
    ("TRAIN_RDZV_TIMEOUT", "launch", lambda c: c["rdzv-conf"].startswith("join_timeout=60,")),
    # read by the run's resume (trainer.config.resume; tests/trainer/test_resume_safety.py)
    ("TRAIN_RESUME_CHANGED_DATA", "full", lambda c: c["settings"]["TRAIN_RESUME_CHANGED_DATA"]["value"] is True),
    ("TRAIN_START_OVER", "full", lambda c: c["settings"]["TRAIN_START_OVER"]["value"] is True),
    (
        "TRAIN_REPORT_TO",
        "full",
        lambda c: (
            c["training_arguments"]["report_to"] == ["tensorboard", "mlflow"]
            and c["training_arguments"]["run_name"] == "out-full"
            and c["settings"]["TRAIN_REPORT_TO"]["value"] == "tensorboard,mlflow"
        ),
    ),
    ("TRAIN_PUSH_TO_HUB", "push", lambda c: c["settings"]["TRAIN_PUSH_TO_HUB"]["value"] == "org/name@v1"),
]


def test_every_variable_has_a_mapping_test() -> None:
    assert {m[0] for m in MAPPING} == {env_name(f) for f in TrainSettings.model_fields}


@pytest.mark.parametrize(("variable", "name", "check"), MAPPING, ids=[m[0] for m in MAPPING])
def test_variable_maps_to_training_arguments(scenario, variable: str, name: str, check) -> None:
    resolved = scenario(name)
    assert check(resolved), json.dumps(resolved, indent=1, default=sorted)[:6000]
    if name not in EFFECT_ENVS and variable in _scenario_env(Path("/x"), name):
        assert resolved["settings"][variable]["source"] == "env"


def test_cpu_auto_decisions(scenario) -> None:
    c = scenario("defaults")
    d, ta = c["decisions"], c["training_arguments"]
    assert d["precision"]["value"] == "fp32" and "no CUDA GPU" in d["precision"]["reason"]
    assert d["tf32"]["value"] is False
    # Transformers' own default where torch has the fused CPU kernel (no per-tensor step-counter reads)
    expected_optim = "adamw_torch_fused" if compat.stack().fused_adamw_on_cpu else "adamw_torch"
    assert d["optim"]["value"] == expected_optim == ta["optim"]
    assert d["attn"]["value"] == "sdpa"
    assert d["pin_memory"]["value"] is False and ta["dataloader_pin_memory"] is False
    assert d["nproc_per_node"]["value"] == 1
    assert d["packing"] == {"value": "stream", "reason": "auto: plain text, one stream cut into sequences (records "
                            "may span two)"}  # fmt: skip
    assert ta["use_cpu"] is True and ta["bf16"] is False and ta["fp16"] is False
    assert ta["report_to"] == ["tensorboard"] and ta["remove_unused_columns"] is False
    assert ta["neftune_noise_alpha"] is None and ta["torch_compile"] is False
    assert "torch_compile_mode" not in ta  # would switch compile on in Transformers
    assert ta["ddp_find_unused_parameters"] is False  # no extra graph pass per step under DDP (issue 10 item 12)
    assert c["environment"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert all(v["source"] == "default" for k, v in c["settings"].items() if k != "TRAIN_OUTPUT_DIR")
    assert all(isinstance(v.get("reason"), str) and v["reason"] for v in d.values())


@pytest.mark.skipif(Path("/data").exists(), reason="this machine has a /data folder")
def test_default_data_missing_means_embedded_corpus(scenario) -> None:
    decision = scenario("defaults")["decisions"]["data"]
    assert decision["value"] == "embedded" and "/data does not exist" in decision["reason"]


def test_secrets_are_masked_in_config_output(scenario) -> None:
    c = scenario("full")
    text = json.dumps(c)
    assert SECRET not in text and "wandb-secret-value" not in text
    assert c["environment"]["HF_TOKEN"] == "***" and c["environment"]["WANDB_API_KEY"] == "***"
    # a token in TRAIN_ARGS never gets this far: it is refused (tests/trainer/test_secrets_outputs.py)


def test_table_output_lists_settings_decisions_and_arguments(run_trainer_in_process, workdir: Path) -> None:
    env = {**_scenario_env(workdir, "fsdp"), "COLUMNS": "200"}
    result = run_trainer_in_process(["config"], env=env)
    assert result.returncode == 0, result.stderr
    for text in ("Settings (TRAIN_*)", "TRAIN_FSDP", "shard_grad_op", "Decisions", "FSDP2", "TrainingArguments"):
        assert text in result.stdout
    assert "fsdp_config" in result.stdout and "reshard_after_forward" in result.stdout


def test_optimizer_names_and_fields_match_installed_transformers() -> None:
    """The names read from Transformers' source without importing it are those of the Transformers imported here."""
    import dataclasses

    from transformers.training_args import OptimizerNames, TrainingArguments

    names, fields = [o.value for o in OptimizerNames], [f.name for f in dataclasses.fields(TrainingArguments)]
    assert list(transformers_names.OPTIMIZER_NAMES) == names
    assert transformers_names.training_argument_fields() == {f for f in fields if not f.startswith("_")}


# ---- decisions on described GPUs (in-process, no torch) ----------------------------------------------------------

A100 = Hardware(
    device="cuda",
    gpu_count=1,
    gpu_name="NVIDIA A100-SXM4-80GB",
    capability=(8, 0),
    total_memory_bytes=80 * 2**30,
    bf16=True,
    tf32=True,
    libraries={"flash_attn": True, "triton": True, "tensorboard": True},
)
T4 = Hardware(device="cuda", gpu_count=1, gpu_name="Tesla T4", capability=(7, 5), libraries={"triton": True})
CPU = Hardware(device="cpu", cpu_count=2, cxx_compiler="/usr/bin/g++")


def _resolve(hw: Hardware, **env: str) -> config.RunConfig:
    settings = config.parse_settings({f"TRAIN_{k.upper()}": v for k, v in env.items()})
    return config.resolve(settings, hw, environ={}, import_heavy=False)


def test_auto_on_an_ampere_gpu() -> None:
    cfg = _resolve(A100)
    assert cfg.decisions.precision.value == "bf16" and cfg.training_arguments["bf16"] is True
    assert cfg.decisions.tf32.value is True and cfg.training_arguments["tf32"] is True
    assert cfg.decisions.optim.value == "adamw_torch_fused"
    assert cfg.decisions.attn.value == "flash_attention_2"
    assert cfg.decisions.pin_memory.value is True
    assert cfg.training_arguments["use_cpu"] is False


def test_auto_on_a_pre_ampere_gpu() -> None:
    cfg = _resolve(T4)
    assert cfg.decisions.precision.value == "fp16" and cfg.training_arguments["fp16"] is True
    assert cfg.decisions.tf32.value is False
    assert cfg.decisions.attn.value == "sdpa"


@pytest.mark.parametrize(
    ("hw", "env", "expected"),
    [
        (T4, {"precision": "bf16"}, "no bf16 support"),
        (T4, {"tf32": "1"}, "TRAIN_TF32=1 needs an Ampere"),
        (T4, {"attn": "flash_attention_2"}, "flash_attn package"),
        (A100, {"attn": "flash_attention_2", "precision": "fp32"}, "fp16/bf16 only"),
        (A100, {"nproc_per_node": "4"}, "only 1 GPU(s) are visible"),
        (CPU, {"optim": "adamw_apex_fused"}, "needs a CUDA GPU"),
        (CPU, {"precision": "fp16"}, "needs a CUDA GPU"),
    ],
)
def test_hardware_refusals(hw: Hardware, env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        _resolve(hw, **env)
    assert expected in info.value.message


def test_gpu_only_switches_are_accepted_on_a_gpu() -> None:
    cfg = _resolve(A100, memory_snapshot="1", tf32="1", precision="bf16", zero_stage="2", zero_offload="cpu")
    assert cfg.decisions.memory_snapshot.value is True
    assert cfg.deepspeed["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert cfg.deepspeed["bf16"] == {"enabled": "auto"} and "offload_param" not in cfg.deepspeed["zero_optimization"]
    assert cfg.decisions.optim.value == "deepspeed"


def test_cpu_allows_bf16_and_quantization() -> None:
    cfg = _resolve(CPU, precision="bf16", lora="1", quant="8bit")
    assert cfg.decisions.precision.value == "bf16" and cfg.decisions.quant.value == "8bit"


def test_run_config_file_masks_secrets(tmp_path: Path) -> None:
    cfg = _resolve(CPU, args=f"--hub_token={SECRET} --weight_decay 0.1 --hub-token plain", output_dir=str(tmp_path))
    environ = {
        "HF_TOKEN": SECRET,
        "AWS_SECRET_ACCESS_KEY": "aws",
        "TRAIN_LR": "0.1",
        "HF_HOME": "/cache/hf",
        "TOKENIZERS_PARALLELISM": "false",
    }
    record = run_record.started(cfg, environ)
    assert record.environment["HF_TOKEN"] == SECRET  # the secret was there to be leaked
    written = run_record.write(tmp_path, record)
    assert written == tmp_path / "run_config.json"
    text = written.read_text()
    assert SECRET not in text
    data = json.loads(text)
    assert data["settings"]["TRAIN_ARGS"]["value"] == "--hub_token=*** --weight_decay 0.1 --hub-token ***"
    assert set(data) >= {"settings", "decisions", "hardware", "training_arguments", "deepspeed", "environment"}
    masked = data["environment"]
    assert masked["HF_TOKEN"] == "***" and masked["HF_HOME"] == "/cache/hf" and "AWS_SECRET_ACCESS_KEY" not in masked
    assert masked["TOKENIZERS_PARALLELISM"] == "false"  # a TOKEN-named switch that is no secret
    assert SECRET not in json.dumps(run_record.read(tmp_path).to_dict())


def test_alloc_conf_default_and_user_value() -> None:
    env: dict[str, str] = {}
    config.apply_process_defaults(env)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
    config.apply_process_defaults(env)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
    settings = config.parse_settings({})
    cfg = config.resolve(settings, CPU, environ=env, import_heavy=False)
    assert cfg.env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
    assert "set by the user" in cfg.decisions.cuda_alloc_conf.reason


def test_load_settings_ignores_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAIN_LR", "0.5")
    assert config.parse_settings({}).lr == 3e-4
    assert config.parse_settings({"TRAIN_LR": ""}).lr == 3e-4  # empty counts as unset
    assert config.parse_settings(None).lr == 0.5


# ---- generated docs --------------------------------------------------------------------------------------------


def test_docs_cover_every_variable() -> None:
    table = docs.markdown_table()
    example = docs.env_example()
    for field in TrainSettings.model_fields:
        assert f"`{env_name(field)}`" in table
        assert f"# {env_name(field)}=" in example


def test_env_example_file_is_generated() -> None:
    assert (REPO / ".env.example").read_text() == docs.env_example()


def test_nvme_swap_buffers_hold_the_largest_tensor(tmp_path: Path) -> None:
    """DeepSpeed asserts "More elements than buffer size" when a tensor outgrows offload_param.buffer_size (1e8 by
    default); Llama-3-8B's embeddings have 128256 x 4096 = 525M elements."""
    model = tmp_path / "llama3-8b"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336})
    )
    cfg = _resolve(A100, model=str(model), zero_stage="3", zero_offload="nvme", nvme_path=str(tmp_path))
    buffer = cfg.deepspeed["zero_optimization"]["offload_param"]["buffer_size"]
    assert 128256 * 4096 <= buffer < 1.05 * 128256 * 4096
    small = _resolve(A100, zero_stage="3", zero_offload="nvme", nvme_path=str(tmp_path))  # the tiny preset
    assert small.deepspeed["zero_optimization"]["offload_param"]["buffer_size"] == 100_000_000

