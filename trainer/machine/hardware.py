"""What this machine can do: `probe()` imports torch lazily and has no side effects.

Shared by `resolve()` (trainer.config), `python -m trainer doctor` and the benchmarks.
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import asdict, dataclass, field

from trainer.compat import installed_version


def module_available(name: str) -> bool:
    """True when `name` (dotted names allowed) can be imported, without importing it when it is top-level."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError, AttributeError):
        # find_spec("a.b") imports "a"; an unrelated or broken "a" lands here.
        return False


def missing_package_problem(module: str, setting: str, hint: str) -> str | None:
    """The message for `setting` needing the Python package `module`, which is not installed; None when it is."""
    if module_available(module):
        return None
    return f"{setting} needs the Python package {module!r}, which is not installed ({hint})"


def apex_fused_available() -> bool:
    """NVIDIA apex with its CUDA extensions (the PyPI package `apex` is unrelated and has no `apex.optimizers`)."""
    return module_available("apex.optimizers") and module_available("amp_C")


@dataclass
class Hardware:
    device: str  # "cuda" or "cpu"
    gpu_count: int = 0
    gpu_name: str | None = None
    capability: tuple[int, int] | None = None  # of GPU 0
    total_memory_bytes: int | None = None  # of GPU 0
    bf16: bool = False  # on the GPU
    tf32: bool = False
    cuda_version: str | None = None
    torch_version: str = ""
    cpu_count: int = 1
    cxx_compiler: str | None = None
    libraries: dict[str, bool] = field(default_factory=dict)

    @property
    def is_gpu(self) -> bool:
        return self.device == "cuda"

    @property
    def ampere_or_newer(self) -> bool:
        return self.capability is not None and self.capability >= (8, 0)

    def describe(self) -> str:
        if not self.is_gpu:
            return f"CPU ({self.cpu_count} cores), no CUDA GPU"
        major, minor = self.capability or (0, 0)
        return f"{self.gpu_count} x {self.gpu_name} (compute capability {major}.{minor})"

    def to_dict(self) -> dict:
        out = asdict(self)
        out["capability"] = list(self.capability) if self.capability else None
        return out


LIBRARIES = {
    "flash_attn": "flash_attn",
    "bitsandbytes": "bitsandbytes",
    "deepspeed": "deepspeed",
    "peft": "peft",
    "triton": "triton",
    "tensorboard": "tensorboard",
    "liger_kernel": "liger_kernel",
    "torchao": "torchao",  # TRAIN_PRECISION=fp8
}


def probe_libraries() -> dict[str, bool]:
    libs = {name: module_available(mod) for name, mod in LIBRARIES.items()}
    libs["apex_fused"] = apex_fused_available()
    # flash-attn (2) and flash-attn-4 both install the module flash_attn: the distribution tells them apart
    libs["flash_attn"] = libs["flash_attn"] and installed_version("flash-attn") is not None
    libs["flash_attn_4"] = installed_version("flash-attn-4") is not None
    return libs


def probe() -> Hardware:
    import os

    import torch

    from trainer.compat import cuda_bf16_supported

    libs = probe_libraries()
    cpu_count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    common = {
        "torch_version": torch.__version__,
        "cpu_count": cpu_count,
        "cxx_compiler": shutil.which("g++") or shutil.which("c++") or shutil.which("clang++"),
        "libraries": libs,
    }
    if not torch.cuda.is_available():
        return Hardware(device="cpu", **common)
    props = torch.cuda.get_device_properties(0)
    capability = (props.major, props.minor)
    return Hardware(
        device="cuda",
        gpu_count=torch.cuda.device_count(),
        gpu_name=props.name,
        capability=capability,
        total_memory_bytes=props.total_memory,
        bf16=cuda_bf16_supported(),
        tf32=capability >= (8, 0),
        cuda_version=torch.version.cuda,
        **common,
    )
