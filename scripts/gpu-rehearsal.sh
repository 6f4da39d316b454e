#!/usr/bin/env bash
# `make gpu-rehearsal`: scripts/gpu-check.sh here, on the CPU, in what the lent GPU machine will hold:
# a Python 3.12 venv of scripts/gpu-image.txt (torch 2.11 from PyPI, whose CUDA build runs on a CPU;
# onnx, onnxruntime, pyarrow, pandas, transformers at the image's versions), made once and kept in
# ~/.cache/parity/gpu-image-venv, plus the kit (`make gpu-kit`), on a fresh clone of HEAD (commit first:
# uncommitted work is not in it). Every step must run; the CUDA cells say UNAVAILABLE with the reason,
# so the first GPU run fails on nothing but the GPU. PARITY_GPU_BUDGET_S (default 2400: two loaded cores
# are slower than the GPU machine's 16), PARITY_GPU_JOBS (2) and PARITY_GPU_SCALE (5) are passed on.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KIT=${PARITY_GPU_KIT:-$ROOT/.gpu-kit}
IMG=${PARITY_GPU_IMAGE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/parity/gpu-image-venv}
PY312=${PYTHON312:-$(command -v python3.12 || true)}
[ -d "$KIT/wheels" ] || { echo "gpu-rehearsal: no kit at $KIT: run make gpu-kit first" >&2; exit 1; }
if [ ! -x "$IMG/bin/python" ] || [ "$ROOT/scripts/gpu-image.txt" -nt "$IMG/.made" ]; then
  [ -n "$PY312" ] || { echo "gpu-rehearsal: the GPU image is Python 3.12 and there is no python3.12 here (PYTHON312=...)" >&2; exit 1; }
  echo "gpu-rehearsal: building the image's stand-in in $IMG (torch 2.11 from PyPI with its CUDA libraries: ~5 GB, minutes)"
  rm -rf "$IMG" && "$PY312" -m venv "$IMG"
  "$IMG/bin/pip" install -q --progress-bar off -r "$ROOT/scripts/gpu-image.txt"
  touch "$IMG/.made"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git clone -q "$ROOT" "$tmp/repo"
cp -al "$KIT" "$tmp/repo/.gpu-kit" 2>/dev/null || cp -a "$KIT" "$tmp/repo/.gpu-kit"
out=${GPU_REHEARSAL_OUT:-$ROOT/gpu-out/rehearsal}
rm -rf "$out" && mkdir -p "$out"
t0=$(date +%s)
(cd "$tmp/repo" && OUT=$out PARITY_GPU_PYTHON="$IMG/bin/python" PARITY_GPU_BUDGET_S=${PARITY_GPU_BUDGET_S:-2400} \
  PARITY_GPU_JOBS=${PARITY_GPU_JOBS:-2} PARITY_GPU_SCALE=${PARITY_GPU_SCALE:-5} bash scripts/gpu-check.sh)
echo "gpu-rehearsal: $(( $(date +%s) - t0 )) s wall; transcript $out/steps.log, logs $out/gpu-check.tgz"
