"""Experiment trackers (TRAIN_REPORT_TO): TensorBoard, Weights & Biases, MLflow, through Transformers' own callbacks.

choice.py      the comma list, parsed and checked without torch
environment.py what each tracker reads from the environment (W&B offline under the output folder, MLflow's local
               store), reachability at start, the tracker run ids a resumed run continues (trackers.json, markers)
callbacks.py   Transformers' WandbCallback / MLflowCallback given the resolved TRAIN_* decisions (masked) as params
"""
