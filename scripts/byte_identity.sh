#!/usr/bin/env bash
# Same inputs, same bytes across two commits (issue 37: a reshaping of the code changes no artifact).
#
#   scripts/byte_identity.sh REV_A REV_B [OUT]
#
# For each commit: a scratch clone under OUT (default: a new temp dir), this checkout's .venv linked in,
# the pipeline composed for mlp, resnet18, tiny_llama and an ONNX-file model (tests/test_onnx_source.py's
# tiny graph) x fp32/fp16 x torch_cpu/ort_cpu plus the critical suite, `dvc repro --no-run-cache` (every
# stage runs: nothing is restored from DVC's run-cache), then an md5 of every file under artifacts/.
# Prints the files that differ between the two commits; timing files (wall time, peak memory),
# artifacts/code (the stages' code hashes, which change with the code on purpose), the report's pages
# (their time and memory tables) and json files that differ only in timing keys are counted apart.
# Exit 0 when every other file is byte-identical. Takes ~30-45 min a commit on 2 cores; a commit whose md5
# list is already in OUT is not run again; delete OUT after.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 REV_A REV_B [OUT]" >&2; exit 2; }
repo=$(git rev-parse --show-toplevel)
out=${3:-$(mktemp -d)}
mkdir -p "$out"
for rev in "$1" "$2"; do
  sha=$(git -C "$repo" rev-parse --short "$rev")
  d=$out/$sha
  [ -s "$out/$sha.md5" ] && { echo "$sha: $out/$sha.md5 kept from an earlier run" >&2; continue; }
  rm -rf "$d"
  git clone -q "$repo" "$d"
  git -C "$d" checkout -q "$sha"
  ln -s "$repo/.venv" "$d/.venv"
  (
    cd "$d"
    export PATH=$d/.venv/bin:$PATH
    mkdir -p models
    python - <<'EOF'
import sys
from pathlib import Path

import onnx

sys.path.insert(0, "tests")
from test_onnx_source import model_conf, tiny_graph  # noqa: E402

onnx.save(tiny_graph(), "models/tiny.onnx")
Path("conf/models/tiny_onnx.yaml").write_text(model_conf("tiny_onnx", "models/tiny.onnx"))
EOF
    git add -A models conf >/dev/null
    git -c user.name=x -c user.email=x@x commit -qm "byte identity: an ONNX-file model"
    python -c "import sys; from parity.commands.cli import main; sys.exit(main(sys.argv[1:]))" compose \
      -S 'models=[mlp,resnet18,tiny_llama,tiny_onnx]' -S 'dtypes=[fp32,fp16]' -S 'providers=[torch_cpu,ort_cpu]' \
      -S 'suites=[critical]' >/dev/null
    start=$(date +%s)
    dvc repro --no-run-cache > "$out/$sha.repro.log" 2>&1 || { echo "$sha: dvc repro failed (see $out/$sha.repro.log)" >&2; exit 1; }
    echo "$sha: dvc repro --no-run-cache $(( $(date +%s) - start )) s, $(grep -c '^Running stage' "$out/$sha.repro.log") stages ran" >&2
    find artifacts -type f | sort | xargs md5sum > "$out/$sha.md5"
  )
done
a=$out/$(git -C "$repo" rev-parse --short "$1").md5
b=$out/$(git -C "$repo" rev-parse --short "$2").md5
python3 - "$a" "$b" "$out" <<'EOF'
import json
import re
import sys
from pathlib import Path


def read(p):
    return {line.split(None, 1)[1].strip(): line.split()[0] for line in open(p)}


TIMED = re.compile(r"latency|seconds|wall|rss|memory|time|_ms$|_s$")


def untimed(v):
    if isinstance(v, dict):
        return {k: untimed(x) for k, x in v.items() if not TIMED.search(k)}
    return [untimed(x) for x in v] if isinstance(v, list) else v


a, b = read(sys.argv[1]), read(sys.argv[2])
root_a, root_b = (Path(sys.argv[3]) / Path(p).stem for p in sys.argv[1:3])
differ = sorted(f for f in a.keys() | b.keys() if a.get(f) != b.get(f))
apart, report, timed, kept = [], [], [], []
for f in differ:
    if f.startswith(("artifacts/timing/", "artifacts/code/")) or "/timing" in f:
        apart.append(f)
    elif f.startswith("artifacts/report/"):
        report.append(f)
    elif f.endswith(".json") and f in a and f in b and \
            untimed(json.loads((root_a / f).read_text())) == untimed(json.loads((root_b / f).read_text())):
        timed.append(f)
    else:
        kept.append(f)
print(f"{len(a)} vs {len(b)} files; {len(a.keys() & b.keys()) - len(differ)} byte-identical; differ: "
      f"{len(apart)} timing files and stage-code hashes (expected), {len(report)} report pages (their time and "
      f"memory tables: {', '.join(report) or 'none'}), {len(timed)} json files only in timing keys "
      f"({', '.join(timed) or 'none'}), {len(kept)} other")
for f in kept:
    print(f"DIFFERS: {f}")
sys.exit(1 if kept else 0)
EOF
