"""What TRAIN_RL_ENGINE=vllm an image's row accepts, as its plan says and its label `org.trainkit.vllm-server-mode`
carries (trainer/vllm_compat.py's rule on the row's TRL, vLLM and torch)."""

from __future__ import annotations

from matrix import Matrix
from standin_base import load_standin

from trainer.vllm_compat import release, row_problem, server_mode_problem


def vllm_server_mode(plan, matrix: Matrix) -> str:
    """Whether the row's trainer can drive TRL's vLLM server mode (trainer/vllm_compat.py's rule), for the label."""
    if matrix.vllm is None:
        return "refused: images/versions.toml has no [vllm] table"
    if plan.rl:
        return rl_vllm_modes(plan, matrix)
    if plan.vllm_cpu:
        return cpu_rl_vllm_modes(plan, matrix)
    row = f"the CUDA {plan.cuda} row" if plan.cuda else "the CPU flavor"
    trl_range = matrix.vllm.trl_range if "trl" in plan.pins and release(plan.python) >= (3, 11) else None
    problem = row_problem(trl_range, matrix.vllm.torch_pins, plan.torch, row, cuda=plan.flavor == "cuda")
    if problem:
        return f"refused: {problem}"
    return (f"possible once a vLLM in TRL's range ({' to '.join(matrix.vllm.trl_range)}) built for its torch is "
            "installed (NGC's PyTorch image has none; the online-RL row, build.py --rl, has NVIDIA's)")


def rl_vllm_modes(plan, matrix: Matrix) -> str:
    """The online-RL row: the base's vLLM in TRL's range, built for the base's own torch (NVIDIA's build; a
    stand-in's PyPI vLLM pins the stand-in's torch), checked by trainer/vllm_compat.py's rule."""
    entry = matrix.rl
    vllm_torch = load_standin(entry).torch if plan.standin else entry.torch
    vllm = next((p.split("==")[1] for p in load_standin(entry).packages if p.startswith("vllm==")), entry.vllm) \
        if plan.standin else entry.vllm  # fmt: skip
    trl_range = (matrix.vllm.trl_range[0], matrix.vllm.trl_range[1]) if "trl" in plan.pins else None
    problem = server_mode_problem(trl_range, vllm, vllm_torch, plan.torch, "the online-RL row")
    if problem:
        return f"refused: {problem}"
    return f"accepted: colocate and server mode (vLLM {vllm} in the image, built for its torch, in TRL's range)"


def cpu_rl_vllm_modes(plan, matrix: Matrix) -> str:
    """The CPU flavor's online-RL image: vllm-cpu pins the CPU base's torch; colocate mode only (server mode's weight
    sync runs on NCCL, on a GPU)."""
    trl_range = (matrix.vllm.trl_range[0], matrix.vllm.trl_range[1]) if "trl" in plan.pins else None
    problem = server_mode_problem(trl_range, matrix.cpu_rl.vllm_cpu, matrix.cpu_rl.torch, plan.torch,
                                  "the CPU flavor's online-RL image")  # fmt: skip
    if problem:
        return f"refused: {problem}"
    return (f"accepted: colocate mode (vLLM's CPU build {matrix.cpu_rl.vllm_cpu} in the image, built for its torch, "
            "in TRL's range); server mode refused: no CUDA device for TRL's NCCL weight sync")  # fmt: skip
