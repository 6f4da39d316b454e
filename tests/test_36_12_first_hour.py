"""Issue 36 item 12: `make run`'s first line announced PyPI's 3.4 GB CUDA build even when the CPU wheel
came from find-links, and then the install was silent for 6-12 minutes (`pip -q`). What `make` would
run (`make -n`, nothing installed) says where torch comes from as it is, and pip names each package."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _plan(tmp_path, *extra) -> str:
    venv = tmp_path / "venv"
    # run from `make test` too: the outer make's MAKEFLAGS/MAKELEVEL would add "Entering directory" lines
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    p = subprocess.run(["make", "--no-print-directory", "-n", "-B", f"VENV={venv}", *extra, f"{venv}/.installed"],
                       cwd=ROOT, capture_output=True, text=True, check=True, env=env)
    return p.stdout


def test_36_12_the_install_line_says_where_torch_comes_from_and_pip_is_not_silent(tmp_path):
    plan = _plan(tmp_path)
    first = plan.splitlines()[0] + plan.splitlines()[1]
    assert "your pip index and find-links: a CPU wheel there is used as it is" in first, first
    assert "TORCH_INDEX=" in first  # how to get the CPU build where there is no local wheel
    pip = [ln for ln in plan.splitlines() if "pip install" in ln and "-e '.[dev]'" in ln]
    assert pip and " -q" not in pip[0] and "Collecting" in plan, plan  # pip's progress reaches the user
    cpu = _plan(tmp_path, "TORCH_INDEX=https://download.pytorch.org/whl/cpu")
    assert "https://download.pytorch.org/whl/cpu; PyPI" not in cpu and "whl/cpu)" in "".join(cpu.splitlines()[:2])
    assert "--index-url https://download.pytorch.org/whl/cpu" in cpu
