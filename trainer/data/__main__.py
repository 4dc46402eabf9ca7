"""`python -m trainer.data`: tokenize TRAIN_DATA into the cache ahead of a run, exactly as the run would.

Prints one JSON line: the cache folder, sequences, tokens, seconds, tokens/s, cores, and the peak resident memory
of this process and of its largest worker process (when the
cache already held the data, the figures of the run that prepared it).
Exit 2 with `error: ...` on a user mistake (bad TRAIN_*, bad data).
"""

from __future__ import annotations

import json
import logging
import sys

from trainer.errors import EXIT_OK, EXIT_USER, ConfigError

STATS = ("tokens", "records", "seconds", "tokens_per_s", "cores", "workers", "skipped_lines", "peak_rss_worker_bytes")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    from trainer.config import load_settings
    from trainer.data.dataset import build_dataset
    from trainer.data.shards import peak_rss_bytes
    from trainer.tokenizer import tokenizer_for

    try:
        settings = load_settings()
        dataset = build_dataset(settings, tokenizer_for(settings))
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_USER
    summary = {"folder": str(dataset.folder), "sequences": len(dataset), **{k: dataset.meta[k] for k in STATS}}
    summary["peak_rss_bytes"] = peak_rss_bytes()
    print(json.dumps(summary))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
