"""A scripted policy through trainkit's multi-turn GRPO, on either engine: what the engine generated, turn by turn, and
what the trainer then trains on (its completion ids and loss mask).

The policy is the model's own generation with every step's logits forced to the script's next token (a logits
processor: Transformers' generate, or vLLM's engine in colocate mode), so the engine really samples each token, stops
where the run makes it stop and returns the ids as it made them. The script writes its text in tokens the tokenizer
would never choose for it (`SCRIPT`: a tool call split across tokens, a multi-byte character byte by byte, a word
apart from its leading space): a decode and encode anywhere between the turns would change them.

In-process (Transformers' generate): `rollouts(MODEL_FOLDER, TOOLS_FILE)`. A real run (`python -m trainer`, the vLLM
engine in colocate mode, in the CPU RL venv): `python tool_policy.py RECORD_JSONL` with the run's TRAIN_* settings in
the environment; each generation batch's engine outputs and trained ids are appended to RECORD_JSONL.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

MAX_TURNS = 3
# Each turn as pieces: a text piece is encoded on its own, a bytes piece is one token per byte (the byte-level
# alphabet); the turns: a call, a call whose argument has the wrong type (the model reads the error), the answer.
SCRIPT: tuple[tuple[str | bytes, ...], ...] = (
    ("<tool", "_call>", "\n", '{"name": "lookup", "arguments": {"key": "k', "3", '"}}', "\n", "</tool_call>", "\n",
     "<|im_end|>"),
    ("<tool_call>", "\n", '{"name": "lookup", "arguments": {"key": ', "3", "}}", "\n", "</tool_call>", "\n",
     "<|im_end|>"),
    ("k", "3", " = ", "gr", "ü".encode(), "n", "<|im_end|>"),
)  # fmt: skip


def script_ids(tokenizer: Any) -> list[list[int]]:
    """The script's turns as token ids."""
    from trainer.tokenizer import _byte_to_printable

    mapping = _byte_to_printable()  # the byte-level alphabet: each byte's token
    turns = []
    for pieces in SCRIPT:
        ids: list[int] = []
        for piece in pieces:
            if isinstance(piece, bytes):
                ids += tokenizer.convert_tokens_to_ids([mapping[b] for b in piece])
            else:
                ids += tokenizer(piece, add_special_tokens=False)["input_ids"]
        turns.append(ids)
    return turns


def turn_of(tokenizer: Any, ids: list[int]) -> int:
    """Which turn a generation is in: the tool results its input already holds."""
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return min(text.count("<tool_response>"), len(SCRIPT) - 1)


class Forcing:
    """Transformers' logits processor: each row's next token is its turn's next scripted token (EOS after it)."""

    def __init__(self, tokenizer: Any, script: list[list[int]], generated: list[list[int]]) -> None:
        self.tokenizer, self.script, self.generated, self.start = tokenizer, script, generated, None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.start is None:
            self.start = input_ids.shape[1]
            self.turns = [turn_of(self.tokenizer, row.tolist()) for row in input_ids]
        step = input_ids.shape[1] - self.start
        forced = torch.full_like(scores, float("-inf"))
        for row, turn in enumerate(self.turns):
            script = self.script[turn]
            forced[row, script[step] if step < len(script) else self.tokenizer.eos_token_id] = 0.0
        return forced


def rollouts(model_folder: str, tools_file: str, max_turns: int = MAX_TURNS) -> dict[str, Any]:
    """One generation batch (2 prompts x 2 completions) of the scripted policy through trainkit's multi-turn layer
    on Transformers' generate: {"script": ids per turn, "generated": [ids the engine returned, per call, per row],
    "completion_ids", "loss_mask", "metrics"}."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessorList
    from trl import GRPOConfig, GRPOTrainer

    from trainer.run.multi_turn import multi_turn
    from trainer.run.online import turn_end
    from trainer.run.tools import check_template, load_toolbox

    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    toolbox = load_toolbox(f"{tools_file}:lookup", "")
    check_template(tokenizer, "the test's chatml")
    script = script_ids(tokenizer)
    generated: list[list[list[int]]] = []
    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32)
    args = GRPOConfig(output_dir=str(Path(model_folder) / "probe"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=160, report_to=[], use_cpu=True, max_steps=1)  # fmt: skip
    prompts = [{"prompt": [{"role": "user", "content": key}], "answer": "gold"} for key in ("k3", "k4")]
    trainer = multi_turn(GRPOTrainer)(model=model, reward_funcs=[_zero], args=args, processing_class=tokenizer,
                                      train_dataset=Dataset.from_list(prompts), tools=list(toolbox.tools))  # fmt: skip
    trainer.setup_turns(turn_end(tokenizer), 10.0, max_turns)
    _force_transformers(trainer.model, tokenizer, script, generated, LogitsProcessorList)
    trainer.model.train()  # as in training: its metrics are the train ones
    batch = [row for row in prompts for _ in range(2)]
    out = trainer._generate_and_score_completions(batch)
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("tools/")}
    return {"script": script, "generated": generated, **trained(out), "metrics": metrics}


def trained(out: dict[str, Any]) -> dict[str, Any]:
    """What the loss sees of a generation batch: its completion ids and the mask the loss multiplies by."""
    mask = out["completion_mask"] * out["tool_mask"]
    return {"completion_ids": out["completion_ids"].tolist(), "loss_mask": mask.tolist()}


def _zero(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
    return [0.0] * len(completions)


def _force_transformers(model: Any, tokenizer: Any, script: list[list[int]], generated: list[list[list[int]]],
                        processors: Any) -> None:  # fmt: skip
    """Every generate() of the policy forced to the script; what it returned recorded (the new ids, each row)."""
    generate = model.generate

    def scripted(*args: Any, **kwargs: Any) -> Any:
        kwargs["logits_processor"] = processors([Forcing(tokenizer, script, generated)])
        out = generate(*args, **kwargs)
        start = kwargs["input_ids"].shape[1]
        generated.append([row[start:].tolist() for row in out])
        return out

    model.generate = scripted


def _force_vllm(tokenizer: Any, script: list[list[int]], generated: list[list[list[int]]]) -> None:
    """TRL's colocated vLLM made with the forcing logits processor; each generate's outputs recorded."""
    import trl.generation.vllm_generation as trl_vllm
    from vllm.v1.sample.logits_processor import LogitsProcessor

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # as trainer.run.vllm_engine sets it for colocate mode

    class VLLMForcing(LogitsProcessor):
        def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
            self.rows: dict[int, tuple[int, list[int]]] = {}

        def is_argmax_invariant(self) -> bool:
            return False

        def update_state(self, batch_update: Any) -> None:
            if batch_update is None:
                return
            for index in batch_update.removed:
                self.rows.pop(index, None)
            for index, _params, prompt, output in batch_update.added:
                self.rows[index] = (turn_of(tokenizer, list(prompt or [])), output)
            for a, b, way in batch_update.moved:
                moved_a, moved_b = self.rows.pop(a, None), self.rows.pop(b, None)
                if moved_a is not None:
                    self.rows[b] = moved_a
                if moved_b is not None and way.name == "SWAP":
                    self.rows[a] = moved_b

        def apply(self, logits: Any) -> Any:
            for index, (turn, output) in self.rows.items():
                step, ids = len(output), script[turn]
                token = ids[step] if step < len(ids) else tokenizer.eos_token_id
                logits[index] = float("-inf")
                logits[index, token] = 0.0
            return logits

    made = trl_vllm.LLM

    def with_forcing(*args: Any, **kwargs: Any) -> Any:
        llm = made(*args, logits_processors=[VLLMForcing], **kwargs)
        generate = llm.generate

        def recorded(*a: Any, **k: Any) -> Any:
            outputs = generate(*a, **k)
            generated.append([list(o.outputs[0].token_ids) for o in outputs])
            return outputs

        llm.generate = recorded
        return llm

    trl_vllm.LLM = with_forcing


def main() -> None:
    """A real run (its TRAIN_* settings in the environment, the vLLM engine) with the scripted policy, recorded."""
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from trainer.__main__ import main as trainer_main

    record = Path(sys.argv[1])
    tokenizer = AutoTokenizer.from_pretrained(os.environ["TRAIN_MODEL"])
    script = script_ids(tokenizer)
    generated: list[list[list[int]]] = []
    _force_vllm(tokenizer, script, generated)
    scored = GRPOTrainer._generate_and_score_completions

    def recorded(self: Any, inputs: Any) -> Any:
        out = scored(self, inputs)
        with record.open("a") as handle:
            handle.write(json.dumps({"script": script, "generated": list(generated), **trained(out)}) + "\n")
        generated.clear()
        return out

    GRPOTrainer._generate_and_score_completions = recorded
    sys.exit(trainer_main([]))


if __name__ == "__main__":
    main()
