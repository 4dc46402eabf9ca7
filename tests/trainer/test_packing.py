"""Packing that keeps records whole (TRAIN_PACKING=auto for prompt/completion data, TRAIN_LONG_RECORDS), with the
user's defaults: attention never crosses records (on this stack and the oldest row's), no sequence starts inside a
record, long records are truncated or dropped and counted, padding stays low and is never trained, BOS follows the
tokenizer, and a resumed run maps the cache the first run made.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from train_runs import finish, start, train_env

from trainer.data import cache
from trainer.data.dataset import ShardedDataset, load_or_prepare
from trainer.data.discovery import discover
from trainer.data.spec import DataSpec
from trainer.tokenizer import byte_level_tokenizer

REPO = Path(__file__).resolve().parents[2]
OLDEST_PYTHON = REPO / ".venv-oldest" / "bin" / "python"
ISOLATION = Path(__file__).with_name("packed_isolation.py")
PAD = 258  # byte-level tokenizer


def write_pairs(path: Path, count: int, seed: int = 0, long: int = 0, seq: int = 96) -> list[bytes]:
    """Prompt/completion records of varied (chat-like, log-normal) lengths, each marked with its number; the first
    `long` ones longer than `seq` tokens. Returns each record's byte-level tokens (prompt, completion, EOS)."""
    rng = random.Random(seed)
    records, lines = [], []
    for i in range(count):
        words = min(max(1, int(rng.lognormvariate(2.3, 0.7))), (seq - 44) // 8) if i >= long else seq  # fits
        prompt = f"<Q{i}> " + " ".join(rng.choice(["tell", "me", "why", "how"]) for _ in range(rng.randint(1, 6)))
        completion = f" <A{i}> " + " ".join(rng.choice(["it", "is", "so", "because"]) for _ in range(words))
        lines.append(json.dumps({"prompt": prompt, "completion": completion}))
        records.append((prompt + completion).encode() + b"\x00")  # \x00 stands for EOS below
    path.write_text("\n".join(lines) + "\n")
    return records


def segments(dataset: object) -> list[tuple[bytes, list[int]]]:
    """Every packed segment (record or padding) of every sequence: (its bytes, EOS as \\x00; its labels)."""
    out = []
    for i in range(len(dataset)):
        item = dataset[i]
        ids, labels, positions = (item[k].tolist() for k in ("input_ids", "labels", "position_ids"))
        starts = [*(j for j, p in enumerate(positions) if p == 0), len(ids)]
        for a, b in itertools.pairwise(starts):
            out.append((bytes(0 if t == 257 else t for t in ids[a:b] if t != PAD), labels[a:b]))
    return out


def has_its_prompt(text: bytes, at: int) -> bool:
    """Whether the completion token at `at` follows its own record's prompt in `text` (one packed sequence)."""
    answer = text.rfind(b"<A", 0, at + 3)  # a completion starts " <A{i}> "
    close = text.find(b">", answer)
    if answer < 0 or close < 0:
        return False
    return text.rfind(b"<Q" + text[answer + 2 : close] + b">", 0, answer) >= 0


def run_isolation(python: str | Path, tmp: Path, *attns: str) -> list[dict]:
    data = tmp / "pairs.jsonl"
    write_pairs(data, 24, long=1)
    result = subprocess.run(
        [str(python), str(ISOLATION), str(data), str(tmp / "out"), *attns], cwd=REPO, capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_a_packed_records_loss_equals_its_loss_alone(tmp_path: Path) -> None:
    """The real dataset items and the model as the run builds it (use_cache as the run sets it), for every attention
    implementation the CPU runs (auto: sdpa; eager), eager and with its layers compiled by inductor: each trained
    token's loss in a packed sequence equals its loss with the record alone. (flash-attention cannot run here: its
    collator's boundaries are checked in the test below.)"""
    variants = ["auto", "auto:compiled", "eager", "eager:compiled"]
    results = run_isolation(sys.executable, tmp_path, *variants)
    assert [r["attn"] for r in results] == variants
    for result in results:
        assert result["records"] >= 6 and result["trained_tokens"] > 100
        assert result["max_diff"] < 1e-5, result


@pytest.mark.row_12_1
@pytest.mark.skipif(not OLDEST_PYTHON.exists(), reason="no .venv-oldest: run `bash tests/oldest/setup.sh`")
def test_the_oldest_row_packs_the_same_way_and_keeps_records_apart(tmp_path: Path) -> None:
    """transformers 4.46 finds no records in position ids: the per-record mask keeps sdpa and eager apart."""
    results = run_isolation(OLDEST_PYTHON, tmp_path, "auto", "eager")
    assert [r["attn"] for r in results] == ["auto", "eager"]
    for result in results:
        assert result["records"] >= 6 and result["max_diff"] < 1e-5, result
    here = load_or_prepare(discover(str(tmp_path / "pairs.jsonl")), byte_level_tokenizer(), DataSpec(96), tmp_path)
    assert results[0]["meta"] == here.meta["packing"]  # the same packing on both stacks


@pytest.mark.parametrize("attn", ["flash_attention_2", "flash_attention_4"])
def test_flash_attention_gets_each_records_boundaries_from_the_collator(tmp_path: Path, attn: str) -> None:
    """flash-attention's kernels cannot run on the CPU: the varlen metadata the collator gives them is checked
    against the records themselves. One row; cu_seq_lens at every record start (int32, ending at the row's length);
    max_length_q/k plain ints (no host sync, no graph break in a compiled layer)."""
    from trainer.model.packed_attention import collator_for

    write_pairs(tmp_path / "pairs.jsonl", 40)
    dataset = load_or_prepare(discover(str(tmp_path / "pairs.jsonl")), byte_level_tokenizer(), DataSpec(96), tmp_path)
    batch = collator_for(attn)([dataset[i] for i in range(4)])
    positions = batch["position_ids"]
    assert positions.shape == batch["input_ids"].shape == batch["labels"].shape == (1, 4 * 96)
    starts = [i for i, p in enumerate(positions[0].tolist()) if p == 0]
    assert len(starts) > 4  # several records per sequence
    for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
        assert batch[key].dtype == torch.int32 and batch[key].tolist() == [*starts, 4 * 96]
    lengths = [b - a for a, b in itertools.pairwise([*starts, 4 * 96])]
    assert type(batch["max_length_q"]) is int and batch["max_length_q"] == batch["max_length_k"] == max(lengths)
    plain = collator_for(attn)([{k: v for k, v in dataset[i].items() if k != "position_ids"} for i in range(2)])
    assert plain["input_ids"].shape == (2, 96) and "cu_seq_lens_q" not in plain  # plain text: the causal kernel


@pytest.mark.parametrize("long_records", ["truncate", "drop"])
def test_no_sequence_starts_inside_a_record_and_long_ones_are_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, long_records: str
) -> None:
    records = write_pairs(tmp_path / "pairs.jsonl", 300, long=3)
    with caplog.at_level(logging.INFO, logger="trainer"):
        dataset = load_or_prepare(discover(str(tmp_path / "pairs.jsonl")), byte_level_tokenizer(),
                                  DataSpec(96, long_records=long_records), tmp_path / "cache")  # fmt: skip
    found = [seg for seg, labels in segments(dataset) if any(lab != -100 for lab in labels)]
    if long_records == "truncate":
        want = [r[:96] for r in records]
        assert dataset.meta["packing"]["records_truncated"] == 3
        assert "3 record(s) longer than TRAIN_SEQ_LEN=96 were truncated to it" in caplog.text
    else:
        want = records[3:]
        assert dataset.meta["packing"]["records_dropped_too_long"] == 3
        assert "3 record(s) longer than TRAIN_SEQ_LEN=96 were dropped (TRAIN_LONG_RECORDS=drop" in caplog.text
    assert sorted(found) == sorted(want)  # every record once, whole (or its first 96 tokens), from its first token
    assert dataset.meta["packing"]["records_packed"] == len(want)


def test_padding_is_under_5_percent_and_never_trained(tmp_path: Path) -> None:
    records = write_pairs(tmp_path / "pairs.jsonl", 3000, seed=1, seq=512)
    dataset = load_or_prepare(discover(str(tmp_path / "pairs.jsonl")), byte_level_tokenizer(), DataSpec(512),
                              tmp_path / "cache")  # fmt: skip
    meta = dataset.meta["packing"]
    assert meta["padding_share"] <= 0.05 and meta["records_packed"] == 3000
    pads = 0
    for i in range(len(dataset)):
        ids, labels = dataset.block(i)
        pads += int((ids == PAD).sum())
        assert (labels[ids == PAD] == -100).all()
    assert pads == meta["padding_tokens"] == len(dataset) * 512 - sum(len(r) for r in records)
    assert pads / (len(dataset) * 512) <= 0.05


def test_prompt_completion_never_trains_a_completion_without_its_prompt(tmp_path: Path) -> None:
    """Every trained token sits in a segment that starts with its own record's prompt; stream packing (the former
    default) does cut pairs, which the same check sees."""
    write_pairs(tmp_path / "pairs.jsonl", 200, seed=2, seq=64)

    def orphans(spec: DataSpec) -> int:
        dataset = load_or_prepare(discover(str(tmp_path / "pairs.jsonl")), byte_level_tokenizer(), spec,
                                  tmp_path / spec.packing)  # fmt: skip
        count = 0
        for i in range(len(dataset)):
            ids, labels = dataset.block(i)
            text = bytes(int(t) if t < 256 else 0 for t in ids)
            for at in np.flatnonzero(labels != -100):
                count += not has_its_prompt(text, int(at))
        return count

    assert orphans(DataSpec(64)) == 0
    assert orphans(DataSpec(64, packing="stream")) > 0


def test_bos_follows_the_tokenizer_and_is_never_doubled(tmp_path: Path) -> None:
    """A tokenizer that puts BOS before a text (as Llama's do) gets exactly one per record, also when the text
    already starts with it; EOS ends each record."""
    from hub_support import save_bpe_tokenizer
    from tokenizers import processors
    from transformers import AutoTokenizer

    save_bpe_tokenizer(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    bos, eos = tok.bos_token_id, tok.eos_token_id
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    assert tok("the fox")["input_ids"][0] == bos  # the tokenizer adds BOS itself
    lines = [{"prompt": "the quick", "completion": " brown fox"}, {"prompt": "<s>the lazy", "completion": " dog"}]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    dataset = load_or_prepare(discover(str(tmp_path / "pairs.jsonl")), tok, DataSpec(64), tmp_path / "cache")
    (item,) = (dataset[i] for i in range(len(dataset)))  # both records in one sequence, then padding
    ids, labels, positions = (item[k].tolist() for k in ("input_ids", "labels", "position_ids"))
    starts = [i for i, p in enumerate(positions) if p == 0]
    assert len(starts) == 3
    for first, end in itertools.pairwise(starts):
        record = ids[first:end]
        assert record[0] == bos and record.count(bos) == 1 and record[-1] == eos
        assert labels[first] == labels[first + 1] == -100  # BOS and prompt untrained


def test_records_mode_keeps_a_txt_document_whole_across_reading_units(tmp_path: Path) -> None:
    """TRAIN_PACKING=records: a .txt file is one record, even when it is read in several units; too long, it is
    truncated to one sequence and counted with its full length."""
    text = "".join(f"line {i}: the quick brown fox\n" for i in range(80_000))  # > 2 MiB: three reading units
    (tmp_path / "doc.txt").write_text(text)
    dataset = load_or_prepare(discover(str(tmp_path / "doc.txt")), byte_level_tokenizer(),
                              DataSpec(64, packing="records"), tmp_path / "cache")  # fmt: skip
    meta = dataset.meta["packing"]
    assert (meta["records_packed"], meta["records_truncated"], len(dataset)) == (1, 1, 1)
    assert meta["longest_record"] == len(text.encode()) + 1  # with its EOS
    assert bytes(dataset[0]["input_ids"].tolist()) == text.encode()[:64]


def test_auto_streams_plain_text_and_packs_pairs_whole_in_one_corpus(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl").write_text(
        "".join(json.dumps({"text": f"plain text {i} " * 9}) + "\n" for i in range(60))
    )
    write_pairs(tmp_path / "d" / "b.jsonl", 40)
    dataset = load_or_prepare(discover(str(tmp_path / "d")), byte_level_tokenizer(), DataSpec(96), tmp_path / "cache")
    meta = dataset.meta["packing"]
    assert meta["stream_blocks"] > 0 and meta["record_blocks"] > 0 and meta["records_packed"] == 40
    # The stream's last partial window is packed with the records (they are padded anyway): every token is kept.
    assert meta["stream_tail_packed_tokens"] > 0 and meta["stream_tail_dropped_tokens"] == 0
    kept = meta["stream_blocks"] * 96 + meta["record_blocks"] * 96 - meta["padding_tokens"]
    assert kept == dataset.meta["tokens"]
    first = dataset[0]  # the plain text comes first: one stream window, positions never restart
    assert first["position_ids"].tolist() == list(range(96)) and (first["labels"] != -100).all()


def test_a_plain_text_tail_short_of_a_sequence_is_counted_and_said(tmp_path: Path, caplog) -> None:
    """Plain text only: the last tokens that do not fill a sequence are left out (nothing else is padded), and the
    log says how many."""
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": f"plain text {i} " * 9}) + "\n" for i in range(60)))
    with caplog.at_level(logging.INFO, logger="trainer"):
        dataset = load_or_prepare(discover(str(tmp_path / "a.jsonl")), byte_level_tokenizer(), DataSpec(96),
                                  tmp_path / "cache")  # fmt: skip
    left_out = dataset.meta["packing"]["stream_tail_dropped_tokens"]
    assert 0 < left_out < 96 and len(dataset) * 96 + left_out == dataset.meta["tokens"]
    said = f"the plain text's last {left_out} tokens (short of one TRAIN_SEQ_LEN=96 sequence) are left out"
    assert said in caplog.text


def test_the_packing_settings_are_part_of_the_cache_key(tmp_path: Path) -> None:
    write_pairs(tmp_path / "pairs.jsonl", 5)
    source, tok = discover(str(tmp_path / "pairs.jsonl")), byte_level_tokenizer()
    keys = {cache.cache_key(source, tok, DataSpec(64, packing=mode, long_records=long))
            for mode in ("auto", "stream", "records") for long in ("truncate", "drop")}  # fmt: skip
    assert len(keys) == 6
    limits = {cache.cache_key(source, tok, DataSpec(64, max_bad_lines=n, workers=w)) for n, w in ((0, None), (5, 2))}
    assert len(limits) == 1  # how the data is made and checked does not change what it holds


def test_auto_packing_is_a_decision_with_its_reason(tmp_path: Path) -> None:
    """TRAIN_PACKING=auto is decided from the data's record layouts by the packer's own rule, and shown."""
    from trainer import config
    from trainer.machine.hardware import Hardware

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl").write_text(json.dumps({"text": "plain text"}) + "\n")
    write_pairs(tmp_path / "d" / "b.jsonl", 3)
    cpu = Hardware(device="cpu", cpu_count=2, cxx_compiler="/usr/bin/g++")
    shown = {}
    for data in ("d/a.jsonl", "d/b.jsonl", "d"):
        settings = config.parse_settings({"TRAIN_DATA": str(tmp_path / data), "TRAIN_OUTPUT_DIR": str(tmp_path)})
        decision = config.resolve(settings, cpu, environ={}, import_heavy=False).decisions.packing
        shown[data] = decision.value
        assert decision.reason.startswith("auto: "), decision
    assert shown == {"d/a.jsonl": "stream", "d/b.jsonl": "records", "d": "records+stream"}
    for layout, records in (("text", False), ("pair", True), ("messages", True)):  # the decision's rule is the packer's
        assert DataSpec(64).records_for(has_mask=records) == (DataSpec(64).packing_of((layout,))[0] == "records")


def test_a_resumed_run_maps_the_cache_of_the_first_run(tmp_path: Path) -> None:
    """Two real runs on prompt/completion data: the second resumes and maps the first one's shards (memory-mapped,
    checked by meta.json), tokenizing nothing; both log the truncated record. What they trained on masks the prompt
    (the only training on prompt/completion records through `python -m trainer` in tests/trainer/test_data_formats.py
    and here)."""
    write_pairs(tmp_path / "pairs.jsonl", 40, long=1, seq=48)
    out = tmp_path / "out"
    env = train_env(out, data=tmp_path / "pairs.jsonl", seq_len=48, save_steps=1, max_steps=1)
    code, first = finish(start(env))
    assert code == 0, first[-3000:]
    assert "tokenized" in first and "40 records packed whole into" in first
    code, second = finish(start({**env, "TRAIN_MAX_STEPS": "2"}))
    assert code == 0, second[-3000:]
    assert "resume: continuing from" in second and "checkpoint-1" in second
    assert "from the cache" in second and "tokenized" not in second
    for log in (first, second):
        assert "1 record(s) longer than TRAIN_SEQ_LEN=48 were truncated to it" in log
    (entry,) = (out / ".cache" / "data").glob("*/meta.json")
    assert json.loads(entry.read_text())["packing"]["records_truncated"] == 1
    losses = {row["step"]: row["loss"] for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    assert sorted(losses) == [1, 2] and all(loss > 0 for loss in losses.values()), losses
    ids, labels = ShardedDataset(entry.parent, json.loads(entry.read_text())).block(0)
    prompt_len = bytes(t for t in ids.tolist() if t < 256).find(b" <A0>")  # the block starts with a whole record
    assert prompt_len > 0 and (labels[:prompt_len] == -100).all()
    assert labels[prompt_len : prompt_len + 8].tolist() == ids[prompt_len : prompt_len + 8].tolist()
