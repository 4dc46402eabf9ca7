"""Nothing under the output folder holds a secret (issue 26, item 10): real tiny runs, then every file grepped.

Transformers pickles every TrainingArguments value into training_args.bin in each checkpoint and in final/, so a
token in TRAIN_ARGS (--hub_token) is refused with exit 2 before anything is written; secrets in the environment
(HF_TOKEN by its name, the password inside HF_ENDPOINT by its value) reach no file and no log line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from train_runs import finish, start, train_env

from trainer.checkpoint_record import COMPLETE_MARKER, read_record
from trainer.secrets import MASK

TOKEN = "hf_argsToken1234567890"
NAMED = "hf_envToken0987654321"
PASSWORD = "mirrorPa55word"
WANDB = "wandbKey0123456789abcdef"


def files_holding(out: Path, secrets: tuple[str, ...]) -> dict[str, list[str]]:
    found = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        data = path.read_bytes()
        hits = [s for s in secrets if s.encode() in data]
        if hits:
            found[str(path.relative_to(out))] = hits
    return found


def test_no_output_file_holds_a_secret(tmp_path: Path) -> None:
    out = tmp_path / "out"
    refused = train_env(out, max_steps=2, save_steps=1, args=f"--warmup_steps 1 --hub_token {TOKEN}")
    code, err = finish(start(refused))
    assert code == 2, err[-3000:]
    assert "--hub_token holds a secret" in err and "HF_TOKEN_PATH" in err
    assert TOKEN not in err and "Traceback" not in err
    assert not [p for p in out.rglob("*") if p.is_file()], "the refused run wrote files"

    env = train_env(out, max_steps=2, save_steps=1, args="--warmup_steps 1")
    env.update(HF_TOKEN=NAMED, HF_ENDPOINT=f"https://trainer:{PASSWORD}@127.0.0.1:9/hf", WANDB_API_KEY=WANDB)
    code, err = finish(start(env))
    assert code == 0, err[-3000:]
    written = [p.relative_to(out).as_posix() for p in out.rglob("training_args.bin")]
    assert sorted(written) == ["checkpoint-1/training_args.bin", "checkpoint-2/training_args.bin",
                               "final/training_args.bin"]  # fmt: skip
    assert files_holding(out, (TOKEN, NAMED, PASSWORD, WANDB)) == {}
    assert not [s for s in (NAMED, PASSWORD, WANDB) if s in err]
    # every record the run wrote masks the secrets alone: no setting (rl_max_new_tokens, a "TOKEN" in its name) and
    # no library version (tokenizers) hidden (issue 59)
    markers = [p.relative_to(out).as_posix() for p in out.rglob(COMPLETE_MARKER)]
    records = ["run_config.json", "provenance.json", *markers]
    assert len(records) == 5, records  # checkpoint-1, checkpoint-2 and final/ each hold one
    for name in records:
        masked = [where for where, value in _leaves(json.loads((out / name).read_text())) if MASK in str(value)]
        assert all(re.search(r"HF_TOKEN|HF_ENDPOINT|WANDB_API_KEY", where) for where in masked), (name, masked)
    provenance = json.loads((out / "provenance.json").read_text())
    assert re.fullmatch(r"\d+\.\d+.*", provenance["distributions"]["tokenizers"])
    assert read_record(out / "checkpoint-2").settings["rl_max_new_tokens"] == 256  # the default, as it is


def _leaves(data: object, where: str = "") -> list[tuple[str, object]]:
    if isinstance(data, dict):
        return [leaf for k, v in data.items() for leaf in _leaves(v, f"{where}/{k}")]
    if isinstance(data, list):
        return [leaf for v in data for leaf in _leaves(v, where)]
    return [(where, data)]
