"""A compiled training run observed from inside, for tests/trainer/test_compile.py:

    python tests/trainer/compiled_probe.py    (TRAIN_* from the environment, as `python -m trainer` reads them)

Runs `python -m trainer train` in this process with two observers: the attention function the model is built
with (trainer.model.packed_attention.CAUSAL_SDPA, Transformers' sdpa) is registered wrapped, counting the masks it is
given, and torch._dynamo's counters say how many graphs were compiled. Prints one JSON line last.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any


def main() -> None:
    import torch._dynamo.utils
    from torch._dynamo.comptime import comptime
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from trainer.__main__ import main as trainer_main
    from trainer.model.packed_attention import CAUSAL_SDPA

    masks: list[bool] = []  # True: no mask. Compiled code records at trace time (comptime runs in the compiler
    # and leaves the graph and its guards as they were); eager calls record each call.

    def traced(ctx: Any) -> None:
        mask = ctx.get_local("attention_mask")
        masks.append(mask.is_python_constant() and mask.as_python_constant() is None)

    def recording(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            comptime(traced)
        else:
            masks.append(attention_mask is None)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(CAUSAL_SDPA, recording)
    code = trainer_main(["train"])
    counters = torch._dynamo.utils.counters
    seen = Counter("none" if m else "mask" for m in masks)
    print(json.dumps({"exit": code, "masks": dict(seen), "stats": dict(counters["stats"]),
                      "frames": dict(counters["frames"]), "breaks": len(counters["graph_break"])}))  # fmt: skip


if __name__ == "__main__":
    main()
