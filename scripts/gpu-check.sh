#!/usr/bin/env bash
# scripts/gpu-check.sh: the GPU verification of parity's CUDA paths in one go, on a lent GPU machine
# (docs/gpu-verification.md). Run from the repository root, after `make gpu-kit` made .gpu-kit/ here:
#   OUT=/some/dir bash scripts/gpu-check.sh
# It installs what the machine's image lacks from the kit (no index, nothing fetched), records the
# environment, runs the GPU providers' conformance tests, then mlp + resnet18 x fp32, tf32, fp16, bf16,
# amp_fp16, amp_bf16 x torch_cpu, torch_cuda, torch_compile_cuda through DVC with the fp64 reference,
# the driver-bump flow (an edited copy of /proc/driver/nvidia: only the CUDA cells re-run), the strict
# mode, and CUDA graphs (torch.compile mode reduce-overhead). Every step has a time limit inside one
# budget; each step's log, the report and the metrics go into $OUT/gpu-check.tgz, refreshed after every
# step, so a run cut short still brings back what it did; $OUT/steps.log is the transcript.
# Environment: OUT (default ./gpu-out), PARITY_GPU_KIT (.gpu-kit), PARITY_GPU_PYTHON (python3: the
# image's interpreter), PARITY_GPU_BUDGET_S (480: on the H200 the steps took ~425 s, resnet18 grid 170 s), PARITY_GPU_JOBS (cells at once, 8),
# PARITY_GPU_SCALE (every step's own limit times this: the rehearsal on 2 CPU cores uses 5),
# PARITY_GPU_STEPS (default all: conformance grid_mlp grid_full noop driver_bump strict cudagraphs;
# install and env always run), PARITY_GPU_MODELS (the full grid's models, default mlp,resnet18).
# Without a GPU (`make gpu-rehearsal`) every step runs the same, and the CUDA cells say UNAVAILABLE.
set -u
ROOT=$(pwd)
OUT=${OUT:-$ROOT/gpu-out}
KIT=${PARITY_GPU_KIT:-$ROOT/.gpu-kit}
PY=${PARITY_GPU_PYTHON:-python3}
BUDGET=${PARITY_GPU_BUDGET_S:-480}
SCALE=${PARITY_GPU_SCALE:-1}
STEPS=" ${PARITY_GPU_STEPS:-conformance grid_mlp grid_full noop driver_bump strict cudagraphs} "
MODELS=${PARITY_GPU_MODELS:-mlp,resnet18}
JOBS=${PARITY_GPU_JOBS:-8}
T0=$(date +%s)
W=$(mktemp -d /tmp/parity-gpu.XXXXXX)
LOGS=$W/logs
mkdir -p "$LOGS" "$OUT"
left() { echo $((BUDGET - ($(date +%s) - T0))); }
say() { printf '[gpu-check %4ss] %s\n' $(($(date +%s) - T0)) "$*" | tee -a "$LOGS/steps.log"; }
pack() {
  cp "$LOGS/steps.log" "$OUT/steps.log"
  for f in artifacts/report/report.md artifacts/env/cuda.json artifacts/env/torch.json; do
    [ -f "$f" ] && cp "$f" "$LOGS/"
  done
  for c in artifacts/diff/*/metrics.json; do  # each cell's verdict, evidence and fp64 figures
    [ -f "$c" ] && mkdir -p "$LOGS/diff" && cp "$c" "$LOGS/diff/$(basename "$(dirname "$c")").json"
  done
  tar czf "$OUT/gpu-check.tgz" -C "$W" logs 2>/dev/null
}
trap pack EXIT
# step NAME LIMIT_S COMMAND...: runs COMMAND with its output in logs/NAME.log, within LIMIT_S and the budget
step() {
  if [ "$1" != install ] && [ "$1" != env ] && [ "$1" != mlp_only ] && [[ "$STEPS" != *" $1 "* ]]; then
    say "$1: not selected (PARITY_GPU_STEPS)"; return 98
  fi
  local name=$1 lim=$(($2 * SCALE)) l s rc; shift 2
  l=$(left)
  if [ "$l" -le 10 ]; then say "$name: SKIPPED (budget of ${BUDGET} s spent)"; return 99; fi
  [ "$lim" -gt "$l" ] && lim=$l
  [ "$lim" -lt 10 ] && lim=10
  s=$(date +%s)
  # a shell function runs in a child bash that is given every function and the variables it reads
  timeout -k 10 "$lim" bash -c "$(declare -f); $(declare -p V PY KIT ROOT JOBS GRID 2>/dev/null); \"\$@\"" \
    step "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  if [ $rc = 124 ] || [ $rc = 137 ]; then  # cut short: what it started (DVC runs cells in sessions of
    reap                                    # their own) goes too, and DVC's lock with it
  fi
  say "$name: rc=$rc in $(($(date +%s) - s)) s$([ $rc = 124 ] && echo " (TIMED OUT at $lim s)")"
  pack
  return $rc
}
# every process still working in this checkout (a cut-short step's DVC and stage processes), then DVC's lock
reap() {
  local p sig q=$$ keep=" $$ "
  while [ "$q" -gt 1 ]; do q=$(awk '{print $4}' "/proc/$q/stat"); keep="$keep$q "; done  # this script's ancestors
  for sig in TERM KILL; do
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/cwd" 2>/dev/null)" = "$ROOT" ] && [[ "$keep" != *" ${p#/proc/} "* ]] \
        && kill -$sig "${p#/proc/}" 2>/dev/null
    done
    sleep 2
  done
  rm -f .dvc/tmp/rwlock .dvc/tmp/lock
}
# the stages DVC ran, from a `dvc repro` log
ran() { sed -n "s/^Running stage '\([^']*\)'.*/\1/p" "$LOGS/$1.log"; }

# 1. what the image lacks, from the kit, into a venv that sees the image's own packages (a .pth file)
V=$W/venv
pin() { sed -n "s/^ *\"\($1==[^\"]*\)\".*/\1/p" pyproject.toml; }
install_kit() {
  set -e
  "$PY" -m venv --without-pip "$V"
  local vsite
  vsite=$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' >"$vsite/gpu-image.pth"
  echo "$ROOT" >"$vsite/parity-src.pth"
  "$PY" -m pip --python "$V/bin/python" install --no-index --no-compile --no-cache-dir --progress-bar off \
    --find-links "$KIT/wheels" --find-links "$KIT/insurance" \
    "$(pin dvc)" "$(pin hydra-core)" "$(pin omegaconf)" "$(pin 'ruamel.yaml.clib')" "$(pin shtab)"
  printf '#!%s\nimport sys\nfrom parity.commands.cli import main\nsys.exit(main())\n' "$V/bin/python" >"$V/bin/parity"
  chmod +x "$V/bin/parity"
}
say "parity GPU check in $ROOT, budget ${BUDGET} s, -j ${JOBS}, kit $KIT ($(du -sh "$KIT" 2>/dev/null | cut -f1))"
step install 90 install_kit || { say "FAILED: the kit does not install on this image (logs/install.log)"; exit 1; }
export PATH="$V/bin:$PATH"

# 2. the environment
envrec() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv || echo "nvidia-smi: none"
  python -c 'import sys, torch; print("python", sys.version.split()[0]); print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available()); print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-"); print("cudnn", torch.backends.cudnn.version())'
  python -c 'import onnxruntime as o, onnx; print("onnxruntime", o.__version__, o.get_available_providers()); print("onnx", onnx.__version__)'
  python -c 'import triton; print("triton", triton.__version__)' || true
  python -m pip list 2>/dev/null | grep -iE '^(dvc|hydra-core|omegaconf|onnxscript|onnx-ir|torchvision|numpy|pyarrow) '
  nproc; free -g | head -2
  [ -d .git ] && git log -1 --format='parity %h %s' || echo "parity: a copy without .git"
}
step env 30 envrec
cat "$LOGS/env.log"

# the pipeline runs in this copy; DVC needs a git repository (or --no-scm)
if [ ! -d .git ]; then
  if command -v git >/dev/null; then
    git init -q && git add -A >/dev/null && git -c user.name=gpu -c user.email=gpu@check commit -qm gpu-check
  else
    dvc config core.no_scm true
  fi
fi

# 3. the conformance contract on the GPU providers (tiny mlp, no DVC)
step conformance 90 python -m pytest -q -p no:cacheprovider tests/test_backends.py -k "cuda or trt"
tail -3 "$LOGS/conformance.log"

# 4. the grid through DVC with the fp64 reference: mlp first (fast), then resnet18 added
GRID=(-S 'dtypes=[fp32,tf32,fp16,bf16,amp_fp16,amp_bf16]'
      -S 'providers=[torch_cpu,torch_cuda,torch_compile_cuda]' -S reference.fp64=true)
grid() { parity compose -S "models=[$1]" "${GRID[@]}" && parity repro -j "$JOBS" && dvc metrics show --json; }
step grid_mlp 120 grid mlp
reserve=20; [[ "$STEPS" == *" driver_bump "* ]] && reserve=150  # for the steps after the grid
step grid_full $((($(left) - reserve) / SCALE)) grid "$MODELS"
for g in grid_mlp grid_full; do say "$g: $(grep -E '^parity: (upstream|done)' "$LOGS/$g.log" | cut -c1-240 | tr '\n' ' ')"; done
dvc metrics show --json >"$LOGS/metrics.json" 2>/dev/null

# 5. the driver-bump flow: a second `dvc repro` runs only the env probe; then, on mlp's cells, an edited
#    driver version (PARITY_NVIDIA_PROC: a copy of /proc/driver/nvidia, or a made-up one where there is
#    none) re-runs only the cells of the providers that use cuda
step noop 30 dvc repro
say "noop: DVC ran [$(ran noop | tr '\n' ' ')]"
fake=$W/nvidia
mkdir -p "$fake/gpus/0"
if [ -r /proc/driver/nvidia/version ]; then
  sed -E 's/([0-9]+\.[0-9]+)\.([0-9]+)/\1.999/' /proc/driver/nvidia/version >"$fake/version"
  cat /proc/driver/nvidia/gpus/*/information >"$fake/gpus/0/information" 2>/dev/null
else
  echo "NVRM version: NVIDIA UNIX x86_64 Kernel Module  999.99.99  (rehearsal)" >"$fake/version"
fi
[[ "$STEPS" == *" driver_bump "* ]] && step mlp_only 30 sh -c "parity compose -S 'models=[mlp]' $(printf '%q ' "${GRID[@]}") && dvc repro"
step driver_bump 60 env PARITY_NVIDIA_PROC="$fake" parity repro -j "$JOBS"
say "driver_bump: $(grep -E '^parity: (upstream|done)' "$LOGS/driver_bump.log" | tr '\n' ' ')"
say "driver_bump: cells that ran: [$(grep -v 'up to date' "$LOGS/driver_bump.log" | sed -n 's/^parity: [0-9]*\/[0-9]*  *\([^:]*\):.*/\1/p' | tr '\n' ' ')]"

# 6. strict: every torch_cuda / torch_compile_cuda cell of mlp must run (UNAVAILABLE fails the pipeline)
step strict 40 sh -c "parity compose -S 'models=[mlp]' -S 'dtypes=[fp32,fp16]' \
  -S 'providers=[torch_cuda,torch_compile_cuda]' -S strict=true && dvc repro"
if [ -f "$LOGS/strict.log" ] && grep -q 'strict: true and these cells did not run' "$LOGS/strict.log"; then
  if python -c 'import sys, torch; sys.exit(torch.cuda.is_available())'; then
    say "strict: refused the UNAVAILABLE CUDA cells, as it must where there is no GPU"
  else
    say "strict: FAILED: CUDA cells did not run on a machine with a GPU (logs/strict.log)"
  fi
fi

# 7. CUDA graphs: torch.compile's reduce-overhead mode (Inductor with CUDA graph trees)
step cudagraphs 45 sh -c "parity compose -S 'models=[mlp]' -S 'dtypes=[fp32,fp16,bf16]' \
  -S 'providers=[torch_compile_cuda]' -S providers.torch_compile_cuda.options.mode=reduce-overhead \
  -S reference.fp64=true && parity repro -j $JOBS"
say "done in $(($(date +%s) - T0)) s; the logs are in $OUT/gpu-check.tgz"
