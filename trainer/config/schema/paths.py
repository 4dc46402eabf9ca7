"""The TRAIN_* settings of the group "Paths and data".

Fields only: the group's rules (checks, decisions, its TrainingArguments) live in trainer/config/paths.py;
trainer.config.schema assembles the groups.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from trainer.config.schema.fields import DATA, FIXED, NOT_RECORDED, setting


class PathSettings(BaseModel):
    model: str = setting(
        "tiny", "paths",
        "A preset for training from scratch: tiny, 125m, 350m, 1b (Llama architecture), tiny-moe (a Qwen3-MoE "
        "mixture of experts: 8 routed experts, top-2), tiny-vl (Qwen2-VL, for records with images); a local Hugging "
        "Face "
        "model folder; or a Hub ID org/name[@revision], downloaded into HF_HOME (HF_TOKEN for gated and private "
        "models; with HF_HUB_OFFLINE=1 only the cache is used). The resolved commit is recorded and kept on resume.",
        on_resume=FIXED,
    )
    tokenizer: str = setting(
        "", "paths",
        "Tokenizer: a folder or Hub ID org/name[@revision] (only its tokenizer files are fetched). Empty: the model "
        "folder's own tokenizer, else the byte-level one (presets).",
        on_resume=FIXED,
    )
    data: str = setting(
        "/data", "paths",
        "Training data: a file, folder or glob of .txt, .jsonl/.json (also .gz/.zst/.bz2/.xz), .parquet, .arrow, "
        ".csv; a hub-style dataset folder (data/train-*.parquet) or a datasets.save_to_disk folder; or a Hub dataset "
        "hf://datasets/org/name[@revision][/config-folder or file glob] (its data files are fetched into HF_HOME, "
        "then read like a local folder: the train split). Missing or empty default: a small embedded corpus. Several "
        "sources (local or Hub datasets) mixed by weight: SOURCE:WEIGHT,SOURCE:WEIGHT (a weight is a share of the "
        "trained tokens), or a NAME.mix.json file (docs/running.md, 'Mixing sources').",
        on_resume=DATA,
    )
    output_dir: str = setting(
        "/output", "paths", "Where checkpoints, the final model, metrics and logs go (unset outside the image: "
        "./output of the current folder).", on_resume=NOT_RECORDED)  # fmt: skip
    text_field: str = setting(
        "text", "paths", "Field holding the text in .jsonl/.json/.parquet/.csv data.", on_resume=DATA
    )
    seq_len: int = setting(512, "paths", "Tokens per packed training sequence.", ge=8, on_resume=DATA)
    rope_scaling: Literal["none", "linear", "dynamic", "yarn", "llama3"] = setting(
        "none", "paths",
        "RoPE scaling, to train a context longer than the model's max_position_embeddings: linear, dynamic (NTK), "
        "yarn or llama3. It is written into the trained model's config.json (final/, exports, pushes load with it).",
        on_resume=FIXED,
    )
    rope_factor: float = setting(
        0.0, "paths",
        "How far TRAIN_ROPE_SCALING stretches the context (2: twice max_position_embeddings). 0: TRAIN_SEQ_LEN "
        "divided by the model's max_position_embeddings.",
        on_resume=FIXED,
    )
    data_max_bad_lines: int = setting(
        0, "paths",
        "Malformed records to skip (JSON Lines that do not parse, conversations that cannot be trained on; each is "
        "reported by file and line); 0: the first one stops the run.",
        ge=0,
        on_resume=DATA,
    )
    # conversations (trainer/data/chat.py)
    chat_template: str = setting(
        "", "paths",
        "Chat template for messages/conversations data: a built-in name (chatml) or a Jinja file; it replaces the "
        "tokenizer's own and is saved with final/ and every checkpoint. Empty: the tokenizer's own template.",
        on_resume=DATA,
    )
    loss_on: Literal["assistant", "last", "all"] = setting(
        "assistant", "paths",
        "Tokens the loss is taken on in conversations: assistant (every assistant turn with its end-of-turn "
        "tokens), last (the last assistant turn only), all (every token, system and user turns included). "
        "prompt/completion records train on the completion, or on everything with all.",
        on_resume=DATA,
    )
    # packing (#25, trainer/data/packing.py)
    packing: Literal["auto", "stream", "records"] = setting(
        "auto", "paths",
        "How records become TRAIN_SEQ_LEN sequences. records: whole records, best-fit packed, position ids restarting "
        "and attention kept inside each record, padding never trained; stream: one token stream cut into windows "
        "(a record may span two sequences and sees the ones before it). auto: records for prompt/completion and "
        "conversations, stream for plain text.",
        on_resume=DATA,
    )
    long_records: Literal["truncate", "drop"] = setting(
        "truncate", "paths",
        "A record longer than TRAIN_SEQ_LEN when records are packed: truncate it to TRAIN_SEQ_LEN, or drop it. "
        "Either way the log and meta.json count them.",
        on_resume=DATA,
    )
