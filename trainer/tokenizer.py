"""Tokenizers: TRAIN_TOKENIZER's (a folder or a Hub ID, trainer.hub), the model folder's own one, or a byte-level
tokenizer that needs no download.

The byte-level tokenizer maps each UTF-8 byte to the id of that byte (0-255) and adds three
special tokens (bos, eos, pad). It is what the presets train with, and what a local model folder
without tokenizer files gets; it is saved with the outputs so `final/` loads with `from_pretrained`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from trainer.hub.sources import TOKENIZER_FILES

log = logging.getLogger("trainer")

BYTE_TOKENIZER_MARKER = "trainkit-byte-level"
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"


def _byte_to_printable() -> dict[int, str]:
    """A reversible map from the 256 byte values to printable characters (the ByteLevel alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer with one token per byte (ids 0-255) plus bos/eos/pad (256-258). No download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in _byte_to_printable().items()}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=PAD, model_max_length=1 << 30
    )
    tok.init_kwargs["trainkit_tokenizer"] = BYTE_TOKENIZER_MARKER
    return tok


def is_byte_level(tok: PreTrainedTokenizerBase) -> bool:
    """True for the tokenizer made by `byte_level_tokenizer` (fresh or reloaded from disk)."""
    if tok.init_kwargs.get("trainkit_tokenizer") == BYTE_TOKENIZER_MARKER:
        return True
    return tok.eos_token == EOS and tok.bos_token == BOS and len(tok) == 259


def has_tokenizer(folder: str | Path) -> bool:
    path = Path(folder)
    return path.is_dir() and any((path / name).exists() for name in TOKENIZER_FILES)


def tokenizer_for(
    folder: str, template: str | None, origin: str = "", replace: bool = False
) -> PreTrainedTokenizerBase:
    """The tokenizer in `folder` (TRAIN_TOKENIZER's when it is set, else TRAIN_MODEL's own, or the byte-level one),
    with the chat template the checks found (`template`, from `origin`; `replace`: TRAIN_CHAT_TEMPLATE's, which
    replaces the folder's own); saved with the tokenizer in final/ and every checkpoint. The data layer uses
    tokenizers, so this module asks nothing of it."""
    tok = load_tokenizer(folder)
    if template and (replace or not tok.chat_template):
        tok.chat_template = template
    if template:
        log.info("tokenizer: chat template: %s", origin)
    return tok


def load_tokenizer(model: str) -> PreTrainedTokenizerBase:
    """The model folder's tokenizer (offline), else the byte-level one. Ensures eos and pad exist."""
    if has_tokenizer(model):
        tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
        log.info("tokenizer: loaded from %s (%d tokens)", model, len(tok))
    else:
        tok = byte_level_tokenizer()
        where = "preset" if not Path(model).is_dir() else f"{model} has no tokenizer files"
        log.info("tokenizer: byte-level, 259 tokens, no download needed (%s); saved with the outputs", where)
    if tok.eos_token is None:
        tok.add_special_tokens({"eos_token": EOS})
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def fit_embeddings(model: Any, tokenizer: PreTrainedTokenizerBase) -> None:
    """Give every id of `tokenizer` an embedding row (a model folder without its tokenizer gets the byte-level one);
    the run does it before training, export before adding the run's adapter."""
    weight = model.get_input_embeddings().weight
    rows = int(getattr(weight, "ds_shape", weight.shape)[0])  # ZeRO-3: the local shard is empty
    if len(tokenizer) > rows:
        model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)
        log.info("model: embeddings resized to %d for the tokenizer", model.get_input_embeddings().weight.shape[0])
