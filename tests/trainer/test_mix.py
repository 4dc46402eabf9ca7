"""A mix of sources in TRAIN_DATA (trainer.data.mix) and several named eval sets: shares of the trained tokens met
from each source's own cache, the mix in resume's checks, per-set eval losses, a Hub dataset as one source (fetched,
mixed, pinned; the stand-in Hub of hub_server.py), and the bad input."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import write_corpus

from tests.trainer.train_runs import REPO, finish, start, train_env
from trainer.config.parse import load_settings
from trainer.config.resume import check_drift
from trainer.data.discovery import discover
from trainer.data.mix import MixEntry, parse_eval_sets, parse_mix
from trainer.data.mixed import MixedDataset, plan, prepare_mix
from trainer.data.spec import DataSpec
from trainer.errors import ConfigError
from trainer.provenance import file_sha256
from trainer.reproduce_command import changed_data
from trainer.tokenizer import byte_level_tokenizer

A, B = ord("a"), ord("b")


def write_source(path: Path, letter: str, records: int) -> Path:
    path.write_text("".join(json.dumps({"text": letter * 100}) + "\n" for _ in range(records)))
    return path


def mixed(tmp: Path, value: str, seed: int = 0) -> MixedDataset:
    mix = parse_mix(value)
    assert not mix.problems
    parts = [discover(e.source) for e in mix.entries]
    return prepare_mix(mix, parts, byte_level_tokenizer(), DataSpec(64), tmp / "cache", seed)[0]


def trained_share_of_a(dataset: MixedDataset) -> float:
    counts = {A: 0, B: 0}
    for i in range(len(dataset)):
        item = dataset[i]
        trained = item["labels"][item["labels"] != -100].numpy()
        letter = A if (item["input_ids"].numpy() == A).any() else B
        counts[letter] += len(trained)
    return counts[A] / (counts[A] + counts[B])


def test_weights_are_shares_of_trained_tokens_from_each_sources_own_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = write_source(tmp_path / "a.jsonl", "a", 200)  # 25% of the tokens by nature: repeated to reach 80%
    b = write_source(tmp_path / "b.jsonl", "b", 600)
    value = f"{a}:0.8,{b}:0.2"
    first = mixed(tmp_path, value, seed=3)
    assert abs(trained_share_of_a(first) - 0.8) <= 0.02
    rows = {row["name"]: row for row in first.report["sources"]}
    assert rows["a"]["repeats"] > 1 and rows["b"]["repeats"] < 1
    assert abs(rows["a"]["achieved_share"] - 0.8) <= 0.02 and rows["a"]["requested_share"] == 0.8
    again = mixed(tmp_path, value, seed=3)
    assert np.array_equal(first.sources, again.sources) and np.array_equal(first.blocks, again.blocks)
    assert all(np.array_equal(first[i]["input_ids"], again[i]["input_ids"]) for i in range(len(first)))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trainer"):
        reweighted = mixed(tmp_path, f"{a}:1,{b}:1", seed=3)
    text = caplog.text
    assert "tokenized" not in text and text.count("(no tokenization)") == 2, text
    assert abs(trained_share_of_a(reweighted) - 0.5) <= 0.02
    assert "repeated" in text and "sampled" in text


def test_max_records_caps_a_source_and_an_unreachable_share_exits_2(tmp_path: Path) -> None:
    a = write_source(tmp_path / "a.jsonl", "a", 300)
    b = write_source(tmp_path / "b.jsonl", "b", 300)
    mix_file = tmp_path / "corpus.mix.json"
    mix_file.write_text(json.dumps({"sources": [{"path": str(a), "weight": 1, "max_records": 50},
                                                {"path": str(b), "weight": 1, "name": "bee"}]}))  # fmt: skip
    dataset = mixed(tmp_path, str(mix_file))
    assert dataset.parts[0].meta["records"] == 50 and dataset.parts[1].meta["records"] == 300
    assert [row["name"] for row in dataset.report["sources"]] == ["a", "bee"]
    capped = [MixEntry("a", str(a), 9, max_repeats=2), MixEntry("b", str(b), 1)]
    counts = [np.full(len(p), 64) for p in dataset.parts]
    with pytest.raises(ConfigError, match=r"needs .* repeats .* above its max_repeats 2"):
        plan(capped, dataset.parts, counts, 0)


def test_parse_rule() -> None:
    mix = parse_mix("hf://datasets/org/name@v1/data/*.parquet:3,/data/a:b.jsonl:1,/data/run:2:1")
    assert [(e.source, e.weight) for e in mix.entries] == [
        ("hf://datasets/org/name@v1/data/*.parquet", 3.0), ("/data/a:b.jsonl", 1.0), ("/data/run:2", 1.0)]
    assert not parse_mix("/data/a:b.jsonl").is_mix and not parse_mix("hf://datasets/org/name@v1").is_mix
    assert parse_eval_sets("chat=/e/chat.jsonl,/e/code.jsonl") == [("chat", "/e/chat.jsonl"), ("code", "/e/code.jsonl")]
    assert parse_eval_sets("/e/one.jsonl") == []


def test_bad_mixes_exit_2_before_training_with_the_fix(tmp_path: Path) -> None:
    a = write_source(tmp_path / "a.jsonl", "a", 3)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = train_env(tmp_path / "out", data=f"{a}:-1,{a},,{empty}")
    proc = subprocess.run([sys.executable, "-m", "trainer", "config"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    for needed in ("is not a positive number", "weights given for 1 of 3 sources", "an empty source",
                   f"{empty}"):  # fmt: skip
        assert needed in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


MIX_KEYS = "max_records, max_repeats, name, path, weight"


@pytest.mark.parametrize(("content", "expected"), [
    ({"source": [{"path": "A"}]}, "it has no `sources` key (it has source; the one key is `sources`)"),
    ([{"path": "A", "weight": 1}], "it holds a JSON list, not an object with a `sources` list"),
    ({"sources": [{"path": "A", "wieght": 2}, {"path": "A", "weight": 1}]},
     f"source 1 has unknown key(s) wieght (known: {MIX_KEYS})"),
    ({"sources": [{"path": "A", "weight": 1}, {"path": "A", "weight": 2}]}, "is in the mix twice, in a (A) and in a-2"),
], ids=["misspelled-key", "bare-list", "misspelled-source-key", "same-file-twice"])  # fmt: skip
def test_a_malformed_mix_file_or_a_file_twice_exits_2_naming_it(tmp_path: Path, content, expected: str) -> None:
    """A mix file that is not one is never read as training data (no TRAIN_TEXT_FIELD advice): its shape and keys
    are named. The same file as two sources (here, and through another path) would train twice per epoch."""
    a = str(write_source(tmp_path / "a.jsonl", "a", 3))
    mix = tmp_path / "train.mix.json"
    mix.write_text(json.dumps(content).replace('"A"', json.dumps(a)))
    expected = expected.replace("(A)", f"({a})")
    values = [str(mix)] + ([f"{a}:1,{tmp_path}/../{tmp_path.name}/a.jsonl:2"] if "twice" in expected else [])
    for value in values:
        proc = subprocess.run([sys.executable, "-m", "trainer", "config"], cwd=REPO, capture_output=True, text=True,
                              env=train_env(tmp_path / "out", data=value), timeout=60)  # fmt: skip
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert expected in proc.stderr and "TRAIN_TEXT_FIELD" not in proc.stderr, proc.stderr[-2000:]
        assert value != str(mix) or f"TRAIN_DATA={mix}" in proc.stderr or "twice" in expected, proc.stderr[-2000:]
        assert "twice" in expected or MIX_KEYS in proc.stderr, proc.stderr[-2000:]


def test_two_eval_sets_report_separately_and_a_changed_weight_is_a_data_change(tmp_path: Path) -> None:
    a, b = write_corpus(tmp_path / "a.txt", 200), tmp_path / "b.jsonl"  # plain text (stream) and pairs (records)
    b.write_text("".join(json.dumps({"prompt": f"Question {i}?", "completion": " An answer."}) + "\n"
                         for i in range(300)))  # fmt: skip
    ea, eb = write_source(tmp_path / "ea.jsonl", "a", 20), write_source(tmp_path / "eb.jsonl", "b", 20)
    out, mix_file = tmp_path / "out", tmp_path / "train.mix.json"
    mix_file.write_text(json.dumps({"sources": [{"path": str(a), "weight": 0.7}, {"path": str(b), "weight": 0.3}]}))
    settings = {"data": str(mix_file), "eval_data": f"chat={ea},code={eb}", "max_steps": 2, "save_steps": 2,
                "eval_steps": 2}  # fmt: skip
    code, err = finish(start(train_env(out, **settings)))
    assert code == 0, err[-3000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = {line["eval_set"]: line for line in lines if "eval_set" in line}
    assert set(evals) == {"chat", "code"}
    assert evals["chat"]["eval_chat_loss"] != evals["code"]["eval_code_loss"]
    events = b"".join(p.read_bytes() for p in (out / "runs").rglob("events.out.tfevents*"))  # the tracker's
    assert b"eval/chat_loss" in events and b"eval/code_loss" in events and b"eval/code_perplexity" in events
    mix = json.loads((out / "run_config.json").read_text())["training_data"]["mix"]
    assert [row["requested_share"] for row in mix["sources"]] == [0.7, 0.3]
    recorded = json.loads((out / "provenance.json").read_text())
    assert recorded["data"][str(mix_file)]["sha256"] == file_sha256(mix_file), "the mix file is an input"
    mix_file.write_text(json.dumps({"sources": [{"path": str(a), "weight": 0.5}, {"path": str(b), "weight": 0.5}]}))
    assert [line for line in changed_data(recorded) if str(mix_file) in line], "reproduce names the edited mix file"
    changed = train_env(out, **settings)
    code, err = finish(start(changed))
    assert code == 2 and "TRAIN_RESUME_CHANGED_DATA=1" in err and "TRAIN_DATA was" in err, err[-2000:]
    checkpoint = out / "checkpoint-2"
    check_drift(checkpoint, load_settings({**changed, "TRAIN_RESUME_CHANGED_DATA": "1"}))  # allowed: no error
    with pytest.raises(ConfigError, match="TRAIN_DATA was"):
        check_drift(checkpoint, load_settings(changed))


def test_data_command_reports_each_sources_requested_and_achieved_share(tmp_path: Path) -> None:
    a, b = write_source(tmp_path / "a.jsonl", "a", 100), write_source(tmp_path / "b.jsonl", "b", 100)
    env = train_env(tmp_path / "out", data=f"{a}:3,{b}:1", seq_len=64)
    proc = subprocess.run([sys.executable, "-m", "trainer", "data"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])["mix"]["sources"]
    assert [(r["name"], r["requested_share"]) for r in rows] == [("a", 0.75), ("b", 0.25)]
    assert abs(rows[0]["achieved_share"] - 0.75) <= 0.02 and rows[0]["repeats"] > 1
    assert "data mix: a" in proc.stderr and "repeated" in proc.stderr


def test_a_hub_dataset_in_a_mix_is_fetched_mixed_at_its_weight_and_pinned(tmp_path: Path) -> None:
    from hub_server import HubServer

    hub = HubServer().start()
    try:
        letters = hub.repo("org/letters", "datasets")
        first = letters.commit({"train.jsonl": write_source(tmp_path / "h.jsonl", "b", 300).read_bytes(),
                                "README.md": b"# letters\n", "letters.py": b"raise SystemExit('never run')\n"})
        a = write_source(tmp_path / "a.jsonl", "a", 100)
        env = {**train_env(tmp_path / "out", data=f"{a}:0.8,hf://datasets/org/letters:0.2", seq_len=64, max_steps=1,
                           save_steps=1), "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}  # fmt: skip
        online = {**env, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0"}

        def trainer(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=REPO, env=env, capture_output=True,
                                  text=True, timeout=120)  # fmt: skip

        eval_sets = {"TRAIN_EVAL_DATA": f"held=hf://datasets/org/letters,{a}"}  # named eval sets resolve alike
        missing = trainer(["config"], {**env, **eval_sets, "HF_ENDPOINT": hub.url})  # offline, nothing fetched yet
        assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr[-2000:]
        for variable in ("TRAIN_DATA", "TRAIN_EVAL_DATA"):
            assert f"{variable}=hf://datasets/org/letters: revision 'main' is not in the cache" in missing.stderr
        assert "python -m trainer fetch" in missing.stderr
        fetched = trainer(["fetch"], online)
        assert fetched.returncode == 0 and f"TRAIN_DATA[letters]=org/letters@main -> commit {first}" in fetched.stdout
        files = f"GET /datasets/org/letters/resolve/{first}/"  # a source of a mix: its data files only, as alone
        assert {r.removeprefix(files) for r in hub.requests if r.startswith(files)} == {"train.jsonl"}
        code, err = finish(start({**env, "HF_ENDPOINT": hub.url}))  # offline: from the fetched cache
        assert code == 0, err[-3000:]
        out = tmp_path / "out"
        rows = json.loads((out / "run_config.json").read_text())["training_data"]["mix"]["sources"]
        assert [(r["name"], r["requested_share"]) for r in rows] == [("a", 0.8), ("letters", 0.2)]
        assert abs(rows[0]["achieved_share"] - 0.8) <= 0.02 and rows[0]["repeats"] > 1 > rows[1]["repeats"]
        pin = {"repo_id": "org/letters", "repo_type": "dataset", "revision": "main", "sha": first}
        assert json.loads((out / "checkpoint-1" / "trainkit_complete").read_text())["hub"] == {"data:letters": pin}
        letters.commit({"train.jsonl": b'{"text": "moved on"}\n'})  # main moves; the resumed run keeps its commit
        resumed = trainer(["config", "--json"], {**online, "TRAIN_MAX_STEPS": "2"})
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert json.loads(resumed.stdout)["hub"] == {"data:letters": pin}  # not main's new commit
    finally:
        hub.stop()
