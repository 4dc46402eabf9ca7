"""The training run (`python -m trainer train`): train.py (the loop), resume.py (what to resume, whether the run may
continue; what a checkpoint recorded is trainer.checkpoint_record's), models.py, checkpoint.py, metrics.py,
signals.py, profiling.py.
Importing this package imports nothing heavy (resume.py is torch-free: the configuration's checks ask it).
"""
