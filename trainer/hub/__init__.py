"""The Hugging Face Hub: models, tokenizers and datasets named by Hub ID, resolved into HF_HOME's cache.

ids.py parses the names (no hub import); download.py is the one call into huggingface_hub (snapshot_download) and
turns its errors into ConfigError (exit 2); models.py resolves TRAIN_MODEL/TRAIN_TOKENIZER once per settings object
(pinned to a checkpoint's commit on resume); datasets.py resolves hf://datasets/ TRAIN_DATA; fetch.py is
`python -m trainer fetch`. Torch-free: stage 1 of the configuration (trainer.config.checks) uses it.
"""
