"""Every `python -m trainer` command, once: its name, one line of help, the module that adds its arguments, and how
the image's entrypoint, the launcher and scripts/run.py start it.

Read by trainer/__main__.py (the subcommands), trainer/launch/ (which commands it runs, and which across GPUs),
scripts/run.py (what it forwards into the container) and, through a block scripts/generate.py writes,
entrypoints/entrypoint.sh (its dispatch); tests/test_commands.py holds them together. Torch-free and free of any
other trainkit module, so that the host tools may import it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One command of `python -m trainer`."""

    name: str
    module: str  # its `register(parser)` adds the command's arguments and sets `func`
    help: str  # one line: `python -m trainer --help`, the entrypoint's header, scripts/run.py --help
    usage: str = ""  # its arguments, as the entrypoint's header shows them
    distributed: bool = False  # the launcher may run it under torchrun (across GPUs and nodes); the entrypoint
    # starts it through `python -m trainer.launch`, every other command as `python -m trainer NAME`
    on_host: bool = False  # scripts/run.py runs it itself (reproduce: in the image the run recorded) rather than
    # forwarding the command line into the container


COMMANDS: tuple[Command, ...] = (
    Command("train", "trainer.run.command", "train with the TRAIN_* configuration (the default command)",
            "[ARGS...]", distributed=True),
    Command("config", "trainer.config_command", "print the resolved configuration without training", "[--json]"),
    Command("doctor", "trainer.doctor.command",
            "what this machine can do, and whether the configured run can work here", "[--json]"),
    Command("bench", "trainer.bench.command", "measure techniques side by side (python -m trainer bench --help)",
            "[ARGS...]"),
    Command("fetch", "trainer.fetch_command",
            "download the configured Hub model, tokenizer and data into the cache (for offline runs)", "[--json]"),
    Command("export", "trainer.export.command",
            "turn a run, a checkpoint or final/ into a plain Transformers model folder (LoRA merged, shards joined)",
            "SRC OUT"),
    Command("push", "trainer.push_command", "upload a model folder (an export, or a run's final/) to a Hub repository",
            "SRC REPO"),
    Command("data", "trainer.data_command",
            "tokenize TRAIN_DATA into the cache ahead of a run; --show N prints what the run trains on", "[--show N]"),
    Command("generate", "trainer.generate.command", "chat with a model, or answer a file of prompts (--input/--output)",
            "MODEL"),
    Command("eval", "trainer.evaluate.command",
            "score a model on your eval set: loss, perplexity, exact_match, contains", "MODEL --data D --output DIR"),
    Command("diff", "trainer.diff_command", "what differs between two runs' provenance and settings", "RUN_A RUN_B"),
    Command("serve", "trainer.serve.command",
            "serve an export on an OpenAI-compatible API (llama.cpp for GGUF, vLLM for folders and adapters)", "OUT"),
    Command("check", "trainer.check.command",
            "does an OpenAI-compatible endpoint answer as the export does? (prompts, answers, stops)",
            "URL --against OUT"),
    Command("reproduce", "trainer.reproduce_command",
            "run a finished run again with the same settings and compare its per-step loss", "OUTPUT_DIR",
            on_host=True),
)  # fmt: skip
DEFAULT = "train"
BY_NAME = {command.name: command for command in COMMANDS}


def names(*, distributed: bool | None = None, on_host: bool | None = None) -> tuple[str, ...]:
    """The commands' names in the list's order; `distributed`/`on_host` keep only those with that value."""
    return tuple(c.name for c in COMMANDS if distributed in (None, c.distributed) and on_host in (None, c.on_host))
