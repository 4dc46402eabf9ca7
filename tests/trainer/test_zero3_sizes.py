"""ZeRO-3 builds the model inside `deepspeed.zero.Init`: every local parameter is an empty shard. Parameter
counts, MFU's FLOPs and the embedding fit must use the full sizes (`ds_numel`, `ds_shape`), not the shards; a mixture
of experts' fused expert parameters are sharded too, and its component table counts them whole.

A real world of one over gloo on CPU, in a subprocess (DeepSpeed's global state stays out of pytest)."""

from __future__ import annotations

import json

SCRIPT = """
import json, os, socket
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(port))
from transformers import AutoModelForCausalLM, TrainingArguments
from trainer.config.deepspeed import generate
from trainer.run.metrics import flops_per_token, matmul_params
from trainer.model.build import preset_config
from trainer.run.training_model import count_parameters
from trainer.tokenizer import byte_level_tokenizer, fit_embeddings
from trainer.model.components import count
from transformers import Qwen3MoeConfig

tok = byte_level_tokenizer()
config = preset_config("tiny", len(tok), 64, tok)
plain = AutoModelForCausalLM.from_config(config)
expected = [count_parameters(plain), matmul_params(plain), flops_per_token(plain, 64)]
embedding_rows = plain.get_input_embeddings().weight.shape[0]
del plain
moe_config = Qwen3MoeConfig(vocab_size=320, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, num_experts=8,
                            num_experts_per_tok=2)
moe_table = [r.to_dict() for r in count(AutoModelForCausalLM.from_config(moe_config))]
args = TrainingArguments(output_dir=os.environ["OUT"], deepspeed=generate(3, "none", "/tmp", "fp32"), use_cpu=True,
                         report_to="none")  # as the trainer does: TrainingArguments first, then the model
model = AutoModelForCausalLM.from_config(config)
fit_embeddings(model, tok)
weight = model.get_input_embeddings().weight
moe = AutoModelForCausalLM.from_config(moe_config)
experts = moe.model.layers[0].mlp.experts
print(json.dumps({
    "moe_experts_local": experts.gate_up_proj.numel() + experts.down_proj.numel(),
    "moe_experts_shape": list(experts.gate_up_proj.ds_shape),
    "moe_table": [r.to_dict() for r in count(moe)], "expected_moe_table": moe_table,
    "local": sum(p.numel() for p in model.parameters()),
    "sharded": [count_parameters(model), matmul_params(model), flops_per_token(model, 64)],
    "expected": expected,
    "rows": list(weight.ds_shape)[0], "expected_rows": embedding_rows,
}))
"""


def test_zero3_counts_full_sizes_not_empty_shards(run_python, tmp_path) -> None:
    result = run_python(["-c", SCRIPT], env={"OUT": str(tmp_path / "out"), "PYTHONPATH": "."}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["local"] == 0  # really sharded: the local parameters are empty
    assert found["sharded"] == found["expected"]
    assert found["rows"] == found["expected_rows"]  # not resized: the tokenizer fits the real embedding
    assert "embeddings resized" not in result.stderr
    assert found["moe_experts_local"] == 0 and found["moe_experts_shape"] == [8, 64, 64]  # [experts, 2 x 32, 64]
    assert found["moe_table"] == found["expected_moe_table"]
