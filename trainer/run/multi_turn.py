"""Multi-turn GRPO (TRAIN_RL_TOOLS, TRAIN_RL_ENVIRONMENT): TRL's tool loop with the tokens trained equal to the tokens
generated, the tools made safe and each step's turns counted.

What TRL 1.16's loop does (GRPOTrainer._tool_call_loop): it parses each completion's tool calls, runs them, renders
the tool results through the chat template as the token ids that follow the model's turn (`_get_tool_suffix_ids`)
and generates the next turn from prompt + completion + those ids, concatenated as ids, never decoded and encoded
again, on both engines; the tool ids get 0 in the tool mask, which multiplies the loss mask. Two things in it assume
that the end of an assistant turn is the tokenizer's EOS token, which trainkit's byte-level tokenizer with the
built-in chatml (and any template whose end of turn is not EOS) breaks:

- Generation stops at EOS only, so the model writes past the end of its turn (into a tool result of its own, which
  then parses as no tool call at all). Here it stops at the template's end of turn (`<|im_end|>`: Transformers'
  stop strings, vLLM's `stop`), and each turn's ids are cut right after the token that completes it: what follows
  there is padding, never something the model generated.
- The tool-result ids are taken from the template's rendering after the last EOS of an assistant turn; with no EOS
  there, TRL's slice starts after the whole `<|im_end|>\\n` and the newline the template puts before the tool turn is
  missing from what the model reads next. Here the slice starts right after the end of turn, as the model's turn
  ends.

The user's tools (and environment methods) are wrapped before each loop (trainer.run.tool_calls: arguments checked,
time limit, failures as messages). Logged per step (metrics.jsonl and the trackers, summed over processes):
tools/turns_per_episode (assistant turns, mean), tools/calls, tools/errors (failed calls, timeouts included),
tools/timeouts, tools/turn_limit (episodes that still asked for a tool at TRAIN_RL_MAX_TURNS).
"""

from __future__ import annotations

import functools
from typing import Any

from trainer.errors import ConfigError
from trainer.run.tool_calls import CallCounts, guarded

TURNS = "tools/turns_per_episode"


@functools.cache  # one subclass per base
def multi_turn(base: type) -> type:
    """`base` (TRL's GRPOTrainer, or a subclass of it) with the tool loop as the module says; `setup` arms it."""

    class MultiTurn(base):
        turn_end: str | None = None
        tool_timeout: float = 0.0
        max_turns: int = 0

        def setup_turns(self, turn_end: str | None, tool_timeout: float, max_turns: int) -> None:
            """The end-of-turn text generation stops at, each tool call's time limit, the most assistant turns."""
            self.turn_end, self.tool_timeout, self.max_turns = turn_end, tool_timeout, max_turns
            self.args.max_tool_calling_iterations = self.max_tool_calling_iterations = max_turns - 1
            if turn_end:
                stop_at(self, turn_end)

        def _generate_single_turn(self, *args: Any, **kwargs: Any) -> tuple[list[list[int]], Any]:
            completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
            if not self.turn_end:
                return completion_ids, logprobs
            kept = [through_turn_end(self._tokenizer, ids, self.turn_end) for ids in completion_ids]
            if logprobs is not None:
                logprobs = [lp[: len(ids)] for lp, ids in zip(logprobs, kept, strict=True)]
            return kept, logprobs

        def _get_tool_suffix_ids(self, tool_messages: list[dict[str, Any]]) -> list[int]:
            if not self.turn_end:
                return super()._get_tool_suffix_ids(tool_messages)
            return tool_suffix_ids(self, tool_messages)

        def _tool_call_loop(self, *args: Any, **kwargs: Any) -> Any:
            counts = CallCounts()
            for tools in (*self._sync_tool_dicts, *self._async_tool_dicts):
                for name, tool in tools.items():
                    tools[name] = guarded(name, tool, self.tool_timeout, counts)
            out = super()._tool_call_loop(*args, **kwargs)
            completions, calls, failures = out[1], out[4], out[5]
            self._record_turns(completions, [calls, failures, counts.timeouts])
            return out

        def _record_turns(self, completions: list[list[dict[str, Any]]], counts: list[int]) -> None:
            import torch

            turns = [sum(m.get("role") == "assistant" for m in c) for c in completions]
            limited = sum(t >= self.max_turns and bool(c and c[-1].get("tool_calls")) for t, c in
                          zip(turns, completions, strict=True))  # fmt: skip
            device = self.accelerator.device
            summed = self.accelerator.gather(torch.tensor([[*counts, limited, sum(turns), len(turns)]],
                                                          device=device)).sum(dim=0).tolist()  # fmt: skip
            metrics = self._metrics["train" if self.model.training else "eval"]
            for key, value in zip(("tools/calls", "tools/errors", "tools/timeouts", "tools/turn_limit"), summed,
                                  strict=False):  # fmt: skip
                metrics[key].append(float(value))
            metrics[TURNS].append(summed[4] / max(1, summed[5]))

    MultiTurn.__name__ = MultiTurn.__qualname__ = f"MultiTurn{base.__name__}"
    return MultiTurn


def through_turn_end(tokenizer: Any, ids: list[int], turn_end: str) -> list[int]:
    """`ids` up to and including the token that completes the first `turn_end` in their text (all of them when it is
    not there). Only tokens are dropped, never changed."""
    if turn_end not in tokenizer.decode(ids, skip_special_tokens=False):
        return list(ids)
    low, high = 1, len(ids)  # the text of ids[:k] holds turn_end for every k from the answer on: bisect it
    while low < high:
        middle = (low + high) // 2
        if turn_end in tokenizer.decode(ids[:middle], skip_special_tokens=False):
            high = middle
        else:
            low = middle + 1
    return list(ids[:low])


def tool_suffix_ids(trainer: Any, tool_messages: list[dict[str, Any]]) -> list[int]:
    """The ids the template puts after an assistant turn that called a tool, through the tool results to the next
    assistant header: its rendering of a conversation with them, less the rendering through the end of the turn."""
    calls = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
    before: list[dict[str, Any]] = [{"role": "user", "content": "dummy"},
                                    {"role": "assistant", "content": "", "tool_calls": calls}]
    tokenizer, end = trainer.processing_class, trainer.turn_end

    def render(messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                             chat_template=trainer.chat_template,
                                             **trainer.chat_template_kwargs)  # fmt: skip

    turn, full = render(before, False), render(before + tool_messages, True)
    if end not in turn:
        raise ConfigError(f"the chat template does not end an assistant turn that calls a tool with {end!r}, as it "
                          "ends its other turns; use TRAIN_CHAT_TEMPLATE=chatml or fix the template")  # fmt: skip
    through = turn[: turn.rindex(end) + len(end)]
    turn_ids = tokenizer(through, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    if not full.startswith(through) or full_ids[: len(turn_ids)] != turn_ids:
        raise ConfigError("the chat template renders an assistant turn differently once tool results follow it; use "
                          "TRAIN_CHAT_TEMPLATE=chatml or a template that keeps earlier turns as they are")  # fmt: skip
    return full_ids[len(turn_ids) :]


def stop_at(trainer: Any, turn_end: str) -> None:
    """Generation stops where a turn ends: a token of its own (`<|im_end|>` in most tokenizers) is one more EOS for
    TRL's generation and masks, or vLLM's stop token; a text of several tokens (the byte-level tokenizer) is a stop
    string of Transformers' generate or vLLM."""
    ids = trainer.processing_class(turn_end, add_special_tokens=False)["input_ids"]
    vllm = getattr(trainer, "vllm_generation", None)
    if len(ids) == 1:
        if vllm is not None:
            vllm.generation_kwargs = {**(vllm.generation_kwargs or {}), "stop_token_ids": ids}
        trainer.eos_token_ids = [*trainer.eos_token_ids, *ids]
        if getattr(trainer, "generation_config", None) is not None:
            trainer.generation_config.eos_token_id = list(trainer.eos_token_ids)
            trainer.generation_kwargs["eos_token_id"] = list(trainer.eos_token_ids)
        return
    if vllm is not None:
        vllm.generation_kwargs = {**(vllm.generation_kwargs or {}), "stop": [turn_end],
                                  "include_stop_str_in_output": True}  # fmt: skip
        return
    trainer.generation_config.stop_strings = [turn_end]
    stop_with_tokenizer(trainer.model, trainer.processing_class)


def stop_with_tokenizer(model: Any, tokenizer: Any) -> None:
    """Transformers' stop strings need the tokenizer at generate(); TRL calls the policy's generate without it."""
    generate = model.generate

    @functools.wraps(generate)
    def with_tokenizer(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("tokenizer", tokenizer)
        return generate(*args, **kwargs)

    model.generate = with_tokenizer
