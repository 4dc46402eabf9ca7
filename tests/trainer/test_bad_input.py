"""Every user mistake ends in `error: <what and how to fix>`, exit code 2, no traceback; the ones that need no
hardware knowledge end before torch is imported, in well under 2 s of CPU time (real `python -m trainer config`
subprocesses; CPU time, not wall time, so that a loaded machine does not decide the outcome)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import assert_user_error

FAST_EXIT_CPU_S = 2.0
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _ds_missing(tmp: Path) -> dict[str, str]:
    return {"TRAIN_DEEPSPEED_CONFIG": str(tmp / "nope.json")}


def _ds_not_json(tmp: Path) -> dict[str, str]:
    path = tmp / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 2},}')
    return {"TRAIN_DEEPSPEED_CONFIG": str(path)}


def _empty_folder(tmp: Path) -> dict[str, str]:
    (tmp / "empty").mkdir()
    return {"TRAIN_DATA": str(tmp / "empty")}


def _empty_file(tmp: Path) -> dict[str, str]:
    (tmp / "d").mkdir()
    (tmp / "d" / "a.txt").write_text("")
    return {"TRAIN_DATA": str(tmp / "d")}


def _dangling_symlink(tmp: Path) -> dict[str, str]:
    (tmp / "d").mkdir()
    (tmp / "d" / "good.txt").write_text("some text\n")
    (tmp / "d" / "gone.txt").symlink_to(tmp / "does-not-exist.txt")
    return {"TRAIN_DATA": str(tmp / "d")}


def _jsonl_without_field(tmp: Path) -> dict[str, str]:
    path = tmp / "rows.jsonl"
    path.write_text('{"body": "hello"}\n{"body": "world"}\n')
    return {"TRAIN_DATA": str(path)}


def _unsupported_file(tmp: Path) -> dict[str, str]:
    path = tmp / "paper.pdf"
    path.write_bytes(b"%PDF-1.4")
    return {"TRAIN_DATA": str(path)}


def _output_under_file(tmp: Path) -> dict[str, str]:
    (tmp / "afile").write_text("x")
    return {"TRAIN_OUTPUT_DIR": str(tmp / "afile" / "out")}


def _model_without_config(tmp: Path) -> dict[str, str]:
    (tmp / "model").mkdir()
    (tmp / "model" / "model.safetensors").write_bytes(b"")
    return {"TRAIN_MODEL": str(tmp / "model")}


def _nvme_missing(tmp: Path) -> dict[str, str]:
    return {"TRAIN_ZERO_STAGE": "3", "TRAIN_ZERO_OFFLOAD": "nvme", "TRAIN_NVME_PATH": str(tmp / "no-nvme")}


def _fixed(env: dict[str, str]) -> Callable[[Path], dict[str, str]]:
    return lambda _tmp: env


# (id, env factory, substrings the message must contain)
PRE_TORCH_CASES = [
    ("bad-literal", _fixed({"TRAIN_PRECISION": "fp4"}), ["TRAIN_PRECISION='fp4'", "auto, fp32, fp16, bf16, fp8"]),
    ("bad-int", _fixed({"TRAIN_BATCH_SIZE": "0"}), ["TRAIN_BATCH_SIZE='0'", "integer >= 1"]),
    ("not-an-int", _fixed({"TRAIN_GRAD_ACCUM": "four"}), ["TRAIN_GRAD_ACCUM='four'", "valid integer"]),
    ("bad-bool", _fixed({"TRAIN_LORA": "maybe"}), ["TRAIN_LORA='maybe'", "0 or 1"]),
    ("bad-float", _fixed({"TRAIN_LR": "-1"}), ["TRAIN_LR='-1'", "number > 0"]),
    ("bad-zero-stage", _fixed({"TRAIN_ZERO_STAGE": "4"}), ["TRAIN_ZERO_STAGE='4'", "integer 0-3"]),
    ("bad-nproc", _fixed({"TRAIN_NPROC_PER_NODE": "0"}), ["TRAIN_NPROC_PER_NODE='0'", "auto or a whole number"]),
    ("unknown-name", _fixed({"TRAIN_PRECISON": "bf16"}), ["TRAIN_PRECISON", "did you mean TRAIN_PRECISION?"]),
    ("unknown-name-2", _fixed({"TRAIN_BATCHSIZE": "4"}), ["did you mean TRAIN_BATCH_SIZE?"]),
    (
        "offload-stage0",
        _fixed({"TRAIN_ZERO_OFFLOAD": "cpu"}),
        ["TRAIN_ZERO_OFFLOAD=cpu needs DeepSpeed ZeRO", "TRAIN_ZERO_STAGE"],
    ),
    (
        "nvme-stage2",
        _fixed({"TRAIN_ZERO_STAGE": "2", "TRAIN_ZERO_OFFLOAD": "nvme"}),
        ["TRAIN_ZERO_OFFLOAD=nvme needs TRAIN_ZERO_STAGE=3"],
    ),
    ("nvme-path-missing", _nvme_missing, ["TRAIN_NVME_PATH=", "no such folder"]),
    ("zero-and-fsdp", _fixed({"TRAIN_ZERO_STAGE": "2", "TRAIN_FSDP": "full_shard"}), ["pick one", "TRAIN_FSDP"]),
    ("quant-without-lora", _fixed({"TRAIN_QUANT": "4bit"}), ["TRAIN_QUANT=4bit needs TRAIN_LORA=1"]),
    ("compile-zero3", _fixed({"TRAIN_COMPILE": "1", "TRAIN_ZERO_STAGE": "3"}), ["ZeRO-3", "torch.compile"]),
    (
        "compile-inference-backend",
        _fixed({"TRAIN_COMPILE": "1", "TRAIN_COMPILE_BACKEND": "tvm"}),
        ["TRAIN_COMPILE_BACKEND=tvm compiles the forward pass only", "cannot train the model"],
    ),
    ("compile-backend-missing", _fixed({"TRAIN_COMPILE_BACKEND": "onnxrt"}), ["onnxruntime", "not installed"]),
    ("auto-batch-zero", _fixed({"TRAIN_AUTO_BATCH": "1", "TRAIN_ZERO_STAGE": "2"}), ["TRAIN_AUTO_BATCH=1"]),
    ("auto-batch-fsdp", _fixed({"TRAIN_AUTO_BATCH": "1", "TRAIN_FSDP": "full_shard"}), ["TRAIN_AUTO_BATCH=1", "FSDP"]),
    ("deepspeed-config-missing", _ds_missing, ["TRAIN_DEEPSPEED_CONFIG=", "no such file"]),
    ("deepspeed-config-not-json", _ds_not_json, ["TRAIN_DEEPSPEED_CONFIG=", "not valid JSON", "line 1"]),
    ("unknown-optimizer", _fixed({"TRAIN_OPTIM": "adamw_torhc"}), ["TRAIN_OPTIM='adamw_torhc'", "adamw_torch?"]),
    ("optimizer-library-missing", _fixed({"TRAIN_OPTIM": "galore_adamw"}), ["galore_torch", "not installed"]),
    ("apex-missing", _fixed({"TRAIN_OPTIM": "adamw_apex_fused"}), ["apex.optimizers", "not installed"]),
    ("train-args-unparsable", _fixed({"TRAIN_ARGS": '--weight_decay "0.1'}), ["TRAIN_ARGS=", "cannot be parsed"]),
    (
        "train-args-unknown-flag",
        _fixed({"TRAIN_ARGS": "--warmup_ratio 0.1"}),
        ["--warmup_ratio is not a TrainingArguments flag", "did you mean warmup_steps?"],
    ),
    ("train-args-reserved", _fixed({"TRAIN_ARGS": "--output_dir /x"}), ["use TRAIN_OUTPUT_DIR instead"]),
    ("train-args-positional", _fixed({"TRAIN_ARGS": "0.1 --weight_decay"}), ["must start with a --flag"]),
    (
        "train-args-contradict-precision",
        _fixed({"TRAIN_PRECISION": "bf16", "TRAIN_ARGS": "--bf16 false --fp16 true"}),
        ["2 problems", "--bf16 would contradict TRAIN_PRECISION", "--fp16 would contradict TRAIN_PRECISION"],
    ),
    (
        "train-args-contradict-decisions",
        _fixed({"TRAIN_ARGS": "--optim adafactor --no_gradient_checkpointing"}),
        ["--optim would contradict TRAIN_OPTIM", "--no_gradient_checkpointing would contradict TRAIN_GRAD_CKPT"],
    ),
    (
        "qlora-with-zero3",
        _fixed({"TRAIN_QUANT": "4bit", "TRAIN_LORA": "1", "TRAIN_ZERO_STAGE": "3"}),
        ["TRAIN_QUANT=4bit with TRAIN_ZERO_STAGE=3", "TRAIN_ZERO_STAGE=2"],
    ),
    (
        "qlora-8bit-with-fsdp",
        _fixed({"TRAIN_QUANT": "8bit", "TRAIN_LORA": "1", "TRAIN_FSDP": "full_shard"}),
        ["TRAIN_QUANT=8bit with TRAIN_FSDP=full_shard", "TRAIN_QUANT=4bit"],
    ),
    (
        "qlora-with-fsdp1",
        _fixed({"TRAIN_QUANT": "4bit", "TRAIN_LORA": "1", "TRAIN_FSDP": "hybrid_shard"}),
        ["TRAIN_FSDP=hybrid_shard (FSDP1)", "FSDP2"],
    ),
    (
        "fsdp-with-bnb-optimizer",
        _fixed({"TRAIN_FSDP": "full_shard", "TRAIN_OPTIM": "adamw_bnb_8bit"}),
        ["TRAIN_OPTIM=adamw_bnb_8bit", "TRAIN_FSDP=full_shard", "DTensor"],
    ),
    ("data-missing", _fixed({"TRAIN_DATA": "/nonexistent/corpus"}), ["TRAIN_DATA=/nonexistent/corpus", "no such"]),
    ("data-empty-folder", _empty_folder, ["TRAIN_DATA=", "no data found"]),
    ("data-empty-file", _empty_file, ["TRAIN_DATA=", "files are empty"]),
    ("data-glob-no-match", _fixed({"TRAIN_DATA": "/nonexistent/*.jsonl"}), ["TRAIN_DATA=/nonexistent/*.jsonl"]),
    ("data-dangling-symlink", _dangling_symlink, ["cannot read", "gone.txt", "dangling symlink"]),
    ("data-jsonl-field", _jsonl_without_field, ["no field 'text'", "TRAIN_TEXT_FIELD", "body"]),
    ("data-unsupported-type", _unsupported_file, ["unsupported file type"]),
    ("output-under-a-file", _output_under_file, ["TRAIN_OUTPUT_DIR=", "is a file, not a folder"]),
    ("output-read-only-fs", _fixed({"TRAIN_OUTPUT_DIR": "/proc/trainkit-output"}), ["not writable"]),
    ("model-unknown", _fixed({"TRAIN_MODEL": "llama-7b"}), ["TRAIN_MODEL='llama-7b'", "neither a preset"]),
    ("model-without-config", _model_without_config, ["TRAIN_MODEL=", "no config.json"]),
    ("resume-missing", _fixed({"TRAIN_RESUME": "/nonexistent/checkpoint-5"}), ["TRAIN_RESUME=", "no such"]),
]


def _assert_user_error(result, expected: list[str]) -> None:
    """The shared assertion, and the mistakes are told in one message (one `error: `), after which each text is."""
    assert_user_error(result, *expected)
    stderr = "\n".join(line for line in result.stderr.splitlines() if not line.startswith("import time:"))
    assert stderr.count("error: ") == 1, stderr
    message = stderr[stderr.index("error: ") :]
    assert all(text in message for text in expected), message


@pytest.mark.parametrize(
    ("make_env", "expected"), [c[1:] for c in PRE_TORCH_CASES], ids=[c[0] for c in PRE_TORCH_CASES]
)
def test_refused_before_torch(
    tmp_path: Path, trainer_env: dict[str, str], run_trainer, imported_modules, make_env, expected: list[str]
) -> None:
    env = {**trainer_env, **make_env(tmp_path)}
    result = run_trainer(["config"], env=env, python_args=["-X", "importtime"], timeout=60)
    _assert_user_error(result, expected)
    assert "torch" not in imported_modules(result.stderr), "torch was imported before the error"
    assert result.cpu_s < FAST_EXIT_CPU_S, f"took {result.cpu_s:.2f}s of CPU ({result.elapsed:.2f}s wall)"


def test_every_problem_is_reported_at_once(trainer_env: dict[str, str], run_trainer) -> None:
    env = {**trainer_env, "TRAIN_PRECISION": "fp4", "TRAIN_PRECISON": "bf16", "TRAIN_SEQ_LEN": "2"}
    result = run_trainer(["config"], env=env)
    _assert_user_error(result, ["3 problems", "TRAIN_PRECISION='fp4'", "TRAIN_PRECISON", "TRAIN_SEQ_LEN='2'"])


def test_combination_problems_are_reported_together(trainer_env: dict[str, str], run_trainer) -> None:
    env = {**trainer_env, "TRAIN_QUANT": "8bit", "TRAIN_ZERO_OFFLOAD": "cpu", "TRAIN_OPTIM": "nope"}
    result = run_trainer(["config"], env=env)
    _assert_user_error(result, ["3 problems", "TRAIN_QUANT=8bit", "TRAIN_ZERO_OFFLOAD=cpu", "TRAIN_OPTIM='nope'"])


def test_the_train_command_refuses_the_same_way(trainer_env: dict[str, str], run_trainer, imported_modules) -> None:
    result = run_trainer(["train"], env={**trainer_env, "TRAIN_PRECISON": "bf16"}, python_args=["-X", "importtime"])
    _assert_user_error(result, ["did you mean TRAIN_PRECISION?"])
    assert "torch" not in imported_modules(result.stderr)


def test_unknown_command_and_argument(trainer_env: dict[str, str], run_trainer) -> None:
    result = run_trainer(["frobnicate"], env=trainer_env)
    _assert_user_error(result, ["invalid choice: 'frobnicate'", "train", "config", "doctor", "bench"])
    result = run_trainer(["config", "--yaml"], env=trainer_env)
    _assert_user_error(result, ["unrecognized arguments: --yaml"])


def _hide_modules(tmp: Path, names: str) -> dict[str, str]:
    """An interpreter on which `names` look uninstalled (a sitecustomize meta-path blocker): how a slim image
    without these optional packages behaves."""
    (tmp / "site").mkdir()
    (tmp / "site" / "sitecustomize.py").write_text(
        "import os, sys\n"
        "HIDDEN = set(os.environ['TRAINKIT_TEST_HIDE'].split(','))\n"
        "class _Hide:\n"
        "    @staticmethod\n"
        "    def find_spec(name, path=None, target=None):\n"
        "        if name.split('.')[0] in HIDDEN:\n"
        "            raise ModuleNotFoundError(name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Hide)\n"
    )
    return {"PYTHONPATH": str(tmp / "site"), "TRAINKIT_TEST_HIDE": names}


def test_missing_libraries_for_zero_lora_quant(
    tmp_path: Path, trainer_env: dict[str, str], run_trainer, imported_modules
) -> None:
    env = {
        **trainer_env,
        **_hide_modules(tmp_path, "deepspeed,peft,bitsandbytes"),
        "TRAIN_ZERO_STAGE": "2",
        "TRAIN_LORA": "1",
        "TRAIN_QUANT": "4bit",
        "TRAIN_OPTIM": "adamw_bnb_8bit",
    }
    result = run_trainer(["config"], env=env, python_args=["-X", "importtime"])
    _assert_user_error(
        result,
        [
            "TRAIN_ZERO_STAGE/TRAIN_DEEPSPEED_CONFIG needs the Python package 'deepspeed'",
            "TRAIN_LORA=1 needs the Python package 'peft'",
            "TRAIN_QUANT=4bit needs the Python package 'bitsandbytes'",
            "TRAIN_OPTIM=adamw_bnb_8bit needs 'bitsandbytes'",
        ],
    )
    assert "torch" not in imported_modules(result.stderr)


@pytest.mark.skipif(IS_ROOT, reason="root reads and writes regardless of permission bits")
def test_unreadable_file_and_unwritable_folder(tmp_path: Path, trainer_env: dict[str, str], run_trainer) -> None:
    data = tmp_path / "d"
    data.mkdir()
    secret = data / "locked.txt"
    secret.write_text("text\n")
    secret.chmod(0)
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        result = run_trainer(["config"], env={**trainer_env, "TRAIN_DATA": str(data), "TRAIN_OUTPUT_DIR": str(out)})
        _assert_user_error(result, ["cannot read", "locked.txt", "TRAIN_OUTPUT_DIR=", "not writable"])
    finally:
        out.chmod(0o755)
        secret.chmod(0o644)


# ---- refusals that need torch (this machine's probe; CPU here) or Transformers' checks: in pytest's process -------


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="checks CPU-only refusals")
def test_cpu_refuses_gpu_only_settings(trainer_env: dict[str, str], run_trainer_in_process) -> None:
    env = {
        **trainer_env,
        "TRAIN_PRECISION": "fp16",
        "TRAIN_TF32": "1",
        "TRAIN_ATTN": "flash_attention_2",
        "TRAIN_MEMORY_SNAPSHOT": "1",
        "TRAIN_COMPILE": "1",
        "TRAIN_COMPILE_BACKEND": "inductr",
    }
    result = run_trainer_in_process(["config"], env=env)
    _assert_user_error(
        result,
        [
            "5 problems",
            "TRAIN_PRECISION=fp16 needs a CUDA GPU",
            "TRAIN_TF32=1 needs an Ampere or newer GPU",
            "TRAIN_ATTN=flash_attention_2 needs the flash_attn package",
            "TRAIN_MEMORY_SNAPSHOT=1",
            "TRAIN_COMPILE_BACKEND='inductr' is not a torch.compile backend (did you mean inductor?)",
        ],
    )


def test_train_args_value_refused_by_transformers_parser(trainer_env: dict[str, str], run_trainer_in_process) -> None:
    result = run_trainer_in_process(["config"], env={**trainer_env, "TRAIN_ARGS": "--lr_scheduler_type cosine_wobble"})
    _assert_user_error(result, ["TRAIN_ARGS:", "--lr_scheduler_type", "invalid choice", "cosine_wobble"])


def test_combination_refused_by_training_arguments(trainer_env: dict[str, str], run_trainer_in_process) -> None:
    result = run_trainer_in_process(["config"], env={**trainer_env, "TRAIN_ARGS": "--load_best_model_at_end"})
    _assert_user_error(result, ["TrainingArguments refused the configuration", "load_best_model_at_end"])
