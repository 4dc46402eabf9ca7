"""Will it fit? (issue 57): the predicted GPU memory (trainer/memory/predict.py) checked part by part against real
tensors on the CPU, and the verdicts it leads to.

- weights, gradients and optimizer state: the bytes of the real tensors of the model the run builds
  (trainer.run.training_model.build_model) and of the optimizer Transformers makes for TRAIN_OPTIM after one step,
  for the tiny and 125m presets: fp32 and bf16, full, LoRA and QLoRA, AdamW and bitsandbytes' 8-bit AdamW (it runs
  on the CPU here);
- activations: what autograd saves in a forward pass of the tiny preset (saved-tensor hooks on the real tensors),
  at two lengths and two batches, fp32 and bf16 autocast, with and without checkpointing, within 15%; the same for
  LoRA and QLoRA (4-bit on bitsandbytes' CPU backend);
- `doctor --memory --gpu 24GiB` for the 1b preset (predicted, never built) at 64 x 4096 and 1 x 512, its --json;
- a GPU run predicted not to fit on a described GPU is refused at resolve, before any model loads.
ZeRO-1/2/3 against two real DeepSpeed processes: tests/trainer/test_memory_zero.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import base_env

from trainer import config, memory
from trainer.config.speed import CHUNK_POSITIONS
from trainer.errors import ConfigError
from trainer.machine.hardware import Hardware
from trainer.memory.fit import plan_of
from trainer.memory.predict import (
    Plan,
    activation_parts,
    autocast_copies,
    autocast_copy_bytes,
    expert_copy_bytes,
    gradient_bytes,
    logits_bytes,
    optimizer_bytes,
    predict,
    weights_bytes,
)
from trainer.memory.shape import preset_shape

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30
CASES = [
    ("tiny", {"TRAIN_PRECISION": "fp32"}),
    ("tiny", {"TRAIN_PRECISION": "bf16"}),
    ("tiny", {"TRAIN_PRECISION": "fp32", "TRAIN_OPTIM": "adamw_bnb_8bit"}),
    ("tiny", {"TRAIN_PRECISION": "bf16", "TRAIN_LORA": "1"}),
    ("tiny", {"TRAIN_PRECISION": "fp32", "TRAIN_LORA": "1", "TRAIN_OPTIM": "adamw_bnb_8bit"}),
    ("tiny", {"TRAIN_PRECISION": "bf16", "TRAIN_LORA": "1", "TRAIN_QUANT": "4bit"}),
    ("125m", {"TRAIN_PRECISION": "bf16"}),
    ("125m", {"TRAIN_PRECISION": "bf16", "TRAIN_LORA": "1", "TRAIN_OPTIM": "adamw_bnb_8bit"}),
    # a mixture of experts: every expert held, trained and in the optimizer, not the 2 of 8 a token passes through
    ("tiny-moe", {"TRAIN_PRECISION": "fp32"}),
    ("tiny-moe", {"TRAIN_PRECISION": "bf16", "TRAIN_LORA": "1"}),  # adapters on attention and the fused experts
]


def resolved(model: str, **env: str) -> config.RunConfig:
    return config.resolve(config.parse_settings({"TRAIN_MODEL": model, **env}), environ={})


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages of `tensors` (a state shared between parameters counted once)."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def real_bytes(cfg: config.RunConfig) -> dict[str, int]:
    """The built model's weights (a 4-bit weight's block scales with it, its 16 and 256 quantization codes, at most
    1.1 KiB a tensor, left out; as built: bitsandbytes' CPU backend undoes the double quantization of some scales at
    their first matmul, 3 KiB more here, which its GPU kernels do not), its gradients after a backward pass and
    Transformers' optimizer's state after a step, in bytes."""
    from trainer.run.training_model import build_model
    from trainer.tokenizer import byte_level_tokenizer

    ids = torch.randint(0, 259, (1, 16))
    return tensor_bytes(cfg, build_model(cfg, byte_level_tokenizer()), {"input_ids": ids, "labels": ids})


def tensor_bytes(cfg: config.RunConfig, model: Any, batch: dict[str, Any], autocast: bool = False) -> dict[str, int]:
    """real_bytes' figures of a built model, its backward pass (under bf16 autocast, as the run's, where asked) and
    optimizer step over `batch`."""
    from transformers import Trainer, TrainingArguments

    quantized = [q for p in model.parameters() if (q := getattr(p, "quant_state", None)) is not None]
    scales = [t for q in quantized for t in (q.absmax, q.state2.absmax if q.nested else None) if t is not None]
    weights = storage_bytes(list(model.parameters()) + scales)
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(**batch).loss
    loss.backward()
    trained = [p for p in model.parameters() if p.requires_grad]
    args = TrainingArguments(output_dir="unused", optim=cfg.decisions.optim.value, report_to=[], use_cpu=True)
    optimizer_class, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    optimizer = optimizer_class(trained, **kwargs)
    optimizer.step()
    state = [v for entry in optimizer.state.values() for v in entry.values() if torch.is_tensor(v)]
    return {"weights": weights, "gradients": storage_bytes([p.grad for p in trained if p.grad is not None]),
            "optimizer": storage_bytes(state)}  # fmt: skip


@pytest.mark.parametrize(("model", "env"), CASES, ids=lambda v: v if isinstance(v, str) else "-".join(v.values()))
def test_weights_gradients_and_optimizer_state_are_the_bytes_of_the_real_tensors(model: str, env: dict) -> None:
    cfg = resolved(model, **env)
    plan = plan_of(cfg)
    predicted = {"weights": weights_bytes(plan), "gradients": gradient_bytes(plan), "optimizer": optimizer_bytes(plan)}
    assert predicted == real_bytes(cfg)


def test_fsdp_full_shard_divides_weights_gradients_and_optimizer_by_the_processes() -> None:
    """FSDP's full_shard by its rule (ZeRO: DeepSpeed's own layout, against real processes: test_memory_zero.py)."""
    fsdp = predict(Plan(preset_shape("125m"), 1, 512, fsdp="full_shard", processes=4)).parts
    alone = predict(Plan(preset_shape("125m"), 1, 512)).parts
    assert [fsdp[k] for k in ("weights", "gradients", "optimizer")] == [
        alone[k] // 4 for k in ("weights", "gradients", "optimizer")]  # fmt: skip


@pytest.fixture(scope="module")
def tiny() -> Any:
    from trainer.run.training_model import build_model
    from trainer.tokenizer import byte_level_tokenizer

    cfg = resolved("tiny", TRAIN_PRECISION="fp32")
    return build_model(cfg, byte_level_tokenizer())


def measured_saved(model: Any, batch: int, seq: int, checkpointing: bool, precision: str) -> int:
    """Bytes autograd saves for the backward pass in a real forward pass (saved-tensor hooks; parameters left out)."""
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()
    ids = torch.randint(0, 259, (batch, seq))
    return saved_bytes(model, {"input_ids": ids, "labels": ids}, precision)


def saved_bytes(model: Any, inputs: dict[str, Any], precision: str) -> int:
    """Bytes autograd saves for the backward pass in a training forward pass over `inputs` (parameters left out)."""
    model.train()
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in parameters:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        loss = model(**inputs).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(saved.values())


def predicted_saved(plan: Plan) -> int:
    """The prediction's share of what the forward pass saves: the activations it keeps, the log-softmax of the loss
    (a quarter of the logits part in fp32, two sevenths in mixed precision), autocast's weight copies (the LM head's
    alone under checkpointing: the layers' are recast while recomputing)."""
    kept, _recomputed = activation_parts(plan)
    log_softmax = plan.batch * plan.seq_len * plan.shape.vocab * 4
    copies = autocast_copies(plan)[0] if plan.grad_ckpt else autocast_copy_bytes(plan)
    assert log_softmax < logits_bytes(plan)
    return kept + log_softmax + copies


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_activations_are_within_15_percent_of_the_saved_tensors_and_grow_as_they_do(
    tiny: Any, precision: str, checkpointing: bool
) -> None:
    figures = {}
    for batch, seq in [(1, 128), (2, 128), (1, 256), (2, 256)]:
        measured = measured_saved(tiny, batch, seq, checkpointing, precision)
        plan = Plan(preset_shape("tiny"), batch, seq, precision=precision, grad_ckpt=checkpointing)
        figures[(batch, seq)] = (predicted_saved(plan), measured)
        assert abs(figures[(batch, seq)][0] - measured) <= 0.15 * measured, figures
    for (batch, seq), (predicted, measured) in figures.items():  # twice the tokens: about twice the bytes, both
        if (batch * 2, seq) in figures:
            assert figures[(batch * 2, seq)][0] > predicted and figures[(batch * 2, seq)][1] > measured
        if (batch, seq * 2) in figures:
            assert figures[(batch, seq * 2)][0] > predicted and figures[(batch, seq * 2)][1] > measured


ADAPTERS = [("lora", "fp32", "0"), ("lora", "bf16", "0"), ("lora", "bf16", "1"), ("qlora", "bf16", "0"),
            ("qlora", "bf16", "1")]  # fmt: skip


@pytest.mark.parametrize(("adapter", "precision", "checkpointing"), ADAPTERS, ids=lambda v: v)
def test_lora_and_qlora_activations_are_within_15_percent_of_the_saved_tensors(
    adapter: str, precision: str, checkpointing: str
) -> None:
    """The run's own LoRA (PEFT, TRAIN_LORA_DROPOUT's default) and QLoRA (bitsandbytes' 4-bit base on its CPU
    backend) models of the tiny preset, at two sizes. The CPU's dropout keeps float noise where CUDA's fused kernel
    keeps a 1-byte mask: the prediction is told the CPU's (dropout_mask_bytes=4)."""
    from trainer.run.training_model import build_model
    from trainer.tokenizer import byte_level_tokenizer

    quant = {"TRAIN_QUANT": "4bit"} if adapter == "qlora" else {}
    cfg = resolved("tiny", TRAIN_LORA="1", TRAIN_PRECISION=precision, TRAIN_GRAD_CKPT=checkpointing, **quant)
    model = build_model(cfg, byte_level_tokenizer())
    plan = replace(plan_of(cfg), dropout_mask_bytes=4)
    assert plan.lora and plan.quant == ("4bit" if quant else "none") and plan.lora_dropout > 0
    figures = {}
    for batch, seq in [(1, 128), (2, 256)]:
        measured = measured_saved(model, batch, seq, checkpointing == "1", precision)
        figures[(batch, seq)] = (predicted_saved(replace(plan, batch=batch, seq_len=seq)), measured)
    print(f"{adapter} {precision} checkpointing={checkpointing}: (predicted, measured) bytes {figures}")
    for predicted, measured in figures.values():
        assert abs(predicted - measured) <= 0.15 * measured, figures
    assert figures[(2, 256)][0] > figures[(1, 128)][0] and figures[(2, 256)][1] > figures[(1, 128)][1]


@pytest.mark.parametrize(("precision", "lora"), [("fp32", "0"), ("bf16", "1")], ids=["fp32", "bf16-lora"])
def test_a_mixture_of_experts_activations_are_within_15_percent_of_the_saved_tensors(precision: str, lora: str) -> None:
    """tiny-moe (Qwen3-MoE's layer, grouped_mm): each token's k experts' tensors, and under LoRA on the fused experts
    the copy of every MoE layer's weights as base + adapter that PEFT makes on each forward (a per-layer constant,
    not per token: the (1, 128) case is most of it)."""
    from trainer.run.training_model import build_model
    from trainer.tokenizer import byte_level_tokenizer

    cfg = resolved("tiny-moe", TRAIN_PRECISION=precision, TRAIN_LORA=lora)
    model = build_model(cfg, byte_level_tokenizer())
    plan = replace(plan_of(cfg), dropout_mask_bytes=4)
    assert plan.shape.experts == 8 and plan.moe_impl == "grouped_mm"
    figures = {}
    for batch, seq in [(1, 128), (2, 256)]:
        measured = measured_saved(model, batch, seq, False, precision)
        figures[(batch, seq)] = (predicted_saved(replace(plan, batch=batch, seq_len=seq)), measured)
    print(f"tiny-moe {precision} lora={lora}: (predicted, measured) bytes {figures}")
    for predicted, measured in figures.values():
        assert abs(predicted - measured) <= 0.15 * measured, figures
    if lora == "1":
        copies = plan.shape.moe_layers * expert_copy_bytes(plan)
        assert copies > 0.5 * figures[(1, 128)][1]  # the weights' copies, not the tokens, dominate a small batch


def doctor(tmp_path: Path, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**base_env(), "PYTHONPATH": str(REPO), "TRAIN_OUTPUT_DIR": str(tmp_path / "o"), **env}
    return subprocess.run([sys.executable, "-m", "trainer", "doctor", "--memory", *extra], cwd=REPO, env=environ,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_doctor_says_1b_at_64_by_4096_does_not_fit_24gib_and_names_changes_that_do(tmp_path: Path) -> None:
    big = {"TRAIN_MODEL": "1b", "TRAIN_BATCH_SIZE": "64", "TRAIN_SEQ_LEN": "4096"}
    shown = doctor(tmp_path, "--gpu", "24GiB", **big)
    assert shown.returncode == 2, shown.stderr[-2000:]
    assert "Does not fit" in shown.stdout and "Changes predicted to fit:" in shown.stdout
    assert "Traceback" not in shown.stderr
    report = json.loads(doctor(tmp_path, "--gpu", "24GiB", "--json", **big).stdout)
    assert report["fits"] is False and report["device_bytes"] == 24 * GIB
    assert sum(report["parts"].values()) == report["predicted_peak_bytes"] > 24 * GIB
    assert report["headroom_bytes"] == 24 * GIB - report["predicted_peak_bytes"]
    assert report["changes"] and all(c["predicted_peak_bytes"] < 24 * GIB for c in report["changes"])
    assert any("TRAIN_GRAD_CKPT=1" in c["settings"] for c in report["changes"])
    small = doctor(tmp_path, "--gpu", "24GiB", "--json", TRAIN_MODEL="1b", TRAIN_BATCH_SIZE="1", TRAIN_SEQ_LEN="512")
    assert small.returncode == 0, small.stderr[-2000:]
    fits = json.loads(small.stdout)
    assert fits["fits"] is True and fits["changes"] == []
    assert sum(fits["parts"].values()) == fits["predicted_peak_bytes"] < 24 * GIB
    unknown = doctor(tmp_path, "--gpu", "Voodoo5")
    assert unknown.returncode == 2 and "unknown GPU 'Voodoo5'" in unknown.stderr and "24GiB" in unknown.stderr


def test_doctor_refuses_a_size_no_gpu_has_and_a_model_it_cannot_read(tmp_path: Path) -> None:
    """--gpu 0GiB (it printed `"fits": null`, device_bytes 0, not naming --gpu) and a TRAIN_MODEL the prediction cannot
    read: a missing folder, a Hub ID not in the cache offline, a torn config.json, an architecture it does not model
    (all ended in tracebacks): exit 2 naming it and the way forward (fetch, the file to fix, the families covered)."""
    from transformers import OPTConfig

    from trainer.doctor.memory import refuse_unreadable_model
    from trainer.machine.gpu_memory import described_gpu
    from trainer.memory.model_config import ShapeUnknown
    from trainer.memory.shape import folder_shape

    for size in ("0GiB", "0.5GiB", "2TB"):
        with pytest.raises(ValueError, match=f"{size} is no GPU's memory: give one between 1 GiB and 1 TiB"):
            described_gpu(size)
    assert described_gpu("1GiB") == ("1GiB", GIB) and described_gpu("1TiB") == ("1TiB", 1 << 40)
    torn, opt = tmp_path / "torn", tmp_path / "opt"
    torn.mkdir()
    (torn / "config.json").write_text('{"hidden_size": 6')
    OPTConfig(hidden_size=32, num_hidden_layers=1, ffn_dim=64, num_attention_heads=2,
              architectures=["OPTForCausalLM"]).save_pretrained(opt)  # as a saved OPT model's folder has it
    with pytest.raises(ShapeUnknown, match=rf"{re.escape(str(torn / 'config.json'))} does not read as JSON .*copy"):
        folder_shape(torn)
    with pytest.raises(ShapeUnknown, match=re.escape("the architecture OPTForCausalLM is not modelled (its config.json "
                                                     "has no intermediate_size): the prediction covers decoders")):
        folder_shape(opt)
    with pytest.raises(ConfigError, match="doctor --memory: TRAIN_MODEL='/no/such' is neither a preset"):
        refuse_unreadable_model(config.Inputs(config.parse_settings({"TRAIN_MODEL": "/no/such"})))
    sized = doctor(tmp_path, "--gpu", "0GiB", "--json")
    assert sized.returncode == 2 and sized.stdout == "", sized.stdout
    assert "error: doctor --memory --gpu 0GiB: 0GiB is no GPU's memory" in sized.stderr
    offline = doctor(tmp_path, "--gpu", "24GiB", TRAIN_MODEL="org/not-cached", HF_HOME=str(tmp_path / "hf"))
    assert offline.returncode == 2 and "Traceback" not in offline.stderr, offline.stderr[-3000:]
    assert "doctor --memory: TRAIN_MODEL=org/not-cached: revision 'main' is not in the cache" in offline.stderr
    assert "run `python -m trainer fetch`" in offline.stderr
    other = doctor(tmp_path, "--gpu", "24GiB", TRAIN_MODEL=str(opt))
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr[-3000:]
    assert f"doctor --memory: TRAIN_MODEL={opt}: the architecture OPTForCausalLM is not modelled" in other.stderr


GPU_24 = Hardware(device="cuda", gpu_count=1, gpu_name="RTX-4090", capability=(8, 9), total_memory_bytes=24 * GIB,
                  bf16=True, tf32=True, libraries={"triton": True, "tensorboard": True})  # fmt: skip


def test_a_gpu_run_predicted_not_to_fit_is_refused_before_the_model_loads() -> None:
    big = {"TRAIN_MODEL": "1b", "TRAIN_BATCH_SIZE": "64", "TRAIN_SEQ_LEN": "4096", "TRAIN_AUTO_BATCH": "0"}
    settings = config.parse_settings(big)
    with pytest.raises(ConfigError) as err:  # the run asks it after resolving, before it builds or loads any model
        memory.predicted(config.resolve(settings, GPU_24, environ={}, import_heavy=False))
    message = str(err.value)
    assert "predicted not to fit in GPU memory" in message and "of the RTX-4090" in message
    assert "TRAIN_GRAD_CKPT=1" in message and "TRAIN_MEMORY_CHECK=off" in message
    anyway = config.parse_settings({**big, "TRAIN_MEMORY_CHECK": "off"})
    allowed = memory.predicted(config.resolve(anyway, GPU_24, environ={}, import_heavy=False))
    assert allowed.decisions.memory.value["predicted_peak_bytes"] > 24 * GIB
    assert "TRAIN_MEMORY_CHECK=off" in allowed.decisions.memory.reason
    searched = config.parse_settings({**big, "TRAIN_AUTO_BATCH": "1", "TRAIN_SEQ_LEN": "512"})
    assert memory.predicted(config.resolve(searched, GPU_24, environ={}, import_heavy=False))  # the search can go to 1
    small = config.parse_settings({"TRAIN_MODEL": "1b", "TRAIN_BATCH_SIZE": "1", "TRAIN_SEQ_LEN": "512"})
    fits = memory.predicted(config.resolve(small, GPU_24, environ={}, import_heavy=False))
    assert fits.decisions.memory.value["predicted_peak_bytes"] < 24 * GIB
    assert fits.decisions.memory.value["device_bytes"] == 24 * GIB


def test_vllm_colocated_takes_its_share_of_the_device_as_a_part() -> None:
    """GRPO with vLLM in the training process (TRAIN_RL_VLLM_MEMORY=0.5 on 24 GiB): 12 GiB are vLLM's, a part of the
    prediction (it was identical to the transformers engine's); its generation KV cache is in that share, as a
    server's is on the server; a share that leaves too little is refused like any other part."""
    grpo = {"TRAIN_METHOD": "grpo", "TRAIN_MODEL": "1b", "TRAIN_REWARD": "length", "TRAIN_BATCH_SIZE": "4",
            "TRAIN_RL_GENERATIONS": "4", "TRAIN_SEQ_LEN": "512"}  # fmt: skip

    def parts(**extra: str) -> dict[str, int]:
        cfg = config.resolve(config.parse_settings({**grpo, **extra}), GPU_24, environ={}, import_heavy=False)
        return predict(plan_of(cfg)).parts

    colocated = parts(TRAIN_RL_ENGINE="vllm", TRAIN_RL_VLLM_MEMORY="0.5")
    in_process, server = parts(), parts(TRAIN_RL_ENGINE="vllm", TRAIN_RL_VLLM_URL="http://vllm:8000")
    assert colocated["vllm_colocated"] == 12 * GIB and "vllm_colocated" not in in_process | server
    assert colocated["method_extras"] == server["method_extras"] == 0 < in_process["method_extras"]
    assert colocated["weights"] == in_process["weights"] and colocated["activations"] == in_process["activations"]
    with pytest.raises(ConfigError, match="predicted not to fit in GPU memory"):
        memory.predicted(config.resolve(config.parse_settings({**grpo, "TRAIN_RL_ENGINE": "vllm",
                                                               "TRAIN_RL_VLLM_MEMORY": "0.9"}),
                                        GPU_24, environ={}, import_heavy=False))  # fmt: skip


@pytest.mark.parametrize("error", [0.0, 0.03, -0.03, 0.1, -0.1])
@pytest.mark.parametrize(("model", "seq"), [("1b", 2048), ("125m", 512)])
def test_the_batch_search_started_from_the_prediction_ends_in_at_most_two_probes(model: str, seq: int,
                                                                                 error: float) -> None:  # fmt: skip
    """The search (trainer/run/batch_fit.py) on a device whose peaks are the prediction off by `error`: started at
    the predicted largest batch with the predicted bytes per sequence, it confirms it in one probe where the
    prediction is right, and ends on a batch that fits within 2% of the largest in two where it is off."""
    from trainer.memory.fit import largest_batch
    from trainer.run.batch_fit import Probed, search_predicted

    def peak(batch: int) -> int:
        return int(predict(Plan(preset_shape(model), batch, seq)).allocated * (1 + error))

    def probe(batch: int) -> Probed:
        return Probed(peak(batch) <= 80 * GIB, peak(batch) if peak(batch) <= 80 * GIB else 0)

    limit = 70 * GIB
    start, slope = largest_batch(Plan(preset_shape(model), 8, seq), limit, 4096)
    found = search_predicted(probe, start, 4096, limit, slope)
    largest = max(b for b in range(1, 4097) if peak(b) <= limit)
    assert len(found.probes) <= (1 if error == 0 else 2), found.probes
    assert 0.98 * largest <= found.batch <= largest and peak(found.batch) <= limit


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_grouped_query_attention_saves_k_and_v_at_their_own_heads(precision: str) -> None:
    """The 1b preset's layout (8 kv heads for 32 query heads) in small: SDPA without a mask takes grouped k and v as
    they are, so they are saved at the kv heads' size; the prediction counts them so (within 64 bytes: the loss's
    scalars)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.memory.shape import Shape
    from trainer.model.packed_attention import implementation

    llama = LlamaConfig(vocab_size=320, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    llama._attn_implementation = implementation("sdpa")
    model = LlamaForCausalLM(llama)
    plan = Plan(Shape(256, 2, 8, 2, 688, 320, tied=True), 2, 128, precision=precision)
    assert abs(predicted_saved(plan) - measured_saved(model, 2, 128, False, precision)) <= 64


def test_the_chunked_loss_holds_one_chunk_of_logits_in_the_prediction() -> None:
    """TRAIN_CROSS_ENTROPY=chunked (auto at 128k rows) reaches the prediction: one chunk of positions' logits is held,
    not the micro-batch's."""
    full = plan_of(resolved("1b-128k", TRAIN_CROSS_ENTROPY="full", TRAIN_SEQ_LEN="2048", TRAIN_BATCH_SIZE="4"))
    chunked = plan_of(resolved("1b-128k", TRAIN_CROSS_ENTROPY="chunked", TRAIN_SEQ_LEN="2048", TRAIN_BATCH_SIZE="4"))
    assert full.loss_chunk_tokens == 0 and chunked.loss_chunk_tokens == CHUNK_POSITIONS
    held = predict(chunked).parts["logits_and_loss"]
    assert held * (4 * 2048 // CHUNK_POSITIONS) == predict(full).parts["logits_and_loss"]
