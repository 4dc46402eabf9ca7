"""Mixture-of-experts models in-process, on tiny random models of each family (tests/trainer/moe_models.py): each
loads through the one loader with its component table; LoRA reaches the routed experts (every expert's adapter,
and after a step exactly the experts that received tokens changed it); a target list that misses the routed
experts is refused; the merge of fused experts is base + adapter; the experts implementations compute the same loss;
the router metrics count each training forward once."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from moe_models import EXPERTS, FAMILIES, HIDDEN, LAYERS, TOP_K, save_mxfp4, save_tiny, tiny_config, tiny_model

from trainer.config.moe import moe_of
from trainer.config.parse import parse_settings
from trainer.errors import ConfigError
from trainer.model import components
from trainer.model.adapters import apply_lora, merged
from trainer.model.expert_adapters import FusedMergeError, names_kept
from trainer.model.loading import LoadHow, Weights, load
from trainer.model.moe import routers
from trainer.run.router_metrics import RouterMetrics
from trainer.tokenizer import byte_level_tokenizer

LORA_FAMILIES = ("qwen3_moe", "gpt_oss", "olmoe")
VOCAB = 320


def _settings(**train: str) -> Any:
    """TRAIN_LORA=1 with the defaults a user gets, and `train` on top."""
    return parse_settings({"TRAIN_LORA": "1", **{f"TRAIN_{k.upper()}": v for k, v in train.items()}})


def _expert_sizes(family: str) -> tuple[int, int, int]:
    """(elements of one layer's routed experts, of its router, MoE layers) from the family's config."""
    c = tiny_config(family)
    inter = getattr(c, "moe_intermediate_size", None) or c.intermediate_size
    per_expert = 3 * inter * HIDDEN + (2 * inter + HIDDEN if family == "gpt_oss" else 0)  # gpt-oss: biases
    router = EXPERTS * HIDDEN + (EXPERTS if family == "gpt_oss" else 0)
    return EXPERTS * per_expert, router, LAYERS - (1 if family == "deepseek_v3" else 0)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_loads_through_the_loader_with_its_component_table(family: str, tmp_path: Path, caplog) -> None:
    folder = save_tiny(family, tmp_path / family)
    with caplog.at_level(logging.INFO, logger="trainer"):
        model = load(Weights(folder=str(folder), tokenizer=byte_level_tokenizer()), LoadHow())
    moe = moe_of(model.config)
    assert moe is not None and (moe.experts, moe.top_k) == (EXPERTS, TOP_K)
    assert f"top-{TOP_K} of {EXPERTS} routed experts run by grouped_mm" in caplog.text
    rows = {r.component: r for r in components.count(model)}
    experts, router, layers = _expert_sizes(family)
    assert rows[components.ROUTED].parameters == layers * experts
    assert rows[components.ROUTED].active == layers * experts * TOP_K // EXPERTS
    assert rows[components.ROUTER].parameters == layers * router
    assert (components.SHARED in rows) == (family == "deepseek_v3")
    assert rows["total"].parameters == sum(p.numel() for p in model.parameters())
    assert rows["total"].active == rows["total"].parameters - layers * experts * (EXPERTS - TOP_K) // EXPERTS
    assert len(routers(model)) == layers


def test_gpt_oss_mxfp4_experts_are_dequantized_and_the_log_says_so(tmp_path: Path, caplog) -> None:
    dense = save_mxfp4(tmp_path / "gpt-oss-mxfp4")
    with caplog.at_level(logging.INFO, logger="trainer"):
        model = load(Weights(folder=str(tmp_path / "gpt-oss-mxfp4")), LoadHow(dense_experts=True))
    assert "MXFP4 expert weights were dequantized to float32" in caplog.text
    for name, expected in dense.items():
        assert torch.equal(model.get_parameter(name), expected), name
    with pytest.raises(ConfigError, match="TRAIN_QUANT=4bit: the model is MXFP4-quantized"):
        load(Weights(folder=str(tmp_path / "gpt-oss-mxfp4")), LoadHow(quant="4bit"))


def _routed_tokens(model: torch.nn.Module) -> tuple[dict[int, set[int]], list[Any]]:
    """Which experts each MoE layer's router sent a trained token to, recorded by a hook of the test's own (one row
    of ids: the last position predicts nothing, so nothing it passes through gets a gradient)."""
    chosen: dict[int, set[int]] = {}
    handles = []
    for layer, (_, module) in enumerate(routers(model)):
        def record(_m: Any, _a: Any, out: Any, layer: int = layer) -> None:
            chosen.setdefault(layer, set()).update(out[2][:-1].flatten().tolist())

        handles.append(module.register_forward_hook(record))
    return chosen, handles


def _expert_deltas(peft_model: torch.nn.Module) -> dict[tuple[int, str], torch.Tensor]:
    """Per MoE layer and fused parameter, each expert's adapter delta B_e A_e ([E, out, in]), the adapter's own
    factors read by expert as PEFT lays them out (A: rows by expert; B: columns interleaved)."""
    found = {}
    for layer, (_, block) in enumerate(n_m for n_m in peft_model.named_modules() if n_m[0].endswith("mlp.experts")):
        for module in block.modules():
            if hasattr(module, "parameter_name") and "default" in module.lora_A:
                a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
                a = a.reshape(EXPERTS, -1, a.shape[-1])  # [E, r, in]
                b = b.reshape(b.shape[0], -1, EXPERTS).permute(2, 0, 1)  # [E, out, r]
                found[(layer, module.parameter_name)] = (b @ a).detach().clone()
    return found


@pytest.mark.parametrize("family", LORA_FAMILIES)
def test_lora_reaches_every_routed_expert_and_a_step_changes_exactly_those_routed(family: str) -> None:
    s = _settings()
    model = apply_lora(tiny_model(family), s)
    c = tiny_config(family)
    inter = getattr(c, "moe_intermediate_size", None) or c.intermediate_size
    rows = {r.component: r for r in components.count(model)}
    # gate_up [hidden -> 2 x inter] and down [inter -> hidden] of each expert: r x (in + out) each
    assert rows[components.ROUTED].trainable == LAYERS * EXPERTS * s.lora_r * ((HIDDEN + 2 * inter) + (inter + HIDDEN))
    assert rows[components.ROUTER].trainable == 0  # the router stays frozen by default
    assert rows[components.ATTENTION].trainable > 0

    before = _expert_deltas(model)
    assert before and all(not d.any() for d in before.values())  # LoRA starts at B = 0
    chosen, handles = _routed_tokens(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))  # 6 tokens x top-2 < 8 experts
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    for handle in handles:
        handle.remove()
    for (layer, parameter), delta in _expert_deltas(model).items():
        changed = {e for e in range(EXPERTS) if delta[e].abs().sum() > 0}
        assert changed == chosen[layer], f"layer {layer} {parameter}: changed {changed}, routed {chosen[layer]}"
    assert any(len(routed) < EXPERTS for routed in chosen.values())  # some expert got no token: the test can tell


def test_target_words_reach_their_components() -> None:
    model = apply_lora(tiny_model("deepseek_v3"), _settings(lora_targets="shared_experts,router"))
    trainable = {r.component: r.trainable for r in components.count(model)}
    assert trainable[components.SHARED] and trainable[components.ROUTER]
    assert not trainable[components.ROUTED] and not trainable[components.ATTENTION] and not trainable["MLP"]


def test_mlp_names_that_miss_the_routed_experts_are_refused_with_the_counts() -> None:
    """The silent miss reported against other tools: MLP projection names adapt the shared expert (and a dense
    layer), not one routed expert, while the log would say LoRA is on."""
    with pytest.raises(ConfigError) as refused:
        apply_lora(tiny_model("deepseek_v3"), _settings(lora_targets="gate_proj,up_proj,down_proj"))
    said = str(refused.value)
    assert "adapts 3 shared-expert and 3 dense MLP modules but none of the routed experts" in said
    assert "(1 MoE layer x 8 experts" in said and "add `experts`" in said
    with pytest.raises(ConfigError, match=r"gate_proj, up_proj, down_proj match nothing .*gate_proj: 0"):
        apply_lora(tiny_model("qwen3_moe"), _settings(lora_targets="gate_proj,up_proj,down_proj"))
    with pytest.raises(ConfigError, match=r"TRAIN_LORA_TARGETS=q_proj,qproj: qproj matches nothing .*q_proj: 2"):
        apply_lora(tiny_model("qwen3_moe"), _settings(lora_targets="q_proj,qproj"))


@pytest.mark.parametrize("family", LORA_FAMILIES)
def test_merging_fused_experts_gives_base_plus_adapter(family: str, monkeypatch) -> None:
    model = apply_lora(tiny_model(family), _settings())
    with names_kept():
        model.add_adapter("ref", model.peft_config["default"])  # TRL's DPO keeps a frozen copy beside it: not merged
    model.set_adapter("default")
    torch.manual_seed(1)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(std=0.2)  # trained adapters: every expert's delta non-zero
    model.eval()
    ids = torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model(input_ids=ids).logits
        got = merged(model)(input_ids=ids).logits
    assert float((got - reference).abs().max()) <= 1e-5 * (1 + float(reference.abs().max()))

    from peft.tuners.lora.layer import ParamWrapper

    shifted = ParamWrapper.get_delta_weight  # a merge that puts each expert's delta on its neighbour
    monkeypatch.setattr(ParamWrapper, "get_delta_weight", lambda self, a: shifted(self, a).roll(1, dims=0))
    with pytest.raises(FusedMergeError, match="merged weights differ from base \\+ adapter"):
        merged(model)


def test_the_experts_implementations_compute_the_same_loss_and_gradients() -> None:
    ids = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))
    results = {}
    for implementation in ("eager", "batched_mm", "grouped_mm"):
        model = tiny_model("qwen3_moe", experts_implementation=implementation)
        assert model.config._experts_implementation == implementation
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        results[implementation] = (loss.detach(), model.model.layers[0].mlp.experts.gate_up_proj.grad)
    eager_loss, eager_grad = results["eager"]
    for implementation, (loss, grad) in results.items():
        assert torch.allclose(loss, eager_loss, rtol=1e-5, atol=1e-6), implementation
        assert torch.allclose(grad, eager_grad, rtol=1e-4, atol=1e-7), implementation


def _state(global_step: int = 1) -> Any:
    from transformers import TrainerState

    return TrainerState(global_step=global_step)


def test_router_metrics_count_each_training_forward_once(caplog) -> None:
    model = apply_lora(tiny_model("qwen3_moe"), _settings())
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    metrics = RouterMetrics(model, moe_of(model.config))
    model.train()
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0  # six padding positions, left out of the counts
    model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()  # the backward recomputes the layers
    with torch.no_grad():
        model(input_ids=ids)  # a reference's or a generation's forward: not counted
    fields = metrics.log_fields(_state())
    shares = metrics.shares
    assert len(shares) == LAYERS and all(abs(sum(row) - 1) < 1e-6 for row in shares)
    assert all(x * 26 * TOP_K == pytest.approx(round(x * 26 * TOP_K), abs=1e-3) for row in shares for x in row)
    assert fields["router/aux_loss"] > 0 and fields["router/unused_experts"] == sum(x == 0 for r in shares for x in r)
    assert metrics.log_fields(_state(2)) == {}  # counting started over; nothing trained since

    for _, router in routers(model.get_base_model()):  # every token ties on every expert: top-2 takes experts 0, 1
        router.weight.data.zero_()
    with caplog.at_level(logging.WARNING, logger="trainer"):
        model(input_ids=ids, labels=ids).loss.backward()
        fields = metrics.log_fields(_state(3))
    assert fields["router/collapsed_layers"] == LAYERS and fields["router/unused_experts"] == LAYERS * (EXPERTS - 2)
    assert "router collapse at step 3: layer 0" in caplog.text


READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__")  # step_syncs.py's


def _host_reads(model: torch.nn.Module, ids: torch.Tensor, monkeypatch) -> int:
    """Host reads of tensor values (each a host-device synchronization on a GPU) in a training forward and backward."""
    counted = [0]
    with monkeypatch.context() as patch:
        for name in READS:
            original = getattr(torch.Tensor, name)

            def counting(self: torch.Tensor, *a: Any, _original: Any = original, **k: Any) -> Any:
                counted[0] += 1
                return _original(self, *a, **k)

            patch.setattr(torch.Tensor, name, counting)
        model(input_ids=ids, labels=ids, output_router_logits=True).loss.backward()
    return counted[0]


def test_router_metrics_read_nothing_on_the_host_between_logging_steps(monkeypatch) -> None:
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    plain = tiny_model("qwen3_moe").train()  # Transformers with its load-balancing loss on, nothing of trainkit's
    watched = tiny_model("qwen3_moe").train()
    RouterMetrics(watched, moe_of(watched.config))
    assert _host_reads(watched, ids, monkeypatch) == _host_reads(plain, ids, monkeypatch)


def _decided(tmp_path: Path, hardware: Any, **train: str) -> Any:
    from trainer import config

    settings = parse_settings({"TRAIN_OUTPUT_DIR": str(tmp_path / "out"), **train})
    return config.resolve(settings, hardware, environ={}, import_heavy=False).decisions


def test_the_experts_implementation_and_the_coefficient_are_decided_per_device_and_family(tmp_path: Path) -> None:
    from trainer.machine.hardware import Hardware

    cpu = Hardware(device="cpu", cpu_count=2, cxx_compiler="/usr/bin/g++")
    turing = Hardware(device="cuda", gpu_count=1, gpu_name="T4", capability=(7, 5), total_memory_bytes=16 << 30)
    hopper = Hardware(device="cuda", gpu_count=1, gpu_name="H100", capability=(9, 0), total_memory_bytes=80 << 30,
                      bf16=True, tf32=True)
    decided = {name: _decided(tmp_path, hw, TRAIN_MODEL="tiny-moe") for name, hw in
               (("cpu", cpu), ("turing", turing), ("hopper", hopper))}  # fmt: skip
    assert [decided[n].moe_impl.value for n in ("cpu", "turing", "hopper")] == ["grouped_mm", "eager", "grouped_mm"]
    assert "compute capability 8.0" in decided["turing"].moe_impl.reason
    assert decided["cpu"].moe_aux_loss.value == 0.001 and "router_aux_loss_coef" in decided["cpu"].moe_aux_loss.reason
    assert _decided(tmp_path, cpu, TRAIN_MODEL="tiny-moe", TRAIN_MOE_AUX_LOSS="off").moe_aux_loss.value == 0.0
    dense = _decided(tmp_path, cpu, TRAIN_MODEL="tiny")
    assert dense.moe_impl.value is None and dense.moe_aux_loss.value is None
    deepseek = save_tiny("deepseek_v3", tmp_path / "deepseek")
    assert _decided(tmp_path, cpu, TRAIN_MODEL=str(deepseek)).moe_aux_loss.value == 0.0  # it defines none


@pytest.mark.parametrize(("train", "said"), [
    ({"TRAIN_MODEL": "tiny", "TRAIN_MOE_IMPL": "eager"}, "TRAIN_MOE_IMPL=eager: TRAIN_MODEL=tiny is not a mixture"),
    ({"TRAIN_MODEL": "tiny-moe", "TRAIN_MOE_AUX_LOSS": "lots"}, "TRAIN_MOE_AUX_LOSS=lots: auto, off or a number"),
    ({"TRAIN_MODEL": "tiny-moe", "TRAIN_MOE_AUX_LOSS": "-1"}, "TRAIN_MOE_AUX_LOSS=-1: auto, off or a number"),
])  # fmt: skip
def test_moe_settings_that_cannot_apply_are_refused_before_torch(train: dict[str, str], said: str) -> None:
    from trainer.config.parse import load_settings

    with pytest.raises(ConfigError, match=said):
        load_settings(train)


def test_a_checkpoint_keeps_the_fused_experts_so_that_a_resume_loads_them(tmp_path: Path) -> None:
    """Transformers 5 saves fused experts back in their original per-expert layout, which its Trainer's resume
    (load_state_dict, strict=False) matches to nothing: the experts would resume freshly initialized. Checkpoints are
    written in the model's own names (trainer.library_patches.saving_in_model_names); the fsdp-moe chain of
    test_resume_nproc.py resumes one to the same losses."""
    from safetensors.torch import load_file

    from trainer.library_patches import saving_in_model_names

    model = tiny_model("qwen3_moe")
    model.save_pretrained(tmp_path / "original")
    with saving_in_model_names(model):
        model.save_pretrained(tmp_path / "own")
    original, own = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("original", "own"))
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in original  # what the resume would not load
    resumed = tiny_model("qwen3_moe", seed=1)
    assert "model.layers.0.mlp.experts.gate_up_proj" in resumed.load_state_dict(original, strict=False).missing_keys
    resumed.load_state_dict(own, strict=True)
    assert torch.equal(resumed.model.layers[0].mlp.experts.gate_up_proj, model.model.layers[0].mlp.experts.gate_up_proj)
