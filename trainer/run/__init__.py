"""The training run (`python -m trainer train`): train.py (the loop), models.py, checkpoint.py, metrics.py,
signals.py, profiling.py. Importing this package imports nothing heavy.
"""
