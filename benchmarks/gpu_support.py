"""What benchmarks/gpu_run.py's parts share: timing on the device, the machine's facts, the carried wheels, the chat
corpus, an import-time profile, a profile's time by kind, and the table of the results file."""

from __future__ import annotations

import json
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def device() -> Any:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def timed(fn: Callable[[], Any], where: Any, repeat: int = 20) -> float:
    """Seconds per call: the median of `repeat` calls after 3 warm-up calls, timed with CUDA events on a GPU."""
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        if where.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def machine_facts() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["gpu_mem_gib"] = round(torch.cuda.get_device_properties(0).total_memory / GIB, 1)
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def gib(value: int | None) -> float | None:
    return round(value / GIB, 2) if value else None


def short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) < 120 else text[:117] + "..."


# ---- an import-time profile (-X importtime) -----------------------------------------------------------------------

IMPORT_LINE = re.compile(r"^import time:\s+(\d+)\s+\|\s+(\d+)\s+\|\s?(\s*)(\S+)")


def import_profile(stderr: str, top: int = 20) -> dict[str, Any]:
    """`python -X importtime` output -> the total, the `top` modules by cumulative microseconds, and the share of
    trainkit's own modules (their self time)."""
    rows = [(int(m[2]), int(m[1]), m[4]) for m in map(IMPORT_LINE.match, stderr.splitlines()) if m]
    total = sum(self_us for _cumulative, self_us, _name in rows)
    ours = sum(self_us for _cumulative, self_us, name in rows if name.split(".")[0] == "trainer")
    slowest = sorted(rows, reverse=True)[:top]
    return {"modules": len(rows), "total_s": round(total / 1e6, 2), "trainkit_self_s": round(ours / 1e6, 3),
            "top": [[name, round(cumulative / 1e6, 3)] for cumulative, _self, name in slowest]}  # fmt: skip


# ---- a profile's time by kind -------------------------------------------------------------------------------------

KINDS = (
    ("attention", ("attention", "flash", "fmha", "sdpa", "cudnn_mha")),
    ("optimizer", ("adam", "foreach", "optimizer", "clip_grad")),
    ("gemm", ("mm", "gemm", "matmul", "nvjet", "cutlass", "sm90_xmma", "linear")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, marks in KINDS if any(mark in low for mark in marks)), "elementwise")


def time_by_kind(summary: dict[str, Any], step_s: float | None) -> dict[str, float | None]:
    """Per step, in ms: a profile's self times (trainer/run/profiling.py's summary JSON) grouped as GEMM, attention,
    optimizer and elementwise (everything else), and on a GPU idle: the measured step time (an unprofiled run's)
    less the kernels' time. On a CPU the operators' times are grouped and idle is None (not a device's idle)."""
    self_us = summary.get("self_us", {})
    kinds = {"gemm": 0.0, "attention": 0.0, "elementwise": 0.0, "optimizer": 0.0}
    for name, us in self_us.items():
        if name.startswith("ProfilerStep") or name.startswith("cuda") or name.startswith("Memcpy"):
            continue
        kinds[kind_of(name)] += us / 1e3
    out: dict[str, float | None] = {k: round(v, 2) for k, v in kinds.items()}
    on_gpu = summary.get("time") != "self_cpu_time_total"
    out["idle"] = round(step_s * 1e3 - sum(kinds.values()), 2) if step_s and on_gpu and self_us else None
    return out


# ---- the chat corpus ----------------------------------------------------------------------------------------------


def write_conversations(path: Path, count: int, seq_len: int) -> None:
    """`count` chat records (messages layout) of varied lengths that fit `seq_len` byte-level tokens with the chatml
    template, the same every time (seeded)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = ["the", "a", "model", "trains", "on", "packed", "records", "of", "text", "with", "attention", "kept",
             "inside", "each", "one"]  # fmt: skip
    user, assistant = max(2, seq_len // 60), max(4, seq_len // 25)  # words per turn, at most; two exchanges at most
    with open(path, "w") as fh:
        for _ in range(count):
            turns = [{"role": "system", "content": "Be brief."}] if rng.random() < 0.3 else []
            for _ in range(rng.randint(1, 2)):
                turns.append({"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(1, user)))})
                turns.append({"role": "assistant",
                              "content": " ".join(rng.choices(words, k=rng.randint(1, assistant)))})  # fmt: skip
            fh.write(json.dumps({"messages": turns}) + "\n")


# ---- wheels and the table -----------------------------------------------------------------------------------------


def use_wheels(wheels: Path, argv: list[str]) -> None:
    """Unpack the carried wheels (.whl/*.whl) into wheels/site once (a wheel is a zip of its site-packages files:
    no pip, no network), then run this command again with that folder ahead of the machine's own packages on
    PYTHONPATH, which every trainer it starts inherits."""
    import zipfile

    found = sorted(wheels.glob("*.whl"))
    site = (wheels / "site").resolve()
    if not found or str(site) in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        return
    marker = site / ".unpacked"
    names = "\n".join(p.name for p in found)
    if not marker.exists() or marker.read_text() != names:
        for wheel in found:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(site)
        marker.write_text(names)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH")) if p)
    os.execv(sys.executable, [sys.executable, "-m", "benchmarks.gpu_run", *argv])


# Each row's predicted peak beside its measured one: the prediction the run made of itself (its run record's
# decisions.memory, trainer.memory.fit, at the batch it ran), or the checked row's resolved one. Its
# predicted_allocated_bytes is what peak_mem_bytes measures (the peak less the framework's allowance).
NOT_PREDICTED = "not predicted"


def memory_prediction(predicted: dict[str, Any] | None, measured_gib: float | None = None) -> dict[str, Any]:
    """The predicted peak (GiB) beside the measured one, and their ratio."""
    if not predicted or predicted.get("predicted_allocated_bytes") is None:
        return {"prediction": NOT_PREDICTED}
    gib_predicted = gib(predicted["predicted_allocated_bytes"])
    ratio = gib_predicted / measured_gib if gib_predicted and measured_gib else None
    return {"prediction": "ok", "predicted_peak_gib": gib_predicted, "predicted_over_measured": ratio}


COLUMNS = ("status", "batch_size", "tokens_per_s", "mfu", "mfu_basis", "loss", "peak_mem_gib", "predicted_peak_gib",
           "to_first_step_s", "compile_s", "tflops", "gb_per_s", "ms", "vs_fp32_speed", "vs_fp32_mem",
           "summary")  # fmt: skip


def table(out: Path) -> str:
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    fp32 = next((r for r in reversed(records) if r["part"] == "techniques" and r["name"] == "fp32"), None)
    for r in records:
        if r["part"] in ("techniques", "techniques2") and fp32 and fp32.get("tokens_per_s") and r.get("tokens_per_s"):
            r["vs_fp32_speed"] = r["tokens_per_s"] / fp32["tokens_per_s"]
            if fp32.get("peak_mem_gib") and r.get("peak_mem_gib"):
                r["vs_fp32_mem"] = r["peak_mem_gib"] / fp32["peak_mem_gib"]
    lines = ["| part | name | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for r in records:
        cells = [short(r.get(c)) if r.get(c) is not None else "" for c in COLUMNS]
        lines.append(f"| {r['part']} | {r['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
