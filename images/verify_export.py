"""The image's export checks (images/verify.py's `llama_cpp` and `llmcompressor`): `export --quant TYPE` for real,
inside the image, one export for every type asked: `python verify_export.py q8_0 fp8`.

A two-layer Llama with trainkit's byte-level tokenizer (random weights, seeded: nothing downloaded) is exported with
`python -m trainer export MODEL OUT --quant TYPE`. q8_0: llama.cpp's converter (TRAINKIT_LLAMA_CPP) writes the GGUF
file, its quantizer makes q8_0, and llama.cpp (the llama_cpp binding) loads and scores it; fp8: llmcompressor (the
overlay TRAINKIT_LLMCOMPRESSOR names) writes the compressed-tensors folder, and Transformers' compressed-tensors loader
loads and scores it. Both against the export in Transformers. The check holds when the export exits 0 and its report
says the artifact passed its gate (for GGUF, with llama.cpp's ids equal to the tokenizer's). Prints one line per type
(`TYPE: file, size, perplexity ratio, agreement, runtime`) or exits 1 with the export's own message. Container side:
no docker SDK.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TYPES = ("q8_0", "fp8")
CONTEXT = 64
TEXT = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog, {i * 7 % 13} times." for i in range(40))


def two_layer_model(folder: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.tokenizer import byte_level_tokenizer

    tokenizer = byte_level_tokenizer()
    config = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def main(kinds: list[str]) -> int:
    if not kinds or set(kinds) - set(TYPES):
        print(f"usage: verify_export.py TYPE... (of {', '.join(TYPES)})", file=sys.stderr)
        return 2
    quant = [word for kind in kinds for word in ("--quant", kind)]
    with tempfile.TemporaryDirectory(prefix="trainkit-export-check-") as tmp:
        model, out, text = Path(tmp, "model"), Path(tmp, "out"), Path(tmp, "eval.txt")
        two_layer_model(model)
        text.write_text(TEXT)
        argv = [sys.executable, "-m", "trainer", "export", str(model), str(out), *quant, "--eval-data", str(text),
                "--eval-context", str(CONTEXT)]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
        result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=900)
        if result.returncode != 0:
            print(f"export {' '.join(quant)} exited {result.returncode}: {result.stderr.strip()[-1500:]}",
                  file=sys.stderr)  # fmt: skip
            return 1
        rows = json.loads((out / "quant_report.json").read_text())["types"]
        failed = [row for row in rows if not (row["pass"] and row.get("tokenizer_agrees", True)
                                              and (out / row["file"]).exists())]  # fmt: skip
        if failed:
            print(f"export {' '.join(quant)} wrote what fails its gate: {json.dumps(failed)}", file=sys.stderr)
            return 1
        for row in rows:
            print(f"{row['type']}: {row['file']} ({row['bytes']} bytes) loads and scores in {row['runtime']}: "
                  f"perplexity ratio {row['ratio']:.5f}, top-token agreement {row['agreement']:.4f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
