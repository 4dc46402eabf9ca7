"""One GPU run that measures the GPU path (issues 34 and 42), on one GPU machine without Docker or network.

From the repository root, after `benchmarks/gpu_wheels.sh` filled `.whl/` (docs/benchmarks.md, "The GPU run"):

    python3 -m benchmarks.gpu_run --only gemm,sdpa,auto --out gpu_run.jsonl
    python3 -m benchmarks.gpu_run --dry-run            # the same driver on the CPU: tiny preset, tiny shapes

Parts, in this order (`--only a,b` picks some; the lead splits them across calls of under 10 minutes):
  gemm        bf16 8192^3 matmul TFLOP/s and device copy bandwidth
  sdpa        SDPA forward+backward at the 1b attention shape: causal with no mask vs a dense boolean mask
  auto        the 1b preset with the trainer's own defaults (no TRAIN_BATCH_SIZE, no TRAIN_COMPILE), TRAIN_SEQ_LEN=2048,
              the embedded corpus: batch chosen, tokens/s, MFU, peak memory, to_first_step_s, compile_s, phases
  warm        the same again, reusing the compile and batch-search caches of `auto`
  whole       the same with the whole model compiled (TRAIN_COMPILE_SCOPE=model) against auto's regional compile,
              cold then warm (the dry run compiles the tiny preset once, cold only)
  eager       the same with TRAIN_COMPILE=0
  chat        a packed conversation corpus made here: records vs stream packing, eager, short
  techniques  the technique rows of the 125m preset, each the fp32 baseline plus one change
  gputests    python3 -m pytest tests/gpu -q -x
Each trainer run is a `python -m trainer.launch train` subprocess with its own output folder (trainer.bench.runner,
the bench's own machinery); medians over the steps after the warm-up, no checkpoint written while measuring (so
none is in the step times). Each measurement appends one JSON line to --out as it ends and prints one line; the
table of every line in --out (earlier calls' too) is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PARTS = ("gemm", "sdpa", "auto", "warm", "whole", "eager", "chat", "techniques", "gputests")
GIB = 1 << 30


@dataclass(frozen=True)
class Sizes:
    """What the real run and the dry run measure."""

    model: str
    seq_len: int
    gemm_n: int
    copy_bytes: int
    sdpa: tuple[int, int, int, int]  # batch, heads, seq, head dim (the 1b preset: 32 heads of 64)
    warmup: int
    steps: int
    tech_model: str
    tech_seq: int
    tech_batch: int
    tech_warmup: int
    tech_steps: int
    chat_steps: int
    timeout_s: float


REAL = Sizes("1b", 2048, 8192, 2 * GIB, (8, 32, 2048, 64), 10, 30, "125m", 2048, 8, 4, 12, 20, 540)
DRY = Sizes("tiny", 64, 256, 64 << 20, (2, 4, 64, 16), 1, 3, "tiny", 64, 4, 1, 2, 4, 240)


class Driver:
    def __init__(self, out: Path, work: Path, sizes: Sizes, dry: bool) -> None:
        self.out, self.work, self.sizes, self.dry = out, work, sizes, dry
        work.mkdir(parents=True, exist_ok=True)

    def emit(self, part: str, name: str, **values: Any) -> None:
        record = {"part": part, "name": name, "dry_run": self.dry, "time": time.time(), **values}
        with open(self.out, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        shown = ", ".join(f"{k}={_short(v)}" for k, v in values.items() if k not in ("phases_s", "note", "tail"))
        print(f"[{part}] {name}: {shown}", flush=True)

    # ---- kernels ------------------------------------------------------------------------------------------------

    def gemm(self) -> None:
        import torch

        device, n = _device(), self.sizes.gemm_n
        a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
        seconds = _timed(lambda: a @ b, device)
        self.emit("gemm", f"bf16 matmul {n}^3", tflops=2 * n**3 / seconds / 1e12, ms=seconds * 1e3, **_machine())
        src = torch.empty(self.sizes.copy_bytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        seconds = _timed(lambda: dst.copy_(src), device)
        self.emit("gemm", f"copy {self.sizes.copy_bytes >> 20} MiB", gb_per_s=2 * src.numel() / seconds / 1e9,
                  ms=seconds * 1e3)  # fmt: skip

    def sdpa(self) -> None:
        import torch
        import torch.nn.functional as F

        device = _device()
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        batch, heads, seq, dim = self.sizes.sdpa
        q, k, v = (torch.randn(batch, heads, seq, dim, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))  # fmt: skip
        mask = torch.ones(seq, seq, device=device, dtype=torch.bool).tril().expand(batch, 1, seq, seq)

        def step(**kwargs: Any) -> None:
            F.scaled_dot_product_attention(q, k, v, **kwargs).sum().backward()

        causal = _timed(lambda: step(is_causal=True), device)
        masked = _timed(lambda: step(attn_mask=mask), device)
        shape = f"batch {batch}, {heads} heads, seq {seq}, head dim {dim}, {dtype}".replace("torch.", "")
        self.emit("sdpa", "causal, no mask", ms=causal * 1e3, shape=shape)
        self.emit("sdpa", "dense boolean mask", ms=masked * 1e3, shape=shape, vs_causal=masked / causal)

    # ---- trainer runs -------------------------------------------------------------------------------------------

    def train(self, part: str, name: str, env: dict[str, str], warmup: int, steps: int, note: str = "") -> None:
        from trainer.bench.runner import OK, RunPlan, row_dir, run_row

        plan = RunPlan(warmup=warmup, steps=steps, timeout_s=self.sizes.timeout_s, work_dir=self.work)
        outcome = run_row(name, env, plan)
        folder = row_dir(plan, name)
        config = _json(folder / "run_config.json")
        decisions = config.get("decisions", {})
        startup = config.get("startup") or {}
        values: dict[str, Any] = {"status": outcome.status, "wall_s": round(outcome.wall_s, 1)}
        if outcome.status != OK:
            values["reason"] = outcome.reason
        m = outcome.measured
        if m is not None:
            values.update(tokens_per_s=m.tokens_per_s, mfu=m.mfu, peak_mem_gib=_gib(m.peak_mem_bytes),
                          step_time_s=m.step_time_s, measured_steps=m.measured_steps)  # fmt: skip
        for key in ("batch_size", "grad_accum", "compile", "precision", "attn", "optim", "packing"):
            if key in decisions:
                values[key] = decisions[key].get("value")
        if "batch_size" in decisions:
            values["batch_reason"] = decisions["batch_size"].get("reason")
        values.update(to_first_step_s=startup.get("to_first_step_s"), compile_s=startup.get("compile_s"),
                      phases_s=startup.get("phases_s"), env=env, logs=str(folder))  # fmt: skip
        if note:
            values["note"] = note
        self.emit(part, name, **values)

    def defaults_env(self) -> dict[str, str]:
        return {"TRAIN_MODEL": self.sizes.model, "TRAIN_SEQ_LEN": str(self.sizes.seq_len)}

    def long_run_env(self) -> tuple[dict[str, str], str]:
        """The defaults as a long run gets them: TRAIN_COMPILE=auto compiles only runs of 200 steps or more, so where
        it would compile a long run here, TRAIN_COMPILE=1 stands for it (as the bench's `auto` row does)."""
        from trainer.bench.machine import machine

        compiles = bool(machine().get("auto_compile"))  # probed in a child: no CUDA context held here
        note = ("TRAIN_COMPILE=1: what auto decides for a long run here" if compiles
                else "TRAIN_COMPILE=auto leaves compile off here, as for a long run")  # fmt: skip
        env = {**self.defaults_env(), **({"TRAIN_COMPILE": "1"} if compiles else {})}
        return env, note + "; medians of the steps after the warm-up; no checkpoint is written in the measured steps"

    def auto(self) -> None:
        env, note = self.long_run_env()
        self.train("auto", "auto", env, self.sizes.warmup, self.sizes.steps, note)

    def warm(self) -> None:
        env, note = self.long_run_env()
        note = "auto again, reusing the compile and batch-search caches of `auto` (same machine, same --work); " + note
        self.train("warm", "auto warm", env, self.sizes.warmup, self.sizes.steps, note)

    def whole(self) -> None:
        env = {**self.defaults_env(), "TRAIN_COMPILE": "1", "TRAIN_COMPILE_SCOPE": "model"}
        note = "the whole model's forward compiled (embeddings, mask, LM head), against auto's regional compile"
        self.train("whole", "whole cold", env, self.sizes.warmup, self.sizes.steps, note)
        if self.dry:
            self.emit("whole", "whole warm", status="skipped", reason="dry run: the warm row repeats the cold one")
            return
        self.train("whole", "whole warm", env, self.sizes.warmup, self.sizes.steps, "again, its compile cache warm")

    def eager(self) -> None:
        env = {**self.defaults_env(), "TRAIN_COMPILE": "0"}
        self.train("eager", "eager", env, self.sizes.warmup, self.sizes.steps)

    def chat(self) -> None:
        corpus = self.work / "chat" / "conversations.jsonl"
        seq_len = max(self.sizes.seq_len, 256)
        write_conversations(corpus, 4000 if not self.dry else 300, seq_len)
        for packing in ("records", "stream"):
            env = {**self.defaults_env(), "TRAIN_SEQ_LEN": str(seq_len), "TRAIN_COMPILE": "0",
                   "TRAIN_DATA": str(corpus), "TRAIN_CHAT_TEMPLATE": "chatml", "TRAIN_PACKING": packing}  # fmt: skip
            self.train("chat", f"chat {packing}", env, self.sizes.warmup, self.sizes.chat_steps)

    def techniques(self) -> None:
        from trainer.bench.catalogue import BASELINE_ENV, catalogue
        from trainer.bench.session import grad_accum_env

        s = self.sizes
        rows = {row.name: dict(row.env) for row in catalogue()}
        base = {**BASELINE_ENV, "TRAIN_MODEL": s.tech_model, "TRAIN_SEQ_LEN": str(s.tech_seq),
                "TRAIN_BATCH_SIZE": str(s.tech_batch)}  # fmt: skip
        chosen = ["fp32", "bf16", "tf32", "adamw_torch_fused", "adamw_bnb_8bit", "grad_accum", "grad_ckpt", "compile",
                  "eager", "lora"]  # fmt: skip
        for name in chosen:
            env = {**base, **rows.get(name, {})}
            if name == "grad_accum":
                env.update(grad_accum_env(s.tech_batch))
            if name == "adamw_bnb_8bit" and not _importable("bitsandbytes"):
                self.emit("techniques", name, status="skipped", reason="bitsandbytes is not importable here")
                continue
            if name == "compile" and self.dry:
                self.emit("techniques", name, status="skipped", reason="dry run: inductor on a CPU takes minutes")
                continue
            if name == "lora":
                env["TRAIN_MODEL"] = str(self.preset_folder(s.tech_model))
            self.train("techniques", name, env, s.tech_warmup, s.tech_steps, note="fp32 baseline plus this row")

    def preset_folder(self, preset: str) -> Path:
        """The preset with fresh weights saved as a model folder (LoRA trains adapters on a pretrained model)."""
        folder = self.work / "models" / preset
        if not (folder / "config.json").exists():
            from transformers import AutoModelForCausalLM

            from trainer.model.build import preset_config
            from trainer.tokenizer import byte_level_tokenizer

            tok = byte_level_tokenizer()
            model = AutoModelForCausalLM.from_config(preset_config(preset, len(tok), self.sizes.tech_seq, tok))
            model.save_pretrained(folder)
            tok.save_pretrained(folder)
        return folder

    def gputests(self) -> None:
        started = time.monotonic()
        command = [sys.executable, "-m", "pytest", "tests/gpu", "-q", "-x", "-p", "no:cacheprovider"]
        try:
            proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=self.sizes.timeout_s)
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            self.emit("gputests", "tests/gpu", status="ok" if proc.returncode in (0, 5) else "failed",
                      rc=proc.returncode, wall_s=round(time.monotonic() - started, 1),
                      summary=tail[-1] if tail else "", tail=tail)  # fmt: skip
        except subprocess.TimeoutExpired:
            self.emit("gputests", "tests/gpu", status="timeout", wall_s=self.sizes.timeout_s)


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


# ---- helpers -----------------------------------------------------------------------------------------------------


def _device() -> Any:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _timed(fn: Callable[[], Any], device: Any, repeat: int = 20) -> float:
    """Seconds per call: the median of `repeat` calls after 3 warm-up calls, timed with CUDA events on a GPU."""
    import statistics

    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
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


def _machine() -> dict[str, Any]:
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


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _gib(value: int | None) -> float | None:
    return round(value / GIB, 2) if value else None


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) < 120 else text[:117] + "..."


# ---- wheels and the table ----------------------------------------------------------------------------------------


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


COLUMNS = ("status", "batch_size", "tokens_per_s", "mfu", "peak_mem_gib", "to_first_step_s", "compile_s", "tflops",
           "gb_per_s", "ms", "vs_fp32_speed", "vs_fp32_mem", "summary")  # fmt: skip


def table(out: Path) -> str:
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    fp32 = next((r for r in reversed(records) if r["part"] == "techniques" and r["name"] == "fp32"), None)
    for r in records:
        if r["part"] == "techniques" and fp32 and fp32.get("tokens_per_s") and r.get("tokens_per_s"):
            r["vs_fp32_speed"] = r["tokens_per_s"] / fp32["tokens_per_s"]
            if fp32.get("peak_mem_gib") and r.get("peak_mem_gib"):
                r["vs_fp32_mem"] = r["peak_mem_gib"] / fp32["peak_mem_gib"]
    lines = ["| part | name | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for r in records:
        cells = [_short(r.get(c)) if r.get(c) is not None else "" for c in COLUMNS]
        lines.append(f"| {r['part']} | {r['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.gpu_run", description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(PARTS), help=f"parts to run, comma-separated: {', '.join(PARTS)}")
    parser.add_argument("--out", type=Path, default=Path("gpu_run.jsonl"), help="JSON lines file results append to")
    parser.add_argument("--work", type=Path, default=Path("gpu_run_work"), help="trainer outputs, logs and caches")
    parser.add_argument("--wheels", type=Path, default=REPO / ".whl", help="folder of the carried wheels")
    parser.add_argument("--dry-run", action="store_true", help="the same driver on the CPU: tiny preset and shapes")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)  # a kernel part's own child
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; the parts are {', '.join(PARTS)}")
    args.parts = [p for p in PARTS if p in parts]
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    os.chdir(REPO)
    if not args.dry_run:  # the wheels are for the GPU machine's Python (3.12); a dry run uses this environment's
        use_wheels(args.wheels, argv)
    for name in ("TRAIN_BATCH_SIZE", "TRAIN_COMPILE", "TRAIN_AUTO_BATCH"):  # the defaults are what `auto` measures
        os.environ.pop(name, None)
    if args.dry_run:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    driver = Driver(args.out.resolve(), args.work.resolve(), DRY if args.dry_run else REAL, args.dry_run)
    failed = 0
    for part in args.parts:
        try:
            if part in IN_CHILD and not args.in_process:
                failed += run_in_child(part, args) != 0
                continue
            getattr(driver, part)()
        except Exception as exc:  # one part failing never stops the others
            failed += 1
            driver.emit(part, part, status="error", reason=f"{type(exc).__name__}: {exc}"[:500])
    if not args.in_process:
        print(table(driver.out), flush=True)
    return 1 if failed else 0


IN_CHILD = ("gemm", "sdpa")  # their CUDA context and cached memory must not stay in the process that starts trainers


def run_in_child(part: str, args: argparse.Namespace) -> int:
    command = [sys.executable, "-m", "benchmarks.gpu_run", "--only", part, "--out", str(args.out.resolve()),
               "--work", str(args.work.resolve()), "--in-process"]  # fmt: skip
    command += ["--dry-run"] if args.dry_run else []
    return subprocess.run(command, cwd=REPO, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
