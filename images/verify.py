"""Prove, from inside the image, every claim of its build manifest (the last step of the image build).

    python /opt/trainkit/images/verify.py          check; exit 1 naming each missing piece
    python /opt/trainkit/images/verify.py --json   also print {manifest, versions, checks} as JSON

Needs no GPU: compiled CUDA modules are imported (their shared libraries load), not run.
Container side: never imports the docker SDK.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

MANIFEST = Path(os.environ.get("TRAINKIT_MANIFEST", "/opt/trainkit/build-manifest.json"))
DS_OP_BUILDERS = {
    "cpu_adam": "CPUAdamBuilder",
    "fused_adam": "FusedAdamBuilder",
    "async_io": "AsyncIOBuilder",
    "deepspeed_shm_comm": "ShareMemCommBuilder",
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
    for module in ("transformers", "accelerate", "datasets", "peft", "bitsandbytes", "trainer"):
        importlib.import_module(module)
    if shutil.which("dumb-init") is None:
        raise Failed("dumb-init is not on PATH")
    return f"{len(manifest.get('pins', {}))} pins match; imports work"


def check_deepspeed_op(op: str) -> str:
    """The op is installed prebuilt (DeepSpeed's own record), compatible, and loads without JIT compiling."""
    from deepspeed import git_version_info
    from deepspeed.accelerator import get_accelerator

    installed_ops = git_version_info.installed_ops  # what DeepSpeed's setup.py compiled (ds_report's "installed")
    if not installed_ops.get(op):
        present = sorted(k for k, v in installed_ops.items() if v)
        raise Failed(f"DeepSpeed op {op} is not installed prebuilt (installed: {present})")
    builder = get_accelerator().create_op_builder(DS_OP_BUILDERS[op])
    if builder is None:
        raise Failed(f"DeepSpeed has no {DS_OP_BUILDERS[op]} for accelerator {get_accelerator()._name}")
    compatible = getattr(git_version_info, "compatible_ops", {}).get(op, builder.is_compatible(verbose=False))
    if not compatible:
        raise Failed(f"DeepSpeed reports op {op} as incompatible")
    with tempfile.TemporaryDirectory() as jit_dir:
        os.environ["TORCH_EXTENSIONS_DIR"] = jit_dir
        module = builder.load(verbose=False)
        if os.listdir(jit_dir):
            raise Failed(f"DeepSpeed op {op} was JIT-compiled instead of loaded prebuilt")
    return f"prebuilt {getattr(module, '__file__', module)}"


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


def planned_checks(manifest: dict) -> list[tuple[str, Callable[[], str] | None, str]]:
    """(name, check or None when skipped, skip reason) for every claim in the manifest."""
    checks: list[tuple[str, Callable[[], str] | None, str]] = [
        ("torch", lambda: check_torch(manifest), ""),
        ("packages", lambda: check_pins(manifest), ""),
    ]
    for piece, claim in manifest["extensions"].items():
        if piece == "deepspeed":
            checks.append(("deepspeed", lambda: check_modules(["deepspeed"]), ""))
            for op, state in claim.get("ops", {}).items():
                if state["status"] == "skipped":
                    checks.append((f"deepspeed:{op}", None, state.get("reason", "")))
                else:
                    checks.append((f"deepspeed:{op}", lambda op=op: check_deepspeed_op(op), ""))
        elif claim["status"] == "skipped":
            checks.append((piece, None, claim.get("reason", "")))
        elif piece == "transformer_engine":
            checks.append((piece, check_transformer_engine, ""))
        else:
            modules = EXTENSION_MODULES.get(piece, [piece])
            checks.append((piece, lambda modules=modules: check_modules(modules), ""))
    return checks


def versions() -> dict[str, str]:
    found = {}
    for package in ("torch", "transformers", "accelerate", "datasets", "peft", "bitsandbytes", "deepspeed",
                    "flash-attn", "apex", "dumb-init", "trainkit"):  # fmt: skip
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[package] = importlib.metadata.version(package)
    import torch

    found["torch"] = torch.__version__  # NGC's own string: pip metadata normalises ".nv25.03" to ".nv25.3"
    found["python"] = ".".join(map(str, sys.version_info[:3]))
    return found


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
    results, failures = [], []
    for name, check, reason in planned_checks(manifest):
        if check is None:
            results.append({"name": name, "status": "skipped", "detail": reason})
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
        document = {"manifest": manifest, "versions": versions(), "checks": results}
        print(json.dumps(document, indent=2), file=real_stdout)
    if failures:
        print("verification failed: the image claims pieces that are not there:\n  " + "\n  ".join(failures),
              file=sys.stderr)
        return 1
    print(f"verification passed ({sum(r['status'] == 'ok' for r in results)} checks)", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
