"""A model built or loaded, for every command that needs one: the run (policy and reward model), generate, eval and
export. loading.py (load(what, how): the one loader), build.py (presets, the run's weights dtype), quantization.py
(the one BitsAndBytesConfig), adapters.py (LoRA: new, attached, merged), packed_attention.py (attention kept
inside packed records). Importing this package imports nothing heavy.
"""
