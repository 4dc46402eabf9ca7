"""Helpers of the Hub tests: a tiny model's files (the `tiny` preset saved with save_pretrained), the repositories the
stand-in Hub (hub_server.py) serves, and the TRAIN_* of a short real run. The fixtures are in conftest.py."""

from __future__ import annotations

import json
from pathlib import Path

from hub_server import HubServer, folder_files

MODEL_ID = "org/tiny-llama"
GATED_ID = "org/gated-llama"
TOKEN = "hf_acceptedTokenForTheGatedRepo123"


def save_tiny_model(folder: Path, seed: int = 0) -> dict[str, bytes]:
    """The tiny preset with the byte-level tokenizer, saved as a Hub repository would hold it."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.model.build import preset_config
    from trainer.tokenizer import byte_level_tokenizer

    tokenizer = byte_level_tokenizer()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(preset_config("tiny", len(tokenizer), 64, tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder_files(folder)


def run_env(tmp_path: Path, **train: object) -> dict[str, str]:
    """A short CPU run writing under tmp_path, with its own empty HF_HOME."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    base = {"output_dir": tmp_path / "output", "seq_len": 32, "batch_size": 2, "log_steps": 1, "max_steps": 2,
            "save_steps": 2}  # fmt: skip
    env = {f"TRAIN_{k.upper()}": str(v) for k, v in {**base, **train}.items()}
    return {**env, "HOME": str(home), "HF_HOME": str(home / "hf")}


def online(env: dict[str, str], hub: HubServer) -> dict[str, str]:
    """The environment of a machine that reaches the Hub (here: the stand-in)."""
    return {**env, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}


def marker(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "trainkit_complete").read_text())


def run_config(output: Path) -> dict:
    return json.loads((output / "run_config.json").read_text())


def save_bpe_tokenizer(folder: Path) -> dict[str, bytes]:
    """A real tokenizer (BPE, up to 400 tokens) trained on a few sentences, saved as a Hub repository holds it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    lines = [f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(200)]
    backend.train_from_iterator(lines, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tokenizer.save_pretrained(folder)
    return folder_files(folder)
