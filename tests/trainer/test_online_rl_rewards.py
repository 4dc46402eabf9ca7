"""Online RL's built-in rewards on real strings (trainer.run.rewards: `math` through math-verify, `exact`), the
stacks that refuse `math` (named with the row, before torch), and `exact` learned in training: the tiny preset is
fine-tuned toward a prompts file's answers (SFT), then GRPO from that folder with TRAIN_REWARD=exact raises the
share of exact answers."""

from __future__ import annotations

import re

import pytest

from trainer import compat
from trainer.config.online import reward_stack_problems
from trainer.config.parse import parse_settings
from trainer.run.rewards import exact, math


def test_math_checks_the_answer_as_mathematics() -> None:
    completions = ["\\boxed{1/2}", "so x = 0.5", "The answer is $\\frac{1}{2}$.", "0.25", "no idea", "\\boxed{2/4}"]
    assert math([None] * 6, completions, ["0.5"] * 6) == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    chat = [[{"role": "assistant", "content": "x = \\boxed{\\frac{\\sqrt{2}}{2}}"}], "$(x+1)^2$", "3"]
    assert math([None] * 3, chat, ["\\frac{1}{\\sqrt{2}}", "x^2+2x+1", "4"]) == [1.0, 1.0, 0.0]
    for answer in ("?", ""):
        with pytest.raises(ValueError, match=re.escape(f"the answer {answer!r} holds no mathematics")):
            math([None], ["1"], [answer])
    assert exact([None] * 3, [" Paris ", "paris.", "PARIS"], ["paris"] * 3) == [1.0, 0.0, 1.0]


def test_math_is_refused_where_math_verify_is_not_installed() -> None:
    """Here (the default row) math runs; a stack without math-verify (the Python 3.10 rows, where TRL is not
    either) refuses it naming the row. The real 12.1 stack's refusal: tests/trainer/test_rows.py."""
    settings = parse_settings({"TRAIN_METHOD": "grpo", "TRAIN_REWARD": "exact,math:0.5"})
    assert reward_stack_problems(settings) == []
    without = compat.Stack(torch=(2, 1, 2), transformers=(4, 46, 3), flash_attn=None, trl=None, math_verify=None)
    problem = compat.switch_problem("TRAIN_REWARD=math", without)
    assert problem is not None and problem.startswith(
        "TRAIN_REWARD=math is not supported on this stack (torch 2.1.2, transformers 4.46.3): math-verify"
    ), problem
    assert compat.switch_problem("TRAIN_REWARD=math") is None
