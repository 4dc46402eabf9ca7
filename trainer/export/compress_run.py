"""llmcompressor's side of `export --quant fp8/w4a16` (trainer/export/compressed.py), in a child process:
`python -m trainer.export.compress_run JOB.json RESULT.json`.

The job names the overlay (put first on sys.path before Transformers is imported: llmcompressor's pins), the written
export, the gate's windows and one entry per type. Per type: the export loaded in its own dtype, quantized by oneshot
(QuantizationModifier for a scheme without calibration, GPTQModifier with it), saved compressed with the tokenizer,
then loaded back from the saved folder through Transformers' compressed-tensors loader, scored on the windows
(trainer/export/quality.py's transformers_scores: the reference's own rule) and asked the answer prompts
(trainer/export/answer_agreement.py's transformers_answers, the same). RESULT gets each type's nll and top tokens,
answers, the recipe, the layers kept unquantized and the seconds it took.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def _kept(model: Any, group_size: int) -> list[str]:
    """Linear layers whose input width is not a multiple of the group (llmcompressor refuses them)."""
    import torch

    linear = torch.nn.Linear
    return [name for name, module in model.named_modules()
            if isinstance(module, linear) and name != "lm_head" and module.in_features % group_size]  # fmt: skip


def _compress(model: Any, entry: dict[str, Any]) -> tuple[str, list[str]]:
    from llmcompressor import oneshot  # type: ignore[import-not-found]
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier  # type: ignore[import-not-found]

    kept = _kept(model, entry["group_size"]) if entry["group_size"] else []
    ignore = ["lm_head", *kept]
    calibration = entry["calibration"]
    if not calibration:
        oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=entry["scheme"], ignore=ignore))
        return f"{entry['scheme']}, no calibration", ignore
    from datasets import Dataset

    data = Dataset.from_dict({"input_ids": calibration, "attention_mask": [[1] * len(c) for c in calibration]})
    oneshot(model=model, recipe=GPTQModifier(targets="Linear", scheme=entry["scheme"], ignore=ignore), dataset=data,
            num_calibration_samples=len(calibration), max_seq_length=len(calibration[0]), batch_size=entry["batch"],
            shuffle_calibration_samples=False)  # fmt: skip
    recipe = (f"GPTQ {entry['scheme']}, groups of {entry['group_size']}, {len(calibration)} calibration windows of "
              f"{len(calibration[0])} tokens")  # fmt: skip
    return recipe, ignore


def write(model: Any, tokenizer: Any, out: str) -> None:
    """The compressed folder, as vLLM loads it (tests/trainer/broken_compressed.py damages it after this)."""
    model.save_pretrained(out, save_compressed=True)
    tokenizer.save_pretrained(out)


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    sys.path.insert(0, job["overlay"])  # llmcompressor's Transformers and huggingface-hub before this environment's
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.export.answer_agreement import Job, transformers_answers
    from trainer.export.quality import transformers_scores

    tokenizer = AutoTokenizer.from_pretrained(job["model"])
    asking = Job(**{**job["answers"], "stops": tuple(job["answers"]["stops"])})
    found: dict[str, Any] = {}
    for entry in job["types"]:
        start = time.monotonic()
        model = AutoModelForCausalLM.from_pretrained(job["model"], dtype="auto")
        recipe, ignore = _compress(model, entry)
        write(model, tokenizer, entry["out"])
        del model
        quantized = AutoModelForCausalLM.from_pretrained(entry["out"]).eval()  # compressed-tensors decompresses it
        scores = transformers_scores(quantized, job["windows"])
        said = transformers_answers(quantized, asking)
        del quantized
        found[entry["type"]] = {"nll": scores.nll, "top": scores.top, "answers": said, "recipe": recipe,
                                "unquantized": ignore, "seconds": round(time.monotonic() - start, 1)}  # fmt: skip
    Path(argv[1]).write_text(json.dumps({"types": found}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
