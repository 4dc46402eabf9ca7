"""An Ollama Modelfile beside each GGUF file: FROM the file, the chat template as Ollama's Go template, stop tokens.

The Go template is rendered from the tokenizer's own chat template: each role's message is rendered alone around a
marker, which gives the text before and after that role's content, and the generation prompt is what
add_generation_prompt adds. The Go template puts those pieces around each message. `render` computes what that Go
template makes of a conversation; the Modelfile is written only when that equals apply_chat_template's string for a
sample conversation, else without a TEMPLATE (the log and the report say so).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MARK = "\x00trainkit-content\x00"
ROLES = ("system", "user", "assistant")
SAMPLE = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Name a colour."},
          {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "And another?"}]  # fmt: skip


@dataclass(frozen=True)
class ChatTemplate:
    affixes: dict[str, tuple[str, str]]  # role -> (before its content, after it)
    generation: str  # what add_generation_prompt appends

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """What the Modelfile's Go template renders for `messages` (its `.Messages`), as Ollama would."""
        text = "".join(self.affixes[m["role"]][0] + m["content"] + self.affixes[m["role"]][1] for m in messages)
        ends_open = bool(messages) and messages[-1]["role"] != "assistant"
        return text + (self.generation if add_generation_prompt and ends_open else "")

    def go_template(self) -> str:
        branches = "".join(f'{{{{ {"if" if i == 0 else "else if"} eq .Role "{role}" }}}}{_go(pre)}{{{{ .Content }}}}'
                           f"{_go(post)}" for i, (role, (pre, post)) in enumerate(self.affixes.items()))  # fmt: skip
        return ("{{- range $i, $_ := .Messages }}{{- $last := eq (len (slice $.Messages $i)) 1 }}" + branches
                + '{{ end }}{{- if and $last (ne .Role "assistant") }}' + _go(self.generation) + "{{ end }}{{- end }}")


def _go(text: str) -> str:
    """`text` as literal output in a Go template (a string action when it holds braces)."""
    return text if "{{" not in text and "}}" not in text else "{{ " + json.dumps(text) + " }}"


def _split(rendered: str) -> tuple[str, str] | None:
    return tuple(rendered.split(MARK)) if rendered.count(MARK) == 1 else None  # type: ignore[return-value]


def chat_template(tokenizer: PreTrainedTokenizerBase) -> ChatTemplate | None:
    """The tokenizer's chat template as pieces, when it has one and the pieces reproduce it on SAMPLE."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    affixes: dict[str, tuple[str, str]] = {}
    try:
        for role in ROLES:
            pieces = _split(tokenizer.apply_chat_template([{"role": role, "content": MARK}], tokenize=False))
            if pieces is not None:
                affixes[role] = pieces
        one = [{"role": "user", "content": MARK}]
        plain = tokenizer.apply_chat_template(one, tokenize=False)
        generation = tokenizer.apply_chat_template(one, tokenize=False, add_generation_prompt=True)[len(plain):]
        expected = tokenizer.apply_chat_template(SAMPLE, tokenize=False, add_generation_prompt=True)
    except Exception:  # a template that refuses lone messages: no Go template can be read off it
        return None
    found = ChatTemplate(affixes, generation)
    if set(affixes) != set(ROLES) or found.render(SAMPLE) != expected:
        return None
    return found


def stop_tokens(tokenizer: PreTrainedTokenizerBase, template: ChatTemplate | None) -> list[str]:
    """The eos token, and the end of an assistant turn where the template marks one (e.g. <|im_end|>)."""
    stops = [str(tokenizer.eos_token)] if getattr(tokenizer, "eos_token", None) else []
    if template is not None:
        end = template.affixes["assistant"][1].strip()
        if end and end not in stops:
            stops.append(end)
    return stops


def modelfile(gguf_name: str, tokenizer: PreTrainedTokenizerBase) -> tuple[str, bool]:
    """(the Modelfile's text, whether it carries the chat template)."""
    template = chat_template(tokenizer)
    lines = [f"FROM ./{gguf_name}"]
    if template is not None:
        lines.append(f'TEMPLATE """{template.go_template()}"""')
    lines += [f"PARAMETER stop {json.dumps(stop)}" for stop in stop_tokens(tokenizer, template)]
    return "\n".join(lines) + "\n", template is not None
