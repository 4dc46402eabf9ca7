"""Prompts in, answers out, below the run and the commands that both use it: decoding.py (rendering, the decoding
settings, batched generation with left padding) and references.py (an eval set's questions and reference answers).
`generate`, `eval` and the run's TRAIN_EVAL_GENERATE samples share them."""
