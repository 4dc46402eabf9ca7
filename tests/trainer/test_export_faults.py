"""`python -m trainer export` under damaged inputs and faults: each mistake refused before any work (exit 2 naming it,
no traceback, nothing written), an existing empty OUT (a mount point) filled in place, a full disk named with the
space the export needs, the quality gate's text the run's own.

One LoRA run on a saved tiny base (conftest.py's `lora_run`, shared with test_export.py) serves the module (its
checkpoint-2 holds the adapter, its final/ the merged model, its TRAIN_DATA a corpus file). Each refusal is checked
in-process on its function, and by one real command per family.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import assert_user_error, assert_user_error_in_process
from hub_support import run_env, save_tiny_model

PLAIN_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "README.md"}  # fmt: skip


def _export(run_trainer, run: Path, *argv: str, **env: str):
    return run_trainer(["export", *argv], env={**run_env(run), **env}, timeout=600)


def test_the_gates_options_are_checked_before_any_work(run_trainer, lora_run: Path, tmp_path: Path) -> None:
    """--eval-context below 2 (a window scores its next tokens), a --max-ppl-increase that is not a positive number,
    and a gate option without --quant (it would be dropped): each named; the command exits 2 at once, writing
    nothing (it ended with IndexError after the export's work)."""
    from trainer.export import command
    from trainer.export.options import option_problems

    parser = argparse.ArgumentParser()
    command.register(parser)

    def problems(*argv: str) -> list[str]:
        return option_problems(parser.parse_args(["SRC", "OUT", *argv]))

    for context in ("-8", "0", "1"):
        assert problems("--quant", "q8_0", "--eval-context", context) == [
            f"export --eval-context {context}: give the tokens per scored window, at least 2 (default: the run's "
            "TRAIN_SEQ_LEN)"]  # fmt: skip
    for increase in ("nan", "inf", "0", "-1"):
        (found,) = problems("--quant", "q8_0", "--max-ppl-increase", increase)
        assert found.startswith(f"export --max-ppl-increase {float(increase)}: give a percentage above 0"), found
    assert problems("--quant", "q8_0", "--eval-context", "2", "--max-ppl-increase", "0.5") == []
    assert problems("--eval-data", "x.txt", "--allow-quality-loss") == [
        "export --allow-quality-loss: only with --quant TYPE (it is the quality gate's); add --quant or drop it",
        "export --eval-data: only with --quant TYPE (it is the quality gate's); add --quant or drop it"]  # fmt: skip
    out = tmp_path / "out"
    result = _export(run_trainer, lora_run, str(lora_run / "output"), str(out), "--quant", "q8_0", "--eval-context",
                     "-8")  # fmt: skip
    assert_user_error(result, "export --eval-context -8: give the tokens per scored window")
    assert list(tmp_path.iterdir()) == []  # no OUT, no staging folder, no lock


def test_an_existing_empty_out_is_filled_in_place_even_a_mount_point(run_trainer, lora_run: Path,
                                                                     tmp_path: Path) -> None:  # fmt: skip
    """`export --help` allows an empty OUT: a mount point (a tmpfs, where root may mount) is neither removed nor renamed
    over, so the export moves its files in; the folder keeps its inode and mode, no staging folder is left (it ended
    with EBUSY after the whole export, a complete-looking staging folder beside it). A staging folder a killed export
    left inside OUT does not make it occupied."""
    from trainer.export import out_folder

    out = tmp_path / "mnt"
    out.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(out)],
                                                   capture_output=True).returncode == 0  # fmt: skip
    try:
        out.chmod(0o750)
        (out / ".tmp-export-mnt").mkdir()  # a killed export's leftover
        (out / ".tmp-export-mnt" / "model.safetensors").write_bytes(b"half")
        before = out.stat()
        result = _export(run_trainer, lora_run, str(lora_run / "output"), str(out))
        assert result.returncode == 0, result.stderr[-3000:]
        assert {p.name for p in out.iterdir()} == PLAIN_FILES and os.path.ismount(out) == mounted
        after = out.stat()
        assert (after.st_ino, after.st_dev, after.st_mode) == (before.st_ino, before.st_dev, before.st_mode)
        assert [p.name for p in tmp_path.iterdir()] == ["mnt"]
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(out)], check=False)
    empty = tmp_path / "empty"  # in-process: the staging folder inside, published whole
    empty.mkdir()
    staging = out_folder.staging(empty)
    (staging / "config.json").write_text("{}")
    (staging / "model.safetensors").write_bytes(b"x")
    assert staging == empty / ".tmp-export-empty"
    out_folder.publish(staging, empty)
    assert sorted(p.name for p in empty.iterdir()) == ["config.json", "model.safetensors"]
    with pytest.raises(Exception, match="the folder is not empty; give a new or empty folder as OUT"):
        out_folder.check(empty)


def _copy_final(lora_run: Path, to: Path, recorded: bool = True) -> Path:
    shutil.copytree(lora_run / "output" / "final", to)
    if not recorded:
        (to / "trainkit_complete").unlink()
    return to


def test_a_damaged_src_is_refused_before_any_work_naming_the_file(run_trainer, lora_run: Path,
                                                                  tmp_path: Path) -> None:  # fmt: skip
    """A torn config.json and a final/ without its tokenizer files: by the record's sizes where the folder has one,
    else as JSON that does not read or a tokenizer that does not load; --quant without any tokenizer. They ended in
    JSONDecodeError from the converter's check, or ValueError after the export."""
    from trainer.errors import ConfigError
    from trainer.export.command import _tokenizer
    from trainer.export.options import QuantRequest
    from trainer.export.quant import plan_request
    from trainer.export.source import resolve_source

    torn = _copy_final(lora_run, tmp_path / "torn")
    size = (torn / "config.json").stat().st_size
    (torn / "config.json").write_text((torn / "config.json").read_text()[:300])
    untokenized = _copy_final(lora_run, tmp_path / "untokenized")
    (untokenized / "tokenizer.json").unlink()
    loose = _copy_final(lora_run, tmp_path / "loose", recorded=False)  # a model folder with no record
    (loose / "config.json").write_text('{"model_type": "lla')
    cases = {torn: f"{torn / 'config.json'} has 300 bytes, the checkpoint was saved with {size}",
             untokenized: f"{untokenized / 'tokenizer.json'} is missing",
             loose: f"{loose / 'config.json'} does not read as JSON"}  # fmt: skip
    for folder, message in cases.items():
        with pytest.raises(ConfigError, match="copy it again, or use another checkpoint of the run") as refused:
            resolve_source(folder)
        assert message in str(refused.value), str(refused.value)
    bare = _copy_final(lora_run, tmp_path / "bare", recorded=False)
    (bare / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match=f"the tokenizer in {bare} does not load"):
        _tokenizer(bare)
    (bare / "tokenizer_config.json").unlink()
    assert _tokenizer(bare) is None
    with pytest.raises(ConfigError, match=f"export --quant: {bare} holds no tokenizer"):
        plan_request(QuantRequest(["q8_0"]), resolve_source(bare), False, tokenizer=False)
    out = tmp_path / "out"
    result = _export(run_trainer, lora_run, str(torn), str(out), "--quant", "q8_0")
    assert_user_error(result, "config.json has 300 bytes")
    assert not out.exists() and not list(tmp_path.glob(".tmp-export-*"))


def test_an_adapter_that_does_not_fit_its_base_is_refused_before_the_merge(run_trainer, lora_run: Path, tmp_path: Path,
                                                                           capsys) -> None:  # fmt: skip
    """--base of another architecture (OPT: it exported with the adapter never applied, exit 0) or another size (a
    state-dict RuntimeError): exit 2 naming the adapter and the base. A base of the same shapes with other weights: the
    merge is checked against the run's own recorded base, so it exits 2 too; a copy of the recorded base exports."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM

    from trainer.model.adapters import fit_problem
    from trainer.tokenizer import byte_level_tokenizer

    adapter = lora_run / "output" / "checkpoint-2"
    trained_on = f"({lora_run / 'base'}, as its adapter_config.json says)"
    opt = OPTForCausalLM(OPTConfig(vocab_size=259, hidden_size=32, num_hidden_layers=1, ffn_dim=64,
                                   num_attention_heads=2, word_embed_proj_dim=32))  # fmt: skip
    opt.save_pretrained(tmp_path / "opt")
    byte_level_tokenizer().save_pretrained(tmp_path / "opt")
    wider = LlamaForCausalLM(LlamaConfig(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=2))  # fmt: skip
    assert fit_problem(wider, adapter).endswith(
        "56 of its 56 tensors do not match the base's shapes (first: model.layers.0.mlp.down_proj takes 688 inputs in "
        f"the adapter, 128 in the base); give the base it was trained on {trained_on}")  # fmt: skip
    assert fit_problem(AutoModelForCausalLM.from_pretrained(lora_run / "base"), adapter) is None
    out = tmp_path / "out"
    assert_user_error_in_process(["export", str(adapter), str(tmp_path / "opt-out"), "--base", str(tmp_path / "opt")],
                                 capsys, f"the LoRA adapter {adapter} does not fit the base {tmp_path / 'opt'} "
                                 "(OPTForCausalLM): 56 of its 56 tensors are for modules the base lacks (first: "
                                 "model.layers.0.mlp.down_proj)", trained_on)  # fmt: skip (in this process)
    save_tiny_model(tmp_path / "other", seed=1)  # the same shapes, other weights
    result = _export(run_trainer, lora_run, str(adapter), str(out), "--base", str(tmp_path / "other"))
    assert_user_error(result, f"the run's own base {lora_run / 'base'}",
                      "that is not the base the run trained on; drop --base")  # fmt: skip
    assert not out.exists() and not (tmp_path / "opt-out").exists() and not list(tmp_path.glob(".tmp-export-*"))
    from trainer.errors import ConfigError
    from trainer.export.merge import base_folder

    gone = str(tmp_path / "gone-base")  # the run's TRAIN_MODEL and the adapter's own base: one path, named once
    (tmp_path / "lone" / "adapter_config.json").parent.mkdir()
    (tmp_path / "lone" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": gone}))
    hubless = SimpleNamespace(hub={})
    lone = SimpleNamespace(record=hubless, run=SimpleNamespace(hub={}, settings=SimpleNamespace(model=gone)),
                           adapter=tmp_path / "lone", folder=tmp_path / "lone")  # fmt: skip
    with pytest.raises(ConfigError, match=f"the base model the run recorded \\({re.escape(gone)}\\) is not here"):
        base_folder(lone, None)  # type: ignore[arg-type]
    shutil.copytree(lora_run / "base", tmp_path / "moved-base")
    result = _export(run_trainer, lora_run, str(adapter), str(out), "--base", str(tmp_path / "moved-base"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"merging the adapter {adapter} into --base {tmp_path / 'moved-base'}" in result.stderr


def _run_record(data: str, eval_data: str = "", embedded: bool = False) -> SimpleNamespace:
    decisions = SimpleNamespace(data=SimpleNamespace(value="embedded" if embedded else data))
    return SimpleNamespace(settings=SimpleNamespace(data=data, eval_data=eval_data), decisions=decisions)


@pytest.mark.fast
def test_the_gate_scores_the_runs_own_text_a_mix_in_its_proportions(tmp_path: Path) -> None:
    """A run on a weighted mix: the gate scores the tail of each source, its windows shared out by the weights, and
    the report names each source with its windows; w4a16 calibrates on the text before each tail (the same code).
    Both scored the package's built-in corpus while the report named the training data."""
    from trainer.export import compressed, quality
    from trainer.tokenizer import byte_level_tokenizer

    a, b = tmp_path / "a.txt", tmp_path / "b.jsonl"
    a.write_text("".join(f"alpha line {i}: apples and apricots, first of the mix.\n" for i in range(3000)))
    b.write_text("".join(json.dumps({"text": f"beta record {i}: bananas and blueberries."}) + "\n"
                         for i in range(3000)))  # fmt: skip
    run = _run_record(f"{a}:0.7,{b}:0.3")
    gate = quality.eval_text(None, run)  # type: ignore[arg-type]
    assert [(p.path, p.share, p.part) for p in gate.pieces()] == [(a, 0.7, "tail"), (b, 0.3, "tail")]
    assert gate.origin == ("the tails of the run's training mix (not held out), in its proportions: a.txt 70%, "
                           "b.jsonl 30%")
    assert gate.text.rstrip().endswith("bananas and blueberries.") and "alpha line 2999" in gate.text
    chunks, counts = quality.text_windows(byte_level_tokenizer(), gate, 64)
    assert counts == [11, 5] and len(chunks) == 16
    assert bytes(chunks[10]).decode().count("alpha") and bytes(chunks[11]).decode().count("beta")
    figures = quality.figures(gate, counts, 64)
    assert [(s["path"], s["share"], s["windows"]) for s in figures["sources"]] == [(str(a), 0.7, 11), (str(b), 0.3, 5)]
    assert figures["windows"] == 16 and figures["sha256"] == gate.sha256
    calibration = compressed.calibration_text(None, run, ["w4a16"])  # type: ignore[arg-type]
    assert [(p.path, p.share, p.part) for p in calibration.pieces()] == [(a, 0.7, "head"), (b, 0.3, "head")]
    assert "alpha line 0:" in calibration.text and "alpha line 0:" not in gate.text
    assert quality.window_counts([0.7, 0.3], [100, 2], 16) == [6, 2]  # a short source: fewer windows, the same shares
    assert quality.window_counts([0.97, 0.03], [100, 100], 16) == [15, 1]  # every source scored
    embedded = _run_record("/data", embedded=True)  # the run found no data at /data and trained on the corpus
    assert quality.eval_text(None, embedded).path.name == "corpus.txt"  # type: ignore[arg-type, union-attr]


@pytest.mark.fast
def test_a_source_the_run_named_that_is_not_here_is_refused_naming_it(tmp_path: Path) -> None:
    """A moved TRAIN_DATA file (or one source of a mix, a moved eval set, a Hub dataset): refused naming it and the
    option that gives the text instead, never another text in its place."""
    from trainer.errors import ConfigError
    from trainer.export import compressed, quality

    kept = tmp_path / "kept.txt"
    kept.write_text("line\n" * 100)
    gone = tmp_path / "gone.txt"
    for run, named in [(_run_record(str(gone)), f"TRAIN_DATA {gone} is not here any more"),
                       (_run_record(f"{kept}:1,{gone}:1"), f"TRAIN_DATA {gone} is not here any more"),
                       (_run_record(str(kept), eval_data=str(gone)), f"TRAIN_EVAL_DATA {gone} is not here any more"),
                       (_run_record("hf://datasets/org/data"), "hf://datasets/org/data is a Hub dataset")]:  # fmt: skip
        with pytest.raises(ConfigError, match="give --eval-data FILE") as refused:
            quality.eval_text(None, run)  # type: ignore[arg-type]
        assert named in str(refused.value)
    with pytest.raises(ConfigError, match=f"TRAIN_DATA {gone} is not here any more.*give --calibration-data FILE"):
        compressed.calibration_text(None, _run_record(str(gone)), ["w4a16"])  # type: ignore[arg-type]


def test_a_moved_training_file_refuses_the_quality_gate_at_once(run_trainer, lora_run: Path, tmp_path: Path) -> None:
    """The command: the run's corpus moved after training, --quant with no --eval-data: exit 2 before any work,
    naming the file and --eval-data (it exited 0 having scored the built-in corpus)."""
    corpus, moved = lora_run / "corpus.txt", lora_run / "corpus-moved.txt"
    corpus.rename(moved)
    try:
        result = _export(run_trainer, lora_run, str(lora_run / "output"), str(tmp_path / "out"), "--quant", "q8_0")
    finally:
        moved.rename(corpus)
    assert_user_error(result, f"the run's TRAIN_DATA {corpus} is not here any more", "give --eval-data FILE")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("small_disk", ["20m"], indirect=True)
def test_a_full_disk_during_the_gguf_conversion_names_the_disk_and_the_space_needed(
        run_trainer, lora_run: Path, llama_cpp: Path, small_disk: Path) -> None:  # fmt: skip
    """The export (13 MB) fits the 20 MiB filesystem, llama.cpp's converted file beside it does not: exit 2 naming the
    filesystem, what the export needs there and what is free; the staging folder removed (it ended with `OSError:
    65536 requested and 14320 written`, from the converter's child process)."""
    from trainer.export.out_folder import ExportDiskFull, removed_on_failure
    from trainer.export.quant import QualityLoss

    out = small_disk / "out"
    result = _export(run_trainer, lora_run, str(lora_run / "output"), str(out), "--quant", "q8_0",
                     TRAINKIT_LLAMA_CPP=str(llama_cpp))  # fmt: skip
    assert_user_error(result, f"export {out}: the filesystem mounted at {small_disk} is full (No space left on "
                      "device); nothing was published and the staging folder is removed. The export needs about 28 MiB "
                      "there (the export's weights 12 MiB, llama.cpp's converted file 12 MiB, q8_0 3 MiB). Free there "
                      "now: 20 MiB of 20 MiB.")  # fmt: skip
    assert list(small_disk.iterdir()) == []
    staging = small_disk / ".tmp-export-x"  # in-process: the export's own outcomes pass through, not taken for a disk
    for raised, expected in [(OSError(errno.ENOSPC, "No space left on device"), ExportDiskFull),
                             (QualityLoss("q8_0: over"), QualityLoss)]:  # fmt: skip
        staging.mkdir()
        with pytest.raises(expected), removed_on_failure(staging, small_disk / "x", {"q8_0": 1 << 20}, (QualityLoss,)):
            raise raised
        assert not staging.exists()
