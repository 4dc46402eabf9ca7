"""`python -m trainer export SRC OUT`: from a run, a checkpoint or final/ to a plain Transformers model folder.

source.py        what SRC is (run folder, checkpoint, final/) and what it holds (adapter, ZeRO or FSDP shards, full)
merge.py         the run's recorded base (pinned Hub commit included), unquantized, with the LoRA adapter merged
consolidate.py   ZeRO-3 / FSDP shards -> one state dict, with DeepSpeed's and accelerate's (torch DCP) own tools
model_card.py    README.md: base model, data with commits, resolved config (masked), last losses
verify.py        the written folder loads without peft and its logits equal the reference's
command.py       the command and export(): build, write to a staging folder, verify, then publish
"""
