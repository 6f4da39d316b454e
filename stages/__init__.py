"""DVC stages: one module per stage, run as `python -m stages.<name>` (see dvc.yaml).

Each stage is thin: parse arguments, load and validate params.yaml, call library code in `parity`,
write its declared outputs atomically. Light stages (env, inputs, diff, report) never import torch.
"""
