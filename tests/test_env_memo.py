"""The env stage's caches (parity.core.importmemo, issue 38) change no byte it writes: with the parsed-imports
memo, without it, with a corrupt one, the same files; a runner edited after the memo was written is read
again (its provider's code hash changes, the other provider's does not); the probe loads no numpy."""

import shutil
import subprocess
import sys

from conftest import ROOT, env


def _tree(tmp_path):
    for name in ("parity", "stages", "conf", "env"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / ".dvc" / "tmp").mkdir(parents=True)
    return tmp_path


def _probe(root, k):
    out = root / f"out{k}"
    p = subprocess.run([sys.executable, "-m", "stages.env", "--out", str(out / "env"), "--code", str(out / "code")],
                       cwd=root, env=dict(env(), PYTHONPATH=str(root)), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return {f.relative_to(out).as_posix(): f.read_bytes() for f in sorted(out.rglob("*.json"))}


def test_the_memo_changes_no_byte_and_an_edited_runner_is_read_again(tmp_path):
    root = _tree(tmp_path)
    memo = root / ".dvc/tmp/parity-import-names.json"
    first = _probe(root, 0)  # no memo yet: every closure parsed, the memo written
    assert memo.is_file()
    assert _probe(root, 1) == first  # from the memo
    memo.write_text("{not json")
    assert _probe(root, 2) == first  # a corrupt memo is ignored
    runner = root / "parity/backends/ort_cpu.py"
    runner.write_text(runner.read_text() + "\nfrom parity.core import importmemo  # noqa: E402,F401\n")
    edited = _probe(root, 3)
    assert edited["code/provider-ort_cpu.json"] != first["code/provider-ort_cpu.json"]
    assert b"parity/core/importmemo.py" in edited["code/provider-ort_cpu.json"]
    assert edited["code/provider-torch_cpu.json"] == first["code/provider-torch_cpu.json"]
    memo.unlink()
    assert _probe(root, 4) == edited  # the same hashes parsed afresh


def test_the_probe_loads_no_numpy(tmp_path):
    root = _tree(tmp_path)
    code = ("import sys, runpy; sys.argv = ['stages.env', '--out', 'o/env', '--code', 'o/code']\n"
            "try:\n    runpy.run_module('stages.env', run_name='__main__')\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\nprint(sorted(m for m in ('numpy', 'pyarrow', 'torch') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], cwd=root, env=dict(env(), PYTHONPATH=str(root)),
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"
