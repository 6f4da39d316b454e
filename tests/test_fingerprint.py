"""Machine identity: the CPU fingerprint (parity.fingerprint.cpu_identity) and what a different CPU
re-runs. The CPU comes from recorded /proc/cpuinfo files (tests/data), so the tests do not depend on
the CPU they run on: an AVX2-only CPU without VNNI and an AVX-512 + VNNI one."""

from __future__ import annotations

import json
import subprocess

from conftest import ENV, ROOT, env, make_repo, ran_stages

from parity import fingerprint

AVX2 = ROOT / "tests/data/cpuinfo-avx2.txt"
AVX512 = ROOT / "tests/data/cpuinfo-avx512-vnni.txt"


def test_cpu_identity_of_an_avx2_cpu_without_vnni(monkeypatch):
    for k in fingerprint.CPU_ENV:
        monkeypatch.delenv(k, raising=False)
    ident = fingerprint.cpu_identity(AVX2)
    assert ident == {
        "vendor": "GenuineIntel", "model_name": "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz",
        "family": "6", "model": "79", "stepping": "1",
        "isa": ["sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c"], "env": {}}


def test_cpu_identity_of_an_avx512_vnni_cpu(monkeypatch):
    for k in fingerprint.CPU_ENV:
        monkeypatch.delenv(k, raising=False)
    ident = fingerprint.cpu_identity(AVX512)
    assert (ident["vendor"], ident["family"], ident["model"]) == ("AuthenticAMD", "25", "17")
    assert {"avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"} <= set(ident["isa"])
    assert not {"amx_tile", "avx512_fp16"} & set(ident["isa"])
    assert ident != fingerprint.cpu_identity(AVX2)


def test_cpu_identity_ignores_what_varies_on_one_machine(tmp_path, monkeypatch):
    """Clock, bogomips, microcode, per-core ids and later processor blocks never change it, so an
    unchanged machine writes byte-identical fingerprints."""
    for k in fingerprint.CPU_ENV:
        monkeypatch.delenv(k, raising=False)
    text = AVX2.read_text()
    first = text.split("\n\n")[0]
    varied = (first.replace("cpu MHz\t\t: 2399.998", "cpu MHz\t\t: 1200.000")
              .replace("bogomips\t: 4799.99", "bogomips\t: 4801.12")
              .replace("microcode\t: 0xb000040", "microcode\t: 0xb000038"))
    assert varied != first
    (tmp_path / "one").write_text(varied + "\n")
    assert fingerprint.cpu_identity(tmp_path / "one") == fingerprint.cpu_identity(AVX2)
    # the path comes from PARITY_CPUINFO when none is given (how the env stage is pointed at a fixture)
    monkeypatch.setenv(fingerprint.CPUINFO_ENV, str(AVX2))
    assert fingerprint.component("cpu") == fingerprint.cpu_identity(AVX2)


def test_cpu_identity_records_isa_masking_variables(monkeypatch):
    """ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY change the numbers (docs/sharing.md), so a masked run
    has another identity than an unmasked one on the same CPU."""
    for k in fingerprint.CPU_ENV:
        monkeypatch.delenv(k, raising=False)
    plain = fingerprint.cpu_identity(AVX512)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    masked = fingerprint.cpu_identity(AVX512)
    assert masked["env"] == {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "default"}
    assert masked != plain


def test_unreadable_cpuinfo_is_a_fingerprint_not_a_crash(tmp_path):
    ident = fingerprint.cpu_identity(tmp_path / "missing")
    assert ident["available"] is False and "missing" in ident["reason"]


def _repro(repo, **extra) -> list[str]:
    e = {k: v for k, v in env().items() if k not in fingerprint.CPU_ENV}  # only the masks asked for
    p = subprocess.run(["dvc", "repro"], cwd=repo.path, env={**e, **extra}, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    return ran_stages(p.stdout)


def test_another_cpu_reruns_the_cpu_cells_not_the_inputs(tmp_path):
    """The pipeline reproduced on one CPU, then `dvc repro` as on a CPU with other ISA flags (the
    recorded AVX2-only cpuinfo), then with oneDNN masked to AVX2: the reference, the export (its
    seeded weights come from ATen's ISA-dispatched random kernels) and the torch/ORT captures re-run;
    the inputs never do."""
    r = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("torch_cpu", "ort_cpu"))
    first = _repro(r, PARITY_CPUINFO=str(AVX512))
    assert "inputs@tiny_mlp" in first
    fp = json.loads((r.path / "artifacts/env/provider-torch_cpu.json").read_text())
    assert fp["cpu"]["vendor"] == "AuthenticAMD" and set(fp) == {"torch", "cpu"}
    assert "cpu" in json.loads((r.path / "artifacts/env/provider-ort_cpu.json").read_text())
    assert "cpu" not in json.loads((r.path / "artifacts/env/stage-inputs.json").read_text())
    assert _repro(r, PARITY_CPUINFO=str(AVX512)) == [ENV]  # same CPU: nothing else

    cpu_stages = {"export@tiny_mlp", "reference@tiny_mlp",
                  "capture@tiny_mlp-fp32-torch_cpu", "capture@tiny_mlp-fp32-ort_cpu"}
    other = _repro(r, PARITY_CPUINFO=str(AVX2))
    assert cpu_stages <= set(other), other
    assert "inputs@tiny_mlp" not in other, other

    masked = _repro(r, PARITY_CPUINFO=str(AVX2), ONEDNN_MAX_CPU_ISA="AVX2")
    assert cpu_stages <= set(masked), masked
    assert "inputs@tiny_mlp" not in masked, masked
    fp = json.loads((r.path / "artifacts/env/provider-ort_cpu.json").read_text())
    assert fp["cpu"]["env"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
