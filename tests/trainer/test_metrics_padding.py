"""tokens_per_s (and the MFU computed from it) leaves padding out (issue 34 item 6): records packing fills each
sequence's tail with padding, which the model computes but nothing learns from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_packing import write_pairs
from transformers import TrainerState, TrainingArguments

from trainer.data.dataset import load_or_prepare
from trainer.data.discovery import discover
from trainer.data.spec import DataSpec
from trainer.run.metrics import MetricsCallback, useful_token_share
from trainer.tokenizer import byte_level_tokenizer

SEQ = 128


def test_padding_is_not_counted_as_useful_tokens(tmp_path: Path) -> None:
    write_pairs(tmp_path / "pairs.jsonl", 300, seq=SEQ)
    dataset = load_or_prepare(discover(str(tmp_path / "pairs.jsonl")), byte_level_tokenizer(), DataSpec(SEQ),
                              tmp_path / "cache")  # fmt: skip
    pads = dataset.meta["packing"]["padding_tokens"]
    share = useful_token_share(dataset)
    assert pads > 0 and share == pytest.approx(1 - pads / (len(dataset) * SEQ))

    callback = MetricsCallback(tmp_path / "metrics.jsonl", SEQ, flops_per_token=1e6, peak_flops=1e12)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, report_to=[])
    loader = torch.utils.data.DataLoader(dataset, batch_size=4)
    callback.on_train_begin(args, TrainerState(), None, train_dataloader=loader)
    callback._step_times = [0.5]
    record = callback.record(args, TrainerState(global_step=1, train_batch_size=4), {"loss": 1.0})
    assert record["samples_per_s"] == pytest.approx(8.0)
    assert record["tokens_per_s"] == pytest.approx(8.0 * SEQ * share)  # the padding's share left out
    assert record["mfu"] == pytest.approx(8.0 * SEQ * share * 1e6 / 1e12)


def test_plain_text_streamed_has_no_padding_to_leave_out(tmp_path: Path) -> None:
    (tmp_path / "text.txt").write_text("a plain sentence that streams into blocks.\n" * 400)
    dataset = load_or_prepare(discover(str(tmp_path / "text.txt")), byte_level_tokenizer(), DataSpec(SEQ),
                              tmp_path / "cache")  # fmt: skip
    assert useful_token_share(dataset) == 1.0
