"""`export`'s quantization options (--quant and the gate's), torch-free: argparse in, a QuantRequest out, every value
checked before any work (a ConfigError, exit 2, naming the option)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from trainer.errors import ConfigError

MIN_CONTEXT = 2  # a window's last position has no next token: two tokens are the least that score one
GATE_OPTIONS = {"max_ppl_increase": "--max-ppl-increase", "allow_quality_loss": "--allow-quality-loss",
                "eval_data": "--eval-data", "calibration_data": "--calibration-data",
                "eval_context": "--eval-context"}  # fmt: skip


@dataclass(frozen=True)
class QuantRequest:
    types: list[str]
    max_ppl_increase: float | None = None
    allow_quality_loss: bool = False
    eval_data: str | None = None
    eval_context: int | None = None
    calibration_data: str | None = None


def add_quant_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quant", action="append", default=[], metavar="TYPE",
        help="also write a quantized file, gated on measured quality (repeatable): GGUF f32, f16, bf16, q8_0, "
        "q4_k_m and llama.cpp's other types (OUT/gguf/, with an Ollama Modelfile each); fp8 and w4a16 for vLLM and "
        "SGLang (compressed-tensors, OUT/fp8/, OUT/w4a16/); report in OUT/quant_report.json",
    )  # fmt: skip
    parser.add_argument(
        "--max-ppl-increase", type=float, metavar="PCT",
        help="largest perplexity increase over the unquantized export, in percent, for every --quant type "
        "(default: each type's own, in trainer/export/quant.py)",
    )  # fmt: skip
    parser.add_argument("--allow-quality-loss", action="store_true",
                        help="publish types over their threshold anyway (the report says so)")  # fmt: skip
    parser.add_argument("--eval-data", metavar="FILE",
                        help="the text the gate scores on (.txt, .jsonl, .json); default: the run's eval set, else "
                        "the tail of its training data")  # fmt: skip
    parser.add_argument("--calibration-data", metavar="FILE",
                        help="w4a16's GPTQ calibration text (.txt, .jsonl, .json); default: the run's training data "
                        "before the tail the gate may score on")  # fmt: skip
    parser.add_argument("--eval-context", type=int, metavar="N",
                        help="tokens per scored window (default: the run's TRAIN_SEQ_LEN)")  # fmt: skip


def option_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the quality gate's options: a number out of range, or a gate option without --quant."""
    if not args.quant:
        given = [flag for name, flag in GATE_OPTIONS.items() if getattr(args, name) not in (None, False)]
        return [f"export {flag}: only with --quant TYPE (it is the quality gate's); add --quant or drop it"
                for flag in given]  # fmt: skip
    problems = []
    increase = args.max_ppl_increase
    if increase is not None and not (math.isfinite(increase) and increase > 0):
        problems.append(f"export --max-ppl-increase {increase}: give a percentage above 0 (publish over the "
                        "threshold with --allow-quality-loss instead)")  # fmt: skip
    if args.eval_context is not None and args.eval_context < MIN_CONTEXT:
        problems.append(f"export --eval-context {args.eval_context}: give the tokens per scored window, at least "
                        f"{MIN_CONTEXT} (default: the run's TRAIN_SEQ_LEN)")  # fmt: skip
    return problems


def quant_request(args: argparse.Namespace) -> QuantRequest | None:
    """The checked request (ConfigError naming each wrong option); None without --quant."""
    problems = option_problems(args)
    if problems:
        raise ConfigError(*problems)
    if not args.quant:
        return None
    return QuantRequest(list(args.quant), args.max_ppl_increase, args.allow_quality_loss, args.eval_data,
                        args.eval_context, args.calibration_data)  # fmt: skip
