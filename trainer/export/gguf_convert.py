"""llama.cpp's own converter (convert_hf_to_gguf.py and its `conversion` and `gguf-py` packages, from the sources
images/versions.toml pins), run in a child process: `python -m trainer.export.gguf_convert LLAMA_CPP MODEL OUT
OUTTYPE [NAME]`, or with OUT `--check` to convert the vocabulary only (architecture and tokenizer: nothing else is
read).

Its one addition is for trainkit's own byte-level tokenizer (trainer/tokenizer.py: one token per byte, no merges),
which the converter cannot place: it names a BPE pre-tokenizer by the hash of a probe text's ids, and its table knows
only published models. With no merges, every pre-tokenizer split gives the same ids (one per byte), so the file
names GPT-2's; and since GGUF stores no empty array and llama.cpp refuses a BPE vocabulary without merges, the file
carries one merge of the two special tokens bos and eos, which can never apply (special tokens are split off before
merging). export's quality gate checks that llama.cpp's ids for the eval text equal the tokenizer's.

A model the converter cannot take prints one line `unsupported: WHAT` on stdout and exits 3.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

UNSUPPORTED_EXIT = 3
BYTE_LEVEL_PRE = "gpt-2"


class _GGUFWriter(Protocol):
    """What set_vocab_gpt2 calls of the converter's gguf.GGUFWriter."""

    def add_token_merges(self, merges: list[str]) -> None: ...


class _TextModel(Protocol):
    """What the byte-level additions read of the converter's TextModel (an instance)."""

    dir_model: Path
    gguf_writer: _GGUFWriter


def _is_byte_level(model_dir: Path) -> bool:
    from trainer.tokenizer import BYTE_TOKENIZER_MARKER

    config = model_dir / "tokenizer_config.json"
    return config.is_file() and json.loads(config.read_text()).get("trainkit_tokenizer") == BYTE_TOKENIZER_MARKER


def _teach_byte_level(base: Any) -> None:  # the converter's TextModel class
    from trainer.tokenizer import BOS, EOS

    plain_pre, plain_gpt2 = base.get_vocab_base_pre, base._set_vocab_gpt2

    def get_vocab_base_pre(self: _TextModel, tokenizer: PreTrainedTokenizerBase) -> str:
        return BYTE_LEVEL_PRE if _is_byte_level(self.dir_model) else str(plain_pre(self, tokenizer))

    def set_vocab_gpt2(self: _TextModel) -> None:
        plain_gpt2(self)
        if _is_byte_level(self.dir_model):
            self.gguf_writer.add_token_merges([f"{BOS} {EOS}"])

    base.get_vocab_base_pre = get_vocab_base_pre
    base._set_vocab_gpt2 = set_vocab_gpt2


def main(argv: list[str]) -> int:
    llama_cpp, model, out, outtype = Path(argv[0]), Path(argv[1]), argv[2], argv[3]
    name = argv[4] if len(argv) > 4 else None  # general.name (else the converter reads it off the folder's name)
    sys.path[:0] = [str(llama_cpp), str(llama_cpp / "gguf-py")]
    logging.basicConfig(level=logging.INFO)  # as convert_hf_to_gguf.py's main: its log on stderr
    import gguf  # type: ignore[import-not-found]
    import torch
    from conversion import get_model_class  # type: ignore[import-not-found]
    from conversion.base import ModelBase, TextModel  # type: ignore[import-not-found]

    _teach_byte_level(TextModel)
    hparams = ModelBase.load_hparams(model, False)
    archs = hparams.get("architectures") or [hparams.get("model_type") or "?"]
    try:
        model_class = get_model_class(archs[0])
    except NotImplementedError:
        print(f"unsupported: the architecture {archs[0]} (llama.cpp's converter has no {archs[0]})")
        return UNSUPPORTED_EXIT
    ftypes = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
              "bf16": gguf.LlamaFileType.MOSTLY_BF16}  # fmt: skip
    check = out == "--check"
    target = Path(out) if not check else Path(tempfile.mkdtemp(prefix="trainkit-vocab-")) / "vocab.gguf"
    try:
        with torch.inference_mode():
            instance = model_class(model, ftypes[outtype], target, dry_run=check, model_name=name)
            if check:
                instance.set_vocab()
            else:
                instance.write()
    except NotImplementedError as exc:  # the converter's word for a tokenizer (or a part) it does not know
        print(f"unsupported: {exc} (tokenizer of {model})")
        return UNSUPPORTED_EXIT
    finally:
        if check:
            shutil.rmtree(target.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
