"""Data preparation at corpus scale: memory flat in the corpus size, throughput per core, against datasets.map.

    .venv/bin/python -m benchmarks.data_prep [--small-mb 40] [--factor 10] [--seq 512] [--workers 0,auto]

Generates a JSONL corpus of --small-mb and one --factor times larger (paragraphs of the embedded corpus, numbered),
and prepares each with trainkit's streaming preparation (trainer.data.shards.prepare, byte-level tokenizer, the
presets' tokenizer) in a fresh process per run, with each --workers setting (0: in the main process; auto: what a
run picks). Each run reports the peak resident memory of its main process and of its largest worker, and tokens/s
(preparation only: imports and interpreter start excluded) in total and per core. Printed:
  - memory ratio: peak RSS (main + largest worker) for the larger corpus / for the small one (goal <= 1.2);
  - throughput ratio: trainkit tokens/s / a plain `datasets.load_dataset("json")` + `.map(tokenize, batched=True)`
    + `.map(group_texts, batched=True)` baseline (in memory, same tokenizer, same small corpus) (goal >= 1.0);
  - the data fingerprint a run's provenance.json records (sha256 of the large corpus, taken from the bytes the
    preparation reads: trainer.provenance.StreamHash) / the preparation time (goal <= 5%).
Everything runs in one invocation, side by side, on this machine.

    .venv/bin/python -m benchmarks.data_prep --corpus chat --small-mb 50 --factor 8 --seq 2048

Records packing (TRAIN_PACKING=records, trainer/data/packing.py) on a generated chat-like corpus: prompt/completion
records of log-normal lengths (a few longer than --seq, truncated). Printed: the padding share (goal <= 5%), the
memory ratio of the larger corpus to the small one (goal <= 1.2), and tokens/s against stream packing of the same
corpus (what the packer costs).

    .venv/bin/python -m benchmarks.data_prep --corpus mix --small-mb 20 --factor 8

A mixed corpus (trainer/data/mixed.py): plain text (70% of the trained tokens) and chat-like prompt/completion
records (30%), each prepared into its own cache entry, then mixed and 2,000 of its sequences read. Printed: the
memory ratio of the larger corpora to the small ones (goal <= 1.2) and the shares reached.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_jsonl(path: Path, megabytes: float) -> None:
    """Paragraphs of the embedded corpus, numbered, as JSONL records (written in blocks: fast, flat memory)."""
    from trainer.data.discovery import EMBEDDED_CORPUS

    paragraphs = [p for p in EMBEDDED_CORPUS.read_text().split("\n\n") if p.strip()]
    size, start = 0, 0
    with open(path, "w", encoding="utf-8") as handle:
        while size < megabytes * 1e6:
            block = "".join(
                json.dumps({"text": f"{i}. {paragraphs[i % len(paragraphs)]}", "id": i}) + "\n"
                for i in range(start, start + 2000)
            )
            handle.write(block)
            size, start = size + len(block.encode()), start + 2000


def write_chat_jsonl(path: Path, megabytes: float) -> None:
    """Chat-like prompt/completion records of varied lengths (log-normal word counts, a few longer than a sequence),
    numbered, from the embedded corpus's words (written in blocks: fast, flat memory)."""
    import random

    from trainer.data.discovery import EMBEDDED_CORPUS

    words = EMBEDDED_CORPUS.read_text().split()
    rng = random.Random(0)
    size, i = 0, 0
    with open(path, "w", encoding="utf-8") as handle:
        while size < megabytes * 1e6:
            lines = []
            for _ in range(2000):
                start = rng.randrange(len(words) - 4000)
                prompt = " ".join(words[start : start + int(rng.lognormvariate(3.0, 0.9)) + 1])
                end = start + int(rng.lognormvariate(4.2, 0.9)) + 1
                lines.append(json.dumps({"prompt": f"{i}. {prompt}", "completion": " " + " ".join(words[start:end])}))
                i += 1
            block = "\n".join(lines) + "\n"
            handle.write(block)
            size += len(block.encode())


def peak_rss() -> int:
    from trainer.data.shards import peak_rss_bytes

    return peak_rss_bytes()


# ---- the measured children --------------------------------------------------------------------------------------


def child_trainkit(data: Path, seq: int, workers: str, packing: str = "auto") -> dict:
    from trainer.data.discovery import discover
    from trainer.data.shards import prepare
    from trainer.data.spec import DataSpec
    from trainer.provenance import fingerprints, stream_hash_seconds
    from trainer.tokenizer import byte_level_tokenizer

    tokenizer = byte_level_tokenizer()
    spec = DataSpec(seq, packing=packing, workers=None if workers == "auto" else int(workers))
    with tempfile.TemporaryDirectory(prefix="data-prep-", dir=data.parent) as folder:
        meta = prepare(discover(str(data)), tokenizer, spec, Path(folder))
    return {"tokens": meta["tokens"], "seconds": meta["seconds"], "workers": meta["workers"], "cores": meta["cores"],
            "rss": peak_rss(), "worker_rss": meta["peak_rss_worker_bytes"], "packing": meta["packing"],
            "hash_seconds": stream_hash_seconds(), "sha256": fingerprints([data], {})[str(data)]["sha256"]}  # fmt: skip


def child_mix(folder: Path, seq: int) -> dict:
    """Both sources of `folder` prepared, mixed 0.7/0.3, and 2,000 mixed sequences read; the peak RSS of it all."""
    from trainer.data.discovery import discover
    from trainer.data.mix import parse_mix
    from trainer.data.mixed import prepare_mix
    from trainer.data.spec import DataSpec
    from trainer.tokenizer import byte_level_tokenizer

    mix = parse_mix(f"{folder / 'text.jsonl'}:0.7,{folder / 'chat.jsonl'}:0.3")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="data-mix-", dir=folder) as cache:
        mixed, _ = prepare_mix(mix, [discover(e.source) for e in mix.entries], byte_level_tokenizer(), DataSpec(seq),
                               Path(cache), seed=0)  # fmt: skip
        for i in range(0, len(mixed), max(1, len(mixed) // 2000)):
            mixed[i]
    seconds = time.perf_counter() - start
    return {"tokens": mixed.report["trained_tokens"], "seconds": seconds, "workers": 0, "cores": 1, "rss": peak_rss(),
            "worker_rss": 0, "shares": {r["name"]: r["achieved_share"] for r in mixed.report["sources"]}}  # fmt: skip


def pack_with_datasets_map(data: Path, tok, seq: int, cache_dir: Path | None = None) -> int:
    """The classic recipe (load_dataset, .map(tokenize), .map(group_texts), in memory); returns tokens packed."""
    from itertools import chain

    from datasets import load_dataset

    raw = load_dataset("json", data_files=str(data), split="train", keep_in_memory=True,
                       cache_dir=str(cache_dir) if cache_dir else None)  # fmt: skip
    tokenized = raw.map(lambda b: tok(b["text"]), batched=True, remove_columns=raw.column_names, keep_in_memory=True)

    def group_texts(batch: dict) -> dict:
        joined = {k: list(chain(*batch[k])) for k in batch}
        total = len(joined["input_ids"]) // seq * seq
        out = {k: [v[i : i + seq] for i in range(0, total, seq)] for k, v in joined.items()}
        out["labels"] = out["input_ids"].copy()
        return out

    return len(tokenized.map(group_texts, batched=True, keep_in_memory=True)) * seq


def child_baseline(data: Path, seq: int) -> dict:
    import datasets

    from trainer.tokenizer import byte_level_tokenizer

    datasets.disable_progress_bars()
    start = time.perf_counter()
    tokens = pack_with_datasets_map(data, byte_level_tokenizer(), seq, data.parent / "hf-cache")
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "workers": 0, "cores": 1, "rss": peak_rss(), "worker_rss": 0}


def measure(kind: str, data: Path, seq: int, workers: str = "0", packing: str = "auto") -> dict:
    """One measurement in a fresh process (its peak RSS is its own)."""
    cmd = [sys.executable, __file__, "--child", kind, "--data", str(data), "--seq", str(seq), "--workers", workers,
           "--packing", packing]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=REPO)
    if out.returncode != 0:
        raise SystemExit(f"{kind} run failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["tokens_per_s"] = result["tokens"] / max(result["seconds"], 1e-9)
    result["peak"] = result["rss"] + result["worker_rss"]
    return result


def row(name: str, r: dict) -> str:
    per_core = r["tokens_per_s"] / max(1, r["cores"])
    return (f"  {name:34s} {r['tokens'] / 1e6:8.1f} M tok {r['seconds']:7.2f} s {r['tokens_per_s'] / 1e6:8.2f} M tok/s "
            f"{per_core / 1e6:8.2f} M/core ({r['cores']} core(s))  RSS {r['rss'] / 2**20:6.0f} MiB main"
            f" + {r['worker_rss'] / 2**20:4.0f} MiB largest worker")  # fmt: skip


@contextmanager
def corpora(a: argparse.Namespace, write: Callable[[Path, float], None], kind: str) -> Iterator[tuple[Path, Path]]:
    """The machine line, then a small corpus and one --factor times larger, written by `write` into a temporary
    folder that lives as long as the block."""
    print(f"machine: {len(os.sched_getaffinity(0))} usable CPUs; python {sys.version.split()[0]}; seq {a.seq}")
    with tempfile.TemporaryDirectory(prefix="trainkit-data-prep-") as name:
        small, large = Path(name, "small.jsonl"), Path(name, "large.jsonl")
        write(small, a.small_mb)
        write(large, a.small_mb * a.factor)
        mb = {path: path.stat().st_size / 1e6 for path in (small, large)}
        print(f"corpora: small {mb[small]:.0f} MB, large {mb[large]:.0f} MB ({kind})\n")
        yield small, large


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small-mb", type=float, default=40.0)
    p.add_argument("--factor", type=float, default=10.0)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--workers", default="0,auto", help="comma-separated worker settings to compare (0, N, auto)")
    p.add_argument("--child", choices=["trainkit", "baseline", "mix"], help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--corpus", choices=["text", "chat", "mix"], default="text",
                   help="text: plain text vs datasets.map; chat: prompt/completion packed whole; mix: both, "
                   "mixed by weight")  # fmt: skip
    p.add_argument("--packing", default="auto", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        children = {"trainkit": lambda: child_trainkit(a.data, a.seq, a.workers, a.packing),
                    "baseline": lambda: child_baseline(a.data, a.seq), "mix": lambda: child_mix(a.data, a.seq)}
        result = children[a.child]()
        print(json.dumps(result))
        return
    if a.corpus in ("chat", "mix"):
        (chat if a.corpus == "chat" else mixed)(a)
        return
    with corpora(a, write_jsonl, "JSONL") as (small, large):
        results = {}
        for workers in a.workers.split(","):
            for label, data in (("small", small), ("large", large)):
                results[label, workers] = r = measure("trainkit", data, a.seq, workers)
                print(row(f"trainkit {label}, workers={workers} ({r['workers']})", r), flush=True)
        base = measure("baseline", small, a.seq)
        print(row("datasets.map group_texts, small", base))
        print()
        for workers in a.workers.split(","):
            mem = results["large", workers]["peak"] / results["small", workers]["peak"]
            speed = results["small", workers]["tokens_per_s"] / base["tokens_per_s"]
            print(f"workers={workers}: memory ratio large/small {mem:.2f} (goal <= 1.2); "
                  f"throughput ratio vs datasets.map {speed:.1f} (goal >= 1.0)")  # fmt: skip
        fingerprint_cost(large, {w: results["large", w] for w in a.workers.split(",")})


def fingerprint_cost(data: Path, runs: dict[str, dict]) -> None:
    """The run's data fingerprint (trainer.provenance: a sha256 of the whole file, taken from the bytes the
    preparation reads) against the preparation time of the same file; the hash is checked against a pass of its own
    (not timed)."""
    from trainer.provenance import file_sha256

    expected = file_sha256(data)
    for workers, r in runs.items():
        if r["sha256"] != expected:
            raise SystemExit(f"workers={workers}: the streamed sha256 {r['sha256']} is not the file's {expected}")
        spent, seconds = r["hash_seconds"], r["seconds"]
        print(f"workers={workers}: data fingerprint (sha256, while read) {spent:.3f} s = {spent / seconds:.1%} of "
              f"preparation {seconds:.2f} s (goal <= 5%)")  # fmt: skip


def chat(a: argparse.Namespace) -> None:
    """Records packing on a chat-like corpus: padding share, tokens/s (against stream packing of the same corpus)
    and peak RSS of --small-mb and --factor times more."""
    with corpora(a, write_chat_jsonl, "prompt/completion JSONL, log-normal lengths") as (small, large):
        runs = {}
        for label, data, packing in (("small", small, "records"), ("large", large, "records"),
                                     ("small", small, "stream")):  # fmt: skip
            runs[label, packing] = r = measure("trainkit", data, a.seq, "0", packing)
            pack = r["packing"]
            print(row(f"{label}, TRAIN_PACKING={packing}", r) + (
                f"  padding {100 * pack['padding_share']:.2f}%, {pack['records_packed']} records, "
                f"{pack['records_truncated']} truncated" if packing == "records" else ""), flush=True)  # fmt: skip
        mem = runs["large", "records"]["peak"] / runs["small", "records"]["peak"]
        speed = runs["small", "records"]["tokens_per_s"] / runs["small", "stream"]["tokens_per_s"]
        share = max(runs[k, "records"]["packing"]["padding_share"] for k in ("small", "large"))
        print(f"\nrecords packing: padding share {100 * share:.2f}% (goal <= 5%); memory ratio large/small {mem:.2f} "
              f"for {a.factor:g}x the data (goal <= 1.2); tokens/s vs stream packing {speed:.2f}")  # fmt: skip


def mixed(a: argparse.Namespace) -> None:
    """A mixed corpus (plain text 0.7, prompt/completion 0.3): peak RSS of preparing and mixing --small-mb of each
    and --factor times more."""
    print(f"machine: {len(os.sched_getaffinity(0))} usable CPUs; python {sys.version.split()[0]}; seq {a.seq}")
    runs = {}
    with tempfile.TemporaryDirectory(prefix="trainkit-data-mix-") as name:
        for label, megabytes in (("small", a.small_mb), ("large", a.small_mb * a.factor)):
            folder = Path(name, label)
            folder.mkdir()
            write_jsonl(folder / "text.jsonl", megabytes)
            write_chat_jsonl(folder / "chat.jsonl", megabytes)
            runs[label] = r = measure("mix", folder, a.seq)
            print(row(f"mix {label} ({2 * megabytes:g} MB)", r) + f"  shares {r['shares']}", flush=True)
    mem = runs["large"]["peak"] / runs["small"]["peak"]
    print(f"\nmixed corpus: memory ratio large/small {mem:.2f} for {a.factor:g}x the data (goal <= 1.2)")


if __name__ == "__main__":
    main()
