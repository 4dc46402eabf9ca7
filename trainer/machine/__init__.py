"""What this machine is: below both `trainer.config` and `trainer.run`, so both ask it and neither imports the other
for it. hardware.py (the GPU, its capabilities, the installed libraries: `probe()` imports torch lazily), gpus.py
(the GPU count taken without torch, and the processes-per-node rule), peaks.py (a GPU's peak FLOP/s, for mfu),
disk.py (whether a failed write is a full disk, and where: the run's and export's one rule). Importing this package
imports nothing heavy.
"""
