"""Writes corpus.txt, the embedded default corpus: original English prose composed from a seeded grammar.

Run `python trainer/assets/make_corpus.py` to regenerate; the output is deterministic (seed 1234).
The text is plain, varied and readable, which is all a smoke run needs from a default corpus.
"""

from __future__ import annotations

import random
from pathlib import Path

PEOPLE = [
    "the miller",
    "the old ferryman",
    "a young teacher",
    "the baker's daughter",
    "a traveling clockmaker",
    "the village doctor",
    "two fishermen",
    "the schoolchildren",
    "a shepherd",
    "the lighthouse keeper",
    "the blacksmith",
    "a botanist from the city",
    "the innkeeper",
    "her grandmother",
    "the postman",
]
PLACES = [
    "the harbor",
    "the market square",
    "the mill by the river",
    "the high meadow",
    "the library",
    "the orchard",
    "the stone bridge",
    "the edge of the forest",
    "the lighthouse",
    "the railway station",
    "the narrow lane behind the church",
    "the salt marsh",
    "the workshop",
    "the kitchen garden",
]
TIMES = [
    "Early in the morning",
    "Just before noon",
    "Late in the afternoon",
    "At dusk",
    "Long after midnight",
    "On the first day of spring",
    "In the middle of winter",
    "During the long summer evenings",
    "When the autumn rains began",
    "On market day",
    "After the storm had passed",
    "Every Sunday",
]
VERBS = [
    "walked slowly to",
    "hurried toward",
    "returned to",
    "waited patiently at",
    "lingered near",
    "set out for",
    "came back from",
    "sat quietly beside",
    "worked for hours at",
    "searched carefully around",
]
OBJECTS = [
    "a basket of apples",
    "an old leather map",
    "a letter with no stamp",
    "a lantern",
    "a jar of honey",
    "a broken compass",
    "a bundle of firewood",
    "a small wooden boat",
    "a notebook full of sketches",
    "a loaf of warm bread",
    "a pair of brass scales",
    "a coil of rope",
    "a tin of tea",
]
FEELINGS = [
    "curious",
    "tired but content",
    "uneasy",
    "cheerful",
    "quiet and thoughtful",
    "proud",
    "hopeful",
    "a little lonely",
    "surprised",
    "determined",
]
WEATHER = [
    "the wind came in cold from the sea",
    "a thin rain fell over the roofs",
    "the sky was clear and pale",
    "fog rolled up the valley",
    "the sun warmed the stone walls",
    "snow covered the fields",
    "clouds gathered over the hills",
    "the air smelled of cut grass",
    "thunder rumbled far away",
]
FACTS = [
    "Water boils at a lower temperature high in the mountains, because the air pressure there is lower.",
    "A year is the time the Earth takes to travel once around the Sun.",
    "Bees carry pollen from flower to flower, and many fruits would not form without them.",
    "Sound travels faster through water than through air.",
    "The Moon has no light of its own; it reflects the light of the Sun.",
    "Iron rusts when it meets both water and oxygen.",
    "Plants take in carbon dioxide and give out oxygen when sunlight falls on their leaves.",
    "A lever lets a small force move a heavy load if the load is close to the pivot.",
    "Salt water freezes at a lower temperature than fresh water.",
    "The tides rise and fall twice a day, pulled mostly by the Moon.",
    "Lightning is hotter than the surface of the Sun for a brief moment.",
    "Seeds can wait in dry soil for years until rain wakes them.",
    "A prism splits white light into the colors of the rainbow.",
    "Rivers carry sand and silt to the sea and slowly build new land at their mouths.",
    "Birds that migrate often use the stars and the Earth's magnetic field to find their way.",
]
SAYINGS = [
    "There is always time for one more cup of tea",
    "A good map is worth a long walk",
    "The river remembers every stone",
    "Nothing grows in a hurry",
    "Mend the net before the storm",
    "Every clock is right once in a while",
    "Ask the old ones, they have seen it before",
]
CONNECT = ["Later", "Meanwhile", "Soon after", "For a while", "In the end", "Before long", "That same evening"]


def sentence(rng: random.Random) -> str:
    kind = rng.randrange(9)
    if kind == 0:
        return f"{rng.choice(TIMES)}, {rng.choice(PEOPLE)} {rng.choice(VERBS)} {rng.choice(PLACES)}."
    if kind == 1:
        who = rng.choice(PEOPLE)
        return f"{who[0].upper() + who[1:]} carried {rng.choice(OBJECTS)} and felt {rng.choice(FEELINGS)}."
    if kind == 2:
        return f"Outside, {rng.choice(WEATHER)}."
    if kind == 3:
        return rng.choice(FACTS)
    if kind == 4:
        who = rng.choice(PEOPLE)
        return f'"{rng.choice(SAYINGS)}," said {who}, and nobody disagreed.'
    if kind == 5:
        return f"{rng.choice(CONNECT)}, {rng.choice(PEOPLE)} found {rng.choice(OBJECTS)} near {rng.choice(PLACES)}."
    if kind == 6:
        n = rng.randrange(2, 40)
        return f"It took {n} minutes to reach {rng.choice(PLACES)}, and by then {rng.choice(WEATHER)}."
    if kind == 7:
        a, b = rng.sample(PEOPLE, 2)
        return f"{a[0].upper() + a[1:]} asked {b} about {rng.choice(OBJECTS)}, but the answer was only a smile."
    return f"Nobody at {rng.choice(PLACES)} could explain why {rng.choice(PEOPLE)} seemed so {rng.choice(FEELINGS)}."


def paragraph(rng: random.Random) -> str:
    return " ".join(sentence(rng) for _ in range(rng.randrange(3, 8)))


def build(target_bytes: int = 160_000, seed: int = 1234) -> str:
    rng = random.Random(seed)
    parts, size, chapter = [], 0, 1
    while size < target_bytes:
        if rng.random() < 0.08:
            block = f"Chapter {chapter}"
            chapter += 1
        else:
            block = paragraph(rng)
        parts.append(block)
        size += len(block) + 2
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    out = Path(__file__).with_name("corpus.txt")
    out.write_text(build(), encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size} bytes)")
