"""benchmarks/gpu_run.py's --dry-run: both prepared commands' driver on the CPU with the tiny preset (issue 49 item 8):
every part, in one process. A and F's profile train for real (their plumbing: metrics, run_config.json, the
profile's time by kind); every other row's settings are resolved and checked as the trainer checks them; each part
appends its JSON lines as it ends, and the table comes last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_run import FIRST, PARTS, SECOND, TECHNIQUES, parse

REPO = Path(__file__).resolve().parents[2]


def test_both_commands_parse_to_their_parts_in_order() -> None:
    assert parse(["--out", "gpu_run.jsonl"]).parts == list(FIRST)
    assert parse(["--plan", "second", "--out", "gpu_run.jsonl"]).parts == list(SECOND)
    assert FIRST[:3] == ("imports", "gemm", "defaults") and FIRST[-1] == "profile"
    assert "bf16_act" not in PARTS  # row E dropped: no measurement gives bf16 activations a reason
    assert {"vocab", "fp8", "fp8_vocab", "techniques", "techniques2"} <= set(SECOND)


def test_the_128k_preset_is_1b_at_llama_3_2s_vocabulary() -> None:
    from trainer.model.build import preset_config
    from trainer.tokenizer import byte_level_tokenizer

    tok = byte_level_tokenizer()
    real, small = preset_config("1b-128k", len(tok), 2048, tok), preset_config("1b", len(tok), 2048, tok)
    assert real.vocab_size == 128_256 and small.vocab_size == 320
    assert real.to_dict() | {"vocab_size": 320} == small.to_dict()  # the same model otherwise


@pytest.mark.slow
def test_the_whole_dry_run(tmp_path: Path) -> None:
    """Every part of both commands, once, as the GPU machine runs them (caches under tmp_path, not the user's)."""
    out = tmp_path / "gpu_run.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN_")} | {"HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_run", "--dry-run", "--only", ",".join(PARTS), "--out", str(out),
         "--work", str(tmp_path / "work")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    by_part = {part: [r for r in records if r["part"] == part] for part in PARTS}
    status = {r["name"]: r.get("status", "ok") for r in records}
    (imports,) = by_part["imports"]
    assert imports["status"] == "ok" and len(imports["top"]) == 20 and imports["total_s"] > 0, imports
    gemm = {r["name"].split(":")[0]: r for r in by_part["gemm"]}
    assert {"q, o", "down", "lm head (128256 rows)", "reference 256^3", "copy 64 MiB"} <= set(gemm), set(gemm)
    assert sum(name.startswith("lm head") for name in gemm) == 2  # the byte-level vocabulary's and Llama-3.2-1B's
    assert all(r.get("tflops", 1) > 0 for r in gemm.values()) and gemm["copy 64 MiB"]["gb_per_s"] > 0
    (a,) = by_part["defaults"]
    assert a["status"] == "ok" and a["tokens_per_s"] > 0 and a["measured_steps"] == 2, a
    assert a["batch_size"] == 8 and a["to_first_step_s"] > 0 and "TRAIN_BATCH_SIZE" not in a["env"]
    assert set(a["phases_s"]) >= {"imports_and_config", "model", "first_step"}
    (b,), (c,), (d,) = by_part["static"], by_part["capped"], by_part["whole"]
    assert (b["status"], b["batch_size"], c["status"], c["batch_size"]) == ("checked", 8, "checked", 6), (b, c)
    assert d["status"] == "checked" and d["compile"] is True and d["env"]["TRAIN_COMPILE_SCOPE"] == "model", d
    assert_fp8_part(by_part["fp8"], batch=8)
    assert_vocab_parts(by_part["vocab"], by_part["fp8_vocab"])
    (f,) = by_part["profile"]
    assert f["status"] == "ok" and f["env"]["TRAIN_PROFILE"] == "1", f
    kinds = f["ms_per_step"]
    assert set(kinds) == {"gemm", "attention", "elementwise", "optimizer", "idle"} and kinds["gemm"] > 0, f
    assert kinds["idle"] is None  # a CPU's operators are no device's idle time
    assert status["chat records"] == status["chat stream"] == "checked", records
    techniques = by_part["techniques"] + by_part["techniques2"]
    assert [r["name"] for r in techniques] == list(TECHNIQUES) and len(by_part["techniques2"]) == 6
    assert status["fp32"] == status["lora"] == "checked" and {r["status"] for r in techniques} <= {"checked", "skipped"}
    # every row checked or trained records its memory prediction beside it (trainer.memory.fit's, as resolved)
    rows = [r for r in records if r.get("status") in ("ok", "checked") and "env" in r]
    assert rows and all(r["prediction"] == "ok" and r["predicted_peak_gib"] > 0 for r in rows), rows
    assert status["tests/gpu"] == "ok", by_part["gputests"]
    table = proc.stdout[proc.stdout.index("| part | name |") :]
    assert table.count("\n| ") == len(records)  # one row per line of --out, printed last


def assert_fp8_part(records: list[dict], batch: int) -> None:
    """bf16 and fp8 at A's batch, compiled: on a CPU bf16's settings check and fp8 is refused with the trainer's
    message; the installed torchao converts the tiny preset's decoder linears and leaves its LM head."""
    by_name = {r["name"]: r for r in records}
    bf16, fp8 = by_name[f"bf16 at batch {batch} (fp8's reference)"], by_name["TRAIN_PRECISION=fp8"]
    assert (bf16["status"], bf16["precision"], bf16["compile"], bf16["batch_size"]) == ("checked", "bf16", True, batch)
    assert fp8["status"] == "skipped" and "needs a GPU with FP8 tensor cores" in fp8["reason"], fp8
    assert fp8["env"] == {**bf16["env"], "TRAIN_PRECISION": "fp8"}  # the same run but the precision
    conversion = by_name["conversion of tiny"]
    assert conversion["status"] == "ok" and conversion["converted"] == 28 and conversion["lm_head"] == "Linear"


def assert_vocab_parts(vocab: list[dict], fp8_vocab: list[dict]) -> None:
    """1b-128k with the full and the chunked loss, each with its own search; bf16 and fp8 with the chunked loss at the
    chunked row's batch (fp8 refused on a CPU with the trainer's message)."""
    by_name = {r["name"]: r for r in vocab + fp8_vocab}
    full, chunked = by_name["A at 128256 rows, full loss"], by_name["A at 128256 rows, chunked loss"]
    assert (full["status"], full["cross_entropy"], chunked["status"], chunked["cross_entropy"]) == (
        "checked", "full", "checked", "chunked")  # fmt: skip
    assert full["env"]["TRAIN_MODEL"] == chunked["env"]["TRAIN_MODEL"] == "1b-128k"
    batch = chunked["batch_size"]
    bf16, fp8 = by_name[f"bf16 at 128256 rows, chunked loss, batch {batch}"], by_name[
        f"fp8 at 128256 rows, chunked loss, batch {batch}"]  # fmt: skip
    assert (bf16["status"], bf16["precision"], bf16["cross_entropy"], bf16["compile"]) == ("checked", "bf16",
                                                                                            "chunked", True)
    assert fp8["status"] == "skipped" and "needs a GPU with FP8 tensor cores" in fp8["reason"], fp8
    assert fp8["env"] == {**bf16["env"], "TRAIN_PRECISION": "fp8"}


def test_the_fp8_part_alone_takes_a_batch_from_the_first_commands_results(tmp_path: Path) -> None:
    """The second command's fp8 part finds A's batch in --out (the first command's line), not a fixed 8."""
    out = tmp_path / "gpu_run.jsonl"
    out.write_text(json.dumps({"part": "defaults", "name": "A defaults", "dry_run": True, "batch_size": 12}) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN_")} | {"HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_run", "--dry-run", "--only", "fp8", "--out", str(out), "--work",
         str(tmp_path / "work")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()][1:]
    assert_fp8_part(records, batch=12)
