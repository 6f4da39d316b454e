"""DVC stages: one module per stage, run as `python -m stages.<name>` (see dvc.yaml).

Each stage is thin: parse arguments, load and validate params.yaml, call library code in `parity`,
write its declared outputs atomically. Light stages (env, inputs, diff, report) never import torch.
"""

import os

# Every stage process: torch's idle OpenMP threads sleep instead of spinning (set before any stage
# imports torch, which reads it when libgomp loads). The arithmetic is the same; at load 15 one bert_base
# forward took 1.88 s of CPU spinning against 0.60 s (issue 38). A value you set (ACTIVE) is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
