"""Will it fit? The memory prediction: a model of a resolved run (not a setting), torch-free, on the floor above config/
(it reads a RunConfig) and below the commands and the run that ask it: predict.py (the predicted peak per process by
part), model_config.py (a model folder's config.json read, or refused saying why), zero.py (DeepSpeed ZeRO's layout
per rank), fit.py (the prediction of a RunConfig, the verdict against a GPU, the cheapest changes that fit, the
refusal of a GPU run predicted not to fit).

`config`, `train` and `doctor` resolve a run and call `predicted(cfg)`; `doctor --memory` reports it for any GPU; the
batch search (trainer/run/batch_search.py) starts from `largest_batch`.
"""

from trainer.memory.fit import check, predicted

__all__ = ["check", "predicted"]
