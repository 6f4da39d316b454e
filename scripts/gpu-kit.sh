#!/usr/bin/env bash
# `make gpu-kit`: the wheelhouse a lent GPU machine needs to run scripts/gpu-check.sh, built here, on a
# CPU machine with PyPI. The GPU image (scripts/gpu-image.txt) is Python 3.12 with torch 2.11 + CUDA 13,
# onnx, onnxscript, onnxruntime (CPU), pyarrow, numpy, transformers and no network; it lacks DVC, Hydra
# and their pure-Python dependencies. This script downloads, for CPython 3.12 on manylinux x86_64:
#   <kit>/wheels/     what the image lacks (installed there with --no-index; the deliverable)
#   <kit>/insurance/  the rest of DVC's and Hydra's closure, packages the image already holds: pip takes
#                     one of these only where the image's own version is too old for a pin
#   <kit>/MANIFEST.txt  every wheel with its size, and the totals
# antlr4-python3-runtime 4.9.3 (hydra-core's pin) is published as an sdist only: it is built into a
# pure-Python wheel here. torchvision is not brought: the image's 0.26.0 is the one built for torch 2.11.
# Usage: scripts/gpu-kit.sh [KIT_DIR]   (default .gpu-kit, git-ignored); PYTHON picks the pip to use.
set -euo pipefail
KIT=${1:-.gpu-kit}
PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# the pins, read from pyproject.toml so the GPU runs what CI runs
pin() { sed -n "s/^ *\"\($1==[^\"]*\)\".*/\1/p" "$ROOT/pyproject.toml"; }
REQS=("$(pin dvc)" "$(pin hydra-core)" "$(pin omegaconf)" "$(pin 'ruamel.yaml.clib')" "$(pin shtab)")
for r in "${REQS[@]}"; do [ -n "$r" ] || { echo "gpu-kit: a pin is missing from pyproject.toml" >&2; exit 1; }; done
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --platform any)
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux_2_5_x86_64 manylinux1_x86_64; do PLATFORM+=(--platform "$p"); done

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "gpu-kit: ${REQS[*]} and their dependencies, for CPython 3.12 manylinux x86_64 -> $KIT"
"$PY" -m pip wheel -q --no-deps -w "$tmp/all" antlr4-python3-runtime==4.9.3
"$PY" -m pip download -q "${PLATFORM[@]}" --find-links "$tmp/all" -d "$tmp/all" "${REQS[@]}"

# split: a wheel whose project the image holds goes to insurance/, the others to wheels/
rm -rf "$KIT.new" && mkdir -p "$KIT.new/wheels" "$KIT.new/insurance"
norm() { tr 'A-Z_.' 'a-z--'; }
image=$(sed -e 's/^#@//' -e '/^#/d' -e 's/[=<>;].*//' "$ROOT/scripts/gpu-image.txt" | tr ' ' '\n' | norm | sort -u)
for w in "$tmp"/all/*.whl; do
  name=$(basename "$w" | cut -d- -f1 | norm)
  if grep -qx "$name" <<<"$image"; then cp "$w" "$KIT.new/insurance/"; else cp "$w" "$KIT.new/wheels/"; fi
done
{
  echo "# parity GPU kit: made $(date -u +%FT%TZ) by scripts/gpu-kit.sh for ${REQS[*]}"
  for d in wheels insurance; do
    echo "## $d: $(ls "$KIT.new/$d" | wc -l) wheels, $(du -sk "$KIT.new/$d" | cut -f1) KiB"
    (cd "$KIT.new/$d" && ls -s --block-size=K -1 *.whl | sed 's/^/  /')
  done
  echo "## total $(du -sk "$KIT.new" | cut -f1) KiB (the device tool carries at most 64 MiB)"
} > "$KIT.new/MANIFEST.txt"
rm -rf "$KIT" && mv "$KIT.new" "$KIT"
grep '^##' "$KIT/MANIFEST.txt" | sed 's/^## /gpu-kit: /'
