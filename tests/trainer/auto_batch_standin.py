"""`python -m trainer train` in this process with TRAIN_AUTO_BATCH's search on a stand-in for a GPU's memory:
`python auto_batch_standin.py SEQUENCES` (TRAIN_* from the environment, as `python -m trainer` reads them).

A CPU has no out-of-memory error to search against, so the device's memory is the one thing stood in for
(tests/trainer/batch_search_ranks.py's StandInDevice, holding SEQUENCES sequences at most): the run's own model
gets its allocation hook, and the search reads its memory instead of CUDA's. Everything else is the real run: the
search, the cache, the decisions, run_config.json. Prints one JSON line last: the exit code.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> None:
    from batch_search_ranks import StandInDevice

    import trainer.run.batch_search as batch_search
    import trainer.run.training_model as models
    from trainer.__main__ import main as trainer_main

    device = StandInDevice(int(sys.argv[1]))
    build = models.build_model

    def build_on_the_device(*args: Any, **kwargs: Any) -> Any:
        return device.attach(build(*args, **kwargs))

    models.build_model = build_on_the_device
    batch_search.device_memory = lambda _device: device
    print(json.dumps({"exit": trainer_main(["train"])}))


if __name__ == "__main__":
    main()
