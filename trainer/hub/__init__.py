"""The Hugging Face Hub: models, tokenizers and datasets named by Hub ID, resolved into HF_HOME's cache.

ids.py parses the names (no hub import); download.py is the one call into huggingface_hub (snapshot_download) and
turns its errors into ConfigError (exit 2); sources.py resolves TRAIN_MODEL/TOKENIZER/DATA/EVAL_DATA once per settings
object (pinned to the commits the checkpoint being resumed recorded: trainer.config.resume); what of a dataset
repository is fetched, the data layer says (trainer.data.hub_datasets). `python -m trainer fetch` is
trainer/fetch_command.py, `push` trainer/push_command.py. Torch-free: stage 1 of the configuration
(trainer.config.checks) uses it.
"""
