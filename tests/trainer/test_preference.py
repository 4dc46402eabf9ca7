"""Preference tuning (TRAIN_METHOD=dpo/orpo/kto/simpo/reward) on TRL's trainers: real `python -m trainer` runs of
the tiny preset on one generated preference set (tests/trainer/preference_data.py), the SIGTERM + resume check,
`data --show` on pairs, and the bad inputs, which end before torch (checked in-process, one of them as a real
subprocess)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hub_support import save_tiny_model
from preference_data import pairs, write_jsonl
from train_runs import assert_same_weights, finish, logged_steps, start, stopped_and_resumed, train_env

from trainer.config.checks import static_problems
from trainer.config.inputs import Inputs
from trainer.config.method import decide_reference
from trainer.config.parse import parse_settings
from trainer.config.resume import check_drift
from trainer.errors import ConfigError

STEPS = 6
HELD_OUT = 0.25  # 12 of 48 pairs


@pytest.fixture(scope="module")
def pair_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", pairs(48))


def method_env(out: Path, data: Path, method: str = "dpo", **more: object) -> dict[str, str]:
    """A short LoRA run with the built-in chatml template; evaluation on the held-out pairs at the last step."""
    settings = {"method": method, "chat_template": "chatml", "lora": 1, "seq_len": 96, "batch_size": 4,
                "max_steps": STEPS, "eval_split": HELD_OUT, "eval_steps": STEPS, **more}  # fmt: skip
    return train_env(out, data=data, **settings)


def lines(out: Path) -> tuple[list[dict], list[dict]]:
    """(training lines, evaluation lines) of metrics.jsonl."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r], [r for r in rows if "eval_loss" in r]


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset saved as a bf16 model folder with the byte-level tokenizer, as a Hub model often comes."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("bf16") / "tiny"
    save_tiny_model(folder, seed=7)
    AutoModelForCausalLM.from_pretrained(folder).to(torch.bfloat16).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def dpo_run(pair_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dpo") / "out"
    code, err = finish(start(method_env(out, pair_file)))
    assert code == 0, err[-3000:]
    (out.parent / "stderr.log").write_text(err)
    return out


def held_and_policy(err: str) -> tuple[float, float]:
    """(MiB of every model parameter alive in the trainer after setup, MiB of the policy's own), from its log."""
    found = re.search(r"memory: ([\d.]+) MiB of model parameters held after setup, the policy's own ([\d.]+) MiB", err)
    assert found, err[-3000:]
    return float(found[1]), float(found[2])


def test_dpo_with_lora_learns_the_preference(dpo_run: Path) -> None:
    train, evaluation = lines(dpo_run)
    margins = [r["rewards/margins"] for r in train]
    assert len(train) == STEPS and all("rewards/accuracies" in r for r in train)  # TRL's own metric names
    assert margins[0] == 0 and margins[-1] > 0.3 and margins[-1] == max(margins), margins
    assert evaluation[-1]["eval_rewards/accuracies"] > 0.8, evaluation[-1]  # on the 12 held-out pairs
    assert "eval_perplexity" not in evaluation[-1]  # a DPO loss is no language-model loss
    decisions = json.loads((dpo_run / "run_config.json").read_text())["decisions"]
    assert decisions["method"]["value"] == "dpo" and decisions["reference"]["value"] == "frozen adapter"
    assert (dpo_run / "final" / "model.safetensors").is_file() and (dpo_run / "final" / "adapter").is_dir()


def test_with_lora_no_second_copy_of_the_model_is_held(dpo_run: Path) -> None:
    """Counted over every parameter alive in the process (not assumed from the decision): the policy, and the
    reference only as TRL's adapter-sized 'ref' adapter. test_dpo_without_lora... sees the copy double it."""
    held, policy = held_and_policy((dpo_run.parent / "stderr.log").read_text())
    assert policy <= held < 1.1 * policy, (held, policy)


def test_the_lora_reference_stays_the_starting_model(dpo_run: Path) -> None:
    """TRL's reference is a frozen copy of the starting adapter, whose lora_B starts at zero (so it equals the base):
    after training it is still zero, while the trained adapter's is not."""
    from safetensors.torch import load_file

    checkpoint = dpo_run / f"checkpoint-{STEPS}"
    reference = load_file(str(checkpoint / "ref" / "adapter_model.safetensors"))
    trained = load_file(str(checkpoint / "adapter_model.safetensors"))
    b_weights = [name for name in reference if "lora_B" in name]
    assert b_weights and all(not reference[name].any() for name in b_weights)
    assert all(trained[name].any() for name in b_weights)


def test_a_stopped_dpo_run_resumes_to_the_same_weights(dpo_run: Path, pair_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = method_env(out, pair_file)
    stopped = stopped_and_resumed(env, out, after_step=3)
    assert logged_steps(out)[:STEPS] == list(range(1, STEPS + 1))
    assert_same_weights(out / "final", dpo_run / "final")
    changed = parse_settings({**env, "TRAIN_PREF_LOSS": "ipo"})  # the method's options cannot change on resume
    with pytest.raises(ConfigError, match="TRAIN_PREF_LOSS was 'auto', now 'ipo'"):
        check_drift(out / f"checkpoint-{stopped}", changed)


def test_eval_scores_the_runs_own_pairs_chosen_above_rejected(dpo_run: Path, pair_file: Path, tmp_path: Path,
                                                               run_trainer) -> None:  # fmt: skip
    """`eval` on the pairs file the run trained on: each side's mean log-prob per answer token (tokenized as TRL
    does, through the run's chat template). The trained policy puts the chosen (lower-case) answer above the
    rejected (upper-case) one far more often than chance, and more often than the untrained preset does, whose
    fresh weights are the same on every call (a run's with TRAIN_SEED's default: a new draw each call scored these
    pairs anywhere from 0.65 to 1.0)."""
    scored = {}
    fresh_model = ["tiny", "--chat-template", "chatml"]
    for name, model in {"trained": [str(dpo_run / "final")], "fresh": fresh_model, "fresh again": fresh_model}.items():
        result = run_trainer(["eval", *model, "--data", str(pair_file), "--output", str(tmp_path / name)], timeout=600)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
        scored[name] = json.loads((tmp_path / name / "eval_results.json").read_text())
        assert f"eval: 48 pairs: reward accuracy {scored[name]['reward_accuracy']:.4f}" in result.stderr
        assert "reward_accuracy" in result.stdout and "margin" in result.stdout  # the printed table
    trained, fresh = scored["trained"], scored["fresh"]
    assert {**scored["fresh again"], "time": None} == {**fresh, "time": None}  # the same figures, another moment
    assert trained["pairs"] == 48 and trained["pairs_without_room"] == 0
    assert trained["reward_accuracy"] > 0.9 and trained["margin"] > 0, trained
    assert trained["reward_accuracy"] > fresh["reward_accuracy"] and trained["margin"] > fresh["margin"], fresh
    records = [json.loads(line) for line in (tmp_path / "trained" / "records.jsonl").read_text().splitlines()]
    assert [r["where"] for r in records] == [f"{pair_file}:{n}" for n in range(1, 49)]
    wins = [r["chosen_logp"] > r["rejected_logp"] for r in records]
    assert sum(wins) / 48 == trained["reward_accuracy"] and [r["chosen_won"] for r in records] == wins
    assert all(r["chosen_tokens"] == r["rejected_tokens"] > 0 for r in records)  # the same words, other case
    evals = [json.loads(line) for line in (dpo_run / "evals.jsonl").read_text().splitlines()]
    assert evals[-1]["metrics"]["reward_accuracy"] == trained["reward_accuracy"]  # recorded in the run


def test_dpo_without_lora_learns_against_a_frozen_copy(pair_file: Path, tmp_path: Path) -> None:
    """Full fine-tuning: the reference is a frozen copy (held: twice the policy), and it stays frozen: its log-probs
    on the held-out pairs, evaluated before training and after, are equal (TRL logs the policy's log-probs and
    rewards = beta * (policy - reference), so reference = logps - rewards / beta, exactly, per evaluation).
    One run, to keep CI short, also proves two more things: TRAIN_FSDP (in one CPU process a world of one, as SFT's
    FSDP test: accelerate does not shard there; TRL wraps the reference too) and TRAIN_PREF_MAX_PROMPT_LEN, which
    the run applies itself (TRL 1.16 has no prompt limit): every prompt (61 tokens with chatml) cut to 56, counted."""
    out = tmp_path / "out"
    env = method_env(out, pair_file, lora=0, args="--eval_on_start", fsdp="full_shard", pref_max_prompt_len=56)
    code, err = finish(start(env))
    assert code == 0, err[-3000:]
    assert "36 of 36 train prompts longer than TRAIN_PREF_MAX_PROMPT_LEN=56 tokens cut from the left" in err
    assert "12 of 12 eval prompts longer than TRAIN_PREF_MAX_PROMPT_LEN=56 tokens cut" in err
    held, policy = held_and_policy(err)
    assert 1.9 * policy < held < 2.1 * policy, (held, policy)
    train, evaluation = lines(out)
    margins = [r["rewards/margins"] for r in train]
    assert margins[-1] > margins[0] and margins[-1] > 0.3, margins
    before, after = evaluation[0], evaluation[-1]
    assert (before["step"], after["step"]) == (0, STEPS)
    assert before["eval_rewards/accuracies"] == 0 and after["eval_rewards/accuracies"] > 0.8, after
    for side in ("chosen", "rejected"):
        reference = [e[f"eval_logps/{side}"] - e[f"eval_rewards/{side}"] / 0.1 for e in (before, after)]
        assert after[f"eval_logps/{side}"] != before[f"eval_logps/{side}"]  # the policy moved
        assert reference[1] == pytest.approx(reference[0], abs=1e-3), reference  # the reference did not
    config = json.loads((out / "run_config.json").read_text())
    assert config["decisions"]["reference"]["value"] == "frozen copy" and config["training_arguments"]["fsdp"]


@pytest.mark.parametrize(
    ("method", "lora", "metric", "reference"),
    [("orpo", 1, "log_odds_chosen", "none"), ("kto", 0, "rewards/margins", "frozen copy"),
     ("simpo", 1, "rewards/margins", "none"), ("reward", 0, "margin", "none")],
)  # fmt: skip
def test_each_method_learns_its_own_metric(method: str, lora: int, metric: str, reference: str, pair_file: Path,
                                           tmp_path: Path, request: pytest.FixtureRequest) -> None:  # fmt: skip
    """ORPO and SimPO with LoRA (no reference), KTO on the pairs without LoRA (a frozen copy of the model is the
    reference), a reward model (a one-score head) scoring chosen above rejected, from a bf16 model folder that it
    trains in fp32 master weights as the policy would (the same loader, dtype and device map)."""
    out = tmp_path / "out"
    more: dict[str, object] = {}
    if method == "reward":  # the classifier gets the RoPE scaling too
        more = {"rope_scaling": "linear", "rope_factor": 2, "model": request.getfixturevalue("bf16_model")}
    code, err = finish(start(method_env(out, pair_file, method=method, lora=lora, eval_split=0, eval_steps=0, **more)))
    assert code == 0, err[-3000:]
    if method == "reward":
        assert "LlamaForSequenceClassification (one-score head), torch.float32 weights" in err, err[-3000:]
    if method == "reward":
        saved = json.loads((out / "final" / "config.json").read_text())
        scaling = saved.get("rope_parameters") or saved["rope_scaling"]  # transformers 5 / 4
        assert (scaling["rope_type"], scaling["factor"]) == ("linear", 2.0), saved
    train, _ = lines(out)
    values = [r[metric] for r in train]
    assert values[-1] > values[0] and values[-1] > 0, values
    accuracy = {"reward": "accuracy", "kto": None}.get(method, "rewards/accuracies")  # KTO logs none (unpaired)
    assert accuracy is None or train[-1][accuracy] > 0.8, train[-1]
    assert json.loads((out / "run_config.json").read_text())["decisions"]["reference"]["value"] == reference


def test_data_show_json_marks_each_sides_answer_trained(pair_file: Path, tmp_path: Path, run_trainer) -> None:
    env = {k: v for k, v in method_env(tmp_path / "out", pair_file).items() if k.startswith("TRAIN_")}
    result = run_trainer(["data", "--show", "2", "--json"], env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    shown = [json.loads(line) for line in result.stdout.splitlines()]
    assert [s["where"] for s in shown] == [f"{pair_file}:1", f"{pair_file}:2"]
    for pair in shown:
        chosen, rejected = pair["chosen"], pair["rejected"]
        prompt = next(i for i, label in enumerate(chosen["labels"]) if label != -100)
        assert chosen["input_ids"][:prompt] == rejected["input_ids"][:prompt]  # one prompt, never trained
        assert all(label == -100 for label in rejected["labels"][:prompt])
        for side in (chosen, rejected):
            assert side["labels"][prompt:] == side["input_ids"][prompt:] and len(side["labels"]) > prompt


def test_a_text_prompt_with_whole_conversations_trains_the_prompt_once(tmp_path: Path, run_trainer) -> None:
    """The layout of the most used public preference sets: `prompt` text, and chosen/rejected whole conversations
    that repeat it as their user turn. The question is in each side once, and no user turn is trained."""
    from trainer.tokenizer import byte_level_tokenizer

    def side(i: int, answer: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"question{i} here"}, {"role": "assistant", "content": answer}]

    rows = [{"prompt": f"question{i} here", "chosen": side(i, f"good{i}"), "rejected": side(i, f"bad{i}")}
            for i in range(4)]  # fmt: skip
    data = write_jsonl(tmp_path / "public.jsonl", rows)
    env = {"TRAIN_DATA": str(data), "TRAIN_OUTPUT_DIR": str(tmp_path / "out"), "TRAIN_METHOD": "dpo",
           "TRAIN_CHAT_TEMPLATE": "chatml", "TRAIN_SEQ_LEN": "256"}  # fmt: skip
    result = run_trainer(["data", "--show", "4", "--json"], env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    tokenizer = byte_level_tokenizer()
    for i, pair in enumerate(json.loads(line) for line in result.stdout.splitlines()):
        for side, answer in (("chosen", f"good{i}"), ("rejected", f"bad{i}")):
            ids, labels = pair[side]["input_ids"], pair[side]["labels"]
            assert tokenizer.decode(ids).count(f"question{i}") == 1, tokenizer.decode(ids)
            trained = tokenizer.decode([t for t, label in zip(ids, labels, strict=True) if label != -100])
            assert answer in trained and "question" not in trained and "user" not in trained, trained


# ---- bad input: exit 2 before torch, naming file:line ----------------------------------------------------------

GOOD = {"prompt": "say hi", "chosen": "hi", "rejected": "HI"}
CHAT = pairs(1)[0]


def problems(tmp_path: Path, rows: list, **env: str) -> str:
    data = tmp_path / "data.jsonl"
    data.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    settings = parse_settings({"TRAIN_DATA": str(data), "TRAIN_OUTPUT_DIR": str(tmp_path / "out"),
                               "TRAIN_METHOD": "dpo", "TRAIN_CHAT_TEMPLATE": "chatml", **env})  # fmt: skip
    return "\n".join(static_problems(Inputs(settings)))


@pytest.mark.parametrize(
    ("second", "expected"),
    [
        ({"prompt": "say hi", "chosen": "", "rejected": "HI"}, "data.jsonl:2: chosen is empty"),
        ({"prompt": "say hi", "rejected": "HI", "chosen": None}, "data.jsonl:2: no chosen"),
        ({"prompt": "say hi", "chosen": "hi", "rejected": "hi"}, "data.jsonl:2: chosen equals rejected"),
        ({**CHAT, "prompt": None, "chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
          "rejected": [{"role": "user", "content": "X"}, {"role": "assistant", "content": "c"}]},
         "data.jsonl:2: chosen and rejected differ before their last turn"),
        (CHAT, "data.jsonl:2: a conversational chosen/rejected record in a file of prompt/chosen/rejected records"),
        ('{"prompt": "x", "chosen"', "data.jsonl:2: not valid JSON"),
    ],
    ids=["empty-side", "missing-side", "chosen-equals-rejected", "prompts-differ", "mixed-layouts", "not-json"],
)  # fmt: skip
def test_a_bad_pair_is_named_by_file_and_line(second: object, expected: str, tmp_path: Path) -> None:
    first = CHAT if "differ before" in expected else GOOD  # the file's layout is its first record's
    found = problems(tmp_path, [first, second])
    assert expected in found and "TRAIN_DATA_MAX_BAD_LINES" in found, found
    assert problems(tmp_path, [first, second, first], TRAIN_DATA_MAX_BAD_LINES="1") == ""  # skipped and counted


def test_kto_labels_must_be_booleans(tmp_path: Path) -> None:
    rows = [{"prompt": "a", "completion": "b", "label": True}, {"prompt": "a", "completion": "c", "label": 1}]
    assert "data.jsonl:2: label must be true or false, not 1" in problems(tmp_path, rows, TRAIN_METHOD="kto")
    assert "use TRAIN_METHOD=kto" in problems(tmp_path, rows[:1])  # DPO needs pairs


def test_the_layout_must_fit_the_method(tmp_path: Path) -> None:
    sft = problems(tmp_path, [{"messages": [{"role": "user", "content": "a"}]}])
    assert "TRAIN_METHOD=dpo needs preference pairs" in sft and "holds messages" in sft
    pairs_for_sft = problems(tmp_path, [GOOD], TRAIN_METHOD="sft")
    assert "holds preference data (prompt/chosen/rejected) but TRAIN_METHOD=sft" in pairs_for_sft


def test_a_method_option_that_does_not_apply_is_an_error(tmp_path: Path) -> None:
    found = problems(tmp_path, [GOOD], TRAIN_METHOD="orpo", TRAIN_PREF_LOSS="ipo", TRAIN_ARGS="--simpo_gama 0.5")
    assert "TRAIN_PREF_LOSS applies to TRAIN_METHOD=dpo, not TRAIN_METHOD=orpo" in found
    assert "--simpo_gama is not a TRL ORPOConfig flag" in found
    assert "did you mean simpo_gamma?" in problems(tmp_path, [GOOD], TRAIN_METHOD="simpo", TRAIN_ARGS="--simpo_gama 1")
    assert problems(tmp_path, [GOOD], TRAIN_ARGS="--use_weighting") == ""  # a DPOConfig field
    assert "TRAIN_LOSS_ON is for TRAIN_METHOD=sft" in problems(tmp_path, [GOOD], TRAIN_LOSS_ON="last")
    reward = problems(tmp_path, [GOOD], TRAIN_METHOD="reward", TRAIN_LORA="1", TRAIN_QUANT="4bit")
    assert "TRAIN_LORA=1 with TRAIN_METHOD=reward" in reward and "TRAIN_QUANT=4bit with TRAIN_METHOD=reward" in reward


def test_a_bad_pair_exits_2_before_torch(tmp_path: Path, run_trainer, imported_modules) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "rejected": "hi"}) + "\n")
    env = {"TRAIN_DATA": str(data), "TRAIN_OUTPUT_DIR": str(tmp_path / "out"), "TRAIN_METHOD": "dpo"}
    result = run_trainer(["config"], env=env, python_args=["-X", "importtime"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{data}:2: chosen equals rejected" in result.stderr
    assert "torch" not in imported_modules(result.stderr)


# ---- sharding and the reference: what TRL 1.16 cannot do exits 2 before torch, the rest runs ----------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TRAIN_LORA": "1", "TRAIN_PREF_REFERENCE": "copy"}, "TRAIN_PREF_REFERENCE=copy with TRAIN_LORA=1"),
        ({"TRAIN_ZERO_STAGE": "3"}, "without LoRA under DeepSpeed ZeRO-3"),
        ({"TRAIN_DEEPSPEED_CONFIG": "zero3.json"}, "without LoRA under DeepSpeed ZeRO-3"),
        ({"TRAIN_FSDP": "full_shard", "TRAIN_PREF_REFERENCE": "precompute"},
         "TRAIN_PREF_REFERENCE=precompute with TRAIN_FSDP=full_shard"),
        ({"TRAIN_ZERO_STAGE": "3", "TRAIN_LORA": "1"}, None),  # the reference: the same sharded model, no adapter
        ({"TRAIN_ZERO_STAGE": "3", "TRAIN_PREF_REFERENCE": "precompute"}, None),
        ({"TRAIN_ZERO_STAGE": "2"}, None),  # a frozen copy, which TRL prepares for DeepSpeed
        ({"TRAIN_FSDP": "full_shard"}, None),  # a frozen copy, which TRL wraps with FSDP
        ({"TRAIN_FSDP": "full_shard", "TRAIN_PREF_REFERENCE": "precompute", "TRAIN_LORA": "1"}, None),
    ],
    ids=["lora-copy", "zero3-copy", "zero3-config-file", "fsdp-precompute", "zero3-lora", "zero3-precompute",
         "zero2-copy", "fsdp-copy", "fsdp-lora-precompute"],
)  # fmt: skip
def test_the_reference_against_lora_and_sharding(env: dict[str, str], expected: str | None, tmp_path: Path) -> None:
    if "TRAIN_DEEPSPEED_CONFIG" in env:
        env = {**env, "TRAIN_DEEPSPEED_CONFIG": str(tmp_path / env["TRAIN_DEEPSPEED_CONFIG"])}
        Path(env["TRAIN_DEEPSPEED_CONFIG"]).write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    found = problems(tmp_path, [GOOD], **env)
    assert (expected in found) if expected else found == "", found
    if env.get("TRAIN_ZERO_STAGE") == "3" and not expected:  # run_config.json says where the reference lives
        reason = decide_reference(parse_settings({"TRAIN_METHOD": "dpo", **env})).reason
        assert "ZeRO-3, sharded with the model" in reason or "precompute" in reason, reason
    if expected:  # ORPO has no reference: the same sharding runs
        sharding = {k: v for k, v in env.items() if k != "TRAIN_PREF_REFERENCE"}
        assert problems(tmp_path, [GOOD], **sharding, TRAIN_METHOD="orpo") == ""


def test_a_long_prompt_is_cut_from_the_left_once_for_both_sides(tmp_path: Path) -> None:
    """TRAIN_PREF_MAX_PROMPT_LEN on the tiny preset's tokenizer with chatml: text loses its start, a conversation
    its earliest messages, then the start of the earliest kept; chosen and rejected see the one cut prompt; drop
    drops the record; a limit the template alone exceeds drops it too; every case counted."""
    from trainer.data.preference import encoded, limit_prompts, prompt_tokens
    from trainer.tokenizer import tokenizer_for

    inputs = Inputs(parse_settings({"TRAIN_DATA": str(write_jsonl(tmp_path / "p.jsonl", pairs(1))),
                                    "TRAIN_METHOD": "dpo", "TRAIN_CHAT_TEMPLATE": "chatml"}))  # fmt: skip
    choice = inputs.template()
    tokenizer = tokenizer_for(inputs.tokenizer_folder, choice.text, choice.origin, choice.from_setting)
    turns = [{"role": "system", "content": "be brief " * 5}, {"role": "user", "content": "a question " * 4},
             {"role": "assistant", "content": "an answer"}, {"role": "user", "content": "say cat sun"}]  # fmt: skip
    chat = {**pairs(1)[0], "prompt": turns}
    text = {"prompt": "a long story " * 15, "chosen": "yes", "rejected": "no"}
    assert prompt_tokens(tokenizer, turns) == 250 and prompt_tokens(tokenizer, text["prompt"]) == 195  # bytes
    limited = limit_prompts([chat, text, {**text, "prompt": "short"}], tokenizer, 150, "truncate")
    assert (limited.cut, limited.dropped) == (2, 0) and limited.rows[2]["prompt"] == "short"
    cut_chat, cut_text = limited.rows[0]["prompt"], limited.rows[1]["prompt"]
    assert cut_text == text["prompt"][-len(cut_text) :] and prompt_tokens(tokenizer, cut_text) == 150
    assert cut_chat[1:] == turns[-2:] and cut_chat[0]["role"] == "user"  # the system message went first
    assert turns[1]["content"].endswith(cut_chat[0]["content"]) and cut_chat[0]["content"] != turns[1]["content"]
    assert 140 < prompt_tokens(tokenizer, cut_chat) <= 150
    for row in limited.rows[:2]:
        item = encoded(tokenizer, row)
        assert len(item["prompt_ids"]) <= 150 and item["chosen_ids"] != item["rejected_ids"]  # one prompt
    assert limit_prompts([chat, text], tokenizer, 150, "drop").dropped == 2
    answer_first = limit_prompts([chat], tokenizer, 120, "truncate").rows[0]["prompt"]  # [answer, question] fits
    assert answer_first == turns[-1:]  # but an answer without its question goes too
    assert limit_prompts([chat], tokenizer, 40, "truncate").dropped == 1  # chatml's own tokens are more than 40
    assert limit_prompts([chat, text], tokenizer, 0, "truncate").rows == [chat, text]  # 0: no limit of its own
    assert "leaves no room for the answer" in problems(tmp_path, [GOOD], TRAIN_PREF_MAX_PROMPT_LEN="512")
    assert "TRAIN_PREF_MAX_PROMPT_LEN applies to" in problems(tmp_path, [GOOD], TRAIN_METHOD="sft",
                                                               TRAIN_PREF_MAX_PROMPT_LEN="8")  # fmt: skip
