"""Records with images for the tests: solid-colour pictures and the question of their colour, in each layout.

A tiny model can only answer them by looking: the question is the same for every record, the answer is the colour.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

COLOURS = {"red": (220, 30, 30), "green": (30, 190, 40), "blue": (30, 50, 220), "yellow": (230, 220, 30)}
QUESTION = "What colour is this?"


def picture(path: Path, colour: str, size: tuple[int, int], seed: int = 0) -> Path:
    """A solid-colour PNG with a little noise (so no two pictures are the same file)."""
    from PIL import Image

    rng = random.Random(seed)
    base = COLOURS[colour]
    image = Image.new("RGB", size, base)
    pixels = image.load()
    for _ in range(size[0] * size[1] // 8):
        x, y = rng.randrange(size[0]), rng.randrange(size[1])
        pixels[x, y] = tuple(max(0, min(255, c + rng.randint(-25, 25))) for c in base)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


def colour_row(image: str, colour: str, layout: str = "messages") -> dict[str, Any]:
    """One record asking the colour of `image` (a path relative to the data file), in `layout`."""
    if layout == "messages":
        return {"messages": [{"role": "user", "content": [{"type": "image", "image": image},
                                                          {"type": "text", "text": QUESTION}]},
                             {"role": "assistant", "content": [{"type": "text", "text": colour}]}]}
    if layout == "messages_images":
        return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]},
                             {"role": "assistant", "content": colour}], "images": [image]}
    if layout == "sharegpt":
        return {"conversations": [{"from": "human", "value": f"<image>{QUESTION}"}, {"from": "gpt", "value": colour}],
                "images": [image]}
    assert layout == "llava", layout
    return {"image": image, "conversations": [{"from": "human", "value": f"<image>\n{QUESTION}"},
                                              {"from": "gpt", "value": colour}]}


def colour_data(folder: Path, count: int, layout: str = "messages", seed: int = 0, name: str = "train.jsonl") -> Path:
    """`count` records (colours in turn, sizes varied) with their pictures under folder/images."""
    rng = random.Random(seed)
    names = list(COLOURS)
    rows = []
    for i in range(count):
        colour = names[i % len(names)]
        size = (rng.choice([28, 42, 56, 70]), rng.choice([28, 42, 56]))
        picture(folder / "images" / f"{seed}-{i}.png", colour, size, seed * 100_000 + i)
        rows.append(colour_row(f"images/{seed}-{i}.png", colour, layout))
    path = folder / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
