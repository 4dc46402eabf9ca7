"""`export`'s quantization options (--quant and the gate's), torch-free: argparse in, a QuantRequest out."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


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


def quant_request(args: argparse.Namespace) -> QuantRequest | None:
    if not args.quant:
        return None
    return QuantRequest(list(args.quant), args.max_ppl_increase, args.allow_quality_loss, args.eval_data,
                        args.eval_context, args.calibration_data)  # fmt: skip
