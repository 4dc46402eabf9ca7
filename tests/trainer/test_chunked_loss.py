"""TRAIN_CROSS_ENTROPY=chunked (issue 58 item 1): the chunked cross-entropy equals Transformers' full loss (loss and
gradients, 1e-6 relative in norm) on a 128,256-row head, with masked prompt positions and packed records; what the
loss keeps for the backward (counted with torch.autograd.graph.saved_tensors_hooks) drops by more than the chunk
factor; `auto` picks it for a big vocabulary with its reason; and a real run of the tiny preset trains with it under
a whole-model torch.compile and with LoRA."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import write_corpus
from train_runs import train_env
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.loss.loss_utils import ForCausalLMLoss, fixed_cross_entropy

from trainer import config
from trainer.errors import ConfigError
from trainer.machine.hardware import Hardware
from trainer.model.chunked_loss import TRAINED_KEY, chunked_causal_lm_loss, install_chunked_loss, trained_count

REPO = Path(__file__).resolve().parents[2]
VOCAB, HIDDEN, BATCH, SEQ = 128_256, 16, 2, 24  # the 1b-128k preset's vocabulary; a small hidden size, few positions
CHUNK = 8  # 48 positions -> 6 chunks


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def prompt_labels() -> torch.Tensor:
    """Labels of two rows with masked prompt positions (-100) and a masked record start."""
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    labels[0, :7] = -100  # a prompt
    labels[1, :3] = -100
    labels[1, 12] = -100  # a packed record's start: the previous record's last token never predicts it
    return labels


def loss_and_grads(loss_fn: Any, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.1).to(dtype).requires_grad_()
    hidden = torch.randn(BATCH, SEQ, HIDDEN, generator=gen).to(dtype).requires_grad_()
    loss = loss_fn(hidden, weight)
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


def full_loss(labels: torch.Tensor, items: torch.Tensor | None, dtype: torch.dtype) -> Any:
    """Transformers' causal LM loss on the whole logits: ForCausalLMLoss itself in fp32; in float64 (which it would
    cast down to fp32) its own shift and its own fixed_cross_entropy on the float64 logits."""
    if dtype == torch.float32:
        return lambda h, w: ForCausalLMLoss(h @ w.t(), labels, VOCAB, num_items_in_batch=items)
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].reshape(-1)
    return lambda h, w: fixed_cross_entropy((h @ w.t()).reshape(-1, VOCAB), shifted, items)


# float64: the algorithm, to 1e-6 relative (it lands near 1e-15); fp32, as training computes the loss: two sums of
# 128k terms in another order differ by rounding (1.2e-6 measured on the hidden states' gradient), so 1e-5
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float64, 1e-6), (torch.float32, 1e-5)], ids=["f64", "f32"])
@pytest.mark.parametrize("reduction", ["mean", "num_items", "host_count"])
def test_loss_and_gradients_equal_the_full_cross_entropy(reduction: str, dtype: torch.dtype, tolerance: float) -> None:
    labels = prompt_labels()
    trained = trained_count(labels)
    assert trained == BATCH * (SEQ - 1) - 6 - 2 - 1  # the last position of each row predicts nothing
    items = torch.tensor(trained + 5) if reduction == "num_items" else None  # as the Trainer's accumulated count
    count = trained if reduction == "host_count" else None
    full = loss_and_grads(full_loss(labels, items, dtype), dtype)
    chunked = loss_and_grads(lambda h, w: chunked_causal_lm_loss(h, w, labels, items, trained=count, chunk=CHUNK),
                             dtype)  # fmt: skip
    for name, got, want in zip(("loss", "hidden grad", "head grad"), chunked, full, strict=True):
        assert got.dtype == want.dtype == dtype
        assert relative(got, want) <= tolerance, (name, relative(got, want))
    assert chunked[1][0, :6].abs().sum() == 0  # masked positions get no gradient


def test_under_bf16_autocast_the_head_multiplies_in_bf16_as_the_full_loss_does() -> None:
    """A GPU run's path (autocast bf16 on fp32 weights), on the CPU's autocast: the chunked loss casts the hidden
    states and the head to bf16 for its matmuls as autocast's Linear does, takes the loss in fp32, and hands back
    fp32 gradients. The head's gradient differs by rounding: the full loss's one bf16 matmul against chunks summed in
    fp32 (2.0e-4 relative measured; each is 2.9e-3 from the fp32 loss's)."""
    labels = prompt_labels()

    def under_autocast(fn: Any) -> Any:
        def run(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fn(h, w)

        return run

    full = loss_and_grads(under_autocast(lambda h, w: ForCausalLMLoss(torch.nn.functional.linear(h, w), labels,
                                                                      VOCAB)), torch.float32)  # fmt: skip
    chunked = loss_and_grads(under_autocast(lambda h, w: chunked_causal_lm_loss(h, w, labels, chunk=CHUNK)),
                             torch.float32)  # fmt: skip
    for name, got, want, tolerance in zip(("loss", "hidden grad", "head grad"), chunked, full, (1e-6, 1e-6, 1e-3),
                                          strict=True):  # fmt: skip
        assert got.dtype == torch.float32, name
        assert relative(got, want) <= tolerance, (name, relative(got, want))


def saved_activation_bytes(loss_fn: Any) -> int:
    """Bytes the loss's autograd graph keeps for its backward, the head weight (a parameter) left out."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(VOCAB, HIDDEN, generator=gen).requires_grad_()
    hidden = torch.randn(BATCH, SEQ, HIDDEN, generator=gen).requires_grad_()
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() != weight.untyped_storage().data_ptr():
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_fn(hidden, weight)
    return sum(seen.values())


def test_saved_activations_drop_by_more_than_the_chunk_factor() -> None:
    labels = prompt_labels()
    full = saved_activation_bytes(lambda h, w: ForCausalLMLoss(h @ w.t(), labels, VOCAB))
    chunked = saved_activation_bytes(lambda h, w: chunked_causal_lm_loss(h, w, labels, chunk=CHUNK))
    factor = BATCH * SEQ // CHUNK
    print(f"saved activation bytes: full {full:,}, chunked {chunked:,} ({full / chunked:.0f}x less; chunk factor "
          f"{factor})")  # fmt: skip
    assert full >= BATCH * SEQ * VOCAB * 4  # the fp32 log-probabilities of every position
    assert chunked * factor <= full


def packed_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM(cfg).float()


def test_a_packed_batch_through_the_model_equals_its_own_loss() -> None:
    """Two records packed per row (position ids restart, the second record's start masked), a prompt masked: the
    installed forward gives the model's own loss and the same gradient for every parameter."""
    labels = prompt_labels()
    positions = torch.cat([torch.arange(12), torch.arange(SEQ - 12)]).repeat(BATCH, 1)
    batch = {"input_ids": labels.clamp(min=0), "labels": labels, "position_ids": positions}

    def run(model: LlamaForCausalLM, **extra: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out = model(**batch, **extra)
        out.loss.backward()
        return out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    full_loss, full_grads = run(packed_model())
    model = packed_model()
    install_chunked_loss(model, chunk=CHUNK)
    loss, grads = run(model, **{TRAINED_KEY: trained_count(labels)})
    assert relative(loss, full_loss) <= 1e-6
    for name, grad in grads.items():  # fp32, as above: 1e-5 (the embedding's gradient lands near 1e-6)
        assert relative(grad, full_grads[name]) <= 1e-5, name
    assert model(input_ids=batch["input_ids"]).logits.shape == (BATCH, SEQ, VOCAB)  # no labels: the model's own


# ---- the decision -------------------------------------------------------------------------------------------------

H100 = Hardware(
    device="cuda", gpu_count=1, gpu_name="NVIDIA H100 80GB HBM3", capability=(9, 0), total_memory_bytes=80 * 2**30,
    bf16=True, tf32=True, libraries={"triton": True, "tensorboard": True, "liger_kernel": True},
)  # fmt: skip


def decided(hw: Hardware, **env: str) -> config.Decision:
    settings = config.parse_settings({f"TRAIN_{k.upper()}": v for k, v in env.items()})
    return config.resolve(settings, hw, environ={}, import_heavy=False).decisions.cross_entropy


def test_auto_chunks_a_big_vocabulary_and_says_why(tmp_path: Path) -> None:
    big = decided(H100, model="1b-128k")
    assert big.value == "chunked" and big.reason.startswith("auto: chunked (a 128,256-row vocabulary, >= 32,768")
    assert "never held" in big.reason and "not measured on a GPU yet" in big.reason
    small = decided(H100, model="1b")  # the byte-level tokenizer's few hundred rows
    assert small.value == "full" and "chunked from 32,768 rows" in small.reason
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 32_000}))
    assert decided(H100, model=str(folder)).reason.startswith("auto: full (a 32,000-row vocabulary")
    (folder / "config.json").write_text(json.dumps({"model_type": "gemma2", "vocab_size": 256_000}))
    gemma = decided(H100, model=str(folder))
    assert gemma.value == "full" and "type 'gemma2' is not one whose head it knows" in gemma.reason
    liger = decided(H100, model="1b-128k", liger="1")
    assert liger.value == "full" and "Liger's fused linear cross-entropy computes the loss" in liger.reason
    assert decided(H100, model="1b-128k", cross_entropy="full").value == "full"


def test_chunked_where_it_cannot_stand_in_exits_2_naming_why(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TRAIN_CROSS_ENTROPY=chunked: TRAIN_FSDP=full_shard shards the LM head"):
        decided(H100, model="1b-128k", cross_entropy="chunked", fsdp="full_shard", precision="bf16")
    with pytest.raises(ConfigError, match="TRAIN_LORA_TARGETS puts an adapter on the LM head; set "
                                          "TRAIN_CROSS_ENTROPY=full"):  # fmt: skip
        decided(H100, model="1b-128k", cross_entropy="chunked", lora="1", lora_targets="q_proj,lm_head")


# ---- real runs: a whole-model compile and LoRA -------------------------------------------------------------------

RUNS = {
    "compiled": {"compile": 1, "compile_scope": "model", "deterministic": 0},
    "lora": {"lora": 1},
}


@pytest.fixture(scope="module", params=sorted(RUNS))
def chunked_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp(request.param)
    out = tmp / "out"
    env = train_env(out, data=write_corpus(tmp / "corpus.txt", lines=60), max_steps=2, cross_entropy="chunked",
                    **RUNS[request.param])  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "trainer"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"name": request.param, "log": proc.stderr, "metrics": metrics,
            "config": json.loads((out / "run_config.json").read_text())}  # fmt: skip


def test_a_run_trains_with_the_chunked_loss(chunked_run: dict[str, Any]) -> None:
    decision = chunked_run["config"]["decisions"]["cross_entropy"]
    assert decision == {"value": "chunked", "reason": decision["reason"]}
    assert "set by TRAIN_CROSS_ENTROPY" in decision["reason"]
    assert "loss: chunked cross-entropy" in chunked_run["log"]
    losses = [m["loss"] for m in chunked_run["metrics"] if "loss" in m]
    assert losses and all(0 < loss < 20 for loss in losses), chunked_run["metrics"]
    if chunked_run["name"] == "compiled":
        assert "torch.compile: the whole model's forward" in chunked_run["log"]
