"""A generated preference set with a learnable difference: each chosen answer repeats the prompt's words in lower
case, its rejected twin in upper case (the same words, so only the style tells them apart)."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ("cat", "sun", "red", "sky", "owl", "map", "ink", "oak", "fig", "jam", "bee", "cup")


def pairs(count: int, seed: int = 0) -> list[dict[str, object]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words = " ".join(rng.sample(WORDS, 2))
        good = f"{words} ok"
        out.append({"prompt": [{"role": "user", "content": f"say {words}"}],
                    "chosen": [{"role": "assistant", "content": good}],
                    "rejected": [{"role": "assistant", "content": good.upper()}]})  # fmt: skip
    return out


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
