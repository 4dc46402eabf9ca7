"""The GPU plan in two prepared commands (issue 49 item 8), on one GPU machine without Docker or network.

From the repository root, after `benchmarks/gpu_wheels.sh` filled `.whl/` (docs/benchmarks.md, "The GPU run"):

    python3 -m benchmarks.gpu_run --out gpu_run.jsonl                  # the first command: at most 9 minutes
    python3 -m benchmarks.gpu_run --plan second --out gpu_run.jsonl    # the second command
    python3 -m benchmarks.gpu_run --dry-run [--plan second]            # the same driver on the CPU

The first command, in this order (`--only a,b` picks parts of either):
  imports     `python -X importtime` of what a run imports: total, the 20 slowest modules, trainkit's own share
  gemm        bf16 matmuls at the 1b preset's own shapes (attention and MLP projections, the LM head at the byte-level
              and at Llama-3.2-1B's 128,256-row vocabulary) and an 8192^3 reference; device copy bandwidth
  defaults    A: the 1b preset with the trainer's defaults (TRAIN_COMPILE=1 where auto compiles a long run), the
              search as built (predicted, capped, static after it): batch, probes, tokens/s, MFU, peak, start-up
  static      B: A's batch set, no search in the process: the static graph alone (A ~ B: item 1 holds)
  capped      C: three quarters of A's batch: whether per-token speed rises further from the allocator's limit
  whole       D: C's batch with the whole model compiled (TRAIN_COMPILE_SCOPE=model)
  profile     F: TRAIN_PROFILE=1 on the fastest of A-D: GEMM, attention, elementwise, optimizer, idle ms per step
(E, bf16 activations, is dropped: no measurement gives it a reason, and its design changes what checkpoints hold.)
The second command, one `--only` call per part (SECOND_CALLS: each under a 10-minute call): gputests (tests/gpu),
vocab (A at the 128k vocabulary, the 1b-128k preset, with the full loss and with the chunked one: tokens/s, peak
memory, the batch each search chose), fp8 (bf16 and TRAIN_PRECISION=fp8 at A's batch, compiled: speed,
bf16-equivalent MFU, the loss of the same steps; torchao's wheel is carried), fp8_vocab (bf16 and fp8, both with the
chunked loss, at 128k rows and the chunked row's batch), chat (records vs stream packing), techniques and
techniques2 (the 125m technique table relative to fp32, in two calls). Every trainer row also records the memory
prediction (decisions.memory, trainer.memory.fit) against its measured peak (gpu_support.memory_prediction).
Each trainer run is a `python -m trainer.launch train` subprocess with its own output folder (trainer.bench.runner);
medians over the steps after the warm-up, no checkpoint written while measuring. Each part appends one JSON line
per result to --out as it ends and prints one line; the table of every line in --out is printed last. The dry run
trains for real only the rows whose plumbing differs (A, and F's profile); every other row's settings are resolved
and checked in this process, as the trainer checks them, and its line says `checked`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.gpu_support import (
    GIB,
    REPO,
    device,
    gib,
    import_profile,
    importable,
    machine_facts,
    memory_prediction,
    read_json,
    short,
    table,
    time_by_kind,
    timed,
    use_wheels,
    write_conversations,
)

FIRST = ("imports", "gemm", "defaults", "static", "capped", "whole", "profile")
SECOND = ("gputests", "vocab", "fp8", "fp8_vocab", "chat", "techniques", "techniques2")
PARTS = FIRST + SECOND
LLAMA_32_VOCAB = 128_256
VOCAB_PRESET = "1b-128k"  # trainer/config/presets.py: 1b with Llama-3.2-1B's vocabulary
FP8_MFU = "mfu is bf16-equivalent: the model's FLOPs over the GPU's dense bf16 peak, as for bf16"
# The technique table in two parts of at most 7 rows (each row a few 125m steps), so each fits a 10-minute call; the
# second part's rows are relative to the first's fp32 (the table reads the last fp32 line in --out).
TECHNIQUES = ("fp32", "bf16", "tf32", "adamw_torch_fused", "adamw_bnb_8bit", "grad_accum", "grad_ckpt", "compile",
              "eager", "flash_attention_2", "zero2_offload", "lora", "qlora")  # fmt: skip
TECHNIQUES_SPLIT = 7
RECORDED_DECISIONS = ("batch_size", "grad_accum", "compile", "precision", "attn", "optim", "packing", "cross_entropy")


@dataclass(frozen=True)
class Sizes:
    """What the real run and the dry run measure."""

    model: str
    seq_len: int
    gemm_n: int
    gemm_tokens: int
    copy_bytes: int
    warmup: int
    steps: int
    tech_model: str
    tech_batch: int
    tech_steps: int
    timeout_s: float


REAL = Sizes("1b", 2048, 8192, 8 * 2048, 2 * GIB, 5, 15, "125m", 8, 8, 240)
DRY = Sizes("tiny", 64, 256, 128, 64 << 20, 1, 2, "tiny", 4, 2, 240)


class Driver:
    def __init__(self, out: Path, work: Path, sizes: Sizes, dry: bool) -> None:
        self.out, self.work, self.sizes, self.dry = out, work, sizes, dry
        self.measured: dict[str, tuple[float, dict[str, str], float | None]] = {}  # name: tokens/s, env, step s
        self.batch = 0
        self.compiles: bool | None = None
        work.mkdir(parents=True, exist_ok=True)

    def emit(self, part: str, name: str, **values: Any) -> None:
        record = {"part": part, "name": name, "dry_run": self.dry, "time": time.time(), **values}
        with open(self.out, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        shown = ", ".join(f"{k}={short(v)}" for k, v in values.items() if k not in ("phases_s", "note", "tail", "top"))
        print(f"[{part}] {name}: {shown}", flush=True)

    # ---- the first command ------------------------------------------------------------------------------------

    def imports(self) -> None:
        code = "import trainer.__main__, trainer.run.train, trainer.run.training_model, transformers.trainer"
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=REPO, capture_output=True,
                              text=True, timeout=self.sizes.timeout_s)  # fmt: skip
        profile = import_profile(proc.stderr)
        self.emit("imports", "python -X importtime", status="ok" if proc.returncode == 0 else "error",
                  wall_s=round(time.monotonic() - started, 2), **profile)  # fmt: skip

    def gemm(self) -> None:
        import torch

        from trainer.model.build import preset_config
        from trainer.tokenizer import byte_level_tokenizer

        where, s = device(), self.sizes
        dtype = torch.bfloat16 if where.type == "cuda" else torch.float32
        tok = byte_level_tokenizer()
        c = preset_config(s.model, len(tok), s.seq_len, tok)
        kv = c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
        shapes = {"q, o": (c.hidden_size, c.hidden_size), "k, v": (c.hidden_size, kv),
                  "gate, up": (c.hidden_size, c.intermediate_size), "down": (c.intermediate_size, c.hidden_size),
                  f"lm head ({len(tok)} rows)": (c.hidden_size, len(tok)),
                  f"lm head ({LLAMA_32_VOCAB} rows)": (c.hidden_size, LLAMA_32_VOCAB)}  # fmt: skip
        shapes[f"reference {s.gemm_n}^3"] = (s.gemm_n, s.gemm_n)
        for name, (k, n) in shapes.items():
            m = s.gemm_n if name.startswith("reference") else s.gemm_tokens
            a = torch.randn(m, k, device=where, dtype=dtype)
            b = torch.randn(k, n, device=where, dtype=dtype)
            seconds = timed(lambda a=a, b=b: a @ b, where, repeat=3 if self.dry else 20)  # a CPU's figure is plumbing
            self.emit(
                "gemm",
                f"{name}: {m}x{k} @ {k}x{n}",
                tflops=2 * m * k * n / seconds / 1e12,
                ms=seconds * 1e3,
                dtype=str(dtype).replace("torch.", ""),
                **(machine_facts() if name.startswith("q") else {}),
            )
            del a, b
        src = torch.empty(s.copy_bytes, dtype=torch.uint8, device=where)
        dst = torch.empty_like(src)
        seconds = timed(lambda: dst.copy_(src), where, repeat=3 if self.dry else 20)
        self.emit("gemm", f"copy {s.copy_bytes >> 20} MiB", gb_per_s=2 * src.numel() / seconds / 1e9, ms=seconds * 1e3)

    def defaults(self) -> None:
        env, note = self.long_run_env()
        self.row("defaults", "A defaults", env, note, train_in_dry_run=True)

    def static(self) -> None:
        env = {**self.long_run_env()[0], "TRAIN_AUTO_BATCH": "0", "TRAIN_BATCH_SIZE": str(self.batch_of_a())}
        self.row("static", "B A's batch, no search", env, "the static graph with no search before it")

    def capped(self) -> None:
        self.row("capped", "C 3/4 of A's batch", self.capped_env(), "further from the allocator's limit than A")

    def whole(self) -> None:
        env = {**self.capped_env(), "TRAIN_COMPILE": "1", "TRAIN_COMPILE_SCOPE": "model"}
        self.row("whole", "D whole-model compile", env, "C's batch, the whole model's forward compiled")

    def profile(self) -> None:
        best = max(self.measured, key=lambda k: self.measured[k][0]) if self.measured else None
        _speed, env, step_s = self.measured[best] if best else (0.0, self.long_run_env()[0], None)
        env = {**env, "TRAIN_PROFILE": "1"}
        self.train("profile", f"F profile of {best or 'A'}", env, 2, 4, note="steps 3-5 profiled", kinds_of=step_s)

    # ---- the second command -----------------------------------------------------------------------------------

    def gputests(self) -> None:
        started = time.monotonic()
        command = [sys.executable, "-m", "pytest", "tests/gpu", "-q", "-rfE", "-p", "no:cacheprovider"]
        command += ["--collect-only"] if self.dry else []
        try:
            proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=540)
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-40:]  # -rfE names every failure
            self.emit("gputests", "tests/gpu", status="ok" if proc.returncode in (0, 5) else "failed",
                      rc=proc.returncode, wall_s=round(time.monotonic() - started, 1),
                      summary=tail[-1] if tail else "", tail=tail)  # fmt: skip
        except subprocess.TimeoutExpired:
            self.emit("gputests", "tests/gpu", status="timeout", wall_s=540)

    def vocab(self) -> None:
        """A at Llama-3.2-1B's vocabulary (the 1b-128k preset: 1b's shape with 128,256 rows), each with its own search:
        Transformers' loss on the whole logits against the chunked loss (what auto picks there)."""
        for loss in ("full", "chunked"):
            env = {**self.long_run_env()[0], "TRAIN_MODEL": VOCAB_PRESET, "TRAIN_CROSS_ENTROPY": loss}
            self.row("vocab", f"A at {LLAMA_32_VOCAB} rows, {loss} loss", env,
                     f"the defaults at the real vocabulary, TRAIN_CROSS_ENTROPY={loss}: the batch its search chose")

    def fp8(self) -> None:
        """FP8 against bf16 at one batch (A's), both compiled: tokens/s, MFU (bf16-equivalent for fp8) and the mean
        loss of the same measured steps. The dry run checks both rows' settings (fp8 is refused on a CPU, with the
        trainer's message) and converts the tiny preset with the installed torchao (the layers fp8 would convert)."""
        batch = self.batch_of_a()
        base = {**self.long_run_env()[0], "TRAIN_COMPILE": "1", "TRAIN_AUTO_BATCH": "0", "TRAIN_BATCH_SIZE": str(batch)}
        self.row("fp8", f"bf16 at batch {batch} (fp8's reference)", {**base, "TRAIN_PRECISION": "bf16"},
                 "the same batch, steps and data as the fp8 row: its loss is fp8's reference")  # fmt: skip
        self.row("fp8", "TRAIN_PRECISION=fp8", {**base, "TRAIN_PRECISION": "fp8"}, f"{FP8_MFU}; loss against bf16's")
        if self.dry:
            self.fp8_conversion()

    def fp8_vocab(self) -> None:
        """bf16 and FP8 at 128k rows, both with the chunked loss, compiled, at the batch the vocab part's chunked row
        chose (no search): what FP8 gains where the LM head and the loss weigh as in Llama-3.2-1B."""
        batch = self.batch_of("vocab", f"A at {LLAMA_32_VOCAB} rows, chunked loss")
        base = {**self.long_run_env()[0], "TRAIN_MODEL": VOCAB_PRESET, "TRAIN_CROSS_ENTROPY": "chunked",
                "TRAIN_COMPILE": "1", "TRAIN_AUTO_BATCH": "0", "TRAIN_BATCH_SIZE": str(batch)}  # fmt: skip
        for precision in ("bf16", "fp8"):
            self.row("fp8_vocab", f"{precision} at {LLAMA_32_VOCAB} rows, chunked loss, batch {batch}",
                     {**base, "TRAIN_PRECISION": precision}, f"{FP8_MFU}" if precision == "fp8" else "fp8's reference")

    def fp8_conversion(self) -> None:
        from transformers import AutoModelForCausalLM

        from trainer.model.build import preset_config
        from trainer.model.float8 import convert_to_fp8
        from trainer.tokenizer import byte_level_tokenizer

        tok = byte_level_tokenizer()
        model = AutoModelForCausalLM.from_config(preset_config(self.sizes.model, len(tok), self.sizes.seq_len, tok))
        converted = convert_to_fp8(model)
        kinds = {type(module).__name__ for name, module in model.named_modules() if name in converted}
        self.emit("fp8", f"conversion of {self.sizes.model}", status="ok" if kinds == {"Float8Linear"} else "error",
                  converted=len(converted), lm_head=type(model.get_output_embeddings()).__name__)  # fmt: skip

    def chat(self) -> None:
        corpus = self.work / "chat" / "conversations.jsonl"
        seq_len = max(self.sizes.seq_len, 256)
        write_conversations(corpus, 300 if self.dry else 4000, seq_len)
        for packing in ("records", "stream"):
            env = {**self.defaults_env(), "TRAIN_SEQ_LEN": str(seq_len), "TRAIN_COMPILE": "0",
                   "TRAIN_DATA": str(corpus), "TRAIN_CHAT_TEMPLATE": "chatml", "TRAIN_PACKING": packing}  # fmt: skip
            self.row("chat", f"chat {packing}", env, steps=self.sizes.tech_steps)

    def techniques(self) -> None:
        self.technique_rows("techniques", TECHNIQUES[:TECHNIQUES_SPLIT])

    def techniques2(self) -> None:
        self.technique_rows("techniques2", TECHNIQUES[TECHNIQUES_SPLIT:])

    def technique_rows(self, part: str, names: tuple[str, ...]) -> None:
        from trainer.bench.catalogue import BASELINE_ENV, catalogue
        from trainer.bench.session import grad_accum_env

        s = self.sizes
        rows = {row.name: dict(row.env) for row in catalogue()}
        base = {**BASELINE_ENV, "TRAIN_MODEL": s.tech_model, "TRAIN_SEQ_LEN": str(s.seq_len),
                "TRAIN_BATCH_SIZE": str(s.tech_batch)}  # fmt: skip
        for name in names:
            env = {**base, **rows.get(name, {})}
            if name == "grad_accum":
                env.update(grad_accum_env(s.tech_batch))
            if name == "adamw_bnb_8bit" and not importable("bitsandbytes"):
                self.emit(part, name, status="skipped", reason="bitsandbytes is not importable here")
                continue
            if name in ("lora", "qlora"):
                env["TRAIN_MODEL"] = str(self.preset_folder(s.tech_model))
            self.row(part, name, env, "fp32 baseline plus this row", steps=s.tech_steps)

    # ---- rows ---------------------------------------------------------------------------------------------------

    def row(self, part: str, name: str, env: dict[str, str], note: str = "", steps: int = 0,
            train_in_dry_run: bool = False) -> None:  # fmt: skip
        if self.dry and not train_in_dry_run:
            self.check(part, name, env, note)
        else:
            self.train(part, name, env, self.sizes.warmup, steps or self.sizes.steps, note)

    def check(self, part: str, name: str, env: dict[str, str], note: str) -> None:
        """The dry run's stand-in for a trainer run: the row's settings resolved and checked in this process."""
        from trainer import config, memory
        from trainer.bench.runner import RunPlan, child_environment
        from trainer.errors import ConfigError

        plan = RunPlan(warmup=1, steps=1, timeout_s=self.sizes.timeout_s, work_dir=self.work)
        full = child_environment(env, plan, self.work / "checked" / part)
        try:
            decisions = memory.predicted(config.resolve(config.load_inputs(full), environ=full)).decisions.to_dict()
        except ConfigError as exc:
            self.emit(part, name, status="skipped", reason=str(exc)[:500], env=env)
            return
        keys = ("batch_size", "compile", "precision", "attn", "cross_entropy")
        picked = {k: decisions[k]["value"] for k in keys if k in decisions}
        predicted = memory_prediction(decisions.get("memory", {}).get("value"))
        self.emit(part, name, status="checked", **picked, **predicted, env=env,
                  note=f"dry run: settings resolved and checked, not trained; {note}")  # fmt: skip

    def train(self, part: str, name: str, env: dict[str, str], warmup: int, steps: int, note: str = "",
              kinds_of: float | None = None) -> None:  # fmt: skip
        from trainer.bench.runner import OK, RunPlan, row_dir, run_row
        from trainer.config import run_record

        plan = RunPlan(warmup=warmup, steps=steps, timeout_s=self.sizes.timeout_s, work_dir=self.work)
        slug = re.sub(r"\W+", "_", name).strip("_")
        outcome = run_row(slug, env, plan)
        folder = row_dir(plan, slug)
        run = run_record.read(folder)  # None when the row's run wrote no record
        startup = run.startup.to_dict() if run and run.startup else {}
        values: dict[str, Any] = {"status": outcome.status, "wall_s": round(outcome.wall_s, 1)}
        if outcome.status != OK:
            values["reason"] = outcome.reason
        m = outcome.measured
        if m is not None:
            values.update(tokens_per_s=m.tokens_per_s, mfu=m.mfu, peak_mem_gib=gib(m.peak_mem_bytes),
                          step_time_s=m.step_time_s, measured_steps=m.measured_steps, loss=m.loss)  # fmt: skip
            if env.get("TRAIN_PRECISION") == "fp8":
                values["mfu_basis"] = "bf16-equivalent"
            if part in ("defaults", "static", "capped", "whole"):
                self.measured[name.split()[0]] = (m.tokens_per_s, env, m.step_time_s)
        if run is not None:
            for key in RECORDED_DECISIONS:
                values[key] = getattr(run.decisions, key).value
            values["batch_reason"] = run.decisions.batch_size.reason
            self.batch = self.batch or (int(values["batch_size"]) if part == "defaults" else 0)
        if part == "profile":
            summary = read_json(folder / "summary-rank0.json")
            values["ms_per_step"] = time_by_kind(summary, kinds_of or values.get("step_time_s"))
        predicted = run.decisions.memory.value if run is not None else None
        values.update(memory_prediction(predicted, values.get("peak_mem_gib")))
        values.update(to_first_step_s=startup.get("to_first_step_s"), compile_s=startup.get("compile_s"),
                      phases_s=startup.get("phases_s"), env=env, logs=str(folder))  # fmt: skip
        self.emit(part, name, **values, **({"note": note} if note else {}))

    def defaults_env(self) -> dict[str, str]:
        return {"TRAIN_MODEL": self.sizes.model, "TRAIN_SEQ_LEN": str(self.sizes.seq_len)}

    def long_run_env(self) -> tuple[dict[str, str], str]:
        """The defaults as a long run gets them: TRAIN_COMPILE=auto compiles only runs of 200 steps or more, so where
        it would compile a long run here, TRAIN_COMPILE=1 stands for it (as the bench's `auto` row does)."""
        compiles = self.auto_compiles()
        note = ("TRAIN_COMPILE=1: what auto decides for a long run here" if compiles
                else "TRAIN_COMPILE=auto leaves compile off here, as for a long run")  # fmt: skip
        env = {**self.defaults_env(), **({"TRAIN_COMPILE": "1"} if compiles else {})}
        return env, note + "; medians of the steps after the warm-up; no checkpoint is written in the measured steps"

    def auto_compiles(self) -> bool:
        """Whether auto compiles a long run here: probed once per call, in a child (no CUDA context held here)."""
        if self.compiles is None:
            from trainer.bench.machine import machine

            self.compiles = bool(machine().get("auto_compile"))
        return self.compiles

    def batch_of_a(self) -> int:
        """The batch A's search chose (its decision in run_config.json): this call's A, else the last A in --out (the
        first command's, for the second), else 8."""
        return self.batch or self.batch_of("defaults")

    def batch_of(self, part: str, name: str | None = None) -> int:
        """The batch of the last line of `part` (and `name`) in --out with one, of this kind of run (dry or not), else
        8: a later call takes an earlier call's batch."""
        lines = self.out.read_text().splitlines() if self.out.exists() else []
        found = [r for r in map(json.loads, lines) if r.get("part") == part and r.get("batch_size")
                 and r.get("dry_run") == self.dry and name in (None, r.get("name"))]  # fmt: skip
        return int(found[-1]["batch_size"]) if found else 8

    def capped_env(self) -> dict[str, str]:
        batch = max(1, self.batch_of_a() * 3 // 4)
        return {**self.long_run_env()[0], "TRAIN_AUTO_BATCH": "0", "TRAIN_BATCH_SIZE": str(batch)}

    def preset_folder(self, preset: str) -> Path:
        """The preset with fresh weights saved as a model folder (LoRA trains adapters on a pretrained model)."""
        folder = self.work / "models" / preset
        if not (folder / "config.json").exists():
            from transformers import AutoModelForCausalLM

            from trainer.model.build import preset_config
            from trainer.tokenizer import byte_level_tokenizer

            tok = byte_level_tokenizer()
            model = AutoModelForCausalLM.from_config(preset_config(preset, len(tok), self.sizes.seq_len, tok))
            model.save_pretrained(folder)
            tok.save_pretrained(folder)
        return folder


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.gpu_run", description=__doc__.split("\n")[0])
    parser.add_argument("--plan", choices=("first", "second"), default="first", help="which prepared command")
    parser.add_argument("--only", default="", help=f"parts to run instead, comma-separated: {', '.join(PARTS)}")
    parser.add_argument("--out", type=Path, default=Path("gpu_run.jsonl"), help="JSON lines file results append to")
    parser.add_argument("--work", type=Path, default=Path("gpu_run_work"), help="trainer outputs, logs and caches")
    parser.add_argument("--wheels", type=Path, default=REPO / ".whl", help="folder of the carried wheels")
    parser.add_argument("--dry-run", action="store_true", help="the same driver on the CPU: tiny preset and shapes")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)  # a kernel part's own child
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.only.split(",") if p.strip()] or list(FIRST if args.plan == "first" else SECOND)
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; the parts are {', '.join(PARTS)}")
    args.parts = [p for p in PARTS if p in parts]
    return args


IN_CHILD = ("gemm",)  # its CUDA context and cached memory must not stay in the process that starts trainers


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    os.chdir(REPO)
    if not args.dry_run:  # the wheels are for the GPU machine's Python (3.12); a dry run uses this environment's
        use_wheels(args.wheels, argv)
    for name in ("TRAIN_BATCH_SIZE", "TRAIN_COMPILE", "TRAIN_AUTO_BATCH"):  # the defaults are what A measures
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


def run_in_child(part: str, args: argparse.Namespace) -> int:
    command = [sys.executable, "-m", "benchmarks.gpu_run", "--only", part, "--out", str(args.out.resolve()),
               "--work", str(args.work.resolve()), "--in-process"]  # fmt: skip
    command += ["--dry-run"] if args.dry_run else []
    return subprocess.run(command, cwd=REPO, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
