"""A task only a tool solves, for the multi-turn RL tests: each prompt is a key (`k3`), its answer the value the
`lookup` tool returns for it, a code drawn at random for this task. The model is first taught the format (SFT on
transcripts: the call, the tool's answer, the answer repeated; and as many records that answer at once with a guess),
with the values of another table, so that nothing of the answers can be learned except through the tool.

Everything is made locally: a BPE tokenizer (`<|im_start|>`, `<|im_end|>` its own tokens, `<|endoftext|>` its EOS:
the end of a turn is not the EOS token, as with many real tokenizers) trained on the task's text, the user's tool
file, its table, the transcripts and the prompts."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

KEYS = [f"k{i}" for i in range(10)]
VALUES = ("red", "blue", "green", "gold", "gray", "pink")
TOOLS = '''"""The lookup task's tool: a table only it can read (table.json beside this file)."""

import json
import time
from pathlib import Path

TABLE = json.loads(Path(__file__).with_name("table.json").read_text())
SLOW = Path(__file__).with_name("slow")  # its seconds: the next call writes `calling`, sleeps them, removes it


def lookup(key: str) -> str:
    """Look up the value stored under a key.

    Args:
        key: the key, e.g. k3
    """
    if SLOW.exists():
        seconds = float(SLOW.read_text() or 0)
        SLOW.with_name("calling").write_text(key)
        time.sleep(seconds)
        SLOW.unlink()
    return f"{key} = {TABLE[key]}"
'''
ENVIRONMENT = '''"""The lookup task as environments: Lookup's reward is whether the model looked up the record's own
key; Echo's tool says back what it is given; Broken cannot start an episode."""

import json
from pathlib import Path

TABLE = json.loads(Path(__file__).with_name("table.json").read_text())


class Lookup:
    def reset(self, key, **columns):
        self.key, self.asked = key, []

    def lookup(self, key: str) -> str:
        """Look up the value stored under a key.

        Args:
            key: the key, e.g. k3
        """
        self.asked.append(key)
        return f"{key} = {TABLE[key]}"

    def get_reward(self):
        return float(self.key in self.asked)


class Echo:
    def reset(self, **columns):
        self.heard = []

    def echo(self, text: str) -> str:
        """Say the text back.

        Args:
            text: what to say back
        """
        self.heard.append(text)
        return text


class Broken:
    def reset(self, **columns):
        raise RuntimeError("no episode today")
'''


REWARDS = '''"""The lookup task's reward: whether the model got a value from the tool in the episode."""


def looked_up(prompts, completions, **columns):
    """1 where a lookup call returned a value (a tool turn that is not an error), else 0."""
    return [float(any(m.get("role") == "tool" and " = " in str(m.get("content")) for m in c)) if isinstance(c, list)
            else 0.0 for c in completions]
'''


def codes(seed: int) -> dict[str, str]:
    """A table of KEYS to VALUES, drawn with `seed`."""
    draw = random.Random(seed)
    return {key: draw.choice(VALUES) for key in KEYS}


def schema(tools_file: Path) -> dict[str, Any]:
    """lookup's tool definition as TRL renders it into the prompt (Transformers' get_json_schema of the function)."""
    from transformers.utils import get_json_schema

    from trainer.run.user_code import import_file

    return get_json_schema(import_file(str(tools_file), "the test's tools").lookup)


def transcript(key: str, value: str) -> list[dict[str, Any]]:
    """The user asks for a key, the model looks it up and says what the tool said (`k3 = gold`)."""
    call = {"type": "function", "function": {"name": "lookup", "arguments": json.dumps({"key": key})}}
    said = f"{key} = {value}"
    return [{"role": "user", "content": key}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "name": "lookup", "content": said}, {"role": "assistant", "content": said}]  # fmt: skip


def sft_records(tools_file: Path, rounds: int = 6, guesses: int = 6) -> list[dict[str, Any]]:
    """Each key answered through the tool `rounds` times, each time with a value drawn anew (so that the answer can
    only be copied from the tool's, never remembered), and `guesses` times at once with a drawn code."""
    draw, tool = random.Random(2), [schema(tools_file)]

    def code() -> str:
        return draw.choice(VALUES)

    records = [{"messages": transcript(key, code()), "tools": tool} for _ in range(rounds) for key in KEYS]
    records += [{"messages": [{"role": "user", "content": key}, {"role": "assistant", "content": f"{key} = {code()}"}],
                 "tools": tool} for _ in range(guesses) for key in KEYS]  # fmt: skip
    return records


def write_task(folder: Path) -> dict[str, Path]:
    """The task's files in `folder`: tokenizer/, tools.py, environment.py, table.json (the tool's values), sft.jsonl,
    prompts.jsonl (each key twice, with its `answer` and `key`)."""
    folder.mkdir(parents=True, exist_ok=True)
    table = codes(3)
    (folder / "table.json").write_text(json.dumps(table))
    (folder / "tools.py").write_text(TOOLS)
    (folder / "environment.py").write_text(ENVIRONMENT)
    (folder / "rewards.py").write_text(REWARDS)
    records = sft_records(folder / "tools.py")
    (folder / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    prompts = [{"prompt": [{"role": "user", "content": key}], "answer": f"{key} = {table[key]}", "key": key}
               for key in KEYS * 3]  # fmt: skip
    (folder / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    save_tokenizer(folder / "tokenizer", records)
    return {name: folder / name for name in ("tokenizer", "tools.py", "environment.py", "rewards.py", "table.json",
                                             "sft.jsonl", "prompts.jsonl")}  # fmt: skip


def chatml() -> str:
    from trainer.data.chat import BUILTIN_TEMPLATES

    return BUILTIN_TEMPLATES["chatml"].read_text()


def save_tokenizer(folder: Path, records: list[dict[str, Any]], vocab: int = 540) -> Any:
    """A BPE tokenizer trained on the task's transcripts as chatml renders them, saved in `folder`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split("\n", "merged_with_previous"),
                                                     pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    seed = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), eos_token=specials[0])
    texts = [seed.apply_chat_template(r["messages"], tools=r["tools"], chat_template=chatml(), tokenize=False)
             for r in records]  # fmt: skip
    backend.train_from_iterator(texts + ["ü ü ü\n"] * 100, trainer)  # a two-byte character made one token
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=specials[0],
                                        additional_special_tokens=specials[1:])  # fmt: skip
    tokenizer.save_pretrained(folder)
    return tokenizer
