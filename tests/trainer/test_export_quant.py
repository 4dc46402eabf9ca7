"""`python -m trainer export --quant`: the tiny preset trained for real, converted by llama.cpp's own converter,
quantized by its quantizer, loaded and scored in llama.cpp (llama-cpp-python), gated against the export; and made
into fp8 / w4a16 compressed-tensors folders by llmcompressor, loaded back through Transformers' compressed-tensors
loader.

llama.cpp is built once per machine (scripts/setup_llama_cpp.py caches the wheel and the converter; conftest.py's
`llama_cpp` session fixture runs it, which is seconds when built), llmcompressor's overlay installed once
(scripts/setup_quant.py, the `overlay` fixture). One trained run (conftest.py's `tiny_run`, its GGUF export
`tiny_gguf_export` shared with test_serve_check.py) serves every test of the file; it carries the built-in chatml
template (TRAIN_CHAT_TEMPLATE) so that the report's answer agreement (trainer/export/answer_agreement.py) is measured
on it."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, base_env
from helpers import assert_user_error_in_process as refused_here
from hub_support import run_env
from waiting import wait_for

OVERLAY_SCRIPT = REPO / "scripts" / "setup_quant.py"


@pytest.fixture(scope="module")
def overlay() -> Path:
    """llmcompressor's overlay folder (installed once: scripts/setup_quant.py)."""
    result = subprocess.run([PYTHON, str(OVERLAY_SCRIPT)], capture_output=True, text=True, timeout=1200, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(result.stdout.strip().splitlines()[-1])


def _export(run_trainer, run: Path, out: Path, llama_cpp: Path, *args: str, overlay: Path | None = None):
    env = {**run_env(run), "TRAINKIT_LLAMA_CPP": str(llama_cpp),
           **({"TRAINKIT_LLMCOMPRESSOR": str(overlay)} if overlay else {})}  # fmt: skip
    return run_trainer(["export", str(run / "output"), str(out), *args], env=env, timeout=900)


def _perplexity_by_hand(path: Path, tokenizer_folder: Path, text: str, context: int, windows: int) -> float:
    """The report's perplexity again, from the file alone: llama.cpp's logits for the tokenizer's ids."""
    import numpy as np
    from llama_cpp import Llama
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tokenizer_folder)(text, add_special_tokens=False)["input_ids"]
    model = Llama(model_path=str(path), n_ctx=context, n_batch=context, n_ubatch=context, logits_all=True,
                  verbose=False, n_threads=1)  # fmt: skip
    nll = []
    for w in range(windows):
        chunk = ids[w * context:(w + 1) * context]
        model.reset()
        model.eval(chunk)
        logits = np.asarray(model.scores[: context - 1], dtype=np.float64)
        logz = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
        nll += (logz - logits[np.arange(context - 1), chunk[1:]]).tolist()
    model.close()
    return math.exp(sum(nll) / len(nll))


def _llama_cpp_greedy_by_hand(path: Path, prompt: list[int], tokens: int, stops: list[int]) -> list[int]:
    """llama.cpp's own greedy sampler (temperature 0) from the prompt ids: the answer the report holds for the file."""
    from llama_cpp import Llama

    model = Llama(model_path=str(path), n_ctx=len(prompt) + tokens, verbose=False, n_threads=1)
    answer: list[int] = []
    for token in model.generate(prompt, temp=0.0):
        answer.append(int(token))
        if len(answer) == tokens or token in stops:
            break
    model.close()
    return answer


def _prompt_ids(folder: Path, prompts: list[str]) -> list[list[int]]:
    """The report's prompts rendered by the exported tokenizer's chat template, as a user of the export would."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return [tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                    add_generation_prompt=True), add_special_tokens=False)["input_ids"]
            for p in prompts]  # fmt: skip


def _transformers_greedy_by_hand(folder: Path, prompts: list[list[int]], tokens: int, stops: list[int]) -> list:
    """Transformers' own generate, greedy, from the prompt ids: the reference's answers."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    how = GenerationConfig(do_sample=False, max_new_tokens=tokens, eos_token_id=stops, pad_token_id=stops[0])
    with torch.no_grad():
        return [model.generate(torch.tensor([p]), generation_config=how)[0, len(p):].tolist() for p in prompts]


def test_tiny_exports_gguf_that_loads_in_llama_cpp_and_passes_the_gate(tiny_gguf_export) -> None:
    out, result = tiny_gguf_export  # `export --quant f16 --quant q8_0 --quant q4_k_m`, made once (conftest.py)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((out / "quant_report.json").read_text())
    rows = {r["type"]: r for r in report["types"]}
    print(json.dumps(report, indent=1))  # the numbers docs/running.md quotes
    assert list(rows) == ["f16", "q8_0", "q4_k_m"]
    text = report["eval_text"]
    assert "corpus.txt" in text["origin"] and "not held out" in text["origin"]
    for kind, row in rows.items():
        assert row["pass"] and row["tokenizer_agrees"], row
        assert (out / row["file"]).is_file() and row["bytes"] == (out / row["file"]).stat().st_size
        assert row["runtime"].startswith("llama.cpp (llama-cpp-python ")
        modelfile = (out / row["modelfile"]["file"]).read_text()
        assert modelfile.startswith(f"FROM ./{Path(row['file']).name}\n") and 'PARAMETER stop "<|eos|>"' in modelfile
        corpus = Path(text["path"]).read_bytes()
        tail = corpus[-64 * 1024:]
        tail = tail[tail.find(b"\n") + 1:].decode()
        ppl = _perplexity_by_hand(out / row["file"], out, tail, text["context"], text["windows"])
        assert ppl == pytest.approx(row["perplexity"], rel=1e-6), kind  # the report is what the file computes
    assert report["reference"]["perplexity"] < 200  # learned: chance over 259 byte tokens is 259
    assert rows["f16"]["ratio"] == pytest.approx(1, abs=0.002) and rows["f16"]["agreement"] > 0.99
    assert rows["q8_0"]["ratio"] == pytest.approx(1, abs=0.01) and rows["q8_0"]["agreement"] > 0.97
    assert rows["q4_k_m"]["increase_pct"] <= 5 and rows["q4_k_m"]["agreement"] > 0.8
    assert rows["q4_k_m"]["bytes"] < rows["q8_0"]["bytes"] < rows["f16"]["bytes"]
    # the answer agreement: the fixed prompts (the corpus is not chat data), reported and not gated
    found = report["answers"]
    assert found["measured"] and not found["gates"] and found["origin"] == "trainkit's fixed prompts"
    assert len(found["prompts"]) == len(found["reference_answers"]) == 4 and found["tokens"] == 16
    assert found["stop_ids"] == [257]  # <|eos|>; chatml's <|im_end|> is 10 byte tokens, not one
    prompt_ids = _prompt_ids(out, found["prompts"])
    assert _transformers_greedy_by_hand(out, prompt_ids, 16, [257]) == found["reference_answers"]
    for kind, row in rows.items():
        agreement = row["answer_agreement"]
        assert agreement["prompts"] == 4 and agreement["tokens"] == 16, (kind, agreement)
        assert agreement["answers"][0] == _llama_cpp_greedy_by_hand(out / row["file"], prompt_ids[0], 16, [257]), kind
    # measured (docs/running.md): every type 4 of 4 prompts, all 16 tokens (the tiny model answers "the the the ...")
    assert rows["f16"]["answer_agreement"]["agree"] >= 0.75 and rows["q8_0"]["answer_agreement"]["agree"] >= 0.75
    assert rows["q4_k_m"]["answer_agreement"]["agree"] >= 0.5
    card = (out / "README.md").read_text()
    assert "## Quantized files" in card and "| q4_k_m | `gguf/out.q4_k_m.gguf` |" in card
    assert "answers agreeing" in card and "reported, not gated" in card
    assert not (out / ".gguf-work").exists() and not list(out.parent.glob(".tmp-export-*"))


# The report's perplexity and answers again, by hand, from each written folder in llmcompressor's environment: loaded
# through Transformers' compressed-tensors loader, every targeted layer holding its scheme, on the same windows; the
# answers by Transformers' own greedy generate from the report's prompts, rendered by the folder's own tokenizer.
BY_HAND = """
import json, math, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
out, tail, context, windows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
asked = json.loads(sys.argv[5])
tokenizer = AutoTokenizer.from_pretrained(out)
rendered = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in asked["prompts"]]
prompt_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in rendered]
how = GenerationConfig(do_sample=False, max_new_tokens=asked["tokens"], eos_token_id=asked["stop_ids"],
                       pad_token_id=asked["stop_ids"][0])
ids = tokenizer(open(tail).read(), add_special_tokens=False)["input_ids"]
found = {}
for kind in ("fp8", "w4a16"):
    model = AutoModelForCausalLM.from_pretrained(f"{out}/{kind}").eval()
    nll = []
    with torch.no_grad():
        for w in range(windows):
            chunk = ids[w * context:(w + 1) * context]
            logp = torch.log_softmax(model(input_ids=torch.tensor([chunk])).logits[0].double(), -1)
            nll += (-logp[torch.arange(context - 1), torch.tensor(chunk[1:])]).tolist()
    schemes = {n: str(m.quantization_scheme.weights.type) + str(m.quantization_scheme.weights.num_bits)
               for n, m in model.named_modules() if getattr(m, "quantization_scheme", None) is not None}
    with torch.no_grad():
        answers = [model.generate(torch.tensor([p]), generation_config=how)[0, len(p):].tolist()
                   for p in prompt_ids]
    found[kind] = {"perplexity": math.exp(sum(nll) / len(nll)), "schemes": schemes, "answers": answers}
print(json.dumps(found))
"""


def test_tiny_exports_fp8_and_w4a16_that_load_through_compressed_tensors(run_trainer, tiny_run, llama_cpp, overlay,
                                                                         tmp_path) -> None:  # fmt: skip
    from safetensors import safe_open

    out = tmp_path / "out"
    result = _export(run_trainer, tiny_run, out, llama_cpp, "--quant", "fp8", "--quant", "w4a16", overlay=overlay)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((out / "quant_report.json").read_text())
    print(json.dumps(report, indent=1))  # the numbers docs/running.md quotes
    rows = {r["type"]: r for r in report["types"]}
    assert list(rows) == ["fp8", "w4a16"]
    for kind, row in rows.items():
        config = json.loads((out / kind / "config.json").read_text())["quantization_config"]
        assert config["quant_method"] == "compressed-tensors" and config["quantization_status"] == "compressed"
        assert config["format"] == {"fp8": "float-quantized", "w4a16": "pack-quantized"}[kind]
        assert row["bytes"] == (out / kind / "model.safetensors").stat().st_size and row["pass"], row
        assert row["runtime"] == "transformers 5.17.0 + compressed-tensors 0.19.0 (CPU, dequantized)"
        assert (out / kind / "tokenizer.json").is_file()
    with safe_open(str(out / "fp8" / "model.safetensors"), "pt") as f:
        assert str(f.get_tensor("model.layers.0.mlp.gate_proj.weight").dtype) == "torch.float8_e4m3fn"
    with safe_open(str(out / "w4a16" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.mlp.gate_proj.weight_packed" in names  # 8 int4 values per int32
    assert "model.layers.0.mlp.down_proj.weight" in names  # 688 wide: not a multiple of the group of 128
    down = [f"model.layers.{n}.mlp.down_proj" for n in range(4)]
    assert rows["fp8"]["unquantized_layers"] == ["lm_head"] and rows["w4a16"]["unquantized_layers"] == ["lm_head",
                                                                                                         *down]
    assert rows["w4a16"]["calibration"]["windows"] == 128 and "before the gate's tail" in rows["w4a16"]["calibration"][
        "origin"]  # fmt: skip
    # measured on this preset (docs/running.md): fp8 -0.01 %, agreement 0.994; w4a16 +0.004 %, agreement 0.997
    assert abs(rows["fp8"]["increase_pct"]) < 0.5 and rows["fp8"]["agreement"] > 0.98
    assert abs(rows["w4a16"]["increase_pct"]) < 1 and rows["w4a16"]["agreement"] > 0.98
    assert rows["fp8"]["bytes"] < rows["w4a16"]["bytes"] < (out / "model.safetensors").stat().st_size
    assert report["answers"]["origin"] == "trainkit's fixed prompts" and not report["answers"]["gates"]
    for kind, row in rows.items():  # measured: both 4 of 4 prompts, all 16 tokens
        assert row["answer_agreement"]["prompts"] == 4 and row["answer_agreement"]["tokens"] == 16, kind
        assert row["answer_agreement"]["agree"] >= 0.5, (kind, row["answer_agreement"])
    text = report["eval_text"]
    tail = tmp_path / "tail.txt"
    raw = Path(text["path"]).read_bytes()[-64 * 1024:]
    tail.write_bytes(raw[raw.find(b"\n") + 1:])
    env = {**base_env(), "PYTHONPATH": str(overlay)}
    asked = json.dumps(report["answers"])
    result = subprocess.run([PYTHON, "-c", BY_HAND, str(out), str(tail), str(text["context"]), str(text["windows"]),
                             asked], capture_output=True, text=True, env=env, timeout=600, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    by_hand = json.loads(result.stdout.strip().splitlines()[-1])
    for kind in rows:
        assert by_hand[kind]["perplexity"] == pytest.approx(rows[kind]["perplexity"], rel=1e-6), kind
        assert by_hand[kind]["answers"] == rows[kind]["answer_agreement"]["answers"], kind
    assert set(by_hand["fp8"]["schemes"].values()) == {"float8"} and len(by_hand["fp8"]["schemes"]) == 28
    assert set(by_hand["w4a16"]["schemes"].values()) == {"int4"} and len(by_hand["w4a16"]["schemes"]) == 24
    # provenance: the run's record and each type's figures and files
    record = json.loads((out / "provenance.json").read_text())
    assert record["seed"] is not None and "distributions" in record
    quantized = {r["type"]: r for r in record["export"]["quantized"]["types"]}
    assert set(quantized) == {"fp8", "w4a16"} and quantized["w4a16"]["ratio"] == rows["w4a16"]["ratio"]
    assert quantized["fp8"]["answer_agreement"] == rows["fp8"]["answer_agreement"]
    assert quantized["fp8"]["sha256"] == {"fp8/model.safetensors": hashlib.sha256(
        (out / "fp8" / "model.safetensors").read_bytes()).hexdigest()}  # fmt: skip
    card = (out / "README.md").read_text()
    assert "| fp8 | `fp8/` |" in card and "left unquantized: lm_head, model.layers.0.mlp.down_proj" in card
    assert not (out / ".compress-work").exists() and not list(tmp_path.glob(".tmp-export-*"))
    # the torch range images/versions.toml gives build.py's plan is the installed wheel's own
    from importlib.metadata import Distribution

    import tomllib
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    wheel = Distribution.at(next(overlay.glob("llmcompressor-*.dist-info")))
    (torch,) = [r for r in map(Requirement, wheel.requires or []) if r.name == "torch" and r.marker is None]
    recorded = tomllib.loads((REPO / "images" / "versions.toml").read_text())["llmcompressor"]["torch"]
    assert torch.specifier == SpecifierSet(recorded)


def test_a_broken_conversion_fails_the_gate_with_exit_1_and_publishes_nothing(run_trainer, run_python, tiny_run,
                                                                            llama_cpp, tmp_path) -> None:  # fmt: skip
    out = tmp_path / "broken"
    env = {**run_env(tiny_run), "TRAINKIT_LLAMA_CPP": str(llama_cpp), "PYTHONPATH": str(REPO)}  # a script's own dir
    # comes first on its sys.path, not the repository's
    argv = ["tests/trainer/broken_gguf.py", "output_norm.weight", "-1", "export", str(tiny_run / "output"), str(out),
            "--quant", "q8_0"]  # fmt: skip
    result = run_python(argv, env=env, timeout=900)
    assert result.returncode == 1, result.stderr[-4000:]
    assert "scaled output_norm.weight by -1.0" in result.stderr
    assert "quality gate failed: q8_0: perplexity" in result.stdout and "threshold 1%" in result.stdout
    assert "Traceback" not in result.stderr
    assert not out.exists() and not list(tmp_path.glob(".tmp-export-*")) and not list(tmp_path.glob(".*.lock"))
    # --allow-quality-loss publishes it, and the report says it failed
    result = run_python([*argv, "--allow-quality-loss"], env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((out / "quant_report.json").read_text())
    assert report["allow_quality_loss"] and not report["types"][0]["pass"]
    # its answers turn at the first token on every prompt (measured: 0 of 4 agree, prefix 0.0): the figure can fail
    broken = report["types"][0]["answer_agreement"]
    assert broken["prompts"] == 4 and broken["agree"] == 0 and broken["mean_prefix"] < 1, broken
    assert "| q8_0 |" in (out / "README.md").read_text() and "| NO |" in (out / "README.md").read_text()


def test_a_broken_compressed_folder_fails_the_gate_with_exit_1_and_publishes_nothing(run_python, tiny_run, overlay,
                                                                                    tmp_path) -> None:  # fmt: skip
    """fp8's written folder with its final norm negated (after llmcompressor saved it, before it is loaded back):
    exit 1 naming the type, the numbers and the threshold; no OUT, no staging folder. --allow-quality-loss publishing
    a failed type is the same code for every type (the broken conversion's test covers it)."""
    out = tmp_path / "broken"
    env = {**run_env(tiny_run), "TRAINKIT_LLMCOMPRESSOR": str(overlay), "PYTHONPATH": str(REPO)}
    argv = ["tests/trainer/broken_compressed.py", "model.norm.weight", "-1", "export", str(tiny_run / "output"),
            str(out), "--quant", "fp8"]  # fmt: skip
    result = run_python(argv, env=env, timeout=900)
    assert result.returncode == 1, result.stderr[-4000:]
    assert "broken_compressed: scaled model.norm.weight by -1.0 in fp8/model.safetensors" in result.stderr
    assert "quality gate failed: fp8: perplexity" in result.stdout and "threshold 2%" in result.stdout, result.stdout
    assert "Traceback" not in result.stderr
    assert not out.exists() and not list(tmp_path.glob(".tmp-export-*")) and not list(tmp_path.glob(".*.lock"))


def test_quant_mistakes_exit_2_naming_them_and_sigterm_leaves_nothing(run_trainer, tiny_run, llama_cpp, overlay,
                                                                     tmp_path, capsys, monkeypatch
                                                                     ) -> None:  # fmt: skip
    """The refusals found after the export's weights are written (a text too short for one window) by real
    commands, the staging folder removed; those made before any work (the plan's) in this process, into another OUT
    (the lock an in-process export holds lasts as long as pytest)."""
    from transformers import OPTConfig, OPTForCausalLM

    from trainer.tokenizer import byte_level_tokenizer

    out, short, bare = tmp_path / "out", tmp_path / "short.txt", tmp_path / "bare"
    short.write_text("Too short for one window.")
    shutil.copytree(tiny_run / "output" / "final", bare)  # a model folder outside any run: no data to calibrate on
    corpus = str(REPO / "trainer" / "assets" / "corpus.txt")
    cases = {
        ("--quant", "q8_0", "--eval-data", str(short)): "has 25 tokens, fewer than the context of 64",
        ("--quant", "w4a16", "--calibration-data", str(short)): "the calibration text (--calibration-data short.txt) "
                                                                "has 25 tokens",
    }  # fmt: skip
    for args, message in cases.items():
        result = _export(run_trainer, tiny_run, out, llama_cpp, *args, overlay=overlay)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr[-3000:])
        assert "Traceback" not in result.stderr and not out.exists() and not list(tmp_path.glob(".tmp-export-*"))
    planned = tmp_path / "planned"
    planned.mkdir()
    refused = planned / "out"
    env = {**run_env(tiny_run), "TRAINKIT_LLAMA_CPP": str(llama_cpp), "TRAINKIT_LLMCOMPRESSOR": str(overlay)}
    run, here = ["export", str(tiny_run / "output"), str(refused)], {"env": env, "monkeypatch": monkeypatch}
    refused_here([*run, "--quant", "q9_z"], capsys, "export --quant q9_z: unknown type; GGUF types: f32, f16", **here)
    refused_here([*run, "--quant", "fp8", "--calibration-data", corpus], capsys,
                 "only --quant w4a16 calibrates; drop it", **here)  # fmt: skip
    refused_here(["export", str(bare), str(refused), "--quant", "w4a16", "--eval-data", corpus], capsys,
                 "export --quant w4a16: GPTQ needs calibration text and SRC is not a run's folder; give "
                 "--calibration-data", **here)  # fmt: skip
    # no overlay: exit 2 naming how to install it
    refused_here([*run, "--quant", "fp8"], capsys,
                 f"llmcompressor is not installed (no overlay in TRAINKIT_LLMCOMPRESSOR={tmp_path / 'none'})",
                 "python scripts/setup_quant.py", env={**env, "TRAINKIT_LLMCOMPRESSOR": str(tmp_path / "none")},
                 monkeypatch=monkeypatch)  # fmt: skip
    opt = tmp_path / "opt"  # an architecture llama.cpp's converter lacks: refused before any work
    OPTForCausalLM(OPTConfig(vocab_size=259, hidden_size=32, num_hidden_layers=1, ffn_dim=64, num_attention_heads=2,
                             word_embed_proj_dim=32)).save_pretrained(opt)  # fmt: skip
    byte_level_tokenizer().save_pretrained(opt)
    refused_here(["export", str(opt), str(refused), "--quant", "q4_k_m", "--eval-data", str(REPO / "README.md")],
                 capsys, "llama.cpp's converter (llama.cpp (llama-cpp-python 0.3.36)) cannot take",
                 "the architecture OPTForCausalLM", **here)  # fmt: skip
    assert not refused.exists() and not list(planned.glob(".tmp-export-*"))
    # SIGTERM while the quantized files are being made: exit 143, no OUT, no staging folder
    staging = tmp_path / ".tmp-export-out"
    err = tmp_path / "err"
    full_env = {**base_env(), **run_env(tiny_run), "TRAINKIT_LLAMA_CPP": str(llama_cpp)}
    with err.open("w") as sink:
        proc = subprocess.Popen([PYTHON, "-m", "trainer", "export", str(tiny_run / "output"), str(out), "--quant",
                                 "q8_0"], cwd=REPO, env=full_env, stdout=subprocess.DEVNULL, stderr=sink,
                                start_new_session=True)  # fmt: skip
    wait_for(lambda: (staging / ".gguf-work").is_dir(), 600, "the converter's work folder", interval=0.01, proc=proc)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, err.read_text()[-3000:]
    assert "export interrupted" in err.read_text() and "Traceback" not in err.read_text()
    assert not out.exists() and not staging.exists()
    # SIGTERM to export alone while llmcompressor's child works: exit 143, the child ended, nothing left
    with err.open("w") as sink:
        proc = subprocess.Popen([PYTHON, "-m", "trainer", "export", str(tiny_run / "output"), str(out), "--quant",
                                 "fp8"], cwd=REPO, env={**full_env, "TRAINKIT_LLMCOMPRESSOR": str(overlay)},
                                stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True)  # fmt: skip
    job = staging / ".compress-work" / "job.json"
    wait_for(job.is_file, 600, "llmcompressor's job file", interval=0.01, proc=proc)
    time.sleep(2)  # the child is importing or compressing
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, err.read_text()[-3000:]
    assert "export interrupted" in err.read_text() and "Traceback" not in err.read_text()
    assert not out.exists() and not staging.exists()
    alive = subprocess.run(["pgrep", "-f", f"compress_run {job}"], capture_output=True, text=True, check=False)
    assert alive.stdout == "", alive.stdout


def _go_render(template: str, messages: list[dict[str, str]]) -> str:
    """Go's text/template, for the constructs the Modelfile's template uses (range over .Messages with $last, if / else
    if / end on eq, ne and and, .Content, string literals, `{{-` trimming): Ollama's renderer is Go, not here."""
    import re

    parts = re.split(r"(\{\{-?\s*.*?\s*-?\}\})", template)
    for n, part in enumerate(parts):  # trimming is the template text's, before anything runs
        if part.startswith("{{-") and n:
            parts[n - 1] = parts[n - 1].rstrip()
        if part.endswith("-}}") and n + 1 < len(parts):
            parts[n + 1] = parts[n + 1].lstrip()
    out: list[str] = []

    def run(start: int, message: dict[str, str] | None, last: bool, emit: bool) -> int:
        i = start
        while i < len(parts):
            part = parts[i]
            if not part.startswith("{{"):
                if emit:
                    out.append(part)
                i += 1
                continue
            action = part.strip("{}-").strip()
            if action == "end" or action.startswith("else"):
                return i
            if action.startswith("range"):
                for n, each in enumerate(messages):
                    end = run(i + 1, each, n == len(messages) - 1, emit)
                i = end + 1 if messages else _skip(i + 1)
            elif action.startswith("$last :="):
                i += 1
            elif action.startswith("if"):
                i = _branch(i, message, last, emit)
            elif action == ".Content":
                out.append(message["content"] if emit and message else "")
                i += 1
            elif action.startswith('"'):
                out.append(json.loads(action) if emit else "")
                i += 1
            else:
                raise AssertionError(f"unexpected action {action!r}")
        return i

    def test(cond: str, message: dict[str, str], last: bool) -> bool:
        if cond.startswith("and $last"):
            return last and message["role"] != re.search(r'ne \.Role "(\w+)"', cond).group(1)
        return message["role"] == re.fullmatch(r'eq \.Role "(\w+)"', cond).group(1)

    def _branch(i: int, message: dict[str, str], last: bool, emit: bool) -> int:
        taken = False
        cond = parts[i].strip("{}-").strip().removeprefix("if ")
        while True:
            now = emit and not taken and test(cond, message, last)
            i = run(i + 1, message, last, now)
            taken = taken or now
            action = parts[i].strip("{}-").strip()
            if action == "end":
                return i + 1
            cond = action.removeprefix("else if ")

    def _skip(i: int) -> int:
        return run(i, None, False, False) + 1

    run(0, None, False, True)
    return "".join(out)


def test_the_modelfile_renders_the_chat_templates_prompt() -> None:
    """The Modelfile's Go template renders a conversation as apply_chat_template does (a conversation other than
    the one it was checked against when written); stop tokens are eos and the end of an assistant turn."""
    from trainer.data.chat import BUILTIN_TEMPLATES
    from trainer.export.modelfile import chat_template, modelfile
    from trainer.tokenizer import byte_level_tokenizer

    tokenizer = byte_level_tokenizer()
    tokenizer.chat_template = BUILTIN_TEMPLATES["chatml"].read_text()
    conversation = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi {{ there }}"},
                    {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye."}]  # fmt: skip
    expected = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    template = chat_template(tokenizer)
    assert template is not None
    text, templated = modelfile("m.q8_0.gguf", tokenizer)
    go = text.split('TEMPLATE """', 1)[1].split('"""', 1)[0]
    assert templated and _go_render(go, conversation) == expected == template.render(conversation)
    assert _go_render(go, conversation[:3]) == tokenizer.apply_chat_template(conversation[:3], tokenize=False)
    assert text.startswith("FROM ./m.q8_0.gguf\n")
    assert 'PARAMETER stop "<|eos|>"' in text and 'PARAMETER stop "<|im_end|>"' in text
    plain = byte_level_tokenizer()  # no chat template: no TEMPLATE, the eos still stops
    assert modelfile("m.gguf", plain) == ('FROM ./m.gguf\nPARAMETER stop "<|eos|>"\n', False)


@pytest.mark.fast
def test_a_run_on_a_data_folder_is_gated_on_its_last_text_files_tail_and_calibrated_on_its_head(tmp_path: Path) -> None:
    """TRAIN_DATA a folder (quickstart's ./data at /data): the gate scores the tail of its last text file in the order
    the run reads them, and w4a16 calibrates on the text before that tail, never on the same text."""
    from types import SimpleNamespace

    from trainer.export import compressed, quality

    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps({"text": "first file"}) + "\n")
    lines = [f"line {i} of the second file, long enough to pass the gate's tail" for i in range(3000)]
    (folder / "b.txt").write_text("\n".join(lines) + "\n")
    run = SimpleNamespace(settings=SimpleNamespace(data=str(folder), eval_data=None))
    gate = quality.eval_text(None, run)  # type: ignore[arg-type]
    calibration = compressed.calibration_text(None, run, ["w4a16"])  # type: ignore[arg-type]
    assert gate.path == calibration.path == folder / "b.txt"
    assert gate.text.rstrip().endswith(lines[-1]) and not calibration.text.rstrip().endswith(lines[-1])
    assert calibration.text.startswith(lines[0]) and lines[0] not in gate.text
    held_out = SimpleNamespace(settings=SimpleNamespace(data=str(folder), eval_data=str(folder / "a.jsonl")))
    scored = quality.eval_text(None, held_out)  # type: ignore[arg-type]  # the run's eval set, whole, comes first
    assert scored.path == folder / "a.jsonl" and scored.text.strip() == "first file"
    assert scored.origin == "the run's eval set TRAIN_EVAL_DATA=a.jsonl"


@pytest.mark.fast
def test_the_answer_prompts_are_the_chat_datas_first_user_turns_else_fixed_and_none_without_a_template(
        tmp_path: Path) -> None:  # fmt: skip
    """trainer/export/answer_agreement.py's prompts: the first user turn of each conversation of the gate's text
    (messages, ShareGPT, conversational prompt/completion; text records and turns too long passed over), else the fixed
    ones;
    without a chat template none, saying why, in the report and the card."""
    from trainer.data.chat import BUILTIN_TEMPLATES
    from trainer.export import answer_agreement, quality
    from trainer.export.quant import card_section
    from trainer.tokenizer import byte_level_tokenizer

    data = tmp_path / "eval.jsonl"
    rows = [{"text": "plain text"}, {"messages": [{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "Hi there"},
                                                  {"role": "assistant", "content": "Hello."}]},
            {"messages": [{"role": "user", "content": "x" * 300}, {"role": "assistant", "content": "long"}]},
            {"conversations": [{"from": "human", "value": "Sup"}, {"from": "gpt", "value": "Yo."}]},
            {"prompt": [{"role": "user", "content": "Two plus two?"}], "completion": [{"role": "assistant",
                                                                                        "content": "Four."}]},
            {"messages": [{"role": "user", "content": "Fourth"}, {"role": "assistant", "content": "x"}]},
            {"messages": [{"role": "user", "content": "Fifth"}, {"role": "assistant", "content": "x"}]}]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenizer = byte_level_tokenizer()
    text = quality.EvalText(quality.read_text(data, "test"), "the run's eval set TRAIN_EVAL_DATA=eval.jsonl", data)
    none = answer_agreement.job(tokenizer, text, 2048)
    assert none.none == "the export's tokenizer has no chat template, so it has no answers to compare"
    assert answer_agreement.agreement([], answer_agreement.llama_cpp_answers("unused.gguf", none, 1), none) == {
        "measured": False, "why": none.none}  # fmt: skip
    tokenizer.chat_template = BUILTIN_TEMPLATES["chatml"].read_text()
    job = answer_agreement.job(tokenizer, text, 2048)
    assert job.texts == ["Hi there", "Sup", "Two plus two?", "Fourth"] and job.stops == (257,)
    assert job.origin == "the first user turns of the run's eval set TRAIN_EVAL_DATA=eval.jsonl"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Sup"}], tokenize=False,
                                             add_generation_prompt=True)  # fmt: skip
    assert job.prompts[1] == list(rendered.encode()) and rendered.endswith("<|im_start|>assistant\n")
    plain = quality.EvalText("x", "corpus", REPO / "trainer" / "assets" / "corpus.txt", "tail")
    fixed = answer_agreement.job(tokenizer, plain, 2048)
    assert fixed.texts == list(answer_agreement.FIXED_PROMPTS) and fixed.origin == "trainkit's fixed prompts"
    assert answer_agreement.job(tokenizer, plain, 40).none == "no prompt fits in 24 tokens with the chat template"
    tokenizer.chat_template = "{{ raise_exception('a system turn comes first') }}"
    refused = answer_agreement.job(tokenizer, plain, 2048).none
    assert refused == "the chat template refused a conversation of one user turn: a system turn comes first"
    tokenizer.chat_template = BUILTIN_TEMPLATES["chatml"].read_text()
    ref = [[1, 2, 3], [4, 5, 257], [6, 7, 8], [9, 9, 9]]
    found = answer_agreement.agreement(ref, [[1, 2, 3], [4, 5, 6], [6, 7, 0], [9, 9, 9]], job)
    assert found == {"measured": True, "prompts": 4, "tokens": 16, "agree": 0.5, "mean_prefix": 2.5,
                     "answers": [[1, 2, 3], [4, 5, 6], [6, 7, 0], [9, 9, 9]]}  # fmt: skip
    report = {"eval_text": {"origin": "o", "sha256": "s", "windows": 1, "context": 64},
              "reference": {"runtime": "r", "perplexity": 2.0}, "answers": answer_agreement.summary(none, []),
              "types": [{"type": "q8_0", "file": "gguf/m.gguf", "bytes": 1e6, "runtime": "llama.cpp",
                         "perplexity": 2.0, "ratio": 1.0, "agreement": 1.0, "max_ppl_increase_pct": 1.0,
                         "pass": True, "answer_agreement": answer_agreement.agreement([], [], none)}]}  # fmt: skip
    card = "\n".join(card_section(report))
    assert "| 1.0000 | - | +1% | yes |" in card and f"Answers agreeing: not measured ({none.none})." in card
    report["answers"] = answer_agreement.summary(job, ref)  # the run's own data: named by sha256, not published
    assert "prompts" not in report["answers"] and "Hi there" not in json.dumps(report["answers"])
    assert report["answers"]["prompt_sha256"][0] == hashlib.sha256(b"Hi there").hexdigest()
    report["types"][0]["answer_agreement"] = found
    card = "\n".join(card_section(report))
    assert "| 1.0000 | 2/4 (prefix 2.5 of 16) | +1% | yes |" in card and "of 4 prompts (the first user turns" in card
    assert answer_agreement.summary(fixed, ref)["prompts"] == list(answer_agreement.FIXED_PROMPTS)
