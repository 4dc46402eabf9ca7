"""The training run (`python -m trainer train`): train.py (the loop), training_model.py (the model trainer.model
builds, placed and compiled for the run), checkpoint.py, metrics.py, signals.py, profiling.py.
Importing this package imports nothing heavy.
"""
