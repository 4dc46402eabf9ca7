"""The launcher behind the image's `train` command: one process, or torchrun across GPUs and nodes.

`python -m trainer.launch [--dry-run] [COMMAND] [ARGS...]` decides the placement from the environment
the scheduler set, then runs `python -m trainer train` as its child (one node, one process: no torchrun) or
torchrun with a c10d rendezvous; other commands are exec'd. Placement sources, first match wins:

1. torchrun's variables: NNODES, NODE_RANK, RDZV_ENDPOINT / RDZV_ID / RDZV_BACKEND, MASTER_ADDR / MASTER_PORT;
2. torchrun's PET_* variables, which the Kubeflow training operator sets for a PyTorchJob
   (PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_NPROC_PER_NODE, PET_RDZV_*, PET_MAX_RESTARTS);
3. Slurm's: SLURM_JOB_ID, SLURM_STEP_NUM_NODES / SLURM_NNODES, SLURM_NODEID, SLURM_STEP_NODELIST / SLURM_JOB_NODELIST
   (the rendezvous port is derived from the job ID);
4. older Kubeflow operators: WORLD_SIZE (pods) and RANK with MASTER_ADDR.

Only TORCHELASTIC_RUN_ID means "already a torchrun worker": LOCAL_RANK, RANK, WORLD_SIZE and MASTER_* set by
anything else (enroot's PyTorch hook, an operator) are cleared before torchrun starts. A stop signal (SIGTERM,
SIGUSR1) goes to the trainer processes directly, not through torchrun, whose wait before SIGKILL is a fixed 30 s
before torch 2.12: the checkpoint gets the time the scheduler gives (trainer/launch/supervise.py).

Only `train` is distributed (trainer/commands.py); every other trainer command runs as one process.
Never imports torch: the decision must be quick and must not touch the GPUs.
"""
