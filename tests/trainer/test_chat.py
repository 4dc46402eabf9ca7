"""Conversations (trainer/data/chat.py), through real `python -m trainer data --show N --json` processes: the chat
template renders each record, the loss is taken on the assistant turns only (unique marker words per turn: no
system/user word trained, every assistant word trained), in the three conversation layouts and from the three
template sources; bad records exit 2 naming file and line; final/ and checkpoints keep the template; a resumed run
maps the same cache; the oldest row's stack tokenizes and masks identically."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, base_env, run_python, run_trainer

OLDEST_PYTHON = REPO / ".venv-oldest" / "bin" / "python"
# A Llama-3-style template without {% generation %} markers: trained tokens are found by prefix rendering.
HEADER_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
SPECIAL = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
RECORDS = 12


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with a real BPE tokenizer (BOS, end-of-turn special tokens) whose tokenizer_config.json holds
    HEADER_TEMPLATE, as Hub instruct models ship it."""
    from hub_support import save_bpe_tokenizer
    from tokenizers import decoders
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.model.build import preset_config

    folder = tmp_path_factory.mktemp("chat-model")
    save_bpe_tokenizer(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.backend_tokenizer.decoder = decoders.ByteLevel()  # decode() gives the text back
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL})
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.save_pretrained(folder)
    for leftover in folder.glob("chat_template.*"):
        leftover.unlink()
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    fast = {"tokenizer_class": "PreTrainedTokenizerFast"}  # a name transformers 4.46 (the 12.1 row) knows too
    config_path.write_text(json.dumps({**config, **fast, "chat_template": HEADER_TEMPLATE}))
    model = AutoModelForCausalLM.from_config(preset_config("tiny", len(tokenizer), 256, tokenizer))
    model.save_pretrained(folder)
    return folder


def turns(i: int) -> list[tuple[str, str]]:
    """(role, content) of record i: every content holds one marker word naming its role, unique in the corpus."""
    return [("system", f"sysmark{i} be brief"), ("user", f"usermark{i}a hello"), ("assistant", f"asstmark{i}a fine"),
            ("user", f"usermark{i}b again"), ("assistant", f"asstmark{i}b done")]  # fmt: skip


def write_corpus(folder: Path, layout: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(RECORDS):
        messages = [{"role": r, "content": c} for r, c in turns(i)]
        if layout == "messages":
            rows.append({"messages": messages})
        elif layout == "conversations":
            names = {"system": "system", "user": "human", "assistant": "gpt"}
            rows.append({"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in messages]})
        else:  # conversational prompt/completion: the prompt's assistant turn is context, not trained
            rows.append({"prompt": messages[:4], "completion": messages[4:]})
    if layout == "conversations":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = folder / "train.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path = folder / "train.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def show_json(env: dict[str, str], python: Path | None = None) -> list[dict]:
    """`python -m trainer data --show 1000 --json` (on `python`, e.g. the oldest row's venv): every sequence."""
    argv = ["-m", "trainer", "data", "--show", "1000", "--json"]
    result = run_python(argv, env=env) if python is None else run_oldest(argv, env)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines()]


def run_oldest(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**base_env(), **env, "PYTHONPATH": str(REPO)}
    return subprocess.run([str(OLDEST_PYTHON), *argv], env=full, cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip


def trained_and_not(sequences: list[dict], tokenizer) -> tuple[str, str]:
    """The decoded text of the runs of trained tokens, and of the runs of the others (" | " between runs)."""
    runs: dict[bool, list[str]] = {True: [], False: []}
    for seq in sequences:
        assert len(seq["input_ids"]) == len(seq["labels"]) == len(seq["position_ids"])
    ids = [t for seq in sequences for t in seq["input_ids"]]  # one stream: a word may cross a sequence's end
    labels = [t for seq in sequences for t in seq["labels"]]
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or (labels[end] != -100) != (labels[start] != -100):
            runs[labels[start] != -100].append(tokenizer.decode(ids[start:end]))
            start = end
    return " | ".join(runs[True]), " | ".join(runs[False])


def assert_assistant_only(sequences: list[dict], tokenizer, layout: str) -> None:
    trained, other = trained_and_not(sequences, tokenizer)
    words = re.findall(r"(sys|user|asst)mark(\d+)([ab]?)", trained + " " + other)
    assert len({w for w in words}) >= 5 * (RECORDS - 2), "the corpus is not in the prepared sequences"
    for kind, i, turn in set(words):
        word = f"{kind}mark{i}{turn}"
        should_train = kind == "asst" and not (layout == "chat_pair" and turn == "a")
        assert (word in trained) == should_train, f"{word}: trained={word in trained} ({layout})"
        assert (word in other) != should_train, f"{word} also outside the trained tokens ({layout})"


def env_for(tmp_path: Path, data: Path, **train: str) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    base = {"TRAIN_DATA": str(data), "TRAIN_OUTPUT_DIR": str(tmp_path / "out"), "TRAIN_SEQ_LEN": "256"}
    return {**base, **{f"TRAIN_{k.upper()}": v for k, v in train.items()}, "HOME": str(home), "HF_HOME": str(home)}


@pytest.fixture(scope="module")
def messages_shown(tmp_path_factory: pytest.TempPathFactory, chat_model: Path) -> tuple[dict[str, str], list[dict]]:
    """`data --show` of messages records with the model folder's template: (its environment, every sequence), read
    by test_loss_only_on_assistant_turns[messages-model] and compared with the oldest row's by
    test_oldest_row_renders_and_masks_the_same."""
    tmp = tmp_path_factory.mktemp("messages-model")
    env = env_for(tmp, write_corpus(tmp / "data", "messages"), model=str(chat_model))
    return env, show_json(env)


def shown_sequences(tmp_path: Path, chat_model: Path, layout: str, source: str) -> list[dict]:
    """Every sequence `data --show` prepares of `layout` records with the template from `source` (builtin, file)."""
    from hub_server import populate_cache

    data = write_corpus(tmp_path / "data", layout)
    settings = {"chat_template": "chatml"}
    if source == "file":
        (tmp_path / "t.jinja").write_text(HEADER_TEMPLATE.replace("\n\n", "\n"))
        settings = {"model": str(chat_model), "chat_template": str(tmp_path / "t.jinja")}
    env = env_for(tmp_path, data, **settings)
    if layout == "conversations":
        files = {"data/train-00000-of-00001.parquet": data.read_bytes(), "README.md": b"# chats\n"}
        populate_cache(Path(env["HF_HOME"]), "org/chats", files, "c" * 40, kind="datasets")
        env["TRAIN_DATA"] = "hf://datasets/org/chats"
    return show_json(env)


@pytest.mark.parametrize("layout, source", [("messages", "model"), ("conversations", "builtin"),
                                            ("chat_pair", "file")])  # fmt: skip
def test_loss_only_on_assistant_turns(tmp_path: Path, chat_model: Path, layout: str, source: str,
                                      request: pytest.FixtureRequest) -> None:  # fmt: skip
    """messages with the model folder's template (prefix rendering, BPE, BOS); ShareGPT parquet as a Hub dataset
    (hf://datasets/..., from the HF cache offline) with the built-in chatml (generation markers, byte-level preset);
    conversational prompt/completion with a TRAIN_CHAT_TEMPLATE file."""
    from transformers import AutoTokenizer

    from trainer.tokenizer import byte_level_tokenizer

    if source == "model":
        sequences = request.getfixturevalue("messages_shown")[1]
    else:
        sequences = shown_sequences(tmp_path, chat_model, layout, source)
    tokenizer = byte_level_tokenizer() if source == "builtin" else AutoTokenizer.from_pretrained(chat_model)
    assert_assistant_only(sequences, tokenizer, layout)
    if source != "builtin":  # the template adds BOS once per record; the tokenizer adds none of its own
        ids = [t for s in sequences for t in s["input_ids"]]
        assert ids[0] == tokenizer.bos_token_id and ids[1] != tokenizer.bos_token_id
        assert ids.count(tokenizer.bos_token_id) in (RECORDS, RECORDS - 1)  # the ragged tail may be dropped
        eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
        labels = [t for s in sequences for t in s["labels"]]
        assert eot in labels, "the end-of-turn token of an assistant turn is trained"


def test_show_marks_trained_tokens_and_records(tmp_path: Path) -> None:
    data = write_corpus(tmp_path / "data", "messages")
    result = run_trainer(["data", "--show", "2"], env=env_for(tmp_path, data, chat_template="chatml"))
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert re.search(r"⟦asstmark\d+a fine", out) and re.search(r"usermark\d+a hello", out)
    assert not re.search(r"⟦[^⟧]*(usermark|sysmark)", out), "a user or system word is marked trained"
    assert "sequence 0" in out and "sequence 1" in out and "sequence 2" not in out and "record 0" in out
    assert '"sequences"' in result.stderr  # the summary line goes to the log with --show


def test_loss_on_last_and_all(tmp_path: Path) -> None:
    from trainer.data.chat import conversation_of
    from trainer.data.chat_encoder import ChatEncoder
    from trainer.tokenizer import byte_level_tokenizer

    tokenizer = byte_level_tokenizer()
    tokenizer.chat_template = (REPO / "trainer/assets/chat_templates/chatml.jinja").read_text()
    conv = conversation_of({"messages": [{"role": r, "content": c} for r, c in turns(0)]}, "messages", "x:1")
    for loss_on, expect in (("last", ["asstmark0b"]), ("all", ["sysmark0", "usermark0a", "asstmark0a"])):
        ids, mask = ChatEncoder(tokenizer, loss_on, "uint16").encode(conv)
        trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
        assert all(word in trained for word in expect), (loss_on, trained)
        assert loss_on == "all" or "asstmark0a" not in trained
    from trainer.data.dataset import load_or_prepare
    from trainer.data.discovery import discover
    from trainer.data.spec import DataSpec

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Q{i}?", "completion": f" A{i}."}) + "\n" for i in range(40)))
    for loss_on in ("assistant", "all"):  # prompt/completion: all trains the prompts too
        dataset = load_or_prepare(discover(str(pairs)), tokenizer, DataSpec(16, loss_on=loss_on), tmp_path / "cache")
        labels = [label for i in range(len(dataset)) for label in dataset.block(i)[1].tolist()]
        trained = tokenizer.decode([label for label in labels if label != -100])
        assert " A1." in trained and ("1?" in trained) == (loss_on == "all"), loss_on  # "Q" starts a record: no label


BAD = {  # line: (record, what the message says)
    3: ({"messages": [{"role": "bot", "content": "hi"}]}, "messages[1] has unknown role 'bot'"),
    4: ({"messages": [{"role": "user"}, {"role": "assistant", "content": "a"}]},
        "messages[1] (role user) has no content"),
    5: ({"messages": [{"role": "user", "content": "q"}]}, "it has no assistant turn to learn from"),
    6: ({"text": "plain"}, "a text record in a file of messages records"),
    7: ({"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "a"}]},
        "the chat template raised TemplateError: no tools here"),
}  # fmt: skip


@pytest.mark.parametrize("allowed", [0, len(BAD) - 1])
def test_bad_records_exit_2_naming_file_and_line(tmp_path: Path, allowed: int) -> None:
    """Each kind of bad record, named by file and line; TRAIN_DATA_MAX_BAD_LINES skips (and names) that many."""
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [good, good, *(r for r, _ in BAD.values()), good]))
    template = tmp_path / "strict.jinja"
    template.write_text("{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}"
                        "{% endif %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")  # fmt: skip
    env = env_for(tmp_path, data, chat_template=str(template), data_max_bad_lines=str(allowed))
    result = run_trainer(["data"], env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert f"{data}:3: {BAD[3][1]}" in result.stderr, result.stderr[-2000:]
    if allowed:  # every one is named as it is skipped, then one too many stops the run
        for line, (_, expected) in BAD.items():
            assert f"skipped malformed line {data}:{line}: {expected}" in result.stderr, (line, result.stderr[-3000:])
        assert f"more than TRAIN_DATA_MAX_BAD_LINES={allowed}" in result.stderr


def test_first_record_and_missing_template_refused_before_torch(tmp_path: Path, imported_modules) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "bot", "content": "hi"}]}) + "\n")
    result = run_trainer(
        ["config"], env=env_for(tmp_path, data, chat_template="chatml"), python_args=["-X", "importtime"]
    )
    assert result.returncode == 2 and f"{data}:1: messages[1] has unknown role 'bot'" in result.stderr
    assert "torch" not in imported_modules(result.stderr)
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    result = run_trainer(["config"], env=env_for(tmp_path, data))
    assert result.returncode == 2 and "no chat template" in result.stderr and "TRAIN_CHAT_TEMPLATE" in result.stderr


@pytest.mark.row_12_1
@pytest.mark.skipif(not OLDEST_PYTHON.exists(), reason="no .venv-oldest: run `bash tests/oldest/setup.sh`")
def test_oldest_row_renders_and_masks_the_same(tmp_path: Path, messages_shown: tuple[dict[str, str], list[dict]]
                                               ) -> None:  # fmt: skip
    """transformers 4.46.3 (the 12.1 row) gives the very same input_ids, labels and position_ids as this stack, by
    prefix rendering (the model's template) and by generation markers (chatml)."""
    env, newest = messages_shown  # its own output folder: the oldest row prepares its own cache, maps none
    assert show_json({**env, "TRAIN_OUTPUT_DIR": str(tmp_path / "old")}, OLDEST_PYTHON) == newest, "messages"
    data = write_corpus(tmp_path / "data", "conversations")
    newest = show_json(env_for(tmp_path, data, output_dir=str(tmp_path / "new"), chat_template="chatml"))
    oldest = show_json(env_for(tmp_path, data, output_dir=str(tmp_path / "old-chatml"), chat_template="chatml"),
                       OLDEST_PYTHON)  # fmt: skip
    assert oldest == newest, "conversations"


def test_final_and_checkpoints_keep_the_template_and_resume_maps_the_cache(tmp_path: Path, chat_model: Path) -> None:
    """A real run on the model folder with TRAIN_CHAT_TEMPLATE=chatml (not the model's own template): final/ and the
    checkpoint load with that template, so apply_chat_template renders as training did; the resumed run maps the
    cache the first run prepared."""
    from transformers import AutoTokenizer

    data = write_corpus(tmp_path / "data", "messages")
    train = {"model": str(chat_model), "chat_template": "chatml", "batch_size": "2", "max_steps": "2",
             "save_steps": "2", "log_steps": "1"}  # fmt: skip
    first = run_trainer([], env=env_for(tmp_path, data, **train))
    assert first.returncode == 0, first.stderr[-3000:]
    chatml = (REPO / "trainer/assets/chat_templates/chatml.jinja").read_text()
    messages = [{"role": r, "content": c} for r, c in turns(0)]
    for folder in ("final", "checkpoint-2"):
        saved = AutoTokenizer.from_pretrained(tmp_path / "out" / folder)
        assert saved.chat_template == chatml, folder
        rendered = saved.apply_chat_template(messages, tokenize=False)
        assert rendered.startswith("<|im_start|>system\nsysmark0 be brief<|im_end|>\n"), rendered
    cached = re.search(r"cached at (\S+)", first.stderr).group(1)
    second = run_trainer([], env=env_for(tmp_path, data, **{**train, "max_steps": "3"}))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "continuing from" in second.stderr and f"from the cache {cached} (no tokenization)" in second.stderr


def test_doctor_fails_conversations_without_a_template(tmp_path: Path) -> None:
    data = write_corpus(tmp_path / "data", "messages")
    result = run_trainer(["doctor", "--json"], env=env_for(tmp_path, data))
    assert result.returncode == 2, result.stderr[-3000:]
    row = next(c for c in json.loads(result.stdout)["checks"] if c["key"] == "chat")
    assert row["status"] == "fail" and "TRAIN_CHAT_TEMPLATE" in row["fix"]
    assert row["value"]["data_format"]["value"] == "messages"


def test_the_readmes_records_train_as_it_says(tmp_path: Path) -> None:
    """The one record of each format in README's "Train your own data", each in its own file of one folder, on the
    preset with TRAIN_CHAT_TEMPLATE=chatml (as the README says for a model without a template): all five are read,
    and the loss is where the README puts it (every token of text, the completion, the assistant turns)."""
    from trainer.tokenizer import byte_level_tokenizer

    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Train your own data") : readme.index("## Fine-tune a chat model")]
    records = re.search(r"```jsonl\n(.*?)```", section, re.S).group(1).strip().splitlines()
    assert len(records) == 5
    data = tmp_path / "data"
    data.mkdir()
    for i, record in enumerate(records):
        (data / f"record{i}.jsonl").write_text(record + "\n")
    sequences = show_json(env_for(tmp_path, data, chat_template="chatml", seq_len="128"))
    trained, untrained = trained_and_not(sequences, byte_level_tokenizer())
    assert "he quick brown fox jumps over the lazy dog.<|eos|>" in trained  # a record's first token is no target
    assert " fromage<|eos|>" in trained
    assert trained.count("Hello!") == 3  # messages, conversations, conversational prompt/completion
    assert "Translate to French: cheese" in untrained and "Hi" not in trained.replace("Hello!", "")
    summary = json.loads((next((tmp_path / "out" / ".cache" / "data").glob("*/meta.json"))).read_text())
    assert summary["records"] == 5


def test_tool_calls_train_with_the_builtin_chatml(tmp_path: Path) -> None:
    """Tool use as an OpenAI-style record: the record's `tools`, an assistant turn with tool_calls (arguments as a JSON
    string) and no content, the tool's answer, the final answer. The built-in chatml renders the tools in a system
    turn, the call as Hermes' <tool_call> JSON object, the answer in <tool_response> (what TRAIN_RL_TOOLS' episodes
    render, so a model taught here reads the same); the call and the final answer are trained, the tools, the tool's
    answer and the question are not."""
    from trainer.tokenizer import byte_level_tokenizer

    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tool = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                             "parameters": city}}  # fmt: skip
    record = {"messages": [{"role": "user", "content": "Weather in Paris?"},
                           {"role": "assistant", "content": None, "tool_calls": [call]},
                           {"role": "tool", "tool_call_id": "c1", "content": "18C, sunny"},
                           {"role": "assistant", "content": "It is 18C and sunny."}], "tools": [tool]}  # fmt: skip
    data = tmp_path / "data"
    data.mkdir()
    (data / "tools.jsonl").write_text(json.dumps(record) + "\n")
    sequences = show_json(env_for(tmp_path, data, chat_template="chatml", seq_len="1024"))
    trained, untrained = trained_and_not(sequences, byte_level_tokenizer())
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in trained
    assert "It is 18C and sunny.<|im_end|>" in trained
    assert "<|im_start|>tool\n<tool_response>\n18C, sunny\n</tool_response><|im_end|>" in untrained
    assert '<|im_start|>system\n<tools>\n{"type": "function", "function": {"name": "get_weather"' in untrained
    assert "Weather in Paris?" in untrained and "get_weather" not in trained.split("<tool_call>")[0]


def test_answers_cut_off_by_truncation_name_the_setting_in_force(tmp_path: Path) -> None:
    """Every answer past TRAIN_SEQ_LEN at the default TRAIN_LONG_RECORDS (truncate): the message says truncation cut
    them off (not `drop`, not "set truncate"), with the longest record and where the first answer starts; under
    drop it names drop and the length that keeps them."""
    data = tmp_path / "long.jsonl"
    prompt = "question " + "word " * 30
    rows = [{"messages": [{"role": "user", "content": f"{prompt}{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(6)]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**env_for(tmp_path, data, chat_template="chatml"), "TRAIN_SEQ_LEN": "64"}
    result = run_trainer(["data"], env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    message = result.stderr.strip().splitlines()[-1]
    assert "TRAIN_LONG_RECORDS=truncate cut every answer off at TRAIN_SEQ_LEN=64" in message, message
    assert "TRAIN_LONG_RECORDS=drop" not in message and "set TRAIN_LONG_RECORDS" not in message, message
    found = re.search(r"the longest record is (\d+) tokens, the first answer starts at token (\d+)", message)
    assert found, message
    longest, first = int(found[1]), int(found[2])
    assert 64 < first < longest, message
    assert f"raise TRAIN_SEQ_LEN above {first}" in message, message
    result = run_trainer(["data"], env={**env, "TRAIN_LONG_RECORDS": "drop"})
    message = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "TRAIN_LONG_RECORDS=drop dropped 6 longer than TRAIN_SEQ_LEN=64" in message
    assert f"the longest record is {longest} tokens" in message and f"raise TRAIN_SEQ_LEN to {longest}" in message
