"""Training data, from TRAIN_DATA to the packed sequences the Trainer reads.

- `discovery`: which files TRAIN_DATA names, and what is wrong with them (torch-free, one scan per run);
- `formats`: reading records from every supported file kind, compressed or not, in batches;
- `readers`: the records of each file as bounded work units; `chat`: conversations (layouts, roles, the chat
  template, the tokens the loss is taken on);
- `shards`: streaming tokenization into memory-mapped token shards, cached and shared by ranks;
- `spec`: `DataSpec`, what shapes the packed data (and keys the cache): what the data layer is given;
- `dataset`: the map-style dataset over the shards, and `load_or_prepare` for the training run.
`python -m trainer data [--show N [--json]]` is trainer/data_command.py (a command: it reads the configuration).

Importing this package imports nothing heavy: `trainer.config` uses `discovery` before torch is loaded.
"""
