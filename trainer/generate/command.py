"""`python -m trainer generate MODEL`: ask the model something.

On a terminal (or with prompts piped in), a chat: the history is kept and rendered with the model's saved chat
template; `/reset` forgets it, `/exit` (or end of input) quits. A model without a template completes each line as
plain text. With `--input prompts.jsonl --output out.jsonl`, a batch (trainer.generate.batch). Decoding is greedy
unless the saved generation config or --temperature/--top-p sample. MODEL: trainer.generate.loading.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from trainer.errors import EXIT_OK, ConfigError, Interrupted

QUANT_CHOICES = ("8bit", "4bit")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """MODEL and how it is loaded: shared by `generate` and `eval`."""
    from trainer.generate.loading import DTYPES
    from trainer.model.quantization import QUANT_TYPES

    parser.add_argument("model", metavar="MODEL", help="a run folder, final/, an export, a checkpoint-N folder, a "
                        "base model folder (with --adapter), a preset or a Hub ID org/name[@revision]")  # fmt: skip
    parser.add_argument("--adapter", metavar="FOLDER", help="a LoRA adapter to put on MODEL (the base)")
    parser.add_argument("--dtype", choices=list(DTYPES), default="auto", help="the weights' dtype (auto: as saved; a "
                        "LoRA checkpoint's base: the run's compute dtype)")  # fmt: skip
    parser.add_argument("--quant", choices=QUANT_CHOICES, help="load the weights quantized by bitsandbytes (Int8, or "
                        "4-bit NF4/FP4)")  # fmt: skip
    parser.add_argument("--quant-type", choices=QUANT_TYPES, default="nf4", help="--quant 4bit's data type")
    parser.add_argument("--double-quant", action="store_true", help="--quant 4bit: quantize the quantization "
                        "constants too (about 0.4 bits per weight less)")  # fmt: skip
    parser.add_argument("--chat-template", metavar="NAME|FILE", help="a built-in template (chatml) or a .jinja file, "
                        "for a model saved without one")  # fmt: skip


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-new-tokens", type=int, metavar="N", help="at most N new tokens per answer (default: "
                        "the saved generation config's, else 256)")  # fmt: skip
    parser.add_argument("--temperature", type=float, help="sample at this temperature (0: greedy, the default)")
    parser.add_argument("--top-p", type=float, help="nucleus sampling: the smallest set of tokens above this mass")
    parser.add_argument("--seed", type=int, help="the random seed of sampling (reproducible draws)")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts generated together (default 8)")


def register(parser: argparse.ArgumentParser) -> None:
    """`generate`'s arguments, on the parser trainer/__main__.py made for it (trainer/commands.py)."""
    parser.description = (
        "Load MODEL (LoRA adapter, chat template and generation config as saved) and chat with it on "
        "the terminal (/reset, /exit), or answer every line of --input into --output. Greedy unless asked to sample."
    )
    add_model_arguments(parser)
    add_decoding_arguments(parser)
    parser.add_argument("--input", metavar="FILE", help='JSON Lines: {"prompt": text} or {"messages": [...]}')
    parser.add_argument("--output", metavar="FILE", help="with --input: the answers (appended line by line)")
    parser.add_argument("--resume", action="store_true", help="--output exists: continue after its complete lines")
    parser.add_argument("--max-bad-lines", type=int, default=0, metavar="N", help="skip up to N bad --input lines")
    parser.set_defaults(func=main)


def check_arguments(args: argparse.Namespace) -> None:
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens {args.max_new_tokens}: give at least 1")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size {args.batch_size}: give at least 1")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ConfigError(f"--top-p {args.top_p}: give a value in (0, 1]")
    if args.temperature is not None and args.temperature < 0:
        raise ConfigError(f"--temperature {args.temperature}: give 0 (greedy) or more")
    if args.quant is None and (args.double_quant or args.quant_type != "nf4"):
        raise ConfigError("--double-quant and --quant-type go with --quant 4bit")


def load_for(args: argparse.Namespace, command: str) -> Any:
    """The loaded model (trainer.generate.loading) and its generator, as the command line asks; logs on stderr."""
    from trainer.answers.decoding import Generator, Sampling
    from trainer.generate.loading import Choice, load
    from trainer.logs import setup_logging

    setup_logging()
    _quiet_transformers()
    choice = Choice(args.dtype, args.quant or "none", args.quant_type, args.double_quant)
    loaded = load(args.model, args.adapter, choice, command)
    if args.chat_template:
        _set_template(loaded, args.chat_template)
    sampling = Sampling(args.temperature, args.top_p, args.max_new_tokens, args.seed)
    return loaded, Generator(loaded, sampling)


def _set_template(loaded: Any, setting: str) -> None:
    from trainer.data.chat import chosen_template

    choice = chosen_template(setting, None)
    if not choice.text:
        raise ConfigError(f"--chat-template {setting}: {choice.origin}")
    loaded.tokenizer.chat_template = choice.text


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


def main(args: argparse.Namespace) -> int:
    from trainer.errors import raise_on_stop_signals
    from trainer.generate.loading import memory_report

    raise_on_stop_signals()  # SIGTERM as Ctrl-C: the answers written stay whole lines (trainer.generate.batch)
    check_arguments(args)
    if (args.input is None) != (args.output is None):
        raise ConfigError("--input and --output go together: generate MODEL --input prompts.jsonl --output out.jsonl")
    if args.input:  # the files are checked before loading: a mistake costs no load time
        from trainer.generate.batch import done_lines, encode_requests, make_folder_of, read_requests, run_batch
        from trainer.output_lock import lock_beside

        make_folder_of(Path(args.output))
        lock_beside(Path(args.output), "generate")  # a second generate into the same file would interleave lines
        skip = done_lines(Path(args.output), args.resume)
        requests, bad = read_requests(Path(args.input), args.max_bad_lines)
    loaded, generator = load_for(args, "generate")
    print(generator.describe(), file=sys.stderr)
    print(memory_report(loaded), file=sys.stderr)
    if args.input:
        requests = encode_requests(Path(args.input), requests, bad, generator, args.max_bad_lines)
        code = run_batch(generator, requests, Path(args.output), args.batch_size, min(skip, len(requests)))
    else:
        code = chat(generator)
    print(memory_report(loaded), file=sys.stderr)
    return code


def chat(generator: Any) -> int:
    """The interactive loop: one line in, one answer out; the conversation is kept where there is a template."""
    from trainer.answers.decoding import Prompt

    terminal = sys.stdin.isatty()
    if terminal:
        import readline  # noqa: F401  (line editing and history for input())
    mode = "chat (history kept; /reset forgets it)" if generator.template else "plain completion, line by line"
    pictures = "; /image PATH shows the model a picture with your next line" if generator.processor else ""
    print(f"{mode}; /exit or Ctrl-D quits{pictures}", file=sys.stderr)
    history: list[dict[str, Any]] = []
    images: list[Any] = []  # every image of the conversation, in order
    pending: list[Any] = []  # /image's, for the next line
    while True:
        try:
            line = input("you> " if terminal else "")
        except (EOFError, KeyboardInterrupt) as exc:  # Ctrl-D or Ctrl-C ends the chat; SIGTERM is a stop (128+N)
            print(file=sys.stderr)
            return exc.exit_code if isinstance(exc, Interrupted) and exc.signum != signal.SIGINT else EXIT_OK
        text = line.strip()
        if text in ("/exit", "/quit"):
            return EXIT_OK
        if text == "/reset":
            history.clear()
            images.clear()
            print("(history cleared)", file=sys.stderr)
            continue
        if text.startswith("/image"):
            pending += _image_of(text[len("/image") :].strip(), generator)
            continue
        if not text:
            continue
        content: Any = [*({"type": "image"} for _ in pending), {"type": "text", "text": line}] if pending else line
        turn = [*history, {"role": "user", "content": content}]
        prompt = Prompt(messages=turn, images=[*images, *pending]) if generator.template else Prompt(text=line)
        try:
            answer = generator.generate([generator.encode(prompt)])[0]
        except ConfigError as exc:
            print(f"error: {exc.message}" + (" (/reset starts over)" if history else ""), file=sys.stderr)
            continue
        print(f"model> {answer.text}" if terminal else answer.text, flush=True)
        if generator.template:
            history = [*turn, {"role": "assistant", "content": answer.text}]
            images, pending = [*images, *pending], []


def _image_of(path: str, generator: Any) -> list[Any]:
    """/image PATH: the picture, checked now ([] and the reason on stderr when it cannot be shown)."""
    from trainer.data.chat import BadRecord
    from trainer.data.images import image_ref, read_image

    if generator.processor is None or not generator.template:
        print("error: /image needs a vision-language model with a chat template", file=sys.stderr)
        return []
    try:
        ref = image_ref(path, Path.cwd(), "/image")
        read_image(ref)
    except BadRecord as exc:
        print(f"error: {exc}", file=sys.stderr)
        return []
    print(f"(image {path} goes with your next line)", file=sys.stderr)
    return [ref]
