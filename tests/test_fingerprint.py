"""Machine identity: the CPU fingerprint (parity.backends.fingerprint.cpu_identity) and what a different CPU
re-runs. The CPU comes from recorded /proc/cpuinfo files (tests/data), so the tests do not depend on
the CPU they run on: an AVX2-only CPU without VNNI and an AVX-512 + VNNI one."""

from __future__ import annotations

import json
import subprocess
from html import escape

from conftest import BIN, ENV, ROOT, env, make_repo, ran_stages

from parity.backends import fingerprint

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


def test_int8_kernel_features_of_the_two_cpus():
    """What picks ONNX Runtime's int8 kernels, from the same function (and fixture) as the fingerprint:
    the AVX2-only Xeon has no VNNI, the EPYC has AVX-512 VNNI; a CPU that cannot be read or is not
    x86 has no answer (None), never a guess."""
    assert fingerprint.int8_kernels(fingerprint.cpu_identity(AVX2)) == {"vnni": False, "flags": ["avx2", "sse4_1"]}
    assert fingerprint.int8_kernels(fingerprint.cpu_identity(AVX512)) == {
        "vnni": True, "flags": ["avx512_vnni", "avx512bw", "avx512f", "avx2", "sse4_1"]}
    assert fingerprint.int8_kernels({"available": False, "reason": "cannot read x"})["vnni"] is None
    arm = {"isa": ["asimd", "asimddp", "i8mm"], "env": {}}
    assert fingerprint.int8_kernels(arm)["vnni"] is None


def _int8_cell(r) -> tuple[dict, str, str]:
    cell = "tiny_mlp-int8_dynamic-ort_int8"
    status = json.loads((r.path / f"artifacts/capture/{cell}/status.json").read_text())
    md = (r.path / "artifacts/report/report.md").read_text()
    html = (r.path / "artifacts/report/report.html").read_text()
    return status, md, html


def test_int8_reduce_range_follows_the_cpu_and_forced_off_names_saturation(tmp_path):
    """An int8 pipeline reproduced on a VNNI CPU, then on an AVX2-only one (recorded /proc/cpuinfo):
    the ort_int8 fingerprints differ, so the int8 capture re-runs instead of being restored, and
    `reduce_range: auto` resolves to false then true, in status.json and in the report. Then the user
    forces `reduce_range: false` on the AVX2-only CPU: every failing layer's cause is int8 saturation,
    with the CPU's int8 flags and the key that set it as evidence. (The kernels that run are this
    machine's; a tight tolerance stands in for the saturated layers, so the test does not depend on
    the CPU it runs on.)"""
    cell = "tiny_mlp-int8_dynamic-ort_int8"
    r = make_repo(tmp_path / "repo", dtypes=("int8_dynamic",), providers=("ort_int8",))
    _repro(r, PARITY_CPUINFO=str(AVX512))
    vnni_fp = (r.path / "artifacts/env/provider-ort_int8.json").read_bytes()
    status, md, html = _int8_cell(r)
    assert status["status"] == "OK" and status["settings"]["reduce_range"] is False
    assert status["settings"]["cpu_vnni"] is True
    want = "reduce_range=false (auto <providers.ort_int8.options.reduce_range=auto>: CPU with VNNI"
    assert want in md and html.count(escape(want)) == 1

    ran = _repro(r, PARITY_CPUINFO=str(AVX2))
    assert f"capture@{cell}" in ran, ran
    avx2_fp = (r.path / "artifacts/env/provider-ort_int8.json").read_bytes()
    assert avx2_fp != vnni_fp
    assert "avx512_vnni" in json.loads(vnni_fp)["cpu"]["isa"] and "avx512_vnni" not in json.loads(avx2_fp)["cpu"]["isa"]
    status, md, html = _int8_cell(r)
    assert status["settings"]["reduce_range"] is True and status["settings"]["saturation_risk"] is False
    want = ("reduce_range=true (auto <providers.ort_int8.options.reduce_range=auto>: CPU without VNNI "
            "(int8 flags: avx2, sse4_1))")
    assert f"- `{cell}` settings: {want}" in md and escape(want) in html
    assert "int8 saturation" not in md

    r.edit("conf/providers/ort_int8.yaml", "reduce_range: auto", "reduce_range: false")
    r.edit("conf/dtypes/int8_dynamic.yaml", "tol: {atol: 5.0e-2, rtol: 5.0e-2}", "tol: {atol: 1.0e-6, rtol: 1.0e-6}")
    r.run([f"{BIN}/parity", "compose"])
    _repro(r, PARITY_CPUINFO=str(AVX2))
    status, md, html = _int8_cell(r)
    assert status["settings"]["reduce_range"] is False and status["settings"]["saturation_risk"] is True
    lj = json.loads((r.path / f"artifacts/diff/{cell}/layers.json").read_text())
    failing = [d["name"] for d in lj["layers"] if not d["passed"]]
    assert failing and sorted(lj["layer_causes"]) == sorted(failing)
    cause = lj["layer_causes"]["fc1"]
    assert cause["label"] == "int8_saturation"
    assert cause["summary"].startswith("int8 saturation (CPU without VNNI, reduce_range off): ")
    assert cause["evidence"]["cpu_int8_flags"] == ["avx2", "sse4_1"] and cause["evidence"]["reduce_range"] is False
    assert "providers.ort_int8.options.reduce_range=false" in cause["evidence"]["reduce_range_from"]
    assert cause["evidence"]["rel_l2"] > 0
    m = json.loads((r.path / f"artifacts/diff/{cell}/metrics.json").read_text())
    assert m["verdict"] == "FAIL" and m["drift_origin_cause"]["label"] == "int8_saturation"
    assert lj["drift_origin_cause"]["evidence"]["numeric"]["label"]  # the numbers' own label, kept
    assert md.count("int8 saturation (CPU without VNNI, reduce_range off)") >= len(failing)
    assert "int8 saturation risk" in md and "int8 saturation (CPU without VNNI, reduce_range off)" in html
