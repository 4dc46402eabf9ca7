"""The memorization recipe of the generate/eval tests: the tiny preset (chatml) trained on four question-answer pairs
until greedy decoding gives every answer back, on any x86 CPU's instruction path (issue 59: a recipe tuned on one
path only memorized three of four pairs on another), and the margin it does so by.

A trajectory is not portable across CPUs: MKL, oneDNN and ATen pick their kernels by the instruction set (AVX-512,
AVX2, ...), which reorders float sums. So the recipe is chosen by its margin on both paths, several seeds each
(docs/development.md), and the suite trains it once on the other path (test_generate_eval.py).
"""

from __future__ import annotations

import json
from pathlib import Path

PAIRS = [("What is the capital of France?", "Paris."), ("Name a primary color.", "Blue."),
         ("What is 2+2?", "Four."), ("Who wrote Hamlet?", "Shakespeare.")]  # fmt: skip
MEMORIZE = {"TRAIN_MODEL": "tiny", "TRAIN_CHAT_TEMPLATE": "chatml", "TRAIN_SEQ_LEN": "100", "TRAIN_BATCH_SIZE": "4",
            "TRAIN_MAX_STEPS": "100", "TRAIN_LR": "0.005", "TRAIN_SAVE_STEPS": "100", "TRAIN_LOG_STEPS": "20",
            "TRAIN_SEED": "1"}  # fmt: skip
# About half the smallest margin measured for this recipe on AVX-512 and AVX2, seeds 1-3 (0.97 logits; seed 1, the
# recipe's: 4.36 and 4.92; the numbers: docs/development.md, "CPU instruction paths").
MARGIN = 0.5
AVX2 = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
BASELINE = {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default"}

# Run as `python -c MARGINS FOLDER` (on the instruction path of its environment): prints each pair's margin.
MARGINS = """
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, pairs = sys.argv[1], json.loads(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder).eval()
margins = []
for question, answer in pairs:
    asked = [{"role": "user", "content": question}]
    prompt = tokenizer.apply_chat_template(asked, add_generation_prompt=True, tokenize=False)
    whole = tokenizer.apply_chat_template([*asked, {"role": "assistant", "content": answer}], tokenize=False)
    start = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    ids = tokenizer(whole, add_special_tokens=False)["input_ids"]
    end = start + len(tokenizer(answer, add_special_tokens=False)["input_ids"]) + 1  # the answer and its end of turn
    with torch.no_grad():
        logits = model(torch.tensor([ids[:end]])).logits[0].float()
    gaps = []
    for position in range(start - 1, end - 1):
        row, target = logits[position].clone(), ids[position + 1]
        right = row[target].item()
        row[target] = float("-inf")
        gaps.append(right - row.max().item())
    margins.append(min(gaps))
print(json.dumps(margins))
"""


def chat_line(question: str, answer: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]})


def write_pairs(path: Path) -> Path:
    path.write_text("".join(chat_line(q, a) + "\n" for q, a in PAIRS))
    return path


def other_path() -> dict[str, str]:
    """The instruction path this machine does not take by default: AVX2 where ATen runs AVX-512, else the baseline
    (ATen's default kernels, MKL's SSE4.2)."""
    import torch

    return AVX2 if torch.backends.cpu.get_cpu_capability() == "AVX512" else BASELINE
