"""`python -m trainer push SRC org/name[@branch] [--public]`: a model folder, or a run's export/ or final/, uploaded to
a (private) Hub repository by trainer.hub.push, which TRAIN_PUSH_TO_HUB's upload at a run's end uses too."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer.errors import EXIT_OK, ConfigError
from trainer.hub.push import push_folder


def register(parser: argparse.ArgumentParser) -> None:
    """`push`'s arguments, on the parser trainer/__main__.py made for it (trainer/commands.py)."""
    parser.description = (
        "Upload SRC to the Hub repository REPO (org/name or org/name@branch), created private unless "
        "--public. SRC is a model folder (e.g. what `python -m trainer export` wrote) or a run folder (its export/, "
        "else its final/). Token: HF_TOKEN or HF_TOKEN_PATH."
    )
    parser.add_argument("src", metavar="SRC", help="a model folder or a run folder")
    parser.add_argument("repo", metavar="REPO", help="org/name[@branch]")
    parser.add_argument("--public", action="store_true", help="create the repository public (default: private)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from trainer.errors import Interrupted, raise_on_stop_signals

    raise_on_stop_signals()  # SIGTERM as Ctrl-C: a message and 128+N, not a bare kill
    folder = model_folder(Path(args.src))
    try:
        url = push_folder(folder, args.repo, private=not args.public, variable="push")
    except Interrupted:
        print(f"push interrupted: the upload is one commit, so {args.repo} holds all of {folder} or none of it; run "
              "the push again to be sure it is there", file=sys.stderr)  # fmt: skip
        raise
    print(f"pushed {folder} to {url}")
    return EXIT_OK


def model_folder(src: Path) -> Path:
    """The folder to upload: SRC itself when it holds a model, else a run folder's export/ or final/."""
    for candidate in (src, src / "export", src / "final"):
        if (candidate / "config.json").is_file() or (candidate / "adapter_config.json").is_file():
            return candidate
    raise ConfigError(f"push {src}: no model there (no config.json or adapter_config.json in it, its export/ or its "
                      "final/); give a model folder or a run folder")  # fmt: skip
