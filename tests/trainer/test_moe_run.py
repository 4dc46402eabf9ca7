"""A mixture of experts trained for real (`python -m trainer`): TRAIN_MODEL=tiny-moe TRAIN_LORA=1 with the defaults a
user gets (LoRA on attention and the routed experts). One uninterrupted run is shared: its log and record hold the
component table, its metrics.jsonl the router health per step, its final/ the merge checked against base + adapter;
a run stopped by SIGTERM resumes to the same weights; final/ exports (a plain folder and GGUF through the gate);
DPO and GRPO train it with the router metrics; the silent miss (MLP names adapting only a DeepSeek-shaped model's
shared expert) exits 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from moe_models import save_tiny
from preference_data import pairs, write_jsonl
from train_runs import (
    MAX_STEPS,
    assert_same_weights,
    finish,
    logged_steps,
    start,
    stopped_and_resumed,
    train_env,
    write_corpus,
)

MODEL = "tiny-moe"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "data.txt")


def moe_env(out: Path, **train: object) -> dict[str, str]:
    return train_env(out, model=MODEL, lora=1, **train)


@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(output folder, log) of an uninterrupted run."""
    out = tmp_path_factory.mktemp("moe") / "out"
    code, err = finish(start(moe_env(out, data=corpus)))
    assert code == 0, err[-3000:]
    return out, err


def _lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_the_run_logs_its_components_and_router_health(reference: tuple[Path, str]) -> None:
    out, err = reference
    table = err[err.index("components: (qwen3_moe: top-2 of 8 routed experts"):]
    routed = re.search(r"routed experts +([\d,]+) +([\d,]+) \([\d.]+%\) +([\d,]+)", table)
    assert routed and int(routed[2].replace(",", "")) > 0  # the routed experts' adapters train
    assert re.search(r"router +[\d,]+ +0 \(0\.0%\)", table)  # the router stays frozen
    record = json.loads((out / "run_config.json").read_text())
    rows = {row["component"]: row for row in record["components"]}
    assert rows["routed experts"]["trainable"] == int(routed[2].replace(",", ""))
    assert "load-balancing loss logged as router/aux_loss, added with coefficient 0.001" in err
    lines = _lines(out)
    assert [line["step"] for line in lines] == list(range(1, MAX_STEPS + 1))
    for line in lines:
        shares = line["router/expert_share"]
        assert len(shares) == 4 and all(len(row) == 8 and abs(sum(row) - 1) < 1e-4 for row in shares)
        assert line["router/aux_loss"] > 0 and line["router/unused_experts"] == sum(x == 0 for r in shares for x in r)
    assert "LoRA merge: 8 fused expert parameters folded in, each equal to base + adapter" in err


def test_a_stopped_run_resumes_to_the_same_weights(reference: tuple[Path, str], corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert stopped_and_resumed(moe_env(out, data=corpus), out, after_step=2) < MAX_STEPS
    assert logged_steps(out) == list(range(1, MAX_STEPS + 1))
    assert_same_weights(out / "final", reference[0] / "final")
    assert _lines(out)[-1]["router/expert_share"] == _lines(reference[0])[-1]["router/expert_share"]


def test_final_exports_as_a_plain_folder_and_gguf(reference: tuple[Path, str], tmp_path: Path, run_trainer) -> None:
    exported = tmp_path / "export"
    result = run_trainer(["export", str(reference[0]), str(exported), "--quant", "q8_0"], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "loads without peft; logits within" in result.stderr
    report = json.loads((exported / "quant_report.json").read_text())
    assert [(entry["type"], entry["pass"]) for entry in report["types"]] == [("q8_0", True)], report
    refused = run_trainer(["export", str(reference[0] / "final"), str(tmp_path / "adapter"), "--adapter-only"])
    assert refused.returncode == 2 and "adapts parameters (experts.down_proj, experts.gate_up_proj" in refused.stderr


def test_a_target_list_adapting_only_the_shared_expert_exits_2(corpus: Path, tmp_path: Path) -> None:
    folder = save_tiny("deepseek_v3", tmp_path / "deepseek")
    env = train_env(tmp_path / "out", model=folder, lora=1, lora_targets="gate_proj,up_proj,down_proj", data=corpus)
    code, err = finish(start(env))
    assert code == 2, err[-3000:]
    assert "adapts 3 shared-expert and 3 dense MLP modules but none of the routed experts" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("method", ["dpo", "grpo"])
def test_preference_and_online_rl_train_it_with_router_metrics(method: str, tmp_path: Path) -> None:
    if method == "dpo":
        data = write_jsonl(tmp_path / "pairs.jsonl", pairs(8))
        more = {"chat_template": "chatml", "seq_len": 96, "batch_size": 4}
    else:
        data = tmp_path / "prompts.jsonl"
        data.write_text("".join(json.dumps({"prompt": f"say {w}:"}) + "\n" for w in ("cat", "sun", "red", "sky")))
        (tmp_path / "rewards.py").write_text("def short(completions, **kw):\n    return [-len(c) for c in completions]\n")  # noqa: E501
        more = {"reward": f"{tmp_path / 'rewards.py'}:short", "batch_size": 8, "rl_generations": 4,
                "rl_max_new_tokens": 8}  # fmt: skip
    out = tmp_path / "out"
    code, err = finish(start(moe_env(out, method=method, data=data, max_steps=2, **more)))
    assert code == 0, err[-3000:]
    for line in _lines(out):
        assert len(line["router/expert_share"]) == 4 and line["router/aux_loss"] > 0, line
