"""`python -m trainer generate --quant 8bit|4bit` on a GPU: bitsandbytes Int8 and NF4 (double-quantized) loading next
to bf16, on the same prompts: every run answers every line, and the quantized weights take less memory than bf16's
(the CPU suite checks the refusal where bitsandbytes cannot run: tests/trainer/test_generate_eval.py).

    .venv/bin/python -m pytest -q tests/gpu/test_generate_gpu.py -rs
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_gpu_paths import HAS_CUDA

REPO = Path(__file__).resolve().parents[2]



pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible to torch)")]


def _model(folder: Path) -> Path:
    """The tiny preset, widened to 1024 so the linear layers dominate the memory (embeddings stay unquantized)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from trainer.tokenizer import byte_level_tokenizer

    tokenizer = byte_level_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=320, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=8, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("quant", ["none", "8bit", "4bit"])
def test_quantized_generation_answers_every_line_in_less_memory(quant: str, tmp_path_factory, tmp_path) -> None:
    folder = tmp_path_factory.getbasetemp() / "gpu-generate-model"
    if not folder.exists():
        _model(folder)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("hello", "a longer prompt here", "x")))
    out = tmp_path / "out.jsonl"
    argv = [sys.executable, "-m", "trainer", "generate", str(folder), "--input", str(prompts), "--output", str(out),
            "--max-new-tokens", "8", "--dtype", "bf16"]  # fmt: skip
    argv += [] if quant == "none" else ["--quant", quant] + (["--double-quant"] if quant == "4bit" else [])
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(answers) == 3 and all(a["completion_tokens"] > 0 for a in answers)
    weights = float(re.search(r"memory: weights ([\d.]+) MiB, GPU peak", result.stderr).group(1))
    linear = 4 * (4 * 1024 * 1024 + 3 * 1024 * 2816)  # 4 layers: q, k, v, o and the MLP's gate, up, down
    bf16 = 2 * (linear + 2 * 320 * 1024) / 2**20  # + embeddings and lm_head, never quantized
    if quant == "8bit":
        assert weights < 0.7 * bf16, result.stderr[-2000:]
    elif quant == "4bit":
        assert weights < 0.45 * bf16, result.stderr[-2000:]
    assert "not quantized" in result.stderr if quant == "none" else quant.replace("bit", "-bit") in result.stderr
