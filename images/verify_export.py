"""The image's export checks (images/verify.py's `llama_cpp` and `llmcompressor`): `export --quant TYPE` for real,
inside the image: `python verify_export.py q8_0` or `python verify_export.py fp8`.

A two-layer Llama with trainkit's byte-level tokenizer (random weights, seeded: nothing downloaded) is exported with
`python -m trainer export MODEL OUT --quant TYPE`. q8_0: llama.cpp's converter (TRAINKIT_LLAMA_CPP) writes the GGUF
file, its quantizer makes q8_0, and llama.cpp (the llama_cpp binding) loads and scores it; fp8: llmcompressor (the
overlay TRAINKIT_LLMCOMPRESSOR names) writes the compressed-tensors folder, and Transformers' compressed-tensors loader
loads and scores it. Both against the export in Transformers. The check holds when the export exits 0 and its report
says the artifact passed its gate (for GGUF, with llama.cpp's ids equal to the tokenizer's). Prints one line (file,
size, perplexity ratio, agreement, runtime) or exits 1 with the export's own message. Container side: no docker SDK.
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


def main(kind: str) -> int:
    if kind not in TYPES:
        print(f"usage: verify_export.py {{{'|'.join(TYPES)}}}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="trainkit-gguf-check-") as tmp:
        model, out, text = Path(tmp, "model"), Path(tmp, "out"), Path(tmp, "eval.txt")
        two_layer_model(model)
        text.write_text(TEXT)
        argv = [sys.executable, "-m", "trainer", "export", str(model), str(out), "--quant", kind,
                "--eval-data", str(text), "--eval-context", str(CONTEXT)]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
        result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=900)
        if result.returncode != 0:
            print(f"export --quant {kind} exited {result.returncode}: {result.stderr.strip()[-1500:]}", file=sys.stderr)
            return 1
        report = json.loads((out / "quant_report.json").read_text())
        row = report["types"][0]
        if not (row["pass"] and row.get("tokenizer_agrees", True) and (out / row["file"]).exists()):
            print(f"export --quant {kind} wrote a file that fails its gate: {json.dumps(row)}", file=sys.stderr)
            return 1
        print(f"{row['file']} ({row['bytes']} bytes) loads and scores in {row['runtime']}: perplexity ratio "
              f"{row['ratio']:.5f}, top-token agreement {row['agreement']:.4f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) == 2 else ""))
