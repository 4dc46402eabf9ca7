"""Conversations: record layouts, roles, the chat template, and which tokens the loss is taken on.

Layouts of a record (one per file, `layout_of_record` / `layout_of_columns`):
- `messages`: OpenAI style, a list of {role, content}; roles system, user, assistant, tool (passed to the template
  as they are, with any other keys such as tool_calls or name), and the record's `tools` (OpenAI tool definitions,
  rendered by the template as the model will see them in online RL with TRAIN_RL_TOOLS);
- `conversations`: ShareGPT, a list of {from, value}; `from` human/gpt/system/tool (FROM_ROLES) maps onto the roles;
- `chat_pair`: prompt/completion where the prompt and/or the completion is a message list;
- `pair` (prompt/completion text) and `text` stay with shards.py;
- `prompt`: a prompt alone (no answer), online RL's (trainer.data.prompts).

`ChatEncoder` (trainer.data.chat_encoder) renders conversations with the tokenizer's chat template (Transformers'
`apply_chat_template`) and marks the trained tokens (TRAIN_LOSS_ON): the template's `{% generation %}` blocks through
`return_assistant_tokens_mask` where it has them, else by rendering prefixes (the text an assistant turn adds to
the rendering of the turns before it, after the generation prompt). No template is parsed by hand.
The template text comes from TRAIN_CHAT_TEMPLATE (a .jinja file or a built-in name) or the tokenizer's own; this
module finds it without importing torch or transformers, so a conversation corpus without one exits 2 first.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.data import preference
from trainer.errors import ConfigError
from trainer.methods import of

ROLES = ("system", "user", "assistant", "tool")
FROM_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
              "tool": "tool", "observation": "tool", "function_call": "assistant"}  # fmt: skip
CHAT_LAYOUTS = ("messages", "conversations", "chat_pair")
LAYOUT_NAMES = {"messages": "messages", "conversations": "ShareGPT conversations", "chat_pair":
                "conversational prompt/completion", "pair": "prompt/completion", "text": "text",
                "prompt": "prompts (no answers)",
                **preference.PREFERENCE_LAYOUTS}  # fmt: skip
TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "assets" / "chat_templates"
BUILTIN_TEMPLATES = {p.stem: p for p in sorted(TEMPLATES_DIR.glob("*.jinja"))}
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


class BadRecord(ValueError):
    """A record that cannot be trained on; the message says why (the caller adds file and line)."""


# ---- layouts ---------------------------------------------------------------------------------------------------


def layout_of_record(row: dict[str, Any], text_field: str) -> str | None:
    """The layout of one JSON record; None when it holds nothing trainkit reads."""
    found = preference.layout_of_record(row)
    if found:
        return found
    if isinstance(row.get("messages"), list):
        return "messages"
    if isinstance(row.get("conversations"), list):
        return "conversations"
    if row.get("prompt") is not None and row.get("completion") is not None:
        return "chat_pair" if isinstance(row["prompt"], list) or isinstance(row["completion"], list) else "pair"
    if text_field in row:
        return "text"
    return "prompt" if row.get("prompt") is not None else None


def layout_of_columns(schema: Any, text_field: str) -> str | None:
    """The layout of a table by its pyarrow schema (parquet, arrow, save_to_disk)."""
    import pyarrow as pa

    names = schema.names
    found = preference.layout_of_columns(schema)
    if found:
        return found
    for layout in ("messages", "conversations"):
        if layout in names and pa.types.is_list(schema.field(layout).type):
            return layout
    if "prompt" in names and "completion" in names:
        is_list = [pa.types.is_list(schema.field(n).type) or pa.types.is_large_list(schema.field(n).type)
                   for n in ("prompt", "completion")]  # fmt: skip
        return "chat_pair" if any(is_list) else "pair"
    if text_field in names:
        return "text"
    return "prompt" if "prompt" in names else None


def file_layout(path: Path, text_field: str) -> str | None:
    """The layout of a data file: its first record's (JSON Lines, .json) or its columns' (parquet, arrow, a
    save_to_disk folder); None when it has no field trainkit reads, or cannot be read (the reader names why).
    Conversations and other records do not share a file."""
    try:
        return _file_layout(path, text_field)
    except Exception:  # a corrupt file: the reader reports it by name when it gets there
        return None


def _file_layout(path: Path, text_field: str) -> str | None:
    from trainer.data.formats import file_kind, open_text

    if path.is_dir():
        path = next(iter(sorted(path.rglob("*.arrow"))), path)
    kind = file_kind(path)
    if kind is None or kind.format == "text":
        return "text"
    if kind.format in ("parquet", "arrow"):
        return layout_of_columns(_schema(path, kind.format), text_field)
    if kind.format == "csv":
        return None
    with open_text(path) as handle:
        first = next((line for line in handle if line.strip()), "")
        try:
            row = json.loads(first)
        except ValueError:  # not JSON Lines: a .json document (read whole, as the reader does), or malformed
            row = _first_document_row(first + handle.read()) if kind.format == "json" else None
    return layout_of_record(row, text_field) if isinstance(row, dict) else None


def _first_document_row(text: str) -> Any:
    """The first record of a JSON document: a list of records, an object holding one, or one record."""
    try:
        content = json.loads(text)
    except ValueError:
        return None
    if isinstance(content, dict) and layout_of_record(content, "") not in CHAT_LAYOUTS:
        lists = [v for v in content.values() if isinstance(v, list)]
        content = lists[0] if len(lists) == 1 else content
    if isinstance(content, list):
        return content[0] if content else None
    return content


def _schema(path: Path, fmt: str) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if fmt == "parquet":
        return pq.read_schema(path)
    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_stream(source).schema
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_file(source).schema


def columns_of_layout(layout: str, text_field: str) -> list[str]:
    return {"messages": ["messages"], "conversations": ["conversations"], "chat_pair": ["prompt", "completion"],
            "pair": ["prompt", "completion"]}.get(layout, [text_field])  # fmt: skip


# ---- records -> conversations ----------------------------------------------------------------------------------


@dataclass
class Conversation:
    """Messages in the roles the template knows; turns from `first_trained` on may be trained (a conversational
    prompt/completion trains its completion only); `where` is the record's file and line, for messages."""

    messages: list[dict[str, Any]]
    first_trained: int
    where: str
    tools: list[dict[str, Any]] | None = None  # the record's tool definitions (messages layout), for the template


def conversation_of(row: dict[str, Any], layout: str, where: str) -> Conversation:
    """The record as a Conversation; BadRecord says what is wrong with it."""
    if layout == "messages":
        return Conversation(_messages(row.get("messages"), "role", "content", None), 0, where, _tools(row.get("tools")))
    if layout == "conversations":
        return Conversation(_messages(row.get("conversations"), "from", "value", FROM_ROLES, "conversations"), 0,
                            where)  # fmt: skip
    prompt = _side(row.get("prompt"), "user", "prompt")
    completion = _side(row.get("completion"), "assistant", "completion")
    return Conversation(prompt + completion, len(prompt), where)


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """A record's `tools`: OpenAI tool definitions ({"type": "function", "function": {name, description,
    parameters}}), as apply_chat_template takes them."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise BadRecord(f"tools must be a list of tool definitions (objects), not {type(value).__name__}")
    return value or None


def check_trainable(conv: Conversation, loss_on: str) -> None:
    """BadRecord when the loss would be taken on nothing (no assistant turn, unless TRAIN_LOSS_ON=all)."""
    if loss_on != "all" and not trained_turns(conv, loss_on):
        part = "its completion has" if conv.first_trained else "it has"
        raise BadRecord(f"{part} no assistant turn to learn from; add one, or set TRAIN_LOSS_ON=all to train on "
                        "every token")  # fmt: skip


def _side(value: Any, role: str, name: str) -> list[dict[str, Any]]:
    if isinstance(value, list):
        return _messages(value, "role", "content", None, name)
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    raise BadRecord(f"{name} must be text or a list of messages, not {type(value).__name__}")


def _messages(items: Any, role_key: str, content_key: str, mapping: dict[str, str] | None, name: str = "messages"
              ) -> list[dict[str, Any]]:  # fmt: skip
    if not isinstance(items, list) or not items:
        raise BadRecord(f"{name} must be a non-empty list of messages")
    out = []
    for n, item in enumerate(items, 1):
        if not isinstance(item, dict):
            raise BadRecord(f"{name}[{n}] is {type(item).__name__}, not an object with {role_key!r} and "
                            f"{content_key!r}")  # fmt: skip
        raw = item.get(role_key)
        role = mapping.get(raw) if mapping is not None and isinstance(raw, str) else raw
        if role not in ROLES:
            known = ", ".join(mapping) if mapping is not None else ", ".join(ROLES)
            raise BadRecord(f"{name}[{n}] has unknown {role_key} {raw!r}; use one of {known}")
        content = item.get(content_key)
        if not isinstance(content, str) and not (content is None and item.get("tool_calls")):
            what = "no content" if content is None else f"content of type {type(content).__name__}, not text"
            raise BadRecord(f"{name}[{n}] ({role_key} {raw}) has {what}; every message needs its text in "
                            f"{content_key!r}")  # fmt: skip
        message = {k: v for k, v in item.items() if k not in (role_key, content_key)} if mapping is None else {}
        out.append({"role": role, "content": content, **message})
    return out


def in_file_order(bad: list[str]) -> list[str]:
    """Bad-record messages ("path:line: why", "path:record N: why") sorted by line, however they were found."""
    found = [re.search(r":(?:record )?(\d+): ", line) for line in bad]
    return [line for _, line in sorted(zip([int(m.group(1)) if m else 0 for m in found], bad, strict=True),
                                       key=lambda pair: pair[0])]  # fmt: skip


def trained_turns(conv: Conversation, loss_on: str) -> list[int]:
    """Indices of the assistant turns the loss is taken on (TRAIN_LOSS_ON=assistant or last)."""
    turns = [i for i, m in enumerate(conv.messages) if i >= conv.first_trained and m["role"] == "assistant"]
    return turns[-1:] if loss_on == "last" else turns


# ---- the template's text, found without transformers -----------------------------------------------------------


@dataclass(frozen=True)
class TemplateChoice:
    text: str | None
    origin: str  # what the `config`/`doctor` reports and the log say
    from_setting: bool = False  # TRAIN_CHAT_TEMPLATE's: it replaces the tokenizer's own


def chosen_template(setting: str, tokenizer_folder: str | Path | None) -> TemplateChoice:
    """TRAIN_CHAT_TEMPLATE's template (a built-in name or a .jinja file) or the tokenizer folder's own."""
    if setting:
        if setting in BUILTIN_TEMPLATES:
            return TemplateChoice(BUILTIN_TEMPLATES[setting].read_text(), f"built-in {setting} (TRAIN_CHAT_TEMPLATE)",
                                  True)  # fmt: skip
        path = Path(setting)
        if not path.is_file():
            raise ConfigError(
                f"TRAIN_CHAT_TEMPLATE={setting!r} is neither a built-in template ({', '.join(BUILTIN_TEMPLATES)}) "
                "nor a Jinja file; give a readable .jinja file path or a built-in name"
            )
        return TemplateChoice(path.read_text(encoding="utf-8"), f"{path} (TRAIN_CHAT_TEMPLATE)", True)
    if tokenizer_folder is None or not Path(tokenizer_folder).is_dir():
        return TemplateChoice(None, "the byte-level tokenizer has none")
    found = folder_template(Path(tokenizer_folder))
    return TemplateChoice(found[0], f"the tokenizer's own ({found[1]})") if found else TemplateChoice(
        None, f"{tokenizer_folder} has none")  # fmt: skip


def folder_template(folder: Path) -> tuple[str, str] | None:
    """(template text, file it came from) of a saved tokenizer: chat_template.jinja (transformers 5),
    chat_template.json, or tokenizer_config.json's chat_template (a named set: its "default")."""
    for name in (*TEMPLATE_FILES, "tokenizer_config.json"):
        path = folder / name
        if not path.is_file():
            continue
        if name.endswith(".jinja"):
            return path.read_text(encoding="utf-8"), str(path)
        try:
            template = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
        except (ValueError, AttributeError):
            continue
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if isinstance(template, str) and template:
            return template, str(path)
    return None


def template_problems(source: Any, setting: str, tokenizer_folder: str) -> list[str]:
    """TRAIN_CHAT_TEMPLATE (`setting`) that names nothing; conversations with no template anywhere."""
    try:
        choice = chosen_template(setting, tokenizer_folder)
    except ConfigError as exc:
        return exc.problems
    if source.conversational and choice.text is None:
        return [no_template_problem(source.layout_names(), choice.origin)]
    return []


LOSS_ON_MEANING = {"assistant": "every assistant turn", "last": "the last assistant turn",
                   "all": "every token"}  # fmt: skip


def chat_report(source: Any, loss_on: str, template_setting: str, tokenizer_folder: str, method: str = "sft"
                ) -> dict[str, tuple[str, str]]:  # fmt: skip
    """{what: (value, reason)} for `config`'s decisions and `doctor`: the detected format (TRAIN_LOSS_ON `loss_on`,
    or a preference `method`'s rule), the template (TRAIN_CHAT_TEMPLATE `template_setting`, else the tokenizer
    folder's own)."""
    setting = f"TRAIN_LOSS_ON={loss_on}"
    if of(method).family != "sft":
        trained = f"TRAIN_METHOD={method}: each side's answer trained, never the prompt"
    elif source.conversational:
        trained = f"loss on {LOSS_ON_MEANING[loss_on]} ({setting})"
    elif "pair" in source.layouts and loss_on != "all":
        trained = f"loss on the completions ({setting})"
    else:
        trained = f"loss on every token ({setting})"
    data_format = (source.layout_names(), trained)
    try:
        choice = chosen_template(template_setting, tokenizer_folder)
    except ConfigError as exc:
        return {"data_format": data_format, "chat_template": ("refused", exc.message)}
    if not choice.text:
        return {"data_format": data_format, "chat_template": ("none", choice.origin)}
    marked = "{% generation %} markers" if GENERATION_TAG.search(choice.text) else "prefix rendering"
    if "preference_chat" in source.layouts:
        use = "renders the conversational pairs (TRL's chat-template tokenization)"
    else:
        use = f"renders the conversations (trained tokens by {marked})" if source.conversational else "no conversations"
    return {"data_format": data_format, "chat_template": (choice.origin, f"{use}; saved with final/ and checkpoints")}


def no_template_problem(layout_names: str, origin: str) -> str:
    return (
        f"TRAIN_DATA holds conversations ({layout_names}) but there is no chat template to render them ({origin}); "
        f"set TRAIN_CHAT_TEMPLATE to a built-in ({', '.join(BUILTIN_TEMPLATES)}) or a .jinja file, or use a "
        "TRAIN_MODEL/TRAIN_TOKENIZER whose tokenizer has a chat template"
    )


def template_hash(tokenizer: Any) -> str:
    import hashlib
    template = getattr(tokenizer, "chat_template", None)
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16] if template else ""


def assistant_spans(render: Any, conv: Conversation, loss_on: str) -> tuple[str, list[tuple[int, int]]]:
    """(the rendered conversation, the character spans of its trained turns): a turn's text is what rendering it
    adds to the turns before it, after the generation prompt (`render(messages, **kwargs)`: the chat template)."""
    full = render(conv.messages)
    spans = []
    for i in trained_turns(conv, loss_on):
        before = render(conv.messages[:i], add_generation_prompt=True) if i else ""
        through = render(conv.messages[: i + 1])
        if not full.startswith(through):
            raise BadRecord(
                f"the chat template renders turn {i + 1} differently once later turns follow, so its tokens "
                "cannot be told apart; use a template with {% generation %} markers (TRAIN_CHAT_TEMPLATE) or "
                "TRAIN_LOSS_ON=last"
            )
        start = len(before) if through.startswith(before) else len(render(conv.messages[:i]))
        spans.append((start, len(through)))
    return full, spans
