"""The questions `check` puts to an endpoint, each on the OpenAI API or, where the server has one, its own route:

- which models it serves (GET /v1/models: vLLM adds the folder it loaded, `root`);
- how it tokenizes a text (vLLM's POST /tokenize, llama-cpp-python's POST /extras/tokenize; others show nothing);
- how it renders a chat (vLLM's POST /tokenize with messages; elsewhere only the count, `usage.prompt_tokens`);
- its greedy answer to one prompt (temperature 0, at most the reference's tokens), as chat or as plain text, with
  the answer's token ids where the server returns them (vLLM's return_token_ids);
- whether it ends the answer at a stop token: the token forced by logit_bias, which a server that stops at it
  answers with an empty text and finish_reason "stop".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.check.client import Endpoint, Unreachable
from trainer.errors import ConfigError

FORCE = 100  # logit_bias that makes a token the greedy choice


@dataclass(frozen=True)
class Reply:
    text: str
    finish: str  # "stop", "length", ...
    prompt_tokens: int | None  # usage.prompt_tokens: the rendered prompt's length in the server's tokenizer
    tokens: int | None  # usage.completion_tokens
    ids: list[int] | None = None  # the answer's token ids, where the server returns them (vLLM's return_token_ids)


def served(endpoint: Endpoint, wanted: str | None) -> dict[str, Any]:
    """The /v1/models entry to check: --model, else the only one; ConfigError listing them otherwise."""
    listed = endpoint.required("GET", "/v1/models").get("data")
    models = [m for m in listed if isinstance(m, dict) and m.get("id")] if isinstance(listed, list) else []
    names = [str(m["id"]) for m in models]
    if wanted is not None:
        if wanted not in names:
            raise ConfigError(f"check --model {wanted}: {endpoint.url} serves {', '.join(names) or 'no model'}")
        return next(m for m in models if m["id"] == wanted)
    if len(models) != 1:
        raise ConfigError(f"check: {endpoint.url} serves {len(models)} models ({', '.join(names) or 'none'}); name the "
                          "one to check with --model")  # fmt: skip
    return models[0]


def tokenized(endpoint: Endpoint, model: str, text: str) -> tuple[list[int], str] | None:
    """The server's ids for `text` (no special tokens added where it can be told so) and the route; None where the
    server has no tokenize route."""
    answer = endpoint.post("/tokenize", {"model": model, "prompt": text, "add_special_tokens": False})
    if answer.status == 200 and isinstance(answer.body, dict) and isinstance(answer.body.get("tokens"), list):
        return [int(t) for t in answer.body["tokens"]], "POST /tokenize"
    answer = endpoint.post("/extras/tokenize", {"model": model, "input": text})
    if answer.status == 200 and isinstance(answer.body, dict) and isinstance(answer.body.get("tokens"), list):
        return [int(t) for t in answer.body["tokens"]], "POST /extras/tokenize"
    return None


def rendered(endpoint: Endpoint, model: str, user: str) -> list[int] | None:
    """vLLM's ids for one user turn as it renders chats (its tokenize route with messages); None elsewhere."""
    body = {"model": model, "messages": [{"role": "user", "content": user}], "add_generation_prompt": True}
    answer = endpoint.post("/tokenize", body)
    if answer.status == 200 and isinstance(answer.body, dict) and isinstance(answer.body.get("tokens"), list):
        return [int(t) for t in answer.body["tokens"]]
    return None


def _reply(body: dict[str, Any], chat: bool) -> Reply:
    try:
        choice = body["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
    except (KeyError, IndexError, TypeError):
        raise Unreachable(f"check: the endpoint's answer is not an OpenAI {'chat ' if chat else ''}completion: "
                          f"{str(body)[:300]}") from None  # fmt: skip
    usage = body.get("usage") or {}
    ids = choice.get("token_ids")
    return Reply(str(text or ""), str(choice.get("finish_reason")), usage.get("prompt_tokens"),
                 usage.get("completion_tokens"), [int(i) for i in ids] if isinstance(ids, list) else None)  # fmt: skip


def _body(model: str, prompt: str, tokens: int, chat: bool) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"model": model, "max_tokens": tokens, "temperature": 0, "seed": 0,
                            "return_token_ids": True}  # vLLM's; other servers pass over it  # fmt: skip
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


def ask(endpoint: Endpoint, model: str, prompt: str, tokens: int, chat: bool) -> Reply:
    """The greedy answer to one user turn (chat) or to plain text (completions)."""
    path, body = _body(model, prompt, tokens, chat)
    answer = endpoint.post(path, body)
    if answer.status != 200 or not isinstance(answer.body, dict):
        raise Unreachable(f"check: POST {endpoint.root}{path} answered HTTP {answer.status}: {str(answer.body)[:300]}")
    return _reply(answer.body, chat)


def forced(endpoint: Endpoint, model: str, prompt: str, tokens: int, chat: bool, token: int) -> Reply | None:
    """The answer with `token` forced (logit_bias); None when the server refuses logit_bias (HTTP 4xx)."""
    path, body = _body(model, prompt, tokens, chat)
    answer = endpoint.post(path, {**body, "logit_bias": {str(token): FORCE}})
    if 400 <= answer.status < 500:
        return None
    if answer.status != 200 or not isinstance(answer.body, dict):
        raise Unreachable(f"check: POST {endpoint.root}{path} answered HTTP {answer.status}: {str(answer.body)[:300]}")
    return _reply(answer.body, chat)
