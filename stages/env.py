"""env: fingerprint every backend component, cheaply (no torch import). env/dvc.yaml: always_changed, outs persist.

Writes, under --out:
  <component>.json         versions / device identity of one component (parity.backends.fingerprint.COMPONENTS)
  provider-<name>.json     what one provider's cells depend on (its `uses:` components)
  stage-<name>.json        what a shared stage depends on (parity.backends.fingerprint.STAGE_USES)
  host.json                OS, kernel, Python, CPU and thread counts: shown by the report, used by no stage
and under --code, <model>.json: sha256 of an `import` model's source and of every file a model reads (ONNX
external data, checkpoint shards and tokenizer, `weights:`; parity.core.modelfiles streams and remembers them), a
dependency of that model's stages, so editing the user's model code or files re-runs exactly those
(<model>.inputs.json: the tokenizer files inputs@ reads); provider-<provider>.json: the same for the provider's
runner module and what it imports (the runner code of capture/engine/reduce/plan cells, so editing one runner
re-runs only its provider's cells); suite-<suite>.json: the same for a suite's modules (parity.suites.code);
stage-<stage>.json: each dvc.yaml stage's import closure (stages/closures.json). Identical machines give identical
bytes: downstream stages re-run only when something they use changed."""

from __future__ import annotations

import sys
from pathlib import Path

from parity.core import codedeps, importmemo
from parity.config import params as config
from parity.pipeline.envfiles import Outs
from parity.suites import code as suite_code


def main(argv=None) -> int:
    ap = config.stage_parser("stages.env", __doc__)
    ap.add_argument("--out", default="artifacts/env")
    ap.add_argument("--code", help="folder for the import models' code hashes (default: code/ beside --out)")
    a = ap.parse_args(argv)
    if "parity.backends" in sys.modules:  # loaded already (a test calling main): the package's own
        from parity.backends import fingerprint  # lazy: the package is loaded already
    else:  # stdlib only; the package's __init__ loads numpy + pyarrow: 0.25 s CPU per repro (issue 38)
        fingerprint = importmemo.load_alone("parity.backends.fingerprint")
    p = config.load_or_die(a.params)
    out = Path(a.out)
    code = Path(a.code) if a.code else out.parent / "code"
    files, known = Outs(out, code), importmemo.load()  # known: parsed imports kept between runs (.dvc/tmp)
    declared = {k: v for pc in p["providers"].values() for k, v in config.runner_components(pc).items()}
    comps = fingerprint.collect([*config.COMPONENTS, *declared], declared)
    for name, fp in comps.items():
        files.put(out / f"{name}.json", fp)
    for prov, pc in sorted(p["providers"].items()):
        fp = {c: comps[c] for c in sorted(pc["uses"])}
        if fingerprint.cluster_unavailable(prov):  # parity repro --cluster: no node offers it
            fp["cluster"] = fingerprint.cluster_unavailable(prov)
        files.put(out / f"provider-{prov}.json", fp)
    files.put(out / "host.json", fingerprint.host())
    for stage, uses in sorted(fingerprint.STAGE_USES.items()):
        files.put(out / f"stage-{stage}.json", {c: comps[c] for c in uses})
    for name, c in [*codedeps.models_code(p["models"]).items(), *codedeps.inputs_code(p["models"]).items(),
                    *((f"provider-{k}", c) for k, c in codedeps.providers_code(p["providers"]).items()),  # runners
                    *((f"suite-{k}", c) for k, c in suite_code.suites_code(p).items()),  # a suite's modules
                    *((f"stage-{k}", c) for k, c in codedeps.stages_code(Path(codedeps.CLOSURES)).items())]:
        files.put(code / f"{name}.json", c)  # each stage's closure: its one code dep (parity deps)
    files.prune()  # files of an earlier run not written now (a model/provider no longer in params)
    importmemo.save(known)
    print("\n".join(f"env: {name:12s} " + ", ".join(f"{k}={v}" for k, v in fp.items()) for name, fp in comps.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
