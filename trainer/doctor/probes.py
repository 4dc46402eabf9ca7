"""The probes of `python -m trainer doctor`: each looks at one thing of this machine (GPUs, libraries, limits, paths)
and is one line of the report.

Probes avoid importing heavy packages (deepspeed, bitsandbytes, flash-attn stay unimported except
flash-attn's tiny version check), so the whole report takes about as long as importing torch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import resource
import runpy
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer import provenance
from trainer.compat import installed_version
from trainer.config.inputs import Inputs
from trainer.config.paths import writable_dir_problem
from trainer.data.discovery import DataSource
from trainer.doctor import driver
from trainer.errors import ConfigError
from trainer.machine import hardware

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"
GIB = 1024**3
MIN_SHM_BYTES = 1 * GIB
# What the image build writes (images/build_ext.py); outside an image it does not exist.
PYTHON_STACK = (
    "torch",
    "transformers",
    "accelerate",
    "datasets",
    "peft",
    "tokenizers",
    "safetensors",
    "deepspeed",
    "flash_attn",
    "bitsandbytes",
    "apex",
    "triton",
    "numpy",
    "pydantic",
)
APEX_EXTENSIONS = ("amp_C", "fused_layer_norm_cuda", "fused_dense_cuda", "scaled_masked_softmax_cuda")


@dataclass
class Probe:
    key: str  # JSON key
    label: str  # table label
    shown: str  # human-readable value
    status: str = INFO
    fix: str = ""  # what to do when status is warn or fail
    value: Any = None  # machine-readable value (JSON)


# --- probes -------------------------------------------------------------------------------------


def nvidia_smi(field: str) -> str | None:
    """One `nvidia-smi --query-gpu` field of GPU 0, or None."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    import subprocess

    try:
        out = subprocess.run([smi, f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=10, check=False).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def driver_version() -> str | None:
    """The NVIDIA kernel driver version, from procfs (visible in containers) or nvidia-smi."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        text = ""
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text)
    return match[1] if match else nvidia_smi("driver_version")


def driver_floor_probe(hw: hardware.Hardware) -> Probe:
    """This image's driver floor against the host's driver: ok, forward compatibility, or the row to use."""
    floor, rows = driver.image_floor()
    status, shown, fix = driver.verdict(driver_version(), hw.gpu_name or nvidia_smi("name"), floor, rows,
                                        driver.COMPAT_LIBS.is_dir())  # fmt: skip
    return Probe("driver_floor", "Driver vs image", shown, status, fix, {"floor": floor or None, "verdict": status})


def cuda_image() -> bool:
    """Whether this runs inside a trainkit CUDA image: its build manifest (written by the Dockerfile) says the base
    has CUDA. A native install with PyPI's Linux torch (a CUDA build) is not one: there the run uses the CPU."""
    try:
        manifest = json.loads(provenance.MANIFEST_FILE.read_text())
    except (OSError, ValueError):
        return False
    return bool(manifest.get("base", {}).get("cuda"))


def gpu_probes(hw: hardware.Hardware) -> list[Probe]:
    import torch

    if not hw.is_gpu:
        if cuda_image():
            fix = (
                "this is a CUDA image but no GPU is visible: run with `--gpus all` (docker run / run.py) or the "
                "compose GPU reservation, and check that the NVIDIA Container Toolkit is installed "
                "(nvidia-smi on the host)"
            )
            return [Probe("gpus", "GPUs", "none visible", FAIL, fix, [])]
        build = f"torch {torch.__version__} is a CUDA {torch.version.cuda} build" if torch.version.cuda else ""
        shown = "none visible: the run will use the CPU" + (f" ({build})" if build else "")
        return [Probe("gpus", "GPUs", shown, INFO, "", [])]
    gpus = []
    for index in range(hw.gpu_count):
        props = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "index": index,
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "memory_bytes": props.total_memory,
            }
        )
    names = ", ".join(f"{g['index']}: {g['name']} ({g['memory_bytes'] / GIB:.0f} GiB)" for g in gpus)
    return [Probe("gpus", "GPUs", names, OK, value=gpus)]


def capability_probes(hw: hardware.Hardware) -> list[Probe]:
    import torch

    if not hw.is_gpu:
        return [Probe("capability", "Compute capability", "n/a (CPU)", value=None)]
    major, minor = hw.capability or (0, 0)
    flash_sdpa = hw.ampere_or_newer and torch.backends.cuda.is_flash_attention_available()
    allows = {"bf16": hw.bf16, "tf32": hw.tf32, "flash_attention": bool(hw.ampere_or_newer), "sdpa_flash": flash_sdpa}
    shown = f"{major}.{minor}: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in allows.items())
    return [Probe("capability", "Compute capability", shown, OK, value={"capability": f"{major}.{minor}", **allows})]


def torch_probes(hw: hardware.Hardware) -> list[Probe]:
    import torch

    build = f"cuda {torch.version.cuda}" if torch.version.cuda else "cpu"
    abi = bool(torch.compiled_with_cxx11_abi())
    driver = driver_version()
    rows = [
        Probe(
            "torch",
            "torch build",
            f"{torch.__version__} ({build}, cxx11 abi {'yes' if abi else 'no'})",
            value={"version": torch.__version__, "build": build, "cxx11_abi": abi},
        ),
        Probe("driver", "NVIDIA driver", driver or "none", value=driver),
        Probe("cuda_runtime", "CUDA runtime", torch.version.cuda or "none (CPU build)", value=torch.version.cuda),
    ]
    nccl = None
    if torch.version.cuda and torch.distributed.is_available() and torch.distributed.is_nccl_available():
        nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
    rows.append(Probe("nccl", "NCCL", nccl or "none", value=nccl))
    return rows


def flash_attn_probe(hw: hardware.Hardware) -> Probe:
    version = installed_version("flash_attn") or installed_version("flash-attn")
    if not version:
        return Probe(
            "flash_attn", "flash-attn", "not installed (sdpa is used)", value={"version": None, "usable": False}
        )
    usable = hw.is_gpu and hw.ampere_or_newer
    why = "usable" if usable else "installed, needs an Ampere or newer GPU"
    return Probe("flash_attn", "flash-attn", f"{version}: {why}", value={"version": version, "usable": usable})


def apex_probe() -> Probe:
    if not hardware.module_available("apex"):
        return Probe("apex", "apex fused kernels", "not installed", value={"installed": False, "extensions": {}})
    extensions = {name: hardware.module_available(name) for name in APEX_EXTENSIONS}
    built = [name for name, ok in extensions.items() if ok]
    shown = ", ".join(built) if built else "apex without CUDA extensions"
    return Probe("apex", "apex fused kernels", shown, value={"installed": True, "extensions": extensions})


def deepspeed_ops() -> tuple[str | None, dict[str, str]]:
    """DeepSpeed's version and, per op, "installed" (prebuilt), "jit" (compiled on first use) or "unavailable".

    Installed ops come from deepspeed/git_version_info_installed.py (written at install time); the rest
    are asked of DeepSpeed's op builders (`is_compatible()`, what `ds_report` shows), with a compiler check.
    """
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return None, {}
    info_file = Path(next(iter(spec.submodule_search_locations))) / "git_version_info_installed.py"
    try:
        info = runpy.run_path(str(info_file))
    except (OSError, SyntaxError):
        info = {}
    installed: dict[str, bool] = info.get("installed_ops", {})
    compatible = builders_compatibility() or info.get("compatible_ops", {})
    compiler = bool(shutil.which("g++") or shutil.which("c++")) and bool(
        shutil.which("ninja") or hardware.module_available("ninja")
    )
    ops = {}
    for op in sorted(set(installed) | set(compatible)):
        if installed.get(op):
            ops[op] = "installed"
        elif compiler and compatible.get(op):
            ops[op] = "jit"
        else:
            ops[op] = "unavailable"
    return info.get("version") or installed_version("deepspeed"), ops


def builders_compatibility() -> dict[str, bool]:
    """{op: builder.is_compatible()} for this machine's accelerator; {} when DeepSpeed cannot say."""
    import contextlib
    import io
    import logging

    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            from deepspeed.ops.op_builder.all_ops import ALL_OPS

            return {name: bool(builder and builder.is_compatible(False)) for name, builder in ALL_OPS.items()}
    except Exception:  # a broken DeepSpeed install must not break the report
        return {}
    finally:
        logging.disable(logging.NOTSET)


def deepspeed_probe() -> Probe:
    version, ops = deepspeed_ops()
    if version is None:
        return Probe("deepspeed", "DeepSpeed ops", "not installed", value={"version": None, "ops": {}})
    prebuilt = [op for op, state in ops.items() if state == "installed"]
    jit = [op for op, state in ops.items() if state == "jit"]
    shown = f"{version}: prebuilt {', '.join(prebuilt) or 'none'}; JIT {', '.join(jit) or 'none'}"
    return Probe("deepspeed", "DeepSpeed ops", shown, value={"version": version, "ops": ops})


def bitsandbytes_probe(hw: hardware.Hardware) -> Probe:
    """The backend bitsandbytes would load (CUDA library for this runtime, or CPU), without importing it."""
    spec = importlib.util.find_spec("bitsandbytes")
    if spec is None or not spec.submodule_search_locations:
        return Probe("bitsandbytes", "bitsandbytes", "not installed", value={"version": None, "backend": None})
    import torch

    version = installed_version("bitsandbytes")
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    backend, library = "CPU", None
    if hw.is_gpu and torch.version.cuda:
        major = torch.version.cuda.split(".")[0]
        candidates = sorted(package_dir.glob(f"libbitsandbytes_cuda{major}*.so"))
        if candidates:
            backend, library = "CUDA", candidates[-1].name
    shown = f"{version}: {backend} backend" + (f" ({library})" if library else "")
    value = {"version": version, "backend": backend, "library": library}
    return Probe("bitsandbytes", "bitsandbytes", shown, value=value)


def versions_probe() -> Probe:
    found = {"python": sys.version.split()[0]}
    for name in PYTHON_STACK:
        version = installed_version(name) or installed_version(name.replace("_", "-"))
        if version:
            found[name] = version
    return Probe("versions", "Python stack", ", ".join(f"{k} {v}" for k, v in found.items()), value=found)


def unsupported_probe() -> Probe:
    """The switches this stack's versions cannot run (trainer/compat.py); choosing one fails the config row."""
    from trainer import compat

    found = compat.unsupported()
    shown = ", ".join(found) if found else "none: every switch can run on this stack"
    return Probe("unsupported", f"Not supported on {compat.stack().describe()}", shown, value=found)


def limits_probes(hw: hardware.Hardware, num_workers: int) -> list[Probe]:
    try:
        stat = os.statvfs("/dev/shm")
        shm = stat.f_blocks * stat.f_frsize
    except OSError:
        shm = 0
    shm_status, shm_fix = OK, ""
    if shm < MIN_SHM_BYTES:
        shm_status = FAIL if (hw.gpu_count > 1 or (hw.is_gpu and num_workers > 0)) else WARN
        shm_fix = "run with `ipc: host` (compose) / `--ipc=host`, or `--shm-size=16g` (NCCL, DataLoader workers)"
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    unlimited = memlock == resource.RLIM_INFINITY
    memlock_status = OK if unlimited else (WARN if hw.is_gpu else INFO)
    return [
        Probe("shm_bytes", "/dev/shm", f"{shm / GIB:.1f} GiB", shm_status, shm_fix, shm),
        Probe(
            "memlock",
            "memlock limit",
            "unlimited" if unlimited else f"{memlock} bytes",
            memlock_status,
            "" if unlimited else "add `--ulimit memlock=-1` (compose: ulimits memlock -1) for pinned memory and RDMA",
            "unlimited" if unlimited else memlock,
        ),
    ]


def user_probe() -> Probe:
    uid, gid = os.getuid(), os.getgid()
    home = os.environ.get("HOME", "")
    home_ok = bool(home) and os.access(home, os.W_OK)
    status = OK if home_ok else WARN
    fix = "" if home_ok else "HOME is not writable: start the container through the trainkit entrypoint"
    return Probe(
        "user", "User", f"uid {uid} gid {gid}, HOME {home}", status, fix, {"uid": uid, "gid": gid, "home": home}
    )


def cache_probe() -> Probe:
    dirs = {
        name: os.environ[name]
        for name in ("HF_HOME", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
        if os.environ.get(name)
    }
    unwritable = [f"{name}={path}" for name, path in dirs.items() if not writable(path)]
    if unwritable:
        return Probe(
            "cache",
            "Caches",
            "not writable: " + ", ".join(unwritable),
            WARN,
            "mount a volume at /cache that this user may write (compose does: volume `cache`)",
            {"dirs": dirs, "writable": False},
        )
    return Probe("cache", "Caches", ", ".join(dirs.values()) or "defaults", OK, value={"dirs": dirs, "writable": True})


# --- data, output, configuration -----------------------------------------------------------------


def writable(path: str) -> bool:
    """The configuration's own rule: `path` is, or can be created as, a folder this user can write."""
    return writable_dir_problem("path", path) is None


def data_probe(source: DataSource) -> Probe:
    """Whether TRAIN_DATA resolves (as the trainer resolves it, from the same scan) to data this user can read."""
    path = source.spec
    if source.embedded:
        shown = f"{path}: empty, the embedded sample corpus will be used"
        return Probe("data", "Data", shown, INFO, value={"path": path, "readable": True, "embedded": True})
    unreadable = [p.removeprefix("TRAIN_DATA: ") for p in source.problems if "cannot read" in p]
    readable = bool(source.files or source.saved_dataset) and not unreadable
    value = {"path": path, "readable": readable}
    if not source.files and not source.saved_dataset:
        return Probe("data", "Data", f"{path}: no data", FAIL, "; ".join(source.problems), value)
    if unreadable:
        fix = f"uid {os.getuid()}: {unreadable[0]}; make the data readable (`chmod -R a+rX data`)"
        return Probe("data", "Data", f"{path}: not readable", FAIL, fix, value)
    status = FAIL if source.problems else OK
    return Probe("data", "Data", f"{path}: {source.describe()}", status, "; ".join(source.problems), value)


def chat_probe(inputs: Inputs) -> Probe:
    """The data's record format and the chat template that renders conversations (trainer.data.chat)."""
    from trainer.data.chat import chat_report, no_template_problem

    s, source = inputs.settings, inputs.data
    report = chat_report(source, s.loss_on, s.chat_template, inputs.tokenizer_folder, s.method)
    (layouts, loss), (template, why) = report["data_format"], report["chat_template"]
    shown = f"format {layouts} ({loss}); chat template: {template}"
    value = {what: {"value": v, "reason": r} for what, (v, r) in report.items()}
    if source.conversational and template in ("none", "refused"):
        fix = why if template == "refused" else no_template_problem(layouts, why)
        return Probe("chat", "Data format", shown, FAIL, fix, value)
    from trainer.config.method import layout_problem

    mismatch = None if source.problems else layout_problem(s.method, source.layouts, source.variable)
    if mismatch:  # the layout the data holds against the one TRAIN_METHOD needs
        return Probe("chat", "Data format", shown, FAIL, mismatch, value)
    return Probe("chat", "Data format", shown, OK, value=value)


def output_probe(path: str) -> Probe:
    if writable(path):
        return Probe("output", "Output", f"{path}: writable", OK, value={"path": path, "writable": True})
    return Probe(
        "output",
        "Output",
        f"{path}: not writable by uid {os.getuid()}",
        FAIL,
        "make the output folder writable by the container user (compose: set TRAINKIT_UID/TRAINKIT_GID to "
        "`id -u`/`id -g`; `mkdir -p output` before the first run) or fix TRAIN_OUTPUT_DIR",
        {"path": path, "writable": False},
    )


def settings_and_config_probe(hw: hardware.Hardware) -> tuple[Inputs | None, Probe]:
    """The TRAIN_* settings with what they name (None when a value is invalid), and whether they can run on this
    machine.

    Static checks (load_settings) and the machine-dependent ones (resolve) both run, so that every
    problem is listed at once, not just the first stage's.
    """
    from trainer import config, memory

    try:
        inputs = config.Inputs(config.parse_settings())
    except ConfigError as exc:
        return None, config_failure(exc.problems)
    problems = config.static_problems(inputs)  # the same inputs for both stages, so the data is scanned once
    try:
        memory.check(config.resolve(inputs, hw))
    except ConfigError as exc:
        problems += [problem for problem in exc.problems if problem not in problems]
    if problems:
        return inputs, config_failure(problems)
    return inputs, Probe("config", "TRAIN_* settings", "possible here", OK, value={"ok": True, "error": None})


def config_failure(problems: list[str]) -> Probe:
    message = ConfigError(*problems).message
    return Probe("config", "TRAIN_* settings", "not possible here", FAIL, message, {"ok": False, "error": message})
