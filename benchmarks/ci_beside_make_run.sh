#!/usr/bin/env bash
# `.ci/run` on clean clones of COMMIT, RUNS times in a row, while a `make run` loop loads the machine
# (issue 36: "green three times in a row while another make run loads the machine"; issue 38: the CI's
# wall and CPU time beside a make run loop).
#
#   benchmarks/ci_beside_make_run.sh COMMIT [OUT] [RUNS]      (OUT default /tmp/parity-ci-load, RUNS 3)
#
# Each CI run: a fresh `git clone` of this repository checked out at COMMIT, then
# `env -u PYTHONDONTWRITEBYTECODE -u PYTHONUNBUFFERED HOME=<empty> /usr/bin/time .ci/run` (as a user's
# machine runs it), each test's CPU appended to OUT/cpu<i>.tsv (PARITY_TEST_CPU, tests/conftest.py).
# Where cgroup v1's cpuacct is writable (root), the run is in a cgroup of its own, whose CPU also
# counts the detached DVC queue workers the sweep tests start (/usr/bin/time does not see them).
# Beside it, until the last run ends: `make run` on a fresh clone of HEAD with a clean HOME, again and
# again (OUT/mrun.txt), and the load average every 30 s (OUT/load.txt). Stops at the first failing run.
# Results: OUT/summary.txt. Needs ~1 h of the machine per run on 2 cores; deletes its clones.
set -u
C=${1:?usage: $0 COMMIT [OUT] [RUNS]}
OUT=${2:-/tmp/parity-ci-load}
RUNS=${3:-3}
SRC=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); rm -f "$OUT/stop"
( while [ ! -e "$OUT/stop" ]; do echo "$(date +%T) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/load.txt"; sleep 30; done ) &
( n=0; while [ ! -e "$OUT/stop" ]; do n=$((n+1)); d=$(mktemp -d /tmp/parity-mrun.XXXX); git clone -q "$SRC" "$d/u"
    s=$(date +%s); (cd "$d/u" && exec env -u PYTHONDONTWRITEBYTECODE -u PYTHONUNBUFFERED HOME="$d/home" make run) > "$OUT/mrun$n.log" 2>&1
    echo "make run #$n rc=$? wall=$(( $(date +%s)-s ))s end=$(date +%T)" >> "$OUT/mrun.txt"; rm -rf "$d"; done ) &
sleep 60   # the loop's set-up is under way first
for i in $(seq 1 "$RUNS"); do
  d=$(mktemp -d /tmp/parity-ci.XXXX); git clone -q "$SRC" "$d/u"; git -C "$d/u" checkout -q "$C"; mkdir -p "$d/home"
  cg=/sys/fs/cgroup/cpuacct/parity_ci_$$_$i; mkdir "$cg" 2>/dev/null || cg=""
  s=$(date +%s); echo "ci$i start $(date +%T) commit $(git -C "$d/u" rev-parse --short HEAD)" >> "$OUT/summary.txt"
  ( [ -n "$cg" ] && echo $BASHPID > "$cg/cgroup.procs"; cd "$d/u"
    exec env -u PYTHONDONTWRITEBYTECODE -u PYTHONUNBUFFERED HOME="$d/home" PARITY_TEST_CPU="$OUT/cpu$i.tsv" \
      /usr/bin/time -f "time: wall %e s user %U s sys %S s" .ci/run ) > "$OUT/ci$i.log" 2>&1
  rc=$?
  echo "ci$i rc=$rc wall=$(( $(date +%s)-s ))s end=$(date +%T)" \
       "cpuacct: $( [ -n "$cg" ] && tr '\n' ' ' < "$cg/cpuacct.stat" || echo none) (USER_HZ=100)" \
       "load=$(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/summary.txt"
  sleep 5; [ -n "$cg" ] && rmdir "$cg" 2>/dev/null; rm -rf "$d"
  [ $rc -ne 0 ] && break
done
touch "$OUT/stop"; wait
echo "done $(date +%T)" >> "$OUT/summary.txt"
