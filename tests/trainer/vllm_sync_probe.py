"""TRL's colocate weight sync, observed: vLLM's greedy completions before and after TRL's own sync, and Transformers'.

Usage (in the CPU RL venv): python vllm_sync_probe.py START TRAINED PROMPTS_JSON MEMORY
START: the folder a GRPO run began from (what vLLM loads, as in the run); TRAINED: weights that run wrote after its
steps; PROMPTS_JSON: a JSON list of prompt strings. Prints one JSON object: {"before": [...], "after": [...],
"transformers": [...]}, the greedy completions (8 new tokens) of vLLM holding START's weights, of vLLM after
VLLMGeneration.sync_weights() copied TRAINED's in (as GRPOTrainer calls it after each step, with the run's
replacement on vLLM's CPU build: trainer.run.vllm_engine.reload_on_cpu), and of Transformers' generate on TRAINED.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # as trainer.run.vllm_engine sets it for colocate mode

import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.generation.vllm_generation import VLLMGeneration
from vllm import SamplingParams

from trainer.run.vllm_engine import reload_on_cpu

NEW_TOKENS = 8


def main() -> None:
    start, trained, prompts_file, memory = sys.argv[1:5]
    prompts = json.loads(Path(prompts_file).read_text())
    tokenizer = AutoTokenizer.from_pretrained(start)
    model = AutoModelForCausalLM.from_pretrained(trained, dtype=torch.float32)
    model.name_or_path = start  # vLLM starts from the run's starting folder, as TRL's colocate mode does
    generation = VLLMGeneration(model, Accelerator(cpu=True), tokenizer, mode="colocate",
                                gpu_memory_utilization=float(memory), max_completion_length=NEW_TOKENS)  # fmt: skip
    reload_on_cpu(generation)  # what the run does to TRL's sync on vLLM's CPU build (trainer.run.vllm_engine)
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)

    def vllm_completions() -> list[str]:
        outputs = generation.llm.generate([{"prompt_token_ids": i} for i in ids], greedy, use_tqdm=False)
        return [tokenizer.decode(o.outputs[0].token_ids, skip_special_tokens=True) for o in outputs]

    before = vllm_completions()
    generation.sync_weights()
    after = vllm_completions()
    hf = []
    with torch.no_grad():
        for prompt_ids in ids:
            out = model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=NEW_TOKENS,
                                 pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)  # fmt: skip
            hf.append(tokenizer.decode(out[0, len(prompt_ids):], skip_special_tokens=True))
    print(json.dumps({"before": before, "after": after, "transformers": hf}))


if __name__ == "__main__":
    main()
