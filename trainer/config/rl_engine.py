"""TRAIN_RL_ENGINE=vllm: which of TRL's two vLLM modes a run uses, what it asks of the stack, and TRL's fields for it.

Colocate (TRAIN_RL_VLLM_URL empty): vLLM runs inside the training process (TRL's `vllm_mode="colocate"`), loading the
policy's folder and taking TRAIN_RL_VLLM_MEMORY of the device's memory; after each optimizer step TRL copies the
updated weights into it. Server (TRAIN_RL_VLLM_URL set): a `vllm serve` elsewhere generates, and TRL broadcasts the
weights to it over NCCL. Both need a vLLM in TRL's range built for this stack's torch in the training process
(trainer/vllm_compat.py, the one rule). Torch-free: the checks read installed metadata and the settings only.
"""

from __future__ import annotations

from typing import Any

from trainer.config.schema import TrainSettings

VLLM_OPTIONS = ("rl_vllm_url", "rl_vllm_memory", "rl_vllm_timeout")


def mode(s: TrainSettings) -> str:
    """TRL's vllm_mode for these settings: "server" where a URL is given, else "colocate"."""
    return "server" if s.rl_vllm_url else "colocate"


def engine_problems(s: TrainSettings) -> list[str]:
    """The engine's settings against each other, the model and this stack (named with its row)."""
    if s.rl_engine != "vllm":
        given = [f"TRAIN_{n.upper()}" for n in VLLM_OPTIONS if n in s.model_fields_set]
        return [f"{', '.join(given)}: for TRAIN_RL_ENGINE=vllm, not {s.rl_engine}; remove "
                f"{'them' if len(given) > 1 else 'it'}"] if given else []  # fmt: skip
    from trainer.compat import stack
    from trainer.config.presets import is_preset
    from trainer.vllm_compat import installed_problem

    problems = []
    cannot = installed_problem(stack().describe())
    if cannot:
        problems.append(f"TRAIN_RL_ENGINE=vllm: {cannot}. Use TRAIN_RL_ENGINE=transformers (generation inside the "
                        "training process); docs/running.md, 'Online RL', says what each row runs")  # fmt: skip
    if is_preset(s.model):
        problems.append(f"TRAIN_RL_ENGINE=vllm with TRAIN_MODEL={s.model}: vLLM loads the policy from a model folder, "
                        "and a preset has none; train it first (e.g. TRAIN_METHOD=sft) and give its final/ folder, "
                        "or use TRAIN_RL_ENGINE=transformers")  # fmt: skip
    for name in ("rl_vllm_memory", "rl_vllm_timeout"):
        if name in s.model_fields_set and (name == "rl_vllm_memory") == bool(s.rl_vllm_url):
            which = "colocate mode (TRAIN_RL_VLLM_URL empty)" if name == "rl_vllm_memory" else \
                "server mode (TRAIN_RL_VLLM_URL set)"  # fmt: skip
            problems.append(f"TRAIN_{name.upper()} applies to {which}, not to the mode in force; remove it")
    return problems


def hardware_problems(s: TrainSettings, gpu: bool) -> list[str]:
    """Server mode on a machine without a CUDA device (trainer.config.method.decide, which knows the hardware)."""
    if s.rl_engine != "vllm" or not s.rl_vllm_url or gpu:
        return []
    return [
        f"TRAIN_RL_VLLM_URL={s.rl_vllm_url} (TRL's server mode) on a machine without a CUDA device: TRL 1.16 sends "
        "the updated weights to the server after every step through vLLM's NCCL weight-transfer engine, which runs on "
        "a CUDA device only (VLLMClient.init_communicator refuses any other; vLLM's other backends are CUDA IPC and "
        "NCCL too), so the server would generate from stale weights. Leave TRAIN_RL_VLLM_URL empty: vLLM then runs "
        "in the training process (colocate mode), which the CPU runs"
    ]


def engine_arguments(s: TrainSettings) -> dict[str, Any]:
    """GRPOConfig/RLOOConfig fields for the engine."""
    if s.rl_engine != "vllm":
        return {"use_vllm": False}
    if s.rl_vllm_url:
        # TRL's own wait for the server at start; trainkit's check (trainer.run.vllm_engine) has run before it
        return {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": s.rl_vllm_url,
                "vllm_server_timeout": s.rl_vllm_timeout}  # fmt: skip
    return {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": s.rl_vllm_memory}
