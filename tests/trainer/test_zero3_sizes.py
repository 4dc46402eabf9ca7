"""ZeRO-3 builds the model inside `deepspeed.zero.Init`: every local parameter is an empty shard. Parameter
counts, MFU's FLOPs and the embedding fit must use the full sizes (`ds_numel`, `ds_shape`), not the shards.

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

tok = byte_level_tokenizer()
config = preset_config("tiny", len(tok), 64, tok)
plain = AutoModelForCausalLM.from_config(config)
expected = [count_parameters(plain), matmul_params(plain), flops_per_token(plain, 64)]
embedding_rows = plain.get_input_embeddings().weight.shape[0]
del plain
args = TrainingArguments(output_dir=os.environ["OUT"], deepspeed=generate(3, "none", "/tmp", "fp32"), use_cpu=True,
                         report_to="none")  # as the trainer does: TrainingArguments first, then the model
model = AutoModelForCausalLM.from_config(config)
fit_embeddings(model, tok)
weight = model.get_input_embeddings().weight
print(json.dumps({
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
