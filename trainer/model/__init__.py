"""A model built or loaded, for every command that needs one: the run (policy and reward model), generate, eval and
export. build.py (presets, from_pretrained's arguments), packed_attention.py (attention kept inside packed records),
adapters.py (LoRA: new, attached, merged). Importing this package imports nothing heavy.
"""
