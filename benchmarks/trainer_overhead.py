"""Overhead of `python -m trainer` against a plain Transformers `Trainer` script, and tokenize+pack throughput.

    .venv/bin/python -m benchmarks.trainer_overhead [--steps 60] [--batch 8] [--seq 128] [--repeats 3]

Part 1 trains the same tiny Llama (the `tiny` preset's config, byte-level tokenizer) on the same JSONL data with
the same steps, batch, sequence length, optimizer and precision:
  A. a minimal plain script: datasets.map tokenize + group_texts, `Trainer`, save the model;
  B. `python -m trainer` (checkpoints, metrics.jsonl, signal handling, run_config.json...);
each in one process, and in two processes over gloo: A under `torchrun --standalone --nproc-per-node 2`, B
through its own launcher (`python -m trainer.launch`, TRAIN_NPROC_PER_NODE=2, which runs the same torchrun).
A and B run side by side, at the same time (which of them starts first alternates from one repeat to the next):
on a machine shared with other work, whatever load comes and goes falls on both alike, where runs one after the
other would each see a different load. Reported, for one and two processes, as the ratio of the best of the
repeats and as each repeat's own (paired) ratio with their median:
  - wall: the whole process, start to exit (imports, data, training, saves), best of the repeats;
  - steady step: the median optimizer-step time (rank 0) after the first 3 steps, timed the same way in both
    (between consecutive step ends), best of the repeats;
  - CPU time: user+sys seconds of the whole process tree (its workers included). Wall times swing with the load;
    CPU time barely does, so it is the steadier overhead measure on a shared machine.
The ratio B/A is the overhead (goal <= 1.01). Both get OMP_NUM_THREADS=--threads per process (default 1: less
sensitive to other load). The load average is printed before and after.

Part 2 (skip with --skip-tokenize) times tokenize+pack of the same JSONL (in this process):
`trainer.data.shards.prepare` against the classic `datasets.load_dataset` + `.map(tokenize, batched=True)` +
`.map(group_texts, batched=True)` (in memory, no cache files), with the byte-level tokenizer and with a BPE
tokenizer trained here on the data. The ratio is ours/baseline in tokens per second (goal >= 1.0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BASELINE = textwrap.dedent(
    """
    import json, sys, time
    from itertools import chain
    from datasets import load_dataset
    from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Trainer, TrainerCallback,
                              TrainingArguments, default_data_collator, set_seed)

    cfg = json.loads(sys.argv[1])
    tok = AutoTokenizer.from_pretrained(cfg["tokenizer"])
    seq = cfg["seq"]
    args = TrainingArguments(output_dir=cfg["out"], save_strategy="steps", save_steps=10**9, **cfg["args"])

    def group_texts(batch):
        joined = {k: list(chain(*batch[k])) for k in batch}
        total = len(joined["input_ids"]) // seq * seq
        out = {k: [v[i : i + seq] for i in range(0, total, seq)] for k, v in joined.items()}
        out["labels"] = out["input_ids"].copy()
        return out

    with args.main_process_first(desc="tokenize"):  # as Transformers' examples do: rank 0 maps, the others load
        raw = load_dataset("json", data_files=cfg["data"], split="train")
        tokenized = raw.map(lambda b: tok(b["text"]), batched=True, remove_columns=raw.column_names)
        # No attention_mask column: all ones anyway, and trainkit's packed blocks have none (same compute path).
        train = tokenized.map(group_texts, batched=True).remove_columns(["attention_mask"])
    set_seed(cfg["args"]["seed"])
    model = AutoModelForCausalLM.from_config(
        LlamaConfig.from_pretrained(cfg["model_config"]), attn_implementation=cfg["attn"])

    class StepTimes(TrainerCallback):
        times, last = [], None
        def on_train_begin(self, *a, **k): StepTimes.last = time.perf_counter()
        def on_step_end(self, *a, **k):
            now = time.perf_counter(); StepTimes.times.append(now - StepTimes.last); StepTimes.last = now
        def on_save(self, *a, **k): StepTimes.last = time.perf_counter()

    trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=default_data_collator,
                      processing_class=tok, callbacks=[StepTimes()])
    trainer.train()
    trainer.save_model(cfg["out"] + "/final")
    if args.process_index == 0:
        print("STEP_TIMES " + json.dumps(StepTimes.times))
    """
)

# TrainingArguments the plain script copies from `python -m trainer config --json`, so both do the same work.
SHARED_ARGS = (
    "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "max_steps", "seed", "optim",
    "bf16", "fp16", "tf32", "use_cpu", "dataloader_num_workers", "dataloader_pin_memory", "logging_steps",
    "logging_first_step", "report_to", "lr_scheduler_type", "weight_decay", "warmup_steps",
)  # fmt: skip


def write_jsonl(path: Path, megabytes: float) -> None:
    """Paragraphs of the embedded corpus, repeated and numbered, as JSONL records."""
    from trainer.data.discovery import EMBEDDED_CORPUS

    paragraphs = [p for p in EMBEDDED_CORPUS.read_text().split("\n\n") if p.strip()]
    size, i = 0, 0
    with open(path, "w", encoding="utf-8") as fh:
        while size < megabytes * 1e6:
            line = json.dumps({"text": f"{i}. {paragraphs[i % len(paragraphs)]}"}) + "\n"
            fh.write(line)
            size += len(line)
            i += 1


def trainer_env(data: Path, out: Path, a: argparse.Namespace) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN_")}
    env.update(
        TRAIN_MODEL="tiny", TRAIN_DATA=str(data), TRAIN_OUTPUT_DIR=str(out), TRAIN_SEQ_LEN=str(a.seq),
        TRAIN_BATCH_SIZE=str(a.batch), TRAIN_MAX_STEPS=str(a.steps), TRAIN_SAVE_STEPS=str(10**9),
        TRAIN_LOG_STEPS="1", TRAIN_NUM_WORKERS="0", PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(a.threads),
    )  # fmt: skip
    return env


def resolved_config(env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "config", "--json"], env=env, cwd=REPO, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(f"python -m trainer config failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def prepare_baseline_inputs(tmp: Path, a: argparse.Namespace, config: dict) -> dict:
    from trainer.model.build import preset_config
    from trainer.tokenizer import byte_level_tokenizer

    tok = byte_level_tokenizer()
    tok.save_pretrained(tmp / "tokenizer")
    preset_config("tiny", len(tok), a.seq, tok).save_pretrained(tmp / "model_config")
    targs = config["training_arguments"]
    args = {k: targs[k] for k in SHARED_ARGS if k in targs and targs[k] is not None}
    return {
        "tokenizer": str(tmp / "tokenizer"), "model_config": str(tmp / "model_config"), "seq": a.seq,
        "attn": config["decisions"]["attn"]["value"], "args": args,
    }  # fmt: skip


def steady(times: list[float]) -> float:
    return statistics.median(times[3:] if len(times) > 6 else times)


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node"]


def plain_command(script: Path, inputs: dict, data: Path, out: Path, a: argparse.Namespace, nproc: int) -> tuple:
    cfg = {**inputs, "data": str(data), "out": str(out)}
    launch = [sys.executable] if nproc == 1 else [*TORCHRUN, str(nproc)]
    return [*launch, str(script), json.dumps(cfg)], {**os.environ, "OMP_NUM_THREADS": str(a.threads)}


def trainkit_command(data: Path, out: Path, a: argparse.Namespace, nproc: int) -> tuple:
    env = trainer_env(data, out, a)
    if nproc > 1:
        env["TRAIN_NPROC_PER_NODE"] = str(nproc)  # the launcher runs torchrun --standalone, as the plain side does
    return [sys.executable, "-m", "trainer" if nproc == 1 else "trainer.launch"], env


def plain_steps(log: str, out: Path) -> list[float]:
    return json.loads(log.split("STEP_TIMES ", 1)[1].splitlines()[0])


def trainkit_steps(log: str, out: Path) -> list[float]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["step_time_s"] for r in rows if r["step_time_s"] is not None]


def run_side_by_side(runs: dict[str, tuple], logs: Path) -> dict[str, tuple[float, float, float]]:
    """Start every run at once; {side: (wall s, steady step s, CPU s of its process tree)}. Each child is reaped as
    it ends (os.wait4 gives its own rusage, its waited-for workers included)."""
    started, results = {}, {}
    for side, (argv, env, _out, _parse) in runs.items():
        with open(logs / f"{side}.log", "w") as fh:
            proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT)
        started[proc.pid] = (side, time.perf_counter())
    while started:
        pid, status, usage = os.wait4(-1, 0)
        if pid not in started:
            continue
        side, began = started.pop(pid)
        wall = time.perf_counter() - began
        _argv, _env, out, parse = runs[side]
        log = (logs / f"{side}.log").read_text()
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"{side} run failed:\n{log[-4000:]}")
        results[side] = (wall, steady(parse(log, out)), usage.ru_utime + usage.ru_stime)
    return results


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def overhead(a: argparse.Namespace, tmp: Path, data: Path) -> None:
    config = resolved_config(trainer_env(data, tmp / "probe", a))
    inputs = prepare_baseline_inputs(tmp, a, config)
    script = tmp / "plain_trainer.py"
    script.write_text(BASELINE)
    results: dict[int, list[dict]] = {n: [] for n in a.nprocs}
    print(f"before: {load()}", flush=True)
    for r in range(a.repeats):
        for nproc in a.nprocs:
            out = {side: tmp / f"{side}-{nproc}-{r}" for side in ("plain", "trainkit")}
            runs = {
                "plain": (*plain_command(script, inputs, data, out["plain"], a, nproc), out["plain"], plain_steps),
                "trainkit": (*trainkit_command(data, out["trainkit"], a, nproc), out["trainkit"], trainkit_steps),
            }
            if r % 2:  # the one started first gets a head start: alternate it
                runs = dict(reversed(runs.items()))
            logs = tmp / f"logs-{nproc}-{r}"
            logs.mkdir()
            results[nproc].append(run_side_by_side(runs, logs))
            for side in ("plain", "trainkit"):
                wall, step, cpu = results[nproc][-1][side]
                print(f"  repeat {r + 1} {nproc} proc {side:8s}: wall {wall:6.2f}s  step {step * 1e3:6.1f}ms  "
                      f"cpu {cpu:6.2f}s  ({load()})", flush=True)  # fmt: skip
    print(f"after: {load()}")
    report(a, config, inputs, results)


def report(a: argparse.Namespace, config: dict, inputs: dict, results: dict[int, list[dict]]) -> None:
    precision = config["decisions"]["precision"]["value"]
    print(
        f"\nTraining overhead ({a.steps} steps, batch {a.batch} per process, seq {a.seq}, {precision}, "
        f"optim {inputs['args'].get('optim')}; {a.repeats} repeats, plain and trainkit running at the same time; "
        "ratio trainkit/plain, goal <= 1.01):"
    )
    measures = (("steady-state step (median)", 1, 1e3, "ms"), ("wall time (whole process)", 0, 1, "s"),
                ("CPU time (whole process)", 2, 1, "s"))  # fmt: skip
    for nproc, repeats in results.items():
        print(f"  {'1 process' if nproc == 1 else f'{nproc} processes (gloo)'}:")
        for name, i, scale, unit in measures:
            plain = min(x["plain"][i] for x in repeats)
            ours = min(x["trainkit"][i] for x in repeats)
            paired = [x["trainkit"][i] / x["plain"][i] for x in repeats]
            print(f"    {name:28s} plain {plain * scale:8.2f}{unit:2s} trainkit {ours * scale:8.2f}{unit:2s} "
                  f"ratio of bests {ours / plain:.3f}; per repeat "
                  f"{', '.join(f'{p:.3f}' for p in paired)} (median {statistics.median(paired):.3f})")  # fmt: skip


def train_bpe(data: Path, folder: Path, vocab: int = 8192):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [json.loads(line)["text"] for line in data.read_text().splitlines()[:20000]]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|eos|>"]))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|eos|>", pad_token="<|eos|>")
    tok.save_pretrained(folder)
    return tok


def baseline_tokenize_pack(data: Path, tok, seq: int) -> int:
    from benchmarks.data_prep import pack_with_datasets_map

    return pack_with_datasets_map(data, tok, seq)


def trainkit_tokenize_pack(data: Path, tok, seq: int) -> int:
    from trainer.data.discovery import discover
    from trainer.data.shards import prepare
    from trainer.data.spec import DataSpec

    with tempfile.TemporaryDirectory(dir=data.parent) as folder:
        return prepare(discover(str(data)), tok, DataSpec(seq), Path(folder))["tokens"] // seq * seq


def timed(fn, *args) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = fn(*args)
    return time.perf_counter() - start, tokens


def tokenize_throughput(a: argparse.Namespace, tmp: Path, data: Path) -> None:
    import datasets

    from trainer.tokenizer import byte_level_tokenizer

    datasets.disable_progress_bars()
    mb = data.stat().st_size / 1e6
    print(f"\nTokenize + pack ({mb:.1f} MB JSONL, seq {a.seq}; best of {a.repeats}):")
    for name, tok in (("byte-level", byte_level_tokenizer()), ("BPE 8k", train_bpe(data, tmp / "bpe"))):
        base = min((timed(baseline_tokenize_pack, data, tok, a.seq) for _ in range(a.repeats)), key=lambda x: x[0])
        ours = min((timed(trainkit_tokenize_pack, data, tok, a.seq) for _ in range(a.repeats)), key=lambda x: x[0])
        base_rate, our_rate = base[1] / base[0], ours[1] / ours[0]
        print(f"  {name:10s} datasets.map {base_rate / 1e6:7.2f} M tok/s ({base[0]:.2f}s)   "
              f"trainer.data {our_rate / 1e6:7.2f} M tok/s ({ours[0]:.2f}s)   ratio {our_rate / base_rate:.2f}"
              "   (goal >= 1.0)")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of both training processes")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--nprocs", default="1,2", help="process counts to compare, e.g. 1 or 1,2")
    p.add_argument("--data-mb", type=float, default=20.0, help="size of the JSONL for the tokenize benchmark")
    p.add_argument("--skip-training", action="store_true")
    p.add_argument("--skip-tokenize", action="store_true")
    a = p.parse_args()
    a.nprocs = [int(n) for n in a.nprocs.split(",")]
    with tempfile.TemporaryDirectory(prefix="trainkit-overhead-") as name:
        tmp = Path(name)
        train_data = tmp / "train.jsonl"
        write_jsonl(train_data, 2.0)
        print(f"machine: {os.cpu_count()} CPUs; python {sys.version.split()[0]}")
        if not a.skip_training:
            overhead(a, tmp, train_data)
        if not a.skip_tokenize:
            tok_data = tmp / "tokenize.jsonl"
            write_jsonl(tok_data, a.data_mb)
            tokenize_throughput(a, tmp, tok_data)


if __name__ == "__main__":
    main()
