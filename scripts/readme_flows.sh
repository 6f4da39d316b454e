#!/usr/bin/env bash
# Re-runs every command README.md shows, as a user would, and writes what each printed: the two
# commands' first one (`make run` on a fresh clone, bytecode on, a temporary HOME), then the four
# flows in a clone of that clone composed to one model (`parity compose -S 'models=[mlp]'`: 4 cells),
# and the config-error example. The transcript is what README's output blocks are copied from.
#
#   bash scripts/readme_flows.sh [REPO] [TRANSCRIPT]     (REPO: a git repo to clone, default .)
#
# Takes ~15 min on 2 cores. Everything lives under one mktemp directory, removed at the end
# (KEEP=1 keeps it). `make test`, the second command, is .ci/run's and is not repeated here.
set -uo pipefail
SRC=$(cd "${1:-.}" && pwd)
OUT=$(realpath -m "${2:-readme-flows.txt}")
D=$(mktemp -d /tmp/parity-readme.XXXXXX)
trap '[ "${KEEP:-0}" = 1 ] || rm -rf "$D"' EXIT
export HOME=$D/home
mkdir -p "$HOME"
unset PYTHONDONTWRITEBYTECODE PYTHONUNBUFFERED
git config --global user.email readme@example.invalid
git config --global user.name "README re-run"
: > "$OUT"

say() { printf '%s\n' "$*" | tee -a "$OUT"; }
# one command: its line as README shows it, then its output and exit status
run() {
  say "\$ $*"
  local t0=$SECONDS
  "$@" > "$D/last.log" 2>&1
  local rc=$?
  tee -a "$OUT" < "$D/last.log" > /dev/null
  say "[exit $rc, $((SECONDS - t0)) s]"
  return 0
}

say "# README commands re-run on $(git -C "$SRC" rev-parse --short HEAD), $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
git clone -q "$SRC" "$D/u" && cd "$D/u" || exit 1

say "## The two commands: make run (fresh clone)"
run make run
BIN=$D/u/.venv/bin
export PATH=$BIN:$PATH

say "## Flows, in a clone composed to one model"
git clone -q "$D/u" "$D/f" && cd "$D/f" || exit 1
ln -s "$D/u/.venv" .venv
cp "$D/u/.dvc/config.local" .dvc/config.local 2>/dev/null
cp "$D/u/.dvc/parity-plots.html" .dvc/ 2>/dev/null
run parity compose -S 'models=[mlp]'
run dvc repro
git add -A params.yaml dvc.lock env/dvc.lock >/dev/null 2>&1
git commit -qm "mlp: 4 cells" && say "(committed: mlp, 4 cells)"

say "### 1. After a driver or runtime bump"
run env ONEDNN_MAX_CPU_ISA=AVX2 dvc repro
run dvc metrics diff --precision 8
run dvc repro
git checkout -q -- dvc.lock env/dvc.lock 2>/dev/null
run dvc checkout -q

say "### 2. A precision sweep"
run parity sweep 'models=[mlp]' 'dtypes=fp32,fp16,bf16'
run dvc exp show --md --drop '.*' --keep 'Experiment|passed|failed|not_run|baseline|diff.verdict'

say "### 3. History"
run parity compose -S 'models=[mlp]' -S diff.verdict=tolerance -S dtypes.fp16.tol.atol=0 -S dtypes.fp16.tol.rtol=0
run dvc repro
git add -A params.yaml dvc.lock env/dvc.lock >/dev/null 2>&1
git commit -qm "fp16 at atol = rtol = 0, tolerance verdict" && say "(committed: tolerance, fp16 atol = rtol = 0)"
run parity compare HEAD~1 --fail-on-regression
run dvc metrics diff HEAD~1 --precision 8
run dvc plots diff HEAD~1
run parity show mlp-fp16-ort_cpu

say "### 4. Sharing"
run dvc push --run-cache
git clone -q "$D/f" "$D/t" && cd "$D/t" || exit 1
ln -s "$D/u/.venv" .venv
cp "$D/f/.dvc/config.local" .dvc/config.local 2>/dev/null
run dvc pull
run dvc repro

say "## Configuration"
cd "$D/f" && run parity sweep 'dtypes=fp32,fp13'
say "# done $(date -u '+%H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
